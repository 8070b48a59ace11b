"""One RL step of a run, and its checkpoint: what the loop (loop.py) repeats; its validation is validation.py.

A step: the prompts of (seed, consumed_samples), rollouts from the policy, rewards on the main process (a failed
reward source stops the run after a checkpoint), the recipe's prepare, the update, the weights sent to the
sampler, and the step's metrics. Over several processes each takes its share of the prompt groups and the rows
come back together in prompt order for scoring.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TypeVar

import torch

from rlsteps.contract.config import RecipeConfig
from rlsteps.contract.prompts import Prompt
from rlsteps.engine.algorithms.dynamic_sampling import DynamicSamplingExhausted
from rlsteps.engine.algorithms.recipe import Recipe, rollout_stats
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.checkpoints.resume import (
    CheckpointManager,
    capture_rng_state,
)
from rlsteps.engine.checkpoints.train_state import write_train_state
from rlsteps.engine.distributed import (
    SINGLE,
    World,
    from_main,
    gather_to_main,
    reduce_max,
    reduce_sum,
    row_weighted_mean,
)
from rlsteps.engine.generation.rollouts import Sampler, step_seed
from rlsteps.engine.inputs.data import prompt_indices
from rlsteps.engine.policy.logprobs import batched_token_logprobs, reads_packed_sequences
from rlsteps.engine.policy.lora import adapters_off, has_adapters
from rlsteps.engine.policy.parallel import (
    Precision,
    gathered,
)
from rlsteps.engine.policy.sampled_distribution import SampledDistribution
from rlsteps.engine.records.metrics import Timers
from rlsteps.engine.records.progress import TrainingProgress
from rlsteps.engine.records.reward_hacking import HackingWatch, rollout_signs
from rlsteps.engine.records.samples import SampleLog, sample_records
from rlsteps.engine.records.throughput import (
    attended_length,
    mfu,
    model_flops,
    peak_memory_gb,
    peak_rss_gb,
    reset_peak_memory,
)
from rlsteps.engine.rewards.functions import FunctionScorer, RewardFunctionFailed
from rlsteps.engine.rewards.scores import RewardSource, Scores
from rlsteps.engine.run.overlap import computed_for, overlaps_reference, run_beside
from rlsteps.engine.run.refill import Drawn, Scored, dropped_groups, refilled
from rlsteps.engine.run.update import PolicyUpdate, UpdateResult, longest_row
from rlsteps.engine.run.validation import validate

log = logging.getLogger(__name__)
T = TypeVar("T")


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
class StepRun:
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
    watch: HackingWatch | None = None  # the main process's: what reward hacking looks like, said when it shows
    timers: Timers = field(default_factory=Timers)
    progress: TrainingProgress | None = None  # the main process's progress line; validation draws its own in it
    skipped_updates: int = 0  # optimizer steps skipped on a non-finite gradient
    steps_without_update: int = 0  # RL steps that changed no weight
    no_update_streak: int = 0

    def step(self, prompts: list[Prompt]) -> dict[str, float]:
        c, cfg = self.counters, self.cfg
        started = time.perf_counter()
        drawn = self._drawn(prompts)
        batch, scored = drawn.batch, drawn.scored
        with self.timers("prepare"):
            train_batch, stats = self.recipe.prepare(batch, scored.mine, self._logprobs(self.model), drawn.reference)
            stats = {**row_weighted_mean(self.world, stats, len(batch)), **scored.rollout_stats}
        with self.timers("train"):
            result = self.update(train_batch)
        if result.optimizer_steps:
            with self.timers("weight_sync"):
                self.sampler.load_weights(self.model)
        c.optimizer_steps += result.optimizer_steps
        self.skipped_updates += result.skipped
        self._count_update(result.optimizer_steps > 0)
        c.step += 1
        c.consumed_samples += cfg.rollout.prompts_per_step * drawn.generation_batches
        stats.update(result.stats)
        stats.update(scored.whole.metrics)  # the reward source's
        seconds = self.timers.pop()
        stats.update(seconds)
        stats.update(self._throughput(drawn.generated_tokens, train_batch, result, seconds))
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

    def _generation_batch(self, prompts: list[Prompt], k: int) -> Drawn:
        """The step's k-th generation batch (k > 0: dynamic sampling's refills): the prompts after k batches of the
        step's, this process's share of their rollouts, every row's scores and the reference's log-prob function
        (its values for these rows computed while the rewards are scored, where that is to be)."""
        c, cfg = self.counters, self.cfg
        per_prompt, count = cfg.rollout.num_rollouts_per_prompt, cfg.rollout.prompts_per_step
        indices, c.epoch = prompt_indices(cfg.seed, c.consumed_samples + k * count, count, len(prompts))
        mine = self.world.mine(len(indices))  # this process's prompt groups
        seed = (cfg.seed, c.step) if k == 0 else (step_seed(cfg.seed, c.step), k)
        with self.timers("rollout"), self._sampling():
            batch = self.sampler.rollouts(
                self.model, [prompts[indices[j]] for j in mine], per_prompt, seed=seed, prompt_positions=mine
            )
        reference = self._reference()
        early = (
            reference is not None
            and self.recipe.reference_of_every_row()
            and overlaps_reference(self.cfg.run.overlap_reference, self.device)
        )
        with self.timers("reward"):  # and beside the scoring, if it is to be (early), the reference's log-probs
            scored, ref_logprobs = self._score_or_stop(
                batch,
                len(indices),
                per_prompt,
                c.step + 1,
                beside=self._timed("reference", lambda: reference(batch)) if early else None,
            )
        if early:
            reference = computed_for(batch, ref_logprobs, reference)
        return Drawn(batch, scored, reference, float(batch.response_lengths.sum()))

    def _drawn(self, prompts: list[Prompt]) -> Drawn:
        """The step's rollouts: its generation batch, or where the recipe drops groups (dynamic sampling) as many as
        fill the step with groups it keeps."""
        first = self._generation_batch(prompts, 0)
        dropped = dropped_groups(self.recipe, first, self.world)
        if dropped is None:
            return first

        def draw(k: int) -> tuple[Drawn, list[bool]]:
            drawn = self._generation_batch(prompts, k)
            return drawn, dropped_groups(self.recipe, drawn, self.world)

        try:
            drawn = refilled(first, dropped, draw, self.cfg.rollout, self.recipe.max_generation_batches(), self.world)
        except DynamicSamplingExhausted as short:  # every process alike: the verdicts are the same everywhere
            self._stop(str(short), short.fix)
        log.info(
            "step %d: dynamic sampling took %d generation batches", self.counters.step + 1, drawn.generation_batches
        )
        drawn.reference = self._reference()
        return drawn

    def _throughput(
        self, generated_tokens: float, trained: RolloutBatch, result: UpdateResult, seconds: dict[str, float]
    ) -> dict[str, float]:
        """Tokens per second of generation and training (all processes), the train phase's model FLOPs
        utilisation (when the device's peak is known) and this step's peak memory (the largest process's)."""
        generated = reduce_sum(self.world, generated_tokens)
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

    def _score_or_stop(
        self, batch: RolloutBatch, prompts: int, per_prompt: int, step: int, beside: Callable[[], T] | None = None
    ) -> tuple[Scored, T | None]:
        """The main process scores every process's rollouts; each gets its own rows' scores back. A reward source
        that stays down stops every process, after a checkpoint: never train on missing rewards.

        beside: work of every process that needs no reward (the reference's log-probs), run while the main process
        waits for its reward sources (they score in a thread of their own); its result comes back with the scores.
        Every collective stays on this thread, in the same order on every process."""
        whole = self._gathered_in_order(batch, prompts, per_prompt)
        outcome, beside_result = run_beside(lambda: None if whole is None else self._score_on_main(whole), beside)
        if isinstance(outcome, Scores):
            self._write_samples(step, "train", whole, outcome)
            stats = {**rollout_stats(whole, outcome), **rollout_signs(whole)}
            if self.watch is not None:
                self.watch.rollouts(step, whole, {**stats, **outcome.metrics})
            outcome = Scored(outcome, stats)
        outcome = from_main(self.world, outcome)
        if isinstance(outcome, str):
            self._stop_without_rewards(f"at step {self.counters.step + 1}", outcome)
        outcome.mine = outcome.whole.select(_rows_of(self.world.mine(prompts), per_prompt))
        return outcome, beside_result

    def _gathered_in_order(self, batch: RolloutBatch | None, prompts: int, per_prompt: int) -> RolloutBatch | None:
        """Every process's rows on the main process, in prompt order (None elsewhere); a process without prompts
        sends None."""
        parts = gather_to_main(self.world, batch)
        return None if parts is None else _in_prompt_order(parts, self.world, prompts, per_prompt)

    def _timed(self, name: str, work: Callable[[], T]) -> Callable[[], T]:
        def timed() -> T:
            with self.timers(name):
                return work()

        return timed

    def _score_on_main(self, batch: RolloutBatch, alone: bool = False) -> Scores | str:
        """The rewards of the batch (alone: one response per prompt, greedy validation), or why there are none."""
        try:
            return self.rewards.score_alone(batch) if alone else self.rewards.score(batch)
        except Exception as error:
            if not is_reward_failure(error):
                raise
            return str(error)

    def _logprobs(self, model: torch.nn.Module | None, base: bool = False, reference: bool = False):
        """The log-prob function of `model` (base: of the base model, the policy's adapters switched off), under the
        distribution the rollouts were drawn from (the reference's: its temperature alone); a recipe.LogprobFn."""
        if model is None:
            return None
        sampled = SampledDistribution.of(self.cfg.rollout.sampling)
        distribution = sampled.without_filters() if reference else sampled

        def logprobs(batch: RolloutBatch, unfiltered: bool = False) -> torch.Tensor:
            with contextlib.ExitStack() as stack:
                stack.enter_context(gathered(model, self.device))
                autocast = lambda: self.precision.autocast(self.device)  # noqa: E731
                stack.enter_context(autocast())
                if base:
                    stack.enter_context(adapters_off(model))
                packing = self.cfg.train.sequence_packing and reads_packed_sequences(model, self.device, autocast)
                bin_tokens = longest_row(self.cfg) if packing else None
                micro_batch = self.cfg.rollout.logprob_micro_batch_size
                return batched_token_logprobs(model, batch, micro_batch, bin_tokens, distribution, unfiltered)

        return logprobs

    def _reference(self):
        """The reference policy's log-prob function: its frozen copy's, or under LoRA the base's (the policy with its
        adapters off); None when the recipe needs no reference."""
        if self.reference is not None:
            return self._logprobs(self.reference, reference=True)
        if self.recipe.needs_reference and has_adapters(self.model):
            return self._logprobs(self.model, base=True, reference=True)
        return None

    def validate(self, prompts: list[Prompt]) -> dict[str, float]:
        """Validation of the policy as it is now (validation.py), its metrics on every process."""
        return validate(self, prompts)

    def _stop_without_rewards(self, when: str, failure: str) -> NoReturn:
        """Every process: a checkpoint (when there is a step to keep), then RunStopped."""
        self._stop(f"rewards unavailable {when}: {failure}")

    def _stop(self, cause: str, fix: str | None = None) -> NoReturn:
        """Every process: a checkpoint (when there is a step to keep), then RunStopped (carrying `fix`, if given)."""
        where = self.save({}) if self.counters.step > 0 else None
        kept = f"; the last checkpoint {where} is intact and a rerun resumes from it" if where else ""
        stopped = RunStopped(f"{cause}{kept}")
        if fix:
            stopped.fix = fix
        raise stopped

    def save(self, step_metrics: dict[str, float]) -> Path:
        """A checkpoint of every process's shards (each process calls it)."""
        update = self.update
        state = {
            "scheduler": update.scheduler.state_dict(),
            "rng": capture_rng_state(),
            "world_size": self.world.size,
            **self.sampler.checkpoint_state(self.counters.step),
        }
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


def _no_update_cause(metrics: dict[str, float]) -> str:
    """Why a step changed no weight, from what it logged."""
    if metrics.get("judge/comparisons") and metrics.get("judge/parse_failures") == metrics.get("judge/comparisons"):
        return "no judge answer parsed, so every sample was masked"
    if metrics.get("train/fraction_scored") == 0:
        return "no sample had a valid reward"
    if metrics.get("train/fraction_ended") == 0:
        return "no sample ended with EOS (raise rollout.sampling.max_new_tokens)"
    return "no row was left to learn from (every advantage zero, every row filtered out, or a non-finite gradient)"


def is_reward_failure(error: Exception) -> bool:
    from rlsteps.engine.rewards.judge.client import JudgeUnavailable
    from rlsteps.engine.rewards.process import ServerStartError  # a local server that never came up
    from rlsteps.engine.rewards.rm.client import RewardError

    return isinstance(error, RewardError | JudgeUnavailable | ServerStartError | RewardFunctionFailed)
