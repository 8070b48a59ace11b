"""Room on the run directory's disk, and a full disk said in one line: the directory, and what to free.

A run writes checkpoints, its records (metrics.jsonl, samples.jsonl, train.log) and its output artifact into
output.dir. Before the first step and before every checkpoint the free space there is compared with what a
checkpoint needs (the latest checkpoint's size; before the first one, an estimate from the policy's weights and
AdamW's two moments), so a disk without room stops the run before it writes a byte of the checkpoint. A write that
still meets a full disk (something else filled it) is undone by its writer, so nothing is left half-written, and
is raised as DiskFull.

Torch-free.
"""

from __future__ import annotations

import errno
import math
import shutil
from pathlib import Path

from rlsteps.errors import DiskFull

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device; the user's quota is used up
MB = 1 << 20
SLACK_BYTES = MB  # a checkpoint's small files (trainer state, training info, the state's metadata)


def free_bytes(directory: Path) -> int:
    """Free bytes (for this user) on the filesystem that holds `directory`, or would hold it once made."""
    path = Path(directory).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def checkpoint_estimate(weight_bytes: int, parameter_bytes: int) -> int:
    """What a checkpoint of a policy takes before one exists to measure: its weights (every tensor of its state,
    fp32), AdamW's two moments of every trained parameter, and the small files."""
    return weight_bytes + 2 * parameter_bytes + SLACK_BYTES


def first_checkpoint_bytes(policy: Path) -> int | None:
    """checkpoint_estimate before the policy is loaded, from its files alone: the parameters its safetensors headers
    list, or (another form: a Megatron checkpoint) three times the size of its files; None when it is not there."""
    from rlsteps.contract.weight_files import safetensors_numel

    if not policy.is_dir():
        return None
    files = sorted(policy.glob("*.safetensors"))
    if not files:
        return 3 * tree_bytes(policy) + SLACK_BYTES
    parameters = sum(safetensors_numel(file) or 0 for file in files)
    return checkpoint_estimate(4 * parameters, 4 * parameters)


def tree_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())


def check_room(directory: Path, need: int, what: str = "a checkpoint") -> None:
    """DiskFull when the disk of `directory` has less than `need` bytes free."""
    free = free_bytes(directory)
    if free < need:
        raise disk_full(directory, need=need, free=free, what=what)


def disk_full(directory: Path, need: int | None = None, free: int | None = None, what: str | None = None) -> DiskFull:
    """The error for a full disk under `directory`: how much is free, what needed more, and how much to free."""
    free = free_bytes(directory) if free is None else free
    if need is not None and need > free:
        short = max(1, math.ceil((need - free) / MB))
        needed = f", {what or 'the run'} needs {_mb(need)} MB"
        fix = f"free {short} MB or move output.dir to a disk with room"
    else:
        needed, fix = f", writing {what}" if what else "", "free space there or move output.dir to a disk with room"
    return DiskFull(f"no space left on {directory} ({_mb(free)} MB free{needed})", fix=fix)


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is a full disk (ENOSPC, or a used-up quota)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFull) or (isinstance(error, OSError) and error.errno in FULL_ERRNOS):
            return True
        error = error.__cause__ or error.__context__
    return False


def _mb(count: int) -> str:
    return f"{count / MB:.1f}" if count < 10 * MB else f"{count // MB}"
