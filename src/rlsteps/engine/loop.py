"""The one training loop every recipe shares: rollout -> score -> prepare -> update -> validate -> checkpoint.

Counters: `step` (RL steps), `consumed_samples` (prompts, not rollouts), `optimizer_steps`, `epoch`.
The prompts of a step and its sampling seed are pure functions of (seed, consumed_samples) and
(seed, step), so a run resumed from a checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlsteps.engine import signals
from rlsteps.engine.algorithms.recipe import Recipe
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.config import RecipeConfig
from rlsteps.engine.data import Prompt, RunPrompts, load_run_prompts, prompt_indices, steps_per_epoch
from rlsteps.engine.device import resolve_device
from rlsteps.engine.generation.rollouts import Sampler
from rlsteps.engine.metrics import MetricsWriter, Timers, TrainingProgress
from rlsteps.engine.policy.logprobs import batched_token_logprobs, token_logprobs
from rlsteps.engine.policy.model import frozen_copy, load_policy
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler, optimizer_step
from rlsteps.engine.resume import (
    CHECKPOINTS_DIR,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)
from rlsteps.engine.rewards.functions import RewardFunction, load_reward_functions
from rlsteps.engine.rewards.sources import RewardSource, Scores
from rlsteps.engine.samples import SampleLog, sample_records, show_samples

log = logging.getLogger(__name__)
step_log = logging.getLogger("rlsteps.steps")  # one line per step, for train.log (the worker keeps it off the terminal)


class RunStopped(RuntimeError):
    """The run stopped on purpose (a reward source failed) after writing a checkpoint."""


@dataclass
class Counters:
    step: int = 0
    consumed_samples: int = 0
    optimizer_steps: int = 0
    epoch: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "step": self.step,
            "consumed_samples": self.consumed_samples,
            "optimizer_steps": self.optimizer_steps,
            "epoch": self.epoch,
        }


@dataclass
class RunResult:
    counters: Counters
    model: torch.nn.Module
    tokenizer: object


def train(
    cfg: RecipeConfig,
    recipe: Recipe,
    rewards: RewardSource,
    run_dir: Path,
    say: Callable[[str], None] = print,
    run_prompts: RunPrompts | None = None,
) -> RunResult:
    """run_prompts: the prompts already loaded and measured (the worker does it before the policy loads); else
    they are loaded here, with the policy's tokenizer."""
    device = resolve_device(cfg.run.device)
    dtype = torch.bfloat16 if cfg.run.dtype == "bfloat16" else torch.float32
    model, tokenizer = load_policy(cfg.inputs.policy, device=device, dtype=dtype)
    reference = frozen_copy(model) if recipe.needs_reference else None  # always the initial policy
    run_prompts = run_prompts or load_run_prompts(cfg, tokenizer)
    prompts, val_prompts = run_prompts.train, run_prompts.validation
    reward_functions = load_reward_functions(cfg.validation.reward_functions)
    total_steps = planned_steps(cfg, len(prompts), say)

    checkpoints = CheckpointManager(
        run_dir / CHECKPOINTS_DIR,
        keep_last=cfg.checkpoint.keep_last,
        keep_top_k=cfg.checkpoint.keep_top_k,
        metric=cfg.checkpoint.metric,
    )
    latest = checkpoints.latest()
    loaded = checkpoints.load(latest) if latest is not None else None
    counters = Counters()
    if loaded is not None:
        model, tokenizer = load_policy(loaded.policy_dir, device=device, dtype=dtype)
        counters = Counters(**{k: loaded.info[k] for k in ("step", "consumed_samples", "optimizer_steps", "epoch")})
        say(f"resuming from {latest} (step {counters.step}, {counters.consumed_samples} prompts consumed)")
    optimizer, scheduler = _optimizer_and_schedule(cfg, recipe, model, total_steps)
    if loaded is not None:
        optimizer.load_state_dict(loaded.trainer_state["optimizer"])
        scheduler.load_state_dict(loaded.trainer_state["scheduler"])
        restore_rng_state(loaded.trainer_state["rng"])

    run = _Run(
        cfg,
        recipe,
        rewards,
        model,
        tokenizer,
        reference,
        optimizer,
        scheduler,
        checkpoints,
        Sampler(tokenizer, cfg.rollout, device),
        counters,
        device,
        say=say,
        reward_functions=reward_functions,
    )
    with (
        _metrics_writer(cfg, run_dir) as metrics,
        SampleLog(run_dir / "samples.jsonl") as run.samples,
        TrainingProgress(total=total_steps, initial=counters.step) as progress,
    ):
        if counters.step == 0 and val_prompts:
            metrics.log(0, run.validate(val_prompts))
        while counters.step < total_steps:
            step_metrics = run.step(prompts)
            if val_prompts and cfg.validation.interval and counters.step % cfg.validation.interval == 0:
                step_metrics.update(run.validate(val_prompts))
            metrics.log(counters.step, step_metrics)
            progress.update(counters.step, step_metrics)
            step_log.info("step %d/%d %s", counters.step, total_steps, _step_line(step_metrics))
            run.stop_if_not_learning(step_metrics)
            requested = signals.checkpoint_requested()  # read once: the signal may arrive at any moment
            if (
                requested
                or counters.step == total_steps
                or (cfg.checkpoint.interval and counters.step % cfg.checkpoint.interval == 0)
            ):
                run.save(step_metrics)
            if requested and counters.step < total_steps:
                raise signals.CheckpointRequested(
                    f"checkpoint written at step {counters.step} of {total_steps}, as asked (SIGUSR1: the job's "
                    "time limit is near); run again, or let the requeued job resume from it"
                )
    return RunResult(counters=counters, model=run.model, tokenizer=tokenizer)


def planned_steps(cfg: RecipeConfig, num_prompts: int, say: Callable[[str], None]) -> int:
    """RL steps this run makes: train.max_steps, unless train.max_epochs (when set) ends the data first; said at
    the start either way, so a cut is never silent."""
    per_epoch = steps_per_epoch(num_prompts, cfg.rollout.prompts_per_step)
    t = cfg.train
    epochs = math.ceil(t.max_steps / per_epoch)
    if t.max_epochs is None or t.max_epochs >= epochs:
        say(
            f"{t.max_steps} steps (train.max_steps) over {num_prompts} prompts at {cfg.rollout.prompts_per_step} "
            f"per step: {epochs} epoch(s) of {per_epoch} steps"
        )
        return t.max_steps
    total = t.max_epochs * per_epoch
    log.warning(
        "running %d steps, not train.max_steps=%d: train.max_epochs=%d over %d prompts at %d per step gives %d "
        "steps per epoch; set train.max_epochs=%d (or null) to run them all",
        total, t.max_steps, t.max_epochs, num_prompts, cfg.rollout.prompts_per_step, per_epoch, epochs,
    )  # fmt: skip
    return total


def _step_line(metrics: dict[str, float]) -> str:
    keys = ("train/reward", "train/loss", "train/grad_norm", "train/optimizer_steps", "timers/step")
    shown = [f"{k.split('/')[1]}={metrics[k]:.4g}" for k in keys if isinstance(metrics.get(k), int | float)]
    return " ".join(shown + [f"{k}={v:.4g}" for k, v in metrics.items() if k.startswith("val/")])


def _optimizer_and_schedule(cfg: RecipeConfig, recipe: Recipe, model: torch.nn.Module, total_steps: int):
    """AdamW and a schedule over every optimizer step of the run (several per RL step when batches are split)."""
    per_rl_step = math.ceil(recipe.train_rows_per_step() / cfg.train.global_batch_size)
    optimizer = build_optimizer(model, cfg.train.lr, cfg.train.weight_decay, tuple(cfg.train.betas))
    scheduler = build_scheduler(
        optimizer,
        warmup_steps=cfg.train.warmup_steps,
        schedule=cfg.train.schedule,
        total_steps=max(1, total_steps * per_rl_step),
        min_lr_ratio=cfg.train.min_lr_ratio,
    )
    return optimizer, scheduler


def _metrics_writer(cfg: RecipeConfig, run_dir: Path) -> MetricsWriter:
    return MetricsWriter(
        run_dir / "metrics.jsonl",
        tensorboard_dir=run_dir / "tensorboard" if cfg.logging.tensorboard else None,
        wandb={"project": cfg.logging.wandb_project} if cfg.logging.wandb_project else None,
    )


@dataclass
class _Run:
    cfg: RecipeConfig
    recipe: Recipe
    rewards: RewardSource
    model: torch.nn.Module
    tokenizer: object
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpoints: CheckpointManager
    sampler: Sampler
    counters: Counters
    device: torch.device
    say: Callable[[str], None] = print
    reward_functions: dict[str, RewardFunction] = field(default_factory=dict)
    samples: SampleLog | None = None
    timers: Timers = field(default_factory=Timers)
    skipped_updates: int = 0  # optimizer steps skipped on a non-finite gradient
    steps_without_update: int = 0  # RL steps that changed no weight
    no_update_streak: int = 0

    def step(self, prompts: list[Prompt]) -> dict[str, float]:
        c, cfg = self.counters, self.cfg
        started = time.perf_counter()
        indices, c.epoch = prompt_indices(cfg.seed, c.consumed_samples, cfg.rollout.prompts_per_step, len(prompts))
        with self.timers("rollout"):
            batch = self.sampler.rollouts(
                self.model, [prompts[i] for i in indices], cfg.rollout.num_rollouts_per_prompt, seed=(cfg.seed, c.step)
            )
        with self.timers("reward"):
            scores = self._score_or_stop(batch)
        with self.timers("prepare"):
            train_batch, stats = self.recipe.prepare(
                batch, scores, self._logprobs(self.model), self._logprobs(self.reference)
            )
        with self.timers("train"):
            updates_before = c.optimizer_steps
            stats.update(self._optimize(train_batch))
        self._count_update(c.optimizer_steps > updates_before)
        self._write_samples(c.step + 1, "train", batch, scores)
        c.step += 1
        c.consumed_samples += cfg.rollout.prompts_per_step
        stats.update(scores.metrics)
        stats.update(self.timers.pop())
        stats.update(
            {
                "train/consumed_samples": c.consumed_samples,
                "train/epoch": c.epoch,
                "train/optimizer_steps": c.optimizer_steps,
                "train/steps_without_update": self.steps_without_update,
                "timers/step": time.perf_counter() - started,
            }
        )
        return stats

    def _count_update(self, updated: bool) -> None:
        self.no_update_streak = 0 if updated else self.no_update_streak + 1
        self.steps_without_update += not updated

    def stop_if_not_learning(self, step_metrics: dict[str, float]) -> None:
        """Too many RL steps in a row without an optimizer update: checkpoint and stop rather than run on."""
        limit = self.cfg.train.max_steps_without_update
        if not self.no_update_streak:
            return
        if not limit or self.no_update_streak < limit:
            log.warning("step %d made no optimizer update: %s", self.counters.step, _no_update_cause(step_metrics))
            return
        where = self.save(step_metrics)
        raise RunStopped(
            f"{self.no_update_streak} steps in a row made no optimizer update (train.max_steps_without_update="
            f"{limit}): {_no_update_cause(step_metrics)}; the rollouts and judge answers are in samples.jsonl; "
            f"checkpoint {where}"
        )

    def _write_samples(self, step: int, split: str, batch: RolloutBatch, scores: Scores, extra=None) -> list[dict]:
        count = self.cfg.logging.samples_per_step
        records = sample_records(step, split, batch, scores, count, extra) if count and self.samples else []
        if records:
            self.samples.write(records)
        return records

    def _score_or_stop(self, batch: RolloutBatch):
        try:
            return self.rewards.score(batch)
        except Exception as error:  # a reward source that stays down: never train on missing rewards
            if not _is_reward_failure(error):
                raise
            where = self.save({}) if self.counters.step > 0 else None
            kept = f"; the last checkpoint {where} is intact and a rerun resumes from it" if where else ""
            raise RunStopped(f"rewards unavailable at step {self.counters.step + 1}: {error}{kept}") from error

    def _logprobs(self, model: torch.nn.Module | None):
        if model is None:
            return None
        return lambda batch: batched_token_logprobs(model, batch, self.cfg.rollout.logprob_micro_batch_size)

    def _optimize(self, batch: RolloutBatch) -> dict[str, float]:
        """Global batches of `global_batch_size` rows (several optimizer steps when the batch is larger)."""
        t = self.cfg.train
        stats = StepStats()
        self.model.train()
        for start in range(0, len(batch), t.global_batch_size):
            chunk = batch.select(list(range(start, min(start + t.global_batch_size, len(batch)))))
            normaliser = self.recipe.loss_normaliser(chunk)
            if normaliser == 0:
                continue  # nothing to learn from (e.g. no sample ended): skip rather than step on zero grads
            for micro in chunk.micro_batches(t.micro_batch_size):
                micro = micro.to(self.device)
                logprobs = token_logprobs(self.model, micro.tokens, micro.attention_mask())
                loss, micro_stats = self.recipe.loss(logprobs, micro, normaliser)
                loss.backward()
                stats.add(micro_stats, weight=micro_stats.get("tokens", 0) / normaliser)
            grad_norm = optimizer_step(self.model, self.optimizer, self.scheduler, t.max_grad_norm)
            stats.end_optimizer_step(grad_norm)
            if math.isfinite(grad_norm):
                self.counters.optimizer_steps += 1
            else:
                self.skipped_updates += 1  # optimizer_step left the weights and the schedule unchanged
        return {
            **stats.result(),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/skipped_updates": self.skipped_updates,
        }

    def validate(self, prompts: list[Prompt]) -> dict[str, float]:
        with self.timers("validation"):
            batch = self.sampler.validation_rollouts(
                self.model,
                prompts,
                self.rewards.validation_samples_per_prompt,
                max_new_tokens=self.cfg.validation.max_new_tokens,
                seed=self.cfg.seed,
            )
            scores = self._score_or_stop(batch)
            extra = {
                f"val/{name}": [float(fn(p, r)) for p, r in zip(batch.prompt_texts, batch.response_texts)]
                for name, fn in self.reward_functions.items()
            }
        rewards = scores.rewards[scores.valid]
        records = self._write_samples(self.counters.step, "val", batch, scores, extra)
        show_samples(records[: self.cfg.validation.show_samples], self.say)
        return {
            "val/reward_mean": rewards.mean().item() if len(rewards) else float("nan"),
            "val/response_length": batch.response_lengths.float().mean().item(),
            "val/fraction_ended": batch.is_end.float().mean().item(),
            **{name: sum(values) / len(values) for name, values in extra.items() if values},
        }

    def save(self, step_metrics: dict[str, float]) -> Path:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": capture_rng_state(),
        }
        info = {
            **self.counters.as_dict(),
            "metrics": {k: v for k, v in step_metrics.items() if isinstance(v, int | float)},
        }
        return self.checkpoints.save(self.counters.step, self.model, self.tokenizer, state, info)


class StepStats:
    """Loss statistics over micro-batches and optimizer steps.

    Within an optimizer step the losses add up (each is already divided by the global token count),
    `*_min`/`*_max` keep their extremes and other statistics are token-weighted means; across
    optimizer steps, the per-step values are averaged.
    """

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.finished: list[dict[str, float]] = []
        self.extremes: dict[str, float] = {}

    def add(self, stats: dict[str, float], weight: float) -> None:
        for key, value in stats.items():
            if key == "tokens":
                continue
            if key.endswith("_min") or key.endswith("_max"):
                pick = min if key.endswith("_min") else max
                self.extremes[key] = pick(self.extremes.get(key, value), value)
            else:
                self.current[key] = self.current.get(key, 0.0) + (value if key == "loss" else value * weight)

    def end_optimizer_step(self, grad_norm: float) -> None:
        self.finished.append({**self.current, "grad_norm": grad_norm})
        self.current = {}

    def result(self) -> dict[str, float]:
        keys = {k for step in self.finished for k in step}
        means = (
            {k: sum(s.get(k, 0.0) for s in self.finished) / len(self.finished) for k in keys} if self.finished else {}
        )
        return {f"train/{k}": v for k, v in {**means, **self.extremes}.items()}


def _no_update_cause(metrics: dict[str, float]) -> str:
    """Why a step changed no weight, from what it logged."""
    if metrics.get("judge/comparisons") and metrics.get("judge/parse_failures") == metrics.get("judge/comparisons"):
        return "no judge answer parsed, so every sample was masked"
    if metrics.get("train/fraction_scored") == 0:
        return "no sample had a valid reward"
    if metrics.get("train/fraction_ended") == 0:
        return "no sample ended with EOS (raise rollout.sampling.max_new_tokens)"
    return "no row was left to learn from (every advantage zero, every row filtered out, or a non-finite gradient)"


def _is_reward_failure(error: Exception) -> bool:
    from rlsteps.engine.rewards.judge.client import JudgeUnavailable
    from rlsteps.engine.rewards.process import ServerStartError  # a local server that never came up
    from rlsteps.engine.rewards.rm.client import RewardError

    return isinstance(error, RewardError | JudgeUnavailable | ServerStartError)
