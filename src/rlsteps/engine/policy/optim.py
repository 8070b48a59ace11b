"""Optimisation of the policy: AdamW with decoupled weight decay, the lr schedule, and one clipped update."""

from __future__ import annotations

import logging
import math
from functools import partial

import torch
from torch import nn

log = logging.getLogger(__name__)

SCHEDULES = ("cosine", "linear", "constant")


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW; matrices decay, 1-D parameters (biases, norm weights) do not."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str = "cosine", min_lr_ratio: float = 0.1
) -> float:
    """The factor on the peak lr for the update after `step` updates.

    Linear warmup reaches the peak on update warmup_steps (the first update already moves,
    at 1/warmup_steps); then cosine or linear decay to min_lr_ratio at total_steps, flat after.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:  # linear
        decay = 1.0 - progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps} and {total_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    multiplier = partial(
        lr_multiplier, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule, min_lr_ratio=min_lr_ratio
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
) -> float:
    """Clip, step, advance the schedule, zero the gradients; returns the pre-clip gradient norm (global: over
    every process's shard of a sharded model, the same on each, so every process skips or steps alike).

    A non-finite norm (inf/nan gradients) skips the update and the schedule, and is returned
    as is: the caller sees `not math.isfinite(norm)` and can count or report the skipped step.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    clip_to = max_grad_norm if max_grad_norm is not None and max_grad_norm > 0 else math.inf
    grad_norm = _global(torch.nn.utils.clip_grad_norm_(params, clip_to)) if params else 0.0
    if math.isfinite(grad_norm):
        optimizer.step()
        scheduler.step()
    else:
        log.warning("non-finite gradient norm %s: update skipped, weights unchanged", grad_norm)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def _global(norm: torch.Tensor) -> float:
    """The norm over every process's shard: FSDP2's sharded gradients give it as a DTensor."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
