"""A run's checkpoint checked against what its own files say of themselves: training_info.json parses and holds the
resume counters, trainer_state.pt is a whole zip (torch.save's), the state/ folder's *.distcp files are as long as its
.metadata places items in them (policy/: its safetensors against their headers), and then every file's bytes against
the SHA-256 written with it (digests.json, rlsteps.contract.file_digests). A file damaged after its save (a copy cut
short, a disk that lost blocks, bytes overwritten in place) is found here, not as a traceback from torch or as a run
that trains on NaN.

Torch-free: the worker asks it before a resume (rlsteps.engine.checkpoints.integrity), and the dry run before it
says a run would start.
"""

from __future__ import annotations

import json
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

from rlsteps.contract.file_digests import digest_damage
from rlsteps.contract.run_files import complete_checkpoints
from rlsteps.contract.weight_files import dcp_damage, hf_damage, zip_damage

# A checkpoint step_<N>/ of a run: its files
POLICY_DIR = "policy"  # the policy in Hugging Face form (a one-process run without optimizer shards)
STATE_DIR = "state"  # or every process's weights and optimizer state, as torch.distributed.checkpoint writes them
TRAINER_STATE = "trainer_state.pt"  # the scheduler's and the RNGs' state
TRAINING_INFO = "training_info.json"  # the counters a resume starts from
REQUIRED_INFO = ("consumed_samples", "epoch", "optimizer_steps")
START_OVER_KEY = "checkpoint.start_over_if_damaged"


def checkpoint_damage(path: Path, content: bool = True) -> str | None:
    """What is wrong with the checkpoint at `path`, in words, or None when its files are whole. content=False checks
    metadata and sizes only, in milliseconds (the command line's early answer; a resume reads every byte's digest)."""
    fs, folder = LocalFileSystem(), str(Path(path).absolute())
    try:
        return (
            _info_damage(path / TRAINING_INFO)
            or _trainer_state_damage(fs, f"{folder}/{TRAINER_STATE}")
            or _weights_damage(fs, path)
            or (digest_damage(path) if content else None)
        )
    except OSError as error:
        return f"{path} cannot be read: {error}"


def _info_damage(path: Path) -> str | None:
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        return f"{path} is absent"
    except (ValueError, UnicodeDecodeError) as error:
        return f"{path} is not JSON ({error})"
    missing = [key for key in REQUIRED_INFO if not isinstance(info, dict) or key not in info]
    return f"{path} lacks {', '.join(missing)}" if missing else None


def _trainer_state_damage(fs: LocalFileSystem, file: str) -> str | None:
    if not fs.isfile(file):
        return f"{file} is absent"
    return zip_damage(fs, file) if fs.size(file) else f"{file} is empty"


def _weights_damage(fs: LocalFileSystem, path: Path) -> str | None:
    if (path / STATE_DIR).is_dir():
        return dcp_damage(fs, str((path / STATE_DIR).absolute()), own=True)
    if (path / POLICY_DIR).is_dir():
        return hf_damage(fs, str((path / POLICY_DIR).absolute()))
    return f"{path} has neither {STATE_DIR}/ nor {POLICY_DIR}/"


def no_intact_checkpoint(checkpoints_dir: Path) -> str | None:
    """When a run directory has checkpoints and every one is damaged by its metadata and sizes, the newest's damage in
    words (the run refuses to start over unless checkpoint.start_over_if_damaged says so); None otherwise. Contents
    are left to the worker: hashing a large checkpoint twice, here and there, would double a resume's wait."""
    found = complete_checkpoints(checkpoints_dir)
    damage = [checkpoint_damage(path, content=False) for path in reversed(found)]
    if not found or any(why is None for why in damage):
        return None
    return f"checkpoint {found[-1]} is damaged ({damage[0]}) and no intact checkpoint is left to resume from"
