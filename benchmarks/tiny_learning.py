"""What the tiny recipes learn: each `rlsteps run rl/<step> -c tiny` over run seeds and tiny-world seeds, in turn.

For each run: its wall time (process start to exit) and summed step time, the hidden true reward of its greedy
validation answers (`val/true_reward`: at step 0 and at the end), how alike those answers are (distinct answers
once the noun is taken out, of 32), and what its sampled rollouts (samples.jsonl, every rollout of a step) say that
games a reward model: the share naming a wrong noun (of all and of those naming a noun) and the share with a broken
word ("The housegh") or a word said twice, over the first and the last four steps.

    python benchmarks/tiny_learning.py                                  # 3 steps x run seeds 0 1 2, world seed 0
    python benchmarks/tiny_learning.py --steps rs --seeds 0 --worlds 1  # one run on a second world
    python benchmarks/tiny_learning.py -- train.lr=2e-3                 # overrides after --, for every run

Runs go one after another (a tiny run uses one thread; two at once on a shared machine time each other). A world
not yet built is built by the first run that needs it, inside its wall time: build them first (`python -c "from
rlsteps.tiny.build import ensure_tiny_world; ensure_tiny_world(1)"`) to time the runs alone.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlsteps.tiny import task as tiny_task

STEPS = {"rs": "rl/rs", "reinforce": "rl/reinforce", "rlhf": "rl/rlhf"}
MEASURED = ["run.num_threads=1", "logging.samples_per_step=128"]  # every rollout of a step in samples.jsonl
QUARTER = 4  # steps at each end of the run whose rollouts are compared


def run_one(step: str, seed: int, world: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="tiny-learning-") as folder:
        command = [sys.executable, "-m", "rlsteps.cli", "run", step, "-c", "tiny", f"seed={seed}"]
        command += [f"tiny_world.seed={world}", *MEASURED, *overrides]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        run = next((Path(folder) / ".rlsteps" / "runs").iterdir())
        return {"step": step, "seed": seed, "world": world, "wall_s": round(wall, 1), **figures(run)}


def figures(run: Path) -> dict:
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    true = [(m["step"], m["val/true_reward"]) for m in metrics if "val/true_reward" in m]
    steps = [m["timers/step"] for m in metrics if "timers/step" in m]
    last_step = max(m["step"] for m in metrics)
    train = [s for s in samples if s["split"] == "train"]
    first = [s for s in train if s["step"] <= QUARTER]
    last = [s for s in train if s["step"] > last_step - QUARTER]
    greedy = [s for s in samples if s["split"] == "val" and s["step"] == last_step]
    return {
        "true_reward_first": true[0][1],
        "true_reward_last": true[-1][1],
        "steps_s": round(sum(m.get("timers/step", 0.0) for m in metrics), 1),
        # the first step left out: it waits for what starts with the run (a rollout process, a compile)
        "median_step_s": round(statistics.median(steps[1:] or steps or [0.0]), 3),
        "wrong_noun": [share(first, wrong_noun), share(last, wrong_noun)],
        "wrong_of_named": [share(named(first), wrong_noun), share(named(last), wrong_noun)],
        "broken_word": [share(first, broken), share(last, broken)],
        "repeated": [share(first, repeated), share(last, repeated)],
        "distinct_greedy": len({without_noun(s) for s in greedy}),
        "greedy_example": greedy[0]["response"] if greedy else None,
    }


def user_text(sample: dict) -> str:
    return " ".join(m["content"] for m in sample["prompt"] if m["role"] == "user")


def wrong_noun(sample: dict) -> bool:
    return tiny_task.names_a_wrong_noun(user_text(sample), sample["response"])


def broken(sample: dict) -> bool:
    return tiny_task.has_a_broken_word(sample["response"])


def named(samples: list[dict]) -> list[dict]:
    """The samples that name a task noun, the prompt's or another."""
    return [s for s in samples if set(tiny_task.words(s["response"])) & set(tiny_task.NOUNS)]


def repeated(sample: dict) -> bool:
    return tiny_task.repeats_a_word(sample["response"])


def share(samples: list[dict], fault) -> float:
    return round(sum(map(fault, samples)) / max(len(samples), 1), 4)


def without_noun(sample: dict) -> str:
    return re.sub(rf"\b{tiny_task.prompt_noun(user_text(sample))}\b", "X", sample["response"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--worlds", nargs="+", type=int, default=[0])
    parser.add_argument("overrides", nargs="*", help="key=value for every run (after --)")
    args = parser.parse_args()
    for world in args.worlds:
        for name in args.steps:
            for seed in args.seeds:
                print(json.dumps(run_one(STEPS[name], seed, world, args.overrides)), flush=True)


if __name__ == "__main__":
    main()
