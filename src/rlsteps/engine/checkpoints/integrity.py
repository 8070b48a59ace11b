"""A damaged checkpoint set aside before a run resumes (whether one is damaged: rlsteps.contract.checkpoint_damage,
from its metadata, sizes and the SHA-256 of every file).

The newest checkpoints that are damaged are renamed `damaged_step_<N>` (never deleted: the user may still want them)
and the run resumes from the newest intact one, its records cut back to it as on any resume. When none is intact the
run refuses to start over unless checkpoint.start_over_if_damaged says so.

Torch-free.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from rlsteps.contract.checkpoint_damage import START_OVER_KEY, checkpoint_damage
from rlsteps.engine.checkpoints.resume import CheckpointError, CheckpointManager
from rlsteps.engine.distributed import SINGLE, World, from_main

log = logging.getLogger(__name__)

DAMAGED_PREFIX = "damaged_"  # damaged_step_<N>: a checkpoint found damaged, kept for the user


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
