"""Megatron-Bridge's own code as the judge of checkpoint_megatron: its config container, loaders and serialiser.

tests/fetch_megatron_bridge.sh downloads the pinned wheels (Megatron-Bridge 0.6.2 and the megatron-core 0.19.2 whose
megatron.training holds the ConfigContainer base it builds on) once, in CI's install phase; they are unpacked here and
imported by tests/megatron_bridge_oracle.py in a process of its own. Nothing is downloaded at test time: without the
wheels a test skips with the command that fetches them, and fails instead under RLSTEPS_REQUIRE_MEGATRON=1.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from upstream import _cache, _unavailable, built_once

BRIDGE_VERSION = "0.6.2"
WHEELS = {
    "megatron_bridge": "megatron_bridge-0.6.2-py3-none-any.whl",
    "megatron_core": "megatron_core-0.19.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
}
ORACLE = Path(__file__).resolve().parent / "megatron_bridge_oracle.py"
FETCH = "bash tests/fetch_megatron_bridge.sh"


def wheel_dir() -> Path:
    return Path(os.environ.get("RLSTEPS_MEGATRON_BRIDGE_DIR") or _cache() / f"megatron-bridge-{BRIDGE_VERSION}")


def unpacked() -> list[Path]:
    """The unpacked wheels (Bridge's first), each a folder holding its `megatron/` namespace package."""
    roots = []
    for name, wheel_name in WHEELS.items():
        wheel = wheel_dir() / wheel_name
        if not wheel.is_file():
            missing = f"{wheel} is missing: the pinned Megatron-Bridge that judges checkpoint_megatron ({FETCH})"
            _unavailable(missing, switch="MEGATRON")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:12]
        roots.append(built_once(_cache() / f"{name}-{digest}", _extractor(wheel)))
    return roots


def _extractor(wheel: Path):
    def extract(staging: Path) -> Path:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(staging)
        return staging

    return extract


def bridge(command: str, *args: str | os.PathLike) -> dict:
    """Run one oracle command (see megatron_bridge_oracle.py) under Bridge's code; its JSON answer."""
    env = dict(os.environ, RLSTEPS_MEGATRON_BRIDGE_ROOTS=os.pathsep.join(map(str, unpacked())))
    env.setdefault("OMP_NUM_THREADS", "1")
    done = subprocess.run(
        [sys.executable, str(ORACLE), command, *map(str, args)], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Megatron-Bridge oracle failed (exit {done.returncode}):\n{done.stderr[-8000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bridge_batch(*calls: tuple) -> list[dict]:
    """Several oracle commands in one process (Bridge's import is most of the time): one {"ok": answer} or
    {"error": message} each."""
    return bridge("batch", json.dumps([[str(part) for part in call] for call in calls]))
