"""Rollouts beside training against the on-policy loop, on the tiny world: `rlsteps run rl/reinforce -c tiny` at
rollout.max_age_steps 0 and 1, seed by seed and in turn (the same script, the same machine state), with the
importance-sampling correction on in both so that the lag is the only difference.

For each run: its wall time, its summed step time and median step (the first step left out: at age 1 it waits for
the rollout process to start), the hidden true reward of its greedy validation answers at the start and the end,
and its sampled rollouts' faults over the last four steps (tiny_learning's figures). Then per age the medians over
seeds, and the ratio of age 1's median step to age 0's.

    python benchmarks/bench_beside.py                      # run seeds 0 1 2, 16 steps each
    python benchmarks/bench_beside.py --seeds 0 -- train.max_steps=8

The on-policy run trains with one thread (`run.num_threads=1`); the run beside training gets one thread for
training and one for the rollout process, so on a 2-core machine it uses both cores where the on-policy run uses
one: the comparison is what asynchrony buys with a second core, not a like-for-like use of the same cores.
"""

from __future__ import annotations

import argparse
import json
import statistics

import tiny_learning

AGES = (0, 1)
CORRECTED = "train.truncated_importance_sampling=true"


def run_one(age: int, seed: int, overrides: list[str]) -> dict:
    at_age = [CORRECTED, f"rollout.max_age_steps={age}", *overrides]
    return {"age": age, **tiny_learning.run_one("rl/reinforce", seed, 0, at_age)}


def summary(runs: list[dict]) -> dict:
    by_age = {age: [r for r in runs if r["age"] == age] for age in AGES}
    medians = {
        age: {
            key: statistics.median(r[key] for r in rows)
            for key in ("wall_s", "median_step_s", "true_reward_first", "true_reward_last")
        }
        for age, rows in by_age.items()
        if rows
    }
    ratio = medians[1]["median_step_s"] / medians[0]["median_step_s"] if len(medians) == len(AGES) else None
    return {"medians": medians, "step_time_ratio_age1_to_age0": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("overrides", nargs="*", help="key=value for every run (after --)")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        for age in AGES:
            runs.append(run_one(age, seed, args.overrides))
            print(json.dumps(runs[-1]), flush=True)
    print(json.dumps(summary(runs)), flush=True)


if __name__ == "__main__":
    main()
