"""Work a step does at once: the rewards scored (waiting on servers) while the reference's log-probs are computed
on the device (run.overlap_reference)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from rlsteps.engine.batch import RolloutBatch

T = TypeVar("T")


def overlaps_reference(choice: bool | str, device: torch.device) -> bool:
    """Whether the reference's log-probs are computed while the rewards are scored (run.overlap_reference); "auto"
    overlaps where the policy runs on an accelerator. On a CPU the reference's forward already takes every core,
    which the scoring needs too (a local server's forward, the client's threads and the GIL): a tiny world step took
    0.285 s overlapped against 0.235 s one after the other (rl/reinforce; rl/rlhf 0.376 against 0.329 s)."""
    return device.type != "cpu" if choice == "auto" else bool(choice)


def run_beside(first: Callable[[], Any], second: Callable[[], T] | None) -> tuple[Any, T | None]:
    """first() and second() at once: first in a thread of its own (it waits on servers: reward models, judges),
    second on this one (it may use the device and the process group). Both results; either's exception is raised
    here once both have ended. Without a second, first runs here alone."""
    if second is None:
        return first(), None
    box: dict[str, Any] = {}

    def run_first() -> None:
        try:
            box["value"] = first()
        except BaseException as error:  # raised on the caller's thread below
            box["error"] = error

    thread = threading.Thread(target=run_first, name="rlsteps-scoring", daemon=True)
    thread.start()
    try:
        second_result = second()
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"], second_result


def computed_for(batch: RolloutBatch, values: torch.Tensor, compute: Callable[[RolloutBatch], torch.Tensor]):
    """A log-prob function that answers `batch` itself with the values computed for it beforehand, and computes
    any other batch."""
    return lambda asked: values if asked is batch else compute(asked)
