"""Weights that are not finite stop the run where they are found: before a checkpoint is written (so the intact ones
before it stay the latest and none is pruned for it), after a checkpoint is read (a resume never trains on NaN), and
before the output is written (no output ever holds a NaN or an infinity). One line names the first such tensor.
"""

from __future__ import annotations

import torch

from rlsteps.engine.distributed import SINGLE, World, reduce_max
from rlsteps.errors import RunFailed


class NonFiniteWeights(RunFailed):
    """A weight of the policy is NaN or infinite: exit 1, naming the tensor and where it was found."""


def first_non_finite(model: torch.nn.Module) -> str | None:
    """The name of the first parameter with a NaN or an infinity in this process's part of it, or None."""
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param  # a sharded DTensor: this process's shard
        if local.numel() and not bool(torch.isfinite(local.detach()).all()):
            return name
    return None


def refuse_non_finite(model: torch.nn.Module, where: str, fix: str, world: World = SINGLE) -> None:
    """NonFiniteWeights on every process when any process holds a weight that is not finite; `where` says when (e.g.
    "after step 4, before its checkpoint"), `fix` what to do."""
    found = first_non_finite(model)
    if not reduce_max(world, float(found is not None)):
        return
    named = f"{found}" if found is not None else "a tensor sharded to another process"
    raise NonFiniteWeights(f"the policy's weights are not finite {where}: {named} holds NaN or infinity", fix=fix)
