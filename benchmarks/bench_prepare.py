"""The prepare phase and the whole RL step of tiny rl/reinforce and rl/rlhf steps, with and without the separate pass
of the policy that prepare runs for its log-probs before the update.

With one optimizer step per batch (the tiny configs: 16 prompts x 4 rollouts in a global batch of 64) the update's
forward gives those log-probs (Recipe.logprobs_from_update); `two-pass` sets Recipe.two_pass, which brings the
separate no-grad pass back. Each run is the engine's own loop (rlsteps.engine.run.loop.train) on the tiny world's
policy, in this process, from a fresh run folder: the step's config (`-c tiny`) with train.max_steps=--steps, no
validation, no samples written, one checkpoint at the end (outside the step's time). Rewards come from a
stand-in source (a fixed function of each response's length): the reward model's or judge's time is not what
changes, and the step phases after it do not depend on the values. The two modes take turns, --rounds runs each;
a run's first step is left out (warm-up) and the other steps of all rounds are pooled. The timers are the loop's:
timers/prepare, timers/train (loss, backward and optimizer step) and timers/step (the whole step).

Before the loop runs, the phases alone, steadier: one run of one step hands over its first batch as prepare got it
(rollouts, scores and the loop's own log-prob passes of the policy and the reference), and prepare then the update
(a fresh optimizer, the weights restored) run on it --repeats times per mode, the modes taking turns.

    python benchmarks/bench_prepare.py                      # both steps: about 10 minutes on a loaded 2-core machine
    python benchmarks/bench_prepare.py --steps-of rl/reinforce --rounds 5 --repeats 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from rlsteps.catalog import load_catalog
from rlsteps.contract.config import STEP_SCHEMAS
from rlsteps.engine.algorithms import RECIPES
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler
from rlsteps.engine.rewards.scores import Scores
from rlsteps.engine.run.loop import train
from rlsteps.engine.run.update import PolicyUpdate
from rlsteps.plan.compile import compile_job
from rlsteps.tiny.build import ensure_tiny_world

MODES = ("two-pass", "one-pass")
TIMERS = ("timers/prepare", "timers/train", "timers/step")


class LengthReward:
    """Rewards without a server: a response's length, scaled, and whether it ended (every row scored)."""

    def score(self, batch: RolloutBatch) -> Scores:
        rewards = batch.response_lengths.float() / 32 + batch.is_end.float()
        return Scores(rewards=rewards, valid=torch.ones(len(batch), dtype=torch.bool))

    def score_alone(self, batch: RolloutBatch) -> Scores:
        return self.score(batch)


def step_config(step: str, steps: int, out: Path, threads: int):
    overrides = [
        f"train.max_steps={steps}",
        "validation.interval=0",
        "inputs.val_prompts=null",
        "checkpoint.interval=0",
        "logging.samples_per_step=0",
        f"run.num_threads={threads}",
        f"output.dir={out}",
    ]
    job = compile_job(load_catalog().find(step), "tiny", overrides=overrides)
    return STEP_SCHEMAS[job.config["algorithm"]].model_validate(job.config)


def one_run(step: str, mode: str, steps: int, threads: int) -> list[dict[str, float]]:
    """The loop's timers of each step but the first, for one run of `step` in `mode`."""
    with tempfile.TemporaryDirectory(prefix="bench_prepare-") as folder:
        run_dir = Path(folder) / "run"
        cfg = step_config(step, steps, run_dir, threads)
        recipe = RECIPES[cfg.algorithm](cfg)
        recipe.two_pass = mode == "two-pass"
        assert recipe.logprobs_from_update() is (mode == "one-pass"), "the tiny step makes one optimizer step"
        with quiet():
            train(cfg, recipe, LengthReward(), run_dir, say=lambda line: None)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_timed = [r for r in records if "timers/step" in r]
    return [{k: r[k] for k in TIMERS if k in r} for r in steps_timed[1:]]


def first_batch(step: str, threads: int):
    """The model, recipe and prepare's inputs of the first step of a one-step run of `step`."""
    captured = {}
    with tempfile.TemporaryDirectory(prefix="bench_prepare-") as folder:
        cfg = step_config(step, 1, Path(folder) / "run", threads)
        recipe = RECIPES[cfg.algorithm](cfg)
        prepare = recipe.prepare

        def capture(batch, scores, policy_logprobs, reference_logprobs):
            captured.setdefault(
                "inputs", (batch.select(list(range(len(batch)))), scores, policy_logprobs, reference_logprobs)
            )
            return prepare(batch, scores, policy_logprobs, reference_logprobs)

        recipe.prepare = capture
        with quiet():
            result = train(cfg, recipe, LengthReward(), Path(folder) / "run", say=lambda line: None)
    del recipe.prepare
    return cfg, recipe, result.model, captured["inputs"]


def phases(step: str, repeats: int, threads: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of prepare, of the update and of both, per mode, on the same batch."""
    cfg, recipe, model, (batch, scores, policy_logprobs, reference_logprobs) = first_batch(step, threads)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    times: dict[str, dict[str, list[float]]] = {mode: {"prepare": [], "update": [], "both": []} for mode in MODES}
    for _ in range(repeats):
        for mode in MODES:
            model.load_state_dict(weights)
            optimizer = build_optimizer(model, cfg.train.lr, cfg.train.weight_decay, tuple(cfg.train.betas))
            scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=10, schedule="constant")
            update = PolicyUpdate(model, optimizer, scheduler, recipe, cfg.train, torch.device("cpu"))
            recipe.two_pass = mode == "two-pass"
            rows = batch.select(list(range(len(batch))))  # prepare writes into its batch: a copy each time
            started = time.perf_counter()
            train_batch, _ = recipe.prepare(rows, scores, policy_logprobs, reference_logprobs)
            prepared = time.perf_counter()
            result = update(train_batch)
            done = time.perf_counter()
            assert result.optimizer_steps == 1
            times[mode]["prepare"].append(prepared - started)
            times[mode]["update"].append(done - prepared)
            times[mode]["both"].append(done - started)
    recipe.two_pass = False
    return times


@contextlib.contextmanager
def quiet():
    """The loop's progress bar and warnings off the terminal."""
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield


def ratio_table(title: str, pooled: dict[str, dict[str, list[float]]]) -> None:
    rows = list(pooled[MODES[0]])
    print(f"\n{title}")
    print(f"{'':<16}" + "".join(f"{mode:>11}" for mode in MODES) + f"{'one / two':>11}")
    for row in rows:
        medians = [statistics.median(pooled[mode][row]) for mode in MODES]
        print(f"{row:<16}" + "".join(f"{m:>11.3f}" for m in medians) + f"{medians[1] / medians[0]:>11.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps-of", nargs="+", default=["rl/reinforce", "rl/rlhf"], help="catalog steps (-c tiny)")
    parser.add_argument("--steps", type=int, default=5, help="RL steps per run (the first one is left out)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each mode, taking turns")
    parser.add_argument("--repeats", type=int, default=15, help="prepare + update on one batch, per mode")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (run.num_threads)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ensure_tiny_world(0)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for step in args.steps_of:
        if args.repeats:
            ratio_table(
                f"{step} -c tiny, prepare and update on one batch: median seconds of {args.repeats} per mode",
                phases(step, args.repeats, args.threads),
            )
        if args.rounds:
            pooled: dict[str, dict[str, list[float]]] = {mode: {t: [] for t in TIMERS} for mode in MODES}
            for _ in range(args.rounds):
                for mode in MODES:
                    for timers in one_run(step, mode, args.steps, args.threads):
                        for timer in TIMERS:
                            pooled[mode][timer].append(timers[timer])
            for mode in MODES:
                shares = [p / s for p, s in zip(pooled[mode]["timers/prepare"], pooled[mode]["timers/step"])]
                pooled[mode]["prepare / step"] = shares
            count = len(pooled[MODES[0]]["timers/step"])
            ratio_table(f"{step} -c tiny, the loop's steps: median seconds of {count} per mode", pooled)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
