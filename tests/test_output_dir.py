"""An output.dir the run cannot write into is said in one line with its exit code, by the run and by its dry run alike,
before anything starts: no job directory, no run directory, no process. (A file, or a path under one, is in
test_bad_inputs.py with the other refusals.)

The conditions are real: a tmpfs mounted read-only, a tmpfs filled to the last block (both need root: skipped
elsewhere, failed under RLSTEPS_REQUIRE_TMPFS), and a directory this user may not write (as root, whom permissions
do not stop, the CLI runs without the capability that overrides them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import required
from rlsteps.contract.output_dir import make_output_dir
from rlsteps.errors import UsageError
from test_bad_inputs import files_under, leftover_processes, marked
from test_disk_full import fill
from tmpfs import tmpfs_mounts

NO_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]  # root obeys permission bits


@pytest.fixture
def mount(tmp_path) -> Iterator:
    """mount(options) -> a tmpfs of 2 MB under tmp_path with those options; unmounted after the test."""
    with tmpfs_mounts(tmp_path) as mount_tmpfs:
        yield lambda options: mount_tmpfs(f"size=2m,{options}")


def run_and_dry_run(out: Path, work: Path, prefix: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    command = [*prefix, sys.executable, "-m", "rlsteps.cli", "run", "rl/rs", "-c", "tiny", f"output.dir={out}"]
    return [
        subprocess.run([*command, *dry], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        for dry in ((), ("--dry-run",))
    ]


def assert_refused_alike(results, code: int, error: str, fix: str | None, work: Path, marker: str) -> None:
    """Both exit with `code`, end with the same error line (and fix line), with no traceback; nothing was left."""
    for result in results:
        assert result.returncode == code, result.stderr
        assert "Traceback" not in result.stderr + result.stdout, result.stderr
        *_, last = [line for line in result.stderr.splitlines() if line.startswith("error:")] or [""]
        assert last.startswith(f"error: {error}"), result.stderr
        if fix is not None:
            assert f"\nfix: {fix}" in result.stderr, result.stderr
    assert results[0].stdout == "" and results[0].stderr.startswith("error:"), results[0].stderr  # nothing started
    assert leftover_processes(marker, str(work)) == []
    assert files_under(work) == []


def test_a_read_only_filesystem_is_refused_with_exit_2(mount, tmp_path, monkeypatch):
    disk = mount("ro")
    work = tmp_path / "work"
    work.mkdir()
    marker = marked(monkeypatch)
    results = run_and_dry_run(disk / "run", work)
    error = f"output.dir {disk / 'run'} is on a read-only filesystem ({disk})"
    assert_refused_alike(results, 2, error, "pass output.dir=PATH to a directory this user can write", work, marker)


def test_a_full_disk_is_refused_with_exit_1_before_anything_is_written(mount, tmp_path, monkeypatch):
    disk = mount("rw")
    fill(disk)
    before = files_under(disk)
    work = tmp_path / "work"
    work.mkdir()
    marker = marked(monkeypatch)
    results = run_and_dry_run(disk / "run", work)
    error = f"no space left on {disk / 'run' / 'checkpoints'} (0.0 MB free, a checkpoint needs "
    assert_refused_alike(results, 1, error, None, work, marker)
    assert "MB or move output.dir to a disk with room" in results[0].stderr
    assert files_under(disk) == before


def test_a_directory_this_user_cannot_write_is_refused_with_exit_2(tmp_path, monkeypatch):
    parent, work = tmp_path / "locked", tmp_path / "work"
    parent.mkdir(mode=0o555)
    work.mkdir()
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            required.unavailable("no setpriv to drop root's override of permissions", switch="TMPFS")
        prefix = tuple(NO_OVERRIDE)
    marker = marked(monkeypatch)
    try:
        results = run_and_dry_run(parent / "run", work, prefix)
    finally:
        parent.chmod(0o755)
    error = f"output.dir {parent / 'run'} is not writable by this user (uid {os.geteuid()}): {parent} belongs to uid"
    fix = f"pass output.dir=PATH to a directory this user can write, or give this user write access to {parent}"
    assert_refused_alike(results, 2, error, fix, work, marker)
    assert not (parent / "run").exists()


def test_the_worker_makes_its_run_directory_or_says_why_not(tmp_path):
    """Where the CLI could not look (a cluster's path), the worker asks the same before it writes a line."""
    make_output_dir(tmp_path / "a" / "run")
    assert (tmp_path / "a" / "run").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match=f"output.dir {tmp_path / 'file' / 'run'} lies under a file"):
        make_output_dir(tmp_path / "file" / "run")
