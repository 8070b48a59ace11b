"""The compiled learning-rate schedule, run by NeMo-RL's own scheduler setup (DTensor: the v2 policy worker's
setup_model_and_optimizer from the pinned source, with the real torch; Megatron: megatron-core's
OptimizerParamScheduler, set up as Megatron-Bridge does), against rlsteps's own schedule at every optimizer step."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import required
import upstream
from rlsteps.catalog import load_catalog
from rlsteps.contract.config import STEP_SCHEMAS
from rlsteps.contract.nemo_rl_job import optimizer_steps_per_step
from rlsteps.engine.policy.optim import lr_multiplier
from rlsteps.nemo_rl import schedule
from rlsteps.plan.compile import compile_job

# Slow (runs NeMo-RL's schedulers in a process of their own): the fast tier, -m 'not slow', leaves it out
pytestmark = pytest.mark.slow

CHECK = Path(__file__).with_name("nemo_rl_schedule_check.py")
INPUTS = ("inputs.prompts=/p.jsonl", "inputs.policy=/sft", "inputs.judge_model=/j")
SCHEDULES = ("cosine", "linear", "constant")
WARMUPS = (0, 1, 2, 4, 9, 10, 13)  # none, the first step at the peak, ..., the whole run, past its end
MAX_STEPS = 10


def config(schedule_name: str, warmup: int, per_step: int = 1, max_steps: int = MAX_STEPS) -> dict:
    """An rl/rlhf config whose GRPO step makes `per_step` optimizer steps (4 prompts x 4 rollouts)."""
    overrides = [
        "engine=nemo_rl",
        *INPUTS,
        f"train.schedule={schedule_name}",
        f"train.warmup_steps={warmup}",
        f"train.max_steps={max_steps}",
        "train.min_lr_ratio=0.1",
        "rollout.prompts_per_step=4",
        "rollout.num_rollouts_per_prompt=4",
        f"train.global_batch_size={16 // per_step}",
        "train.micro_batch_size=1",
    ]
    job = compile_job(load_catalog().find("rl/rlhf"), "default", overrides=overrides)
    return STEP_SCHEMAS[job.algorithm].model_validate(job.config).model_dump(mode="json")


def rlsteps_rates(cfg: dict) -> list[float]:
    """rlsteps's own lr at each optimizer step (engine.policy.optim.lr_multiplier, as the worker builds it)."""
    train = cfg["train"]
    total = schedule.optimizer_steps(cfg)
    return [
        train["lr"]
        * lr_multiplier(
            step,
            warmup_steps=train["warmup_steps"],
            total_steps=total,
            schedule=train["schedule"],
            min_lr_ratio=train["min_lr_ratio"],
        )
        for step in range(total)
    ]


def policy_section(cfg: dict) -> dict:
    return {
        "model_name": "unused",
        "dtensor_cfg": {"activation_checkpointing": False},
        "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": cfg["train"]["lr"], "weight_decay": 0.0}},
        "scheduler": schedule.torch_schedulers(cfg),
    }


def nemo_rl_rates(cfgs: list[dict], policies: list[dict] | None = None) -> list:
    """The lr at each optimizer step as NeMo-RL's DTensor worker sets up the policy's optimizer and scheduler
    (policies: the compiled master config's policy sections; by default optimizer and scheduler alone) and steps them
    (tests/nemo_rl_schedule_check.py, in a process of its own)."""
    upstream.unpacked("nemo_rl")  # skips (or fails under RLSTEPS_REQUIRE_UPSTREAM=1) without the archive
    cases = [
        {
            "policy": policy if policy is not None else policy_section(cfg),
            "grpo_steps": cfg["train"]["max_steps"],
            "per_step": optimizer_steps_per_step(cfg),
        }
        for cfg, policy in zip(cfgs, policies or [None] * len(cfgs), strict=True)
    ]
    done = subprocess.run(
        [sys.executable, str(CHECK)], input=json.dumps(cases), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_nemo_rls_dtensor_scheduler_gives_rlsteps_learning_rate_at_every_optimizer_step():
    cases = [(name, warmup) for name in SCHEDULES for warmup in WARMUPS]
    cfgs = [config(name, warmup) for name, warmup in cases]
    for (name, warmup), cfg, got in zip(cases, cfgs, nemo_rl_rates(cfgs), strict=True):
        assert isinstance(got, list), f"{name} warmup {warmup}: NeMo-RL refused {policy_section(cfg)}: {got}"
        assert got == pytest.approx(rlsteps_rates(cfg), rel=1e-6), (name, warmup, schedule.torch_schedulers(cfg))


def test_with_several_optimizer_steps_per_grpo_step_nemo_rl_holds_the_lr_through_each_step():
    """NeMo-RL steps its scheduler once per GRPO step: rlsteps's schedule counted in GRPO steps (warmup rounded
    up), held for the step's optimizer steps; said in the notes."""
    per_step = 4
    cases = [(name, warmup) for name in SCHEDULES for warmup in (0, 1, 4, 6)]
    cfgs = [config(name, warmup, per_step=per_step) for name, warmup in cases]
    for (name, warmup), cfg, got in zip(cases, cfgs, nemo_rl_rates(cfgs), strict=True):
        assert isinstance(got, list), got
        lr = cfg["train"]["lr"]
        held = [
            lr * lr_multiplier(step, warmup_steps=math.ceil(warmup / per_step), total_steps=MAX_STEPS, schedule=name)
            for step in range(MAX_STEPS)
            for _ in range(per_step)
        ]
        assert got == pytest.approx(held, rel=1e-6), (name, warmup)
        assert "once per GRPO step" in schedule.notes(cfg)[0]
    assert schedule.notes(config("cosine", 4)) == []


def megatron_rates(cfg: dict, gbs: int = 16) -> list[float]:
    """megatron-core's OptimizerParamScheduler as Megatron-Bridge sets it up from megatron_cfg.scheduler (steps in
    samples: iterations x global batch size) and NeMo-RL's Megatron worker steps it (increment=gbs once per GRPO
    step), at every optimizer step."""
    import torch

    core = required.importorskip("megatron.core.optimizer_param_scheduler", switch="MEGATRON")
    train, compiled = cfg["train"], schedule.megatron_scheduler(cfg)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=train["lr"])
    wsd = compiled.get("lr_wsd_decay_iters")
    scheduler = core.OptimizerParamScheduler(
        optimizer,
        init_lr=compiled["lr_warmup_init"],
        max_lr=train["lr"],
        min_lr=train["lr"] * (train["min_lr_ratio"] if train["schedule"] != "constant" else 1.0),
        lr_warmup_steps=compiled["lr_warmup_iters"] * gbs,
        lr_decay_steps=compiled["lr_decay_iters"] * gbs,
        lr_decay_style=compiled["lr_decay_style"],
        start_wd=compiled["start_weight_decay"],
        end_wd=compiled["end_weight_decay"],
        wd_incr_steps=compiled["lr_decay_iters"] * gbs,
        wd_incr_style=compiled["weight_decay_incr_style"],
        wsd_decay_steps=wsd * gbs if wsd is not None else None,
        lr_wsd_decay_style=compiled.get("lr_wsd_decay_style"),
    )
    rates = []
    for _ in range(cfg["train"]["max_steps"]):
        rates.extend([optimizer.param_groups[0]["lr"]] * optimizer_steps_per_step(cfg))
        scheduler.step(increment=gbs)
    return rates


@pytest.mark.parametrize("name", SCHEDULES)
def test_megatron_cores_scheduler_gives_rlsteps_learning_rate_at_every_optimizer_step(name):
    for warmup in WARMUPS:
        cfg = config(name, warmup)
        assert megatron_rates(cfg) == pytest.approx(rlsteps_rates(cfg), rel=1e-6), (
            warmup,
            schedule.megatron_scheduler(cfg),
        )


def test_the_megatron_scheduler_has_the_keys_nemo_rl_reads():
    """NeMo-RL's MegatronSchedulerConfig keys (it passes the dict whole to Megatron-Bridge's SchedulerConfig, whose
    lr_wsd_decay_* keys give the flat step between warmup and decay)."""
    required = {
        "start_weight_decay",
        "end_weight_decay",
        "weight_decay_incr_style",
        "lr_decay_style",
        "lr_warmup_iters",
        "lr_warmup_init",
    }
    for name in SCHEDULES:
        compiled = schedule.megatron_scheduler(config(name, 4))
        assert required <= set(compiled), name
        assert set(compiled) - required <= {"lr_decay_iters", "lr_wsd_decay_style", "lr_wsd_decay_iters"}
        assert compiled["lr_decay_iters"] == MAX_STEPS  # NeMo-RL's train_iters: GRPO steps, not optimizer steps
    assert schedule.megatron_scheduler(config("cosine", 13))["lr_decay_iters"] == 14  # longer than the warmup
