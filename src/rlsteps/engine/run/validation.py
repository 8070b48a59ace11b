"""A run's validation: responses to the validation prompts (greedy, or a few sampled where the scorer compares
them) from every process, scored and summarised in val/ figures by the main process, its progress said as it goes
(records.progress: rows answered, scoring, the time so far).

`validate` is what StepRun.validate (step.py) runs; `run` is that StepRun: its config, sampler, reward sources,
samples, watch and progress line.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rlsteps.contract.prompts import Prompt
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.distributed import from_main
from rlsteps.engine.records.progress import QuietValidation
from rlsteps.engine.records.reward_hacking import validation_correlations
from rlsteps.engine.records.samples import sample_records, show_samples
from rlsteps.engine.rewards.functions import RewardFunctionFailed


def validate(run: Any, prompts: list[Prompt]) -> dict[str, float]:
    """Validation rollouts of every process, scored and summarised by the main process, its metrics on all."""
    n = run.cfg.validation.samples_per_prompt
    mine = run.world.mine(len(prompts))
    started = time.perf_counter()  # its own timer, logged with its metrics (not with the next step's)
    with _progress(run, len(mine) * n) as progress:
        batch = _rollouts(run, prompts, mine, n, progress)
        whole = run._gathered_in_order(batch, len(prompts), n)
        if whole is not None:
            progress.scoring()
        outcome = from_main(run.world, None if whole is None else figures_on_main(run, whole))
        if isinstance(outcome, str):
            run._stop_without_rewards(f"at validation after step {run.counters.step}", outcome)
        progress.done(outcome)
    return {**outcome, "timers/validation": time.perf_counter() - started}


def _progress(run: Any, rows: int):
    """The main process's validation progress, beside the steps' (where the loop gave the run one)."""
    shown = getattr(run, "progress", None)
    return shown.validation(rows) if shown is not None and run.world.is_main else QuietValidation()


def _rollouts(run: Any, prompts: list[Prompt], mine: list[int], n: int, progress: Any) -> RolloutBatch | None:
    """This process's validation rows; None where it has no prompt (more processes than validation prompts)."""
    with run._sampling():  # every process gathers the policy, when the sampler reads it
        if not mine:
            return None
        return run.sampler.validation_rollouts(
            run.model,
            [prompts[j] for j in mine],
            n,
            max_new_tokens=run.cfg.validation.max_new_tokens,
            seed=run.cfg.seed,
            prompt_positions=mine,
            on_answered=progress.on_answered,
        )


def figures_on_main(run: Any, batch: RolloutBatch) -> dict[str, float] | str:
    """The val/ figures of every process's rows (the main process's work), or why the rewards are missing."""
    scores = run._score_on_main(batch, alone=run.cfg.validation.samples_per_prompt == 1)
    if isinstance(scores, str):
        return scores
    try:
        extra = {f"val/{scorer.name}": scorer(batch) for scorer in run.reward_functions}
    except RewardFunctionFailed as error:
        return str(error)
    rewards = scores.rewards[scores.valid]
    records = run._write_samples(run.counters.step, "val", batch, scores, extra)
    show_samples(records[: run.cfg.validation.show_samples], run.say)
    rewarded = {
        "val/reward_mean": rewards.mean().item() if len(rewards) else float("nan"),
        **{f"val/{k}": v for k, v in scores.metrics.items() if k.startswith("reward/")},
    }
    figures = {
        # a figure no row has is left out (greedy validation's judge meets only the initial policy's answers)
        **{k: v for k, v in rewarded.items() if not math.isnan(v)},
        "val/response_length": batch.response_lengths.float().mean().item(),
        "val/fraction_ended": batch.is_end.float().mean().item(),
        **{name: mean_of_scored(values) for name, values in extra.items()},
        **validation_correlations(scores.rewards, scores.valid, extra),
    }
    if run.watch is not None:
        every_sample = sample_records(run.counters.step, "val", batch, scores, len(batch), extra)
        run.watch.validation(run.counters.step, every_sample, figures, list(extra))
    return figures


def mean_of_scored(values: list[float | None]) -> float:
    """The mean of the values a function gave (None: no value for that sample); NaN when it gave none."""
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else float("nan")
