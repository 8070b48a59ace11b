"""What the tiny recipes learn: each `rlsteps run rl/<step> -c tiny` over run seeds and tiny-world seeds.

For each run: its wall time (process start to exit) and summed step time; the hidden true reward of its greedy
validation answers (`val/true_reward`: at step 0 and at the end) and of its sampled rollouts (the first step's, drawn
by the SFT policy itself, and the last four steps'); how alike the final greedy answers are (distinct answers once
the noun is taken out, of 32); what its sampled rollouts (samples.jsonl, every rollout of a step) say that is not the
task's sentence, each fault counted from the text (rlsteps.tiny.task.faults: a word said again, a list without its
"and", more than four adjectives, a wrong noun, a broken word, another form) and the share that never ended, at the
first step against the last four; and the lines the run's reward-hacking watch said (reward_hacking.jsonl).

    python benchmarks/tiny_learning.py                                  # 3 steps x run seeds 0 1 2, world seed 0
    python benchmarks/tiny_learning.py --seeds 0 1 2 3 4 --worlds 0 1 2 --jobs 2 --table grid.jsonl
    python benchmarks/tiny_learning.py --steps rs --seeds 0 --worlds 1  # one run on a second world
    python benchmarks/tiny_learning.py -- train.lr=2e-3                 # overrides after --, for every run
    python benchmarks/tiny_learning.py --summarise grid.jsonl           # the table of runs already measured

Each run uses one thread. With --jobs 2 two run at once: their learning is the same (a run is a pure function of its
seeds), their times are not the times of a run alone. A world not yet built is built first, before any run.

The table (Markdown, per recipe): the median and lowest final val/true_reward, how many runs reach the whole task
(>= 2.95), the runs whose sampled answers at the end are less well formed than the SFT policy's (a fault's share up by
more than FAULT_SLACK), and the runs the watch said anything on.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlsteps.tiny import task as tiny_task

STEPS = {"rs": "rl/rs", "reinforce": "rl/reinforce", "rlhf": "rl/rlhf"}
MEASURED = ["run.num_threads=1", "logging.samples_per_step=128"]  # every rollout of a step in samples.jsonl
QUARTER = 4  # steps at the end of the run whose rollouts are compared with the first step's
FAULTS = ("a word said again", 'a list without its "and"', "more than four adjectives", "a wrong noun",
          "a broken word", "another form")  # fmt: skip
FAULT_SLACK = 0.03  # a fault's share of the last steps' rollouts above the first step's by more: less well formed
WHOLE_TASK = 2.95


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
    first = [s for s in train if s["step"] == 1]  # drawn by the SFT policy: no update before them
    last = [s for s in train if s["step"] > last_step - QUARTER]
    greedy = [s for s in samples if s["split"] == "val" and s["step"] == last_step]
    watch = run / "reward_hacking.jsonl"
    return {
        "true_reward_first": true[0][1],
        "true_reward_last": true[-1][1],
        "sampled_true_reward": [mean_true_reward(first), mean_true_reward(last)],
        "steps_s": round(sum(m.get("timers/step", 0.0) for m in metrics), 1),
        # the first step left out: it waits for what starts with the run (a rollout process, a compile)
        "median_step_s": round(statistics.median(steps[1:] or steps or [0.0]), 3),
        "faults": {fault: [share(first, fault), share(last, fault)] for fault in FAULTS},
        "not_ended": [share_of(first, lambda s: not s["ended"]), share_of(last, lambda s: not s["ended"])],
        "task_sentence": [share_of(first, task_sentence), share_of(last, task_sentence)],
        "distinct_greedy": len({without_noun(s) for s in greedy}),
        "greedy_example": greedy[0]["response"] if greedy else None,
        "watch": [json.loads(line)["sign"] for line in watch.read_text().splitlines()] if watch.is_file() else [],
    }


def user_text(sample: dict) -> str:
    return " ".join(m["content"] for m in sample["prompt"] if m["role"] == "user")


def task_sentence(sample: dict) -> bool:
    return not faults_of(sample)


def mean_true_reward(samples: list[dict]) -> float:
    return round(statistics.fmean(tiny_task.true_reward(user_text(s), s["response"]) for s in samples), 3)


def share(samples: list[dict], fault: str) -> float:
    return share_of(samples, lambda s: fault in faults_of(s))


def faults_of(sample: dict) -> list[str]:
    """tiny_task.faults of a sample, read once (each fault's share asks again)."""
    if "faults" not in sample:
        sample["faults"] = tiny_task.faults(user_text(sample), sample["response"])
    return sample["faults"]


def share_of(samples: list[dict], has) -> float:
    return round(sum(map(has, samples)) / max(len(samples), 1), 4)


def without_noun(sample: dict) -> str:
    return re.sub(rf"\b{tiny_task.prompt_noun(user_text(sample))}\b", "X", sample["response"])


def less_well_formed(run: dict) -> list[str]:
    """What the run's last rollouts do more than its first step's (the SFT policy's), beyond FAULT_SLACK."""
    worse = [f"{fault} {first:.0%}->{last:.0%}" for fault, (first, last) in run["faults"].items()
             if last > first + FAULT_SLACK]  # fmt: skip
    first, last = run["not_ended"]
    return worse + ([f"never ended {first:.0%}->{last:.0%}"] if last > first + FAULT_SLACK else [])


def summary(runs: list[dict]) -> str:
    """The Markdown table over the runs, a row per recipe."""
    lines = [
        "| recipe | runs | greedy true reward at step 0 (median) | sampled at step 1 (median) | final (median) "
        "| lowest | whole task (>= 2.95) | less well formed at the end | watch lines |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for step in dict.fromkeys(run["step"] for run in runs):
        mine = [run for run in runs if run["step"] == step]
        finals = [run["true_reward_last"] for run in mine]
        worse = [f"seed {r['seed']} world {r['world']}: {', '.join(less_well_formed(r))}"
                 for r in mine if less_well_formed(r)]  # fmt: skip
        said = [f"seed {r['seed']} world {r['world']}: {', '.join(r['watch'])}" for r in mine if r["watch"]]
        lines.append(
            f"| {step} | {len(mine)} | {statistics.median(r['true_reward_first'] for r in mine):.2f} "
            f"| {statistics.median(r['sampled_true_reward'][0] for r in mine):.2f} | {statistics.median(finals):.2f} "
            f"| {min(finals):.2f} | {sum(f >= WHOLE_TASK for f in finals)} of {len(mine)} "
            f"| {'; '.join(worse) or 'none'} | {'; '.join(said) or 'none'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--worlds", nargs="+", type=int, default=[0])
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each one thread)")
    parser.add_argument("--table", type=Path, help="append each run's figures to this JSON-lines file")
    parser.add_argument("--summarise", type=Path, help="print the table of a --table file and stop")
    parser.add_argument("overrides", nargs="*", help="key=value for every run (after --)")
    args = parser.parse_args()
    if args.summarise:
        print(summary([json.loads(line) for line in args.summarise.read_text().splitlines()]))
        return
    from rlsteps.tiny.build import ensure_tiny_world

    for world in args.worlds:
        ensure_tiny_world(world)
    grid = [(STEPS[name], seed, world) for world in args.worlds for name in args.steps for seed in args.seeds]
    runs = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for run in pool.map(lambda cell: run_one(*cell, args.overrides), grid):
            print(json.dumps(run), flush=True)
            runs.append(run)
            if args.table:
                with args.table.open("a") as table:
                    table.write(json.dumps(run) + "\n")
    print(summary(runs))


if __name__ == "__main__":
    main()
