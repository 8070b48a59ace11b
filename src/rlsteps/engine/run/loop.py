"""The one training loop every recipe shares: rollout -> score -> prepare -> update -> validate -> checkpoint.

Counters: `step` (RL steps), `consumed_samples` (prompts, not rollouts), `optimizer_steps`, `epoch`.
The prompts of a step and its sampling seed are pure functions of (seed, consumed_samples) and
(seed, step), so a run resumed from a checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlsteps.engine.algorithms.recipe import Recipe, rollout_stats
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.checkpoints.disk import checkpoint_estimate, disk_full, is_disk_full
from rlsteps.engine.checkpoints.resume import (
    CHECKPOINTS_DIR,
    STATE_DIR,
    CheckpointError,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
    rewind_records,
)
from rlsteps.engine.checkpoints.train_state import read_train_state, write_train_state
from rlsteps.engine.config import RecipeConfig
from rlsteps.engine.device import resolve_device
from rlsteps.engine.distributed import (
    SINGLE,
    World,
    all_gather,
    from_main,
    gather_to_main,
    join,
    reduce_max,
    reduce_sum,
)
from rlsteps.engine.generation.choice import backend_name, build_backend, engine_checkpoint, processes_on_this_node
from rlsteps.engine.generation.rollouts import Sampler
from rlsteps.engine.generation.sizing import check_rollout_fits, rollout_shape
from rlsteps.engine.inputs.data import Prompt, RunPrompts, load_run_prompts, prompt_indices, steps_per_epoch
from rlsteps.engine.policy.logprobs import batched_token_logprobs
from rlsteps.engine.policy.model import load_policy
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler
from rlsteps.engine.policy.parallel import (
    Precision,
    full_state_on_main,
    gathered,
    place_policy,
    reference_copy,
    unsharded_copy,
)
from rlsteps.engine.records.metrics import MetricsWriter, Timers, TrainingProgress
from rlsteps.engine.records.samples import SampleLog, sample_records, show_samples
from rlsteps.engine.records.throughput import (
    attended_length,
    mfu,
    model_flops,
    peak_flops,
    peak_memory_gb,
    peak_rss_gb,
    reset_peak_memory,
)
from rlsteps.engine.rewards.functions import FunctionScorer, RewardFunctionFailed
from rlsteps.engine.rewards.sources import RewardSource, Scores
from rlsteps.engine.run import signals
from rlsteps.engine.run.update import PolicyUpdate, UpdateResult

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
    rewards: RewardSource | None,
    run_dir: Path,
    say: Callable[[str], None] = print,
    run_prompts: RunPrompts | None = None,
    world: World = SINGLE,
) -> RunResult:
    """run_prompts: the prompts already loaded and measured (the worker does it before the policy loads); else
    they are loaded here, with the policy's tokenizer. rewards: the main process's source (None elsewhere).
    Every process of `world` calls train; the result's model is whole on the main process only."""
    try:
        with contextlib.ExitStack() as cleanup:  # what the run made for itself, removed however it ends
            return _train(cleanup, cfg, recipe, rewards, run_dir, say, run_prompts, world)
    except OSError as error:  # a write that met a full disk (each writer has undone its part)
        if not is_disk_full(error):
            raise
        need = CheckpointManager(run_dir / CHECKPOINTS_DIR).needed_bytes() or None
        raise disk_full(run_dir, need=need, what="the next checkpoint") from error


def _train(
    cleanup: contextlib.ExitStack,
    cfg: RecipeConfig,
    recipe: Recipe,
    rewards: RewardSource | None,
    run_dir: Path,
    say: Callable[[str], None],
    run_prompts: RunPrompts | None,
    world: World,
) -> RunResult:
    device = join(world, resolve_device(cfg.run.device))
    precision = Precision.named(cfg.run.dtype)
    peak_flops(device, precision.compute)  # a malformed RLSTEPS_PEAK_TFLOPS stops the run now, not after a step
    checkpoints = CheckpointManager(
        run_dir / CHECKPOINTS_DIR,
        keep_last=cfg.checkpoint.keep_last,
        keep_top_k=cfg.checkpoint.keep_top_k,
        metric=cfg.checkpoint.metric,
    )
    checkpoints.check_room(world)  # room for a checkpoint like the latest: before the policy loads
    initial, tokenizer = load_policy(cfg.inputs.policy, device="cpu", dtype=torch.float32)
    checkpoints.size_hint = _checkpoint_size(initial)
    checkpoints.check_room(world)  # before the first checkpoint: room for the estimate, before anything is written
    check_rollout_fits(rollout_shape(cfg), initial.config)
    sampler_name = backend_name(cfg.rollout.backend, device, processes_on_this_node())
    engine_dir = (
        cleanup.enter_context(engine_checkpoint(cfg.inputs.policy, initial, tokenizer, run_dir, world))
        if sampler_name == "vllm"
        else None
    )  # written before the policy is sharded
    reference = (
        reference_copy(initial, world, device, precision, cfg.run.offload_reference) if recipe.needs_reference else None
    )  # the initial policy, frozen; taken before the policy moves, so a resume never holds three copies
    model = place_policy(initial, world, device, precision, cfg.train.activation_checkpointing)
    run_prompts = run_prompts or load_run_prompts(cfg, tokenizer)
    prompts, val_prompts = run_prompts.train, run_prompts.validation
    reward_functions = [FunctionScorer.load(name, spec) for name, spec in cfg.validation.reward_functions.items()]
    total_steps = planned_steps(cfg, len(prompts), say)

    optimizer, scheduler = _optimizer_and_schedule(cfg, recipe, model, total_steps)
    counters = _resume(checkpoints, model, optimizer, scheduler, world, say)
    # the records of what came after the checkpoint (a stopped run's later steps) go: they are made again
    rewind_records(run_dir, counters.step if checkpoints.latest() else None, records=world.is_main)
    backend = build_backend(sampler_name, cfg, model, tokenizer, device, precision.compute, engine_dir, say, cleanup)
    run = _Run(
        cfg,
        recipe,
        rewards,
        model,
        tokenizer,
        reference,
        checkpoints,
        Sampler(tokenizer, cfg.rollout, backend),
        counters,
        device,
        PolicyUpdate(model, optimizer, scheduler, recipe, cfg.train, device, precision, world),
        precision=precision,
        world=world,
        say=say,
        reward_functions=reward_functions,
    )
    with contextlib.ExitStack() as outputs:
        metrics, progress = _main_outputs(outputs, cfg, run_dir, run, total_steps, counters.step)
        if counters.step == 0 and val_prompts:
            metrics.log(0, run.validate(val_prompts))
        outputs.enter_context(signals.stops_at_step_end())  # SIGTERM/SIGINT: checkpoint at the step's end, stop
        while counters.step < total_steps:
            step_metrics = run.step(prompts)
            if val_prompts and cfg.validation.interval and counters.step % cfg.validation.interval == 0:
                step_metrics.update(run.validate(val_prompts))
            metrics.log(counters.step, step_metrics)
            progress.update(counters.step, step_metrics)
            step_log.info("step %d/%d %s", counters.step, total_steps, _step_line(step_metrics))
            run.stop_if_not_learning(step_metrics)
            # read once (the signal may arrive at any moment), and on any process: all of them checkpoint
            requested = bool(reduce_max(world, float(signals.checkpoint_requested())))
            stop = int(reduce_max(world, float(signals.stop_requested() or 0)))
            if (
                requested
                or stop
                or counters.step == total_steps
                or (cfg.checkpoint.interval and counters.step % cfg.checkpoint.interval == 0)
            ):
                run.save(step_metrics)
            if stop:
                raise signals.stopped(counters.step, stop)
            if requested and counters.step < total_steps:
                raise signals.CheckpointRequested(
                    f"checkpoint written at step {counters.step} of {total_steps}, as asked (SIGUSR1: the job's "
                    "time limit is near); run again, or let the requeued job resume from it"
                )
    return RunResult(counters=counters, model=_whole_on_main(run.model, cfg, world), tokenizer=tokenizer)


def _resume(checkpoints, model, optimizer, scheduler, world: World, say: Callable[[str], None]) -> Counters:
    """The counters to start from: the latest checkpoint's, its weights and optimizer state read in place."""
    latest = checkpoints.latest()
    if latest is None:
        return Counters()
    loaded = checkpoints.load(latest)
    if loaded.policy_dir.name == STATE_DIR:
        read_train_state(model, optimizer, loaded.policy_dir)
    else:
        _read_policy_layout(loaded, model, optimizer, world)
    scheduler.load_state_dict(loaded.trainer_state["scheduler"])
    restore_rng_state(loaded.trainer_state["rng"])
    counters = Counters(**{k: loaded.info[k] for k in ("step", "consumed_samples", "optimizer_steps", "epoch")})
    written_by = loaded.trainer_state.get("world_size", 1)
    on = f"; written by {written_by} process(es), read by {world.size}" if written_by != world.size else ""
    say(f"resuming from {latest} (step {counters.step}, {counters.consumed_samples} prompts consumed{on})")
    return counters


def _checkpoint_size(model: torch.nn.Module) -> int:
    """What a checkpoint of the policy takes before one exists to measure: its fp32 weights and AdamW's two fp32
    moments of every trained parameter (the loop keeps both in fp32 whatever the compute dtype)."""
    weights = sum(t.numel() * 4 for t in model.state_dict().values())
    trained = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    return checkpoint_estimate(weights, trained)


def _read_policy_layout(loaded, model, optimizer, world: World) -> None:
    """A checkpoint of the one-process layout (policy/ in Hugging Face form, the optimizer in trainer_state.pt)."""
    if world.is_distributed:
        raise CheckpointError(
            f"{loaded.policy_dir.parent} holds a one-process checkpoint (policy/, no {STATE_DIR}/); resume it "
            "with one process, which writes the next checkpoint in the layout any number of processes reads"
        )
    saved, _ = load_policy(loaded.policy_dir, device="cpu", dtype=torch.float32)
    model.load_state_dict(saved.state_dict())
    optimizer.load_state_dict(loaded.trainer_state["optimizer"])


def _whole_on_main(model: torch.nn.Module, cfg: RecipeConfig, world: World) -> torch.nn.Module | None:
    """The trained policy as one plain model on the main process (gathered from the shards of several)."""
    if not world.is_distributed:
        return model
    state = full_state_on_main(model, world)
    return unsharded_copy(cfg.inputs.policy, state) if world.is_main else None


def _main_outputs(stack, cfg: RecipeConfig, run_dir: Path, run: _Run, total_steps: int, initial_step: int):
    """metrics.jsonl, samples.jsonl and the progress bar: the main process's; the others write nothing."""
    if not run.world.is_main:
        return _Nowhere(), _Nowhere()
    metrics = stack.enter_context(_metrics_writer(cfg, run_dir))
    run.samples = stack.enter_context(SampleLog(run_dir / "samples.jsonl"))
    progress = stack.enter_context(TrainingProgress(total=total_steps, initial=initial_step))
    return metrics, progress


class _Nowhere:
    """Where a process other than the main one logs metrics and progress."""

    def log(self, *args, **kwargs) -> None:
        pass

    def update(self, *args, **kwargs) -> None:
        pass


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
    rewards: RewardSource | None  # the main process's
    model: torch.nn.Module
    tokenizer: object
    reference: torch.nn.Module | None
    checkpoints: CheckpointManager
    sampler: Sampler
    counters: Counters
    device: torch.device
    update: PolicyUpdate
    precision: Precision = field(default_factory=Precision)
    world: World = SINGLE
    say: Callable[[str], None] = print
    reward_functions: list[FunctionScorer] = field(default_factory=list)  # validation's figures
    samples: SampleLog | None = None
    timers: Timers = field(default_factory=Timers)
    skipped_updates: int = 0  # optimizer steps skipped on a non-finite gradient
    steps_without_update: int = 0  # RL steps that changed no weight
    no_update_streak: int = 0

    def step(self, prompts: list[Prompt]) -> dict[str, float]:
        c, cfg = self.counters, self.cfg
        started = time.perf_counter()
        indices, c.epoch = prompt_indices(cfg.seed, c.consumed_samples, cfg.rollout.prompts_per_step, len(prompts))
        mine = self.world.mine(len(indices))  # this process's prompt groups
        with self.timers("rollout"), self._sampling():
            batch = self.sampler.rollouts(
                self.model,
                [prompts[indices[j]] for j in mine],
                cfg.rollout.num_rollouts_per_prompt,
                seed=(cfg.seed, c.step),
                prompt_positions=mine,
            )
        with self.timers("reward"):
            scored = self._score_or_stop(batch, len(indices), cfg.rollout.num_rollouts_per_prompt, c.step + 1)
        with self.timers("prepare"):
            train_batch, stats = self.recipe.prepare(
                batch, scored.mine, self._logprobs(self.model), self._logprobs(self.reference)
            )
            stats = {**_row_weighted_mean(self.world, stats, len(batch)), **scored.rollout_stats}
        with self.timers("train"):
            result = self.update(train_batch)
        if result.optimizer_steps:
            with self.timers("weight_sync"):
                self.sampler.load_weights(self.model)
        c.optimizer_steps += result.optimizer_steps
        self.skipped_updates += result.skipped
        self._count_update(result.optimizer_steps > 0)
        c.step += 1
        c.consumed_samples += cfg.rollout.prompts_per_step
        stats.update(result.stats)
        stats.update(scored.whole.metrics)  # the reward source's
        seconds = self.timers.pop()
        stats.update(seconds)
        stats.update(self._throughput(batch, train_batch, result, seconds))
        stats.update(
            {
                "train/lr": self.update.scheduler.get_last_lr()[0],
                "train/skipped_updates": self.skipped_updates,
                "train/consumed_samples": c.consumed_samples,
                "train/epoch": c.epoch,
                "train/optimizer_steps": c.optimizer_steps,
                "train/steps_without_update": self.steps_without_update,
                "timers/step": time.perf_counter() - started,
            }
        )
        return stats

    @contextlib.contextmanager
    def _sampling(self):
        """Rollouts from the policy: gathered whole for a sampler that reads its weights; the sampler's memory
        given back to training after."""
        with contextlib.ExitStack() as stack:
            if self.sampler.samples_from_policy:
                stack.enter_context(gathered(self.model, self.device))
                stack.enter_context(self.precision.autocast(self.device))
            yield
        self.sampler.release()

    def _throughput(
        self, batch: RolloutBatch, trained: RolloutBatch, result: UpdateResult, seconds: dict[str, float]
    ) -> dict[str, float]:
        """Tokens per second of generation and training (all processes), the train phase's model FLOPs
        utilisation (when the device's peak is known) and this step's peak memory (the largest process's)."""
        generated = reduce_sum(self.world, float(batch.response_lengths.sum()))
        train_seconds = max(seconds.get("timers/train", 0.0), 1e-9)
        perf = {
            "perf/generation_tokens_per_s": generated / max(seconds.get("timers/rollout", 0.0), 1e-9),
            "perf/train_tokens_per_s": result.tokens / train_seconds,
        }
        utilisation = self._train_mfu(trained, result, train_seconds)
        if utilisation is not None:
            perf["perf/train_mfu"] = utilisation
        on_gpu = peak_memory_gb(self.device)
        name = "perf/peak_memory_gb" if on_gpu is not None else "perf/peak_rss_gb"
        perf[name] = reduce_max(self.world, on_gpu if on_gpu is not None else peak_rss_gb())
        reset_peak_memory(self.device)
        return perf

    def _train_mfu(self, trained: RolloutBatch, result: UpdateResult, seconds: float) -> float | None:
        """Model FLOPs of the train phase over the device's peak; None where either is unknown (a CPU, a mixture
        of experts)."""
        if not len(trained):
            return None
        try:
            seq_len = attended_length(trained.sequence_lengths)
            flops = model_flops(self.model.config, result.tokens, seq_len, lm_head_tokens=result.response_tokens)
        except ValueError:
            return None
        return mfu(flops / self.world.size, seconds, self.device, self.precision.compute)

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

    def _score_or_stop(self, batch: RolloutBatch, prompts: int, per_prompt: int, step: int) -> _Scored:
        """The main process scores every process's rollouts; each gets its own rows' scores back. A reward source
        that stays down stops every process, after a checkpoint: never train on missing rewards."""
        parts = gather_to_main(self.world, batch)
        outcome = None
        if parts is not None:
            whole = _in_prompt_order(parts, self.world, prompts, per_prompt)
            outcome = self._score_on_main(whole)
            if isinstance(outcome, Scores):
                self._write_samples(step, "train", whole, outcome)
                outcome = _Scored(outcome, rollout_stats(whole, outcome))
        outcome = from_main(self.world, outcome)
        if isinstance(outcome, str):
            self._stop_without_rewards(f"at step {self.counters.step + 1}", outcome)
        outcome.mine = outcome.whole.select(_rows_of(self.world.mine(prompts), per_prompt))
        return outcome

    def _score_on_main(self, batch: RolloutBatch, alone: bool = False) -> Scores | str:
        """The rewards of the batch (alone: one response per prompt, greedy validation), or why there are none."""
        try:
            return self.rewards.score_alone(batch) if alone else self.rewards.score(batch)
        except Exception as error:
            if not _is_reward_failure(error):
                raise
            return str(error)

    def _logprobs(self, model: torch.nn.Module | None):
        if model is None:
            return None

        def logprobs(batch: RolloutBatch) -> torch.Tensor:
            with gathered(model, self.device), self.precision.autocast(self.device):
                return batched_token_logprobs(model, batch, self.cfg.rollout.logprob_micro_batch_size)

        return logprobs

    def validate(self, prompts: list[Prompt]) -> dict[str, float]:
        """Validation rollouts of every process, scored and summarised by the main process, its metrics on all."""
        n = self.cfg.validation.samples_per_prompt
        mine = self.world.mine(len(prompts))
        started = time.perf_counter()  # its own timer, logged with its metrics (not with the next step's)
        with self._sampling():  # every process gathers the policy, when the sampler reads it
            batch = None  # more processes than validation prompts: this one has none
            if mine:
                batch = self.sampler.validation_rollouts(
                    self.model,
                    [prompts[j] for j in mine],
                    n,
                    max_new_tokens=self.cfg.validation.max_new_tokens,
                    seed=self.cfg.seed,
                    prompt_positions=mine,
                )
        parts = gather_to_main(self.world, batch)
        outcome = (
            None if parts is None else self._validation_on_main(_in_prompt_order(parts, self.world, len(prompts), n))
        )
        outcome = from_main(self.world, outcome)
        if isinstance(outcome, str):
            self._stop_without_rewards(f"at validation after step {self.counters.step}", outcome)
        return {**outcome, "timers/validation": time.perf_counter() - started}

    def _stop_without_rewards(self, when: str, failure: str) -> None:
        """Every process: a checkpoint (when there is a step to keep), then RunStopped."""
        where = self.save({}) if self.counters.step > 0 else None
        kept = f"; the last checkpoint {where} is intact and a rerun resumes from it" if where else ""
        raise RunStopped(f"rewards unavailable {when}: {failure}{kept}")

    def _validation_on_main(self, batch: RolloutBatch) -> dict[str, float] | str:
        scores = self._score_on_main(batch, alone=self.cfg.validation.samples_per_prompt == 1)
        if isinstance(scores, str):
            return scores
        try:
            extra = {f"val/{scorer.name}": scorer(batch) for scorer in self.reward_functions}
        except RewardFunctionFailed as error:
            return str(error)
        rewards = scores.rewards[scores.valid]
        records = self._write_samples(self.counters.step, "val", batch, scores, extra)
        show_samples(records[: self.cfg.validation.show_samples], self.say)
        return {
            "val/reward_mean": rewards.mean().item() if len(rewards) else float("nan"),
            **{f"val/{k}": v for k, v in scores.metrics.items() if k.startswith("reward/")},
            "val/response_length": batch.response_lengths.float().mean().item(),
            "val/fraction_ended": batch.is_end.float().mean().item(),
            **{name: _mean_of_scored(values) for name, values in extra.items()},
        }

    def save(self, step_metrics: dict[str, float]) -> Path:
        """A checkpoint of every process's shards (each process calls it)."""
        update = self.update
        state = {"scheduler": update.scheduler.state_dict(), "rng": capture_rng_state(), "world_size": self.world.size}
        info = {
            **self.counters.as_dict(),
            "metrics": {k: v for k, v in step_metrics.items() if isinstance(v, int | float)},
        }
        return self.checkpoints.save(
            self.counters.step,
            None,
            None,
            state,
            info,
            write_state=lambda folder: write_train_state(update.model, update.optimizer, folder),
            world=self.world,
        )


@dataclass
class _Scored:
    whole: Scores  # every row of the step, in prompt order
    rollout_stats: dict[str, float]  # over the whole step
    mine: Scores | None = None  # this process's rows


def _rows_of(positions: list[int], per_prompt: int) -> list[int]:
    """Rows of the prompts at `positions` in a batch of `per_prompt` adjacent rows per prompt."""
    return [j * per_prompt + k for j in positions for k in range(per_prompt)]


def _in_prompt_order(parts: list[RolloutBatch | None], world: World, prompts: int, per_prompt: int) -> RolloutBatch:
    """One batch of every process's rows in the step's prompt order (as one process would have drawn them);
    a process without prompts sends None."""
    if len(parts) == 1:
        return parts[0]
    whole = RolloutBatch.concat([part for part in parts if part is not None])
    offsets = [0]
    for part in parts[:-1]:
        offsets.append(offsets[-1] + (len(part) if part is not None else 0))
    order = [
        offsets[j % world.size] + (j // world.size) * per_prompt + k for j in range(prompts) for k in range(per_prompt)
    ]
    return whole.select(order)


def _row_weighted_mean(world: World, stats: dict[str, float], rows: int) -> dict[str, float]:
    """A recipe's step statistics over all processes: each process's value weighted by its rows."""
    if not world.is_distributed:
        return stats
    gathered_stats = all_gather(world, (stats, rows))
    total = sum(r for _, r in gathered_stats) or 1
    keys = [k for k in stats if isinstance(stats[k], int | float)]
    return {k: sum(s.get(k, 0.0) * r for s, r in gathered_stats) / total for k in keys}


def _mean_of_scored(values: list[float | None]) -> float:
    """The mean of the values a function gave (None: no value for that sample); NaN when it gave none."""
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else float("nan")


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

    return isinstance(error, RewardError | JudgeUnavailable | ServerStartError | RewardFunctionFailed)
