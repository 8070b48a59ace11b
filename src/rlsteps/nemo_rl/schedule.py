"""rlsteps's learning-rate schedule (engine.policy.optim.lr_multiplier: linear warmup, then cosine, linear or
constant) in the forms NeMo-RL's policy workers build a scheduler from; pure.

NeMo-RL steps its scheduler once per GRPO step, after all of that step's optimizer steps (DTensorPolicyWorkerV2.train
and MegatronPolicyWorker.train at the pinned version), so the schedule's unit there is the GRPO step. When a GRPO
step makes one optimizer step (train_global_batch_size = prompts x rollouts) the two engines give the same learning
rate at every optimizer step; with several, NeMo-RL holds it through the step and rlsteps's warmup_steps is
counted in GRPO steps (rounded up): `notes` says so.

- DTensor: `policy.scheduler`, a list of torch schedulers with a `{"milestones": [...]}` entry that NeMo-RL always
  needs (it builds a SequentialLR from every list; none without warmup).
- Megatron: `policy.megatron_cfg.scheduler`, Megatron-Bridge's SchedulerConfig for megatron-core's
  OptimizerParamScheduler: warmup_steps - 1 iterations from lr / warmup_steps (rlsteps's first step already moves),
  then WSD (a flat step at the peak, as rlsteps's decay starts one step after the warmup's last) annealing with
  the decay style to min_lr at the run's last step.
"""

from __future__ import annotations

import math
from typing import Any

from rlsteps.contract.nemo_rl_job import optimizer_steps_per_step
from rlsteps.nemo_rl.semantics import NO_END


def optimizer_steps(cfg: dict[str, Any]) -> int:
    """Optimizer steps of the whole run: NeMo-RL steps once per train_global_batch_size rows of a GRPO step."""
    return cfg["train"]["max_steps"] * optimizer_steps_per_step(cfg)


def scheduler_steps(cfg: dict[str, Any]) -> tuple[int, int]:
    """(warmup, total) in NeMo-RL's scheduler steps, GRPO steps: rlsteps's warmup_steps (optimizer steps) over the
    optimizer steps of one GRPO step, rounded up, and train.max_steps."""
    warmup = math.ceil(cfg["train"]["warmup_steps"] / optimizer_steps_per_step(cfg))
    return warmup, cfg["train"]["max_steps"]


def torch_schedulers(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """`policy.scheduler`: a SequentialLR of a warmup to the peak on scheduler step warmup (the first at
    1/warmup) and the decay to min_lr_ratio at the run's last step; the milestones entry always (NeMo-RL's builder
    reads it for any list)."""
    train = cfg["train"]
    warmup, total = scheduler_steps(cfg)
    decay_steps = max(1, total - warmup)
    if train["schedule"] == "cosine":
        decay = {
            "name": "torch.optim.lr_scheduler.CosineAnnealingLR",
            "kwargs": {"T_max": decay_steps, "eta_min": train["lr"] * train["min_lr_ratio"]},
        }
    elif train["schedule"] == "linear":
        decay = {
            "name": "torch.optim.lr_scheduler.LinearLR",
            "kwargs": {"start_factor": 1.0, "end_factor": train["min_lr_ratio"], "total_iters": decay_steps},
        }
    else:
        decay = {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0, "total_iters": NO_END}}
    if warmup == 0:
        return [decay, {"milestones": []}]
    ramp = {
        "name": "torch.optim.lr_scheduler.LinearLR",
        "kwargs": {"start_factor": 1.0 / warmup, "end_factor": 1.0, "total_iters": warmup - 1},
    }
    return [ramp, decay, {"milestones": [warmup]}]


def megatron_scheduler(cfg: dict[str, Any]) -> dict[str, Any]:
    """`policy.megatron_cfg.scheduler` (NeMo-RL's MegatronSchedulerConfig keys, and Megatron-Bridge's WSD ones);
    the peak and min_lr are megatron_cfg.optimizer's lr and min_lr."""
    train = cfg["train"]
    warmup, total = scheduler_steps(cfg)
    decay_iters = max(total, warmup + 1)  # megatron-core needs the warmup shorter than the decay
    scheduler = {
        "start_weight_decay": train["weight_decay"],
        "end_weight_decay": train["weight_decay"],
        "weight_decay_incr_style": "constant",
        "lr_warmup_iters": max(0, warmup - 1),  # megatron-core's warmup starts at lr_warmup_init on step 0
        "lr_warmup_init": train["lr"] / warmup if warmup else train["lr"],
        "lr_decay_iters": decay_iters,
    }
    if train["schedule"] == "constant":
        return {**scheduler, "lr_decay_style": "constant"}
    return {
        **scheduler,
        "lr_decay_style": "WSD",
        "lr_wsd_decay_style": train["schedule"],
        "lr_wsd_decay_iters": decay_iters - warmup,  # the decay starts after scheduler step warmup
    }


def notes(cfg: dict[str, Any]) -> list[str]:
    """Where NeMo-RL's schedule differs from rlsteps's for this config (for the dry run's notes)."""
    per_step = optimizer_steps_per_step(cfg)
    if per_step == 1:
        return []
    warmup, _ = scheduler_steps(cfg)
    return [
        f"train.schedule: NeMo-RL moves the learning rate once per GRPO step, not per optimizer step ({per_step} "
        f"per GRPO step here): the warmup takes {warmup} GRPO step(s) and the decay ends at train.max_steps"
    ]
