"""Whether a checkpoint is whole before a run resumes from it, told from its own metadata, and a damaged one set aside.

A checkpoint's files are checked against what it says of itself, without reading a weight: training_info.json
parses and holds the resume counters, trainer_state.pt is a whole zip (torch.save's), the state/ folder's *.distcp
files are as long as its .metadata places items in them (policy/: its safetensors against their headers). A file
damaged after its save (a copy cut short, a disk that lost blocks) is found here, not as a traceback from torch.

The newest checkpoints that are damaged are renamed `damaged_step_<N>` (never deleted: the user may still want them)
and the run resumes from the newest intact one, its records cut back to it as on any resume. When none is intact the
run refuses to start over unless checkpoint.start_over_if_damaged says so.

Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

from rlsteps.contract.weight_files import dcp_damage, hf_damage, zip_damage
from rlsteps.engine.checkpoints.resume import (
    POLICY_DIR,
    REQUIRED_INFO,
    STATE_DIR,
    TRAINER_STATE,
    TRAINING_INFO,
    CheckpointError,
    CheckpointManager,
)
from rlsteps.engine.distributed import SINGLE, World, from_main

log = logging.getLogger(__name__)

DAMAGED_PREFIX = "damaged_"  # damaged_step_<N>: a checkpoint found damaged, kept for the user
START_OVER_KEY = "checkpoint.start_over_if_damaged"


def checkpoint_damage(path: Path) -> str | None:
    """What is wrong with the checkpoint at `path`, in words, or None when its files are whole."""
    fs, folder = LocalFileSystem(), str(Path(path).absolute())
    try:
        return (
            _info_damage(path / TRAINING_INFO)
            or _trainer_state_damage(fs, f"{folder}/{TRAINER_STATE}")
            or _weights_damage(fs, path)
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


def set_aside_damaged(
    checkpoints: CheckpointManager,
    start_over: bool,
    world: World = SINGLE,
    say: Callable[[str], None] = log.warning,
) -> None:
    """Before a resume: the newest checkpoints that are damaged renamed damaged_step_<N>, each said in one line, so
    that the latest is the newest intact one. CheckpointError (on every process) when none is intact and
    `start_over` is False; nothing is moved then."""
    problem = None
    if world.is_main:
        try:
            _set_aside(checkpoints, start_over, say)
        except CheckpointError as error:
            problem = error
    problem = from_main(world, problem)  # the others wait here, and read the checkpoints as the main one left them
    if problem is not None:
        raise problem


def _set_aside(checkpoints: CheckpointManager, start_over: bool, say: Callable[[str], None]) -> None:
    found = checkpoints.list()
    damaged: list[tuple[Path, str]] = []
    for path in reversed(found):
        why = checkpoint_damage(path)
        if why is None:
            break
        damaged.append((path, why))
    if not damaged:
        return
    intact = found[: len(found) - len(damaged)]
    if not intact and not start_over:
        newest, why = damaged[0]
        raise CheckpointError(
            f"checkpoint {newest} is damaged ({why}) and no intact checkpoint is left to resume from (fix: rerun "
            f"with {START_OVER_KEY}=true to start over, the damaged checkpoints kept as {DAMAGED_PREFIX}step_N, or "
            "put back an intact copy of it)"
        )
    then = f"resuming from {intact[-1].name}" if intact else f"starting over ({START_OVER_KEY}=true)"
    for path, why in damaged:
        aside = _move_aside(path)
        say(f"checkpoint {path.name} is damaged ({why}): moved aside to {aside}; {then}")


def _move_aside(path: Path) -> Path:
    """`path` renamed damaged_<name> beside it (damaged_<name>.2, .3, ... when that is taken), whole."""
    target = path.with_name(f"{DAMAGED_PREFIX}{path.name}")
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{DAMAGED_PREFIX}{path.name}.{number}")
    os.replace(path, target)
    return target
