"""Real small filesystems for the disk tests: tmpfs mounts (as root; CI runs as root), unmounted afterwards. Where
none can be mounted the test skips with the reason, or fails under RLSTEPS_REQUIRE_TMPFS=1."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import required


@contextlib.contextmanager
def tmpfs_mounts(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """mount(options) -> a fresh tmpfs under tmp_path, mounted with those tmpfs options; all unmounted at exit."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            required.unavailable(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}", switch="TMPFS")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)
