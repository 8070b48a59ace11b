"""Whether output.dir can hold a run, asked before anything starts: by `rlsteps run` and its dry run (on the machine
that will run it), and by the worker before it writes a line there.

Each condition is one error with its exit code: a path that is a file, or lies under one, a read-only filesystem
and a directory this user cannot write are config errors (exit 2: pick another output.dir); a disk without room
for a checkpoint is DiskFull (exit 1, as when it fills during the run: free space or move output.dir).

Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlsteps.contract import disk
from rlsteps.contract.run_files import CHECKPOINTS_DIR
from rlsteps.errors import RlstepsError, UsageError

ANOTHER_DIR = "pass output.dir=PATH to a directory this user can write"


def output_dir_problem(run_dir: Path, need_bytes: int = disk.SLACK_BYTES) -> RlstepsError | None:
    """What stops a run from writing into `run_dir` (made if absent), or None. need_bytes: the room the run needs
    before its first checkpoint (at least a checkpoint's small files: a full disk has less)."""
    run_dir = Path(run_dir)
    existing = _nearest_existing(run_dir)
    if not existing.is_dir():
        return _not_a_directory(run_dir, existing)
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return UsageError(
            f"output.dir {run_dir} is on a read-only filesystem ({_mount_point(existing)})",
            fix=f"{ANOTHER_DIR}, on a disk mounted read-write",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        owner = existing.stat().st_uid
        return UsageError(
            f"output.dir {run_dir} is not writable by this user (uid {os.geteuid()}): {existing} belongs to uid "
            f"{owner}, mode {existing.stat().st_mode & 0o777:o}",
            fix=f"{ANOTHER_DIR}, or give this user write access to {existing}",
        )
    try:
        disk.check_room(run_dir / CHECKPOINTS_DIR, max(need_bytes, disk.SLACK_BYTES), what="a checkpoint")
    except RlstepsError as full:
        return full
    return None


def make_output_dir(run_dir: Path) -> None:
    """Make `run_dir` (and its parents), or raise the one-line error that says why it cannot be."""
    problem = output_dir_problem(run_dir, need_bytes=0)
    if problem is not None:
        raise problem
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    except OSError as error:  # what changed since the check (a race), in one line all the same
        if disk.is_disk_full(error):
            raise disk.disk_full(Path(run_dir), what="the run directory") from None
        raise UsageError(f"output.dir {run_dir} cannot be made: {error.strerror}", fix=ANOTHER_DIR) from None


def _not_a_directory(run_dir: Path, existing: Path) -> UsageError:
    kind = "a file" if existing.is_file() else "not a directory"
    where = f"is {kind}" if existing == run_dir.absolute() else f"lies under {kind}, {existing}"
    fix = f"{ANOTHER_DIR}, or move {existing} away" if existing.is_file() else ANOTHER_DIR
    return UsageError(f"output.dir {run_dir} {where}" + (", not a directory" if existing.is_file() else ""), fix=fix)


def _nearest_existing(path: Path) -> Path:
    """`path` if it exists, else its nearest ancestor that does."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mount_point(path: Path) -> Path:
    path = path.absolute()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path
