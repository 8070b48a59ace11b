"""Whole runs of a step in two or more modes (sets of overrides), taking turns: the loop's own timers per mode.

Each run is `rlsteps run STEP -c CONFIG <mode's overrides>` as a fresh process into a fresh output folder. Per mode,
the median of each timer (timers/*, seconds a step: the first step of every run left out, it warms up; the other
steps of all rounds pooled), the median wall time of the runs (process start to exit) and the last val/true_reward
(the tiny world's hidden reward; other steps: val/reward_mean); each median's ratio to the first mode's (above 1:
faster).

    python benchmarks/bench_run_modes.py rl/reinforce --modes train.sequence_packing=false train.sequence_packing=true
    python benchmarks/bench_run_modes.py rl/rlhf -c tiny --rounds 3 --modes "train.compile=false" "train.compile=true"

A mode is one argument: its overrides separated by spaces ("" for the step's own config).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIGURES = ("val/true_reward", "val/reward_mean")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", help="a step of the catalog, e.g. rl/reinforce")
    parser.add_argument("-c", "--config", default="tiny")
    parser.add_argument("--modes", nargs="+", required=True, help="each mode's overrides, one argument a mode")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, the modes taking turns")
    return parser.parse_args()


def one_run(step: str, config: str, mode: str, out: Path) -> tuple[float, list[dict]]:
    """(wall seconds, the run's metrics records)."""
    command = ["rlsteps", "run", step, "-c", config, *mode.split(), f"output.dir={out}"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def step_timers(records: list[dict]) -> dict[str, list[float]]:
    """Each timer's values over the run's steps, the first step left out."""
    steps = [r for r in records if "timers/step" in r][1:]
    keys = sorted({k for r in steps for k in r if k.startswith("timers/")})
    return {k: [r[k] for r in steps if k in r] for k in keys}


def last_figure(records: list[dict]) -> str:
    for name in FIGURES:
        values = [r[name] for r in records if name in r]
        if values:
            return f"{name} {values[-1]:.3f}"
    return "-"


def main() -> None:
    args = parse_args()
    timers = {mode: {} for mode in args.modes}
    walls = {mode: [] for mode in args.modes}
    figures = {mode: [] for mode in args.modes}
    with tempfile.TemporaryDirectory(prefix="bench-run-modes-") as tmp:
        for round_ in range(args.rounds):
            for i, mode in enumerate(args.modes):
                wall, records = one_run(args.step, args.config, mode, Path(tmp) / f"{round_}-{i}")
                walls[mode].append(wall)
                figures[mode].append(last_figure(records))
                for key, values in step_timers(records).items():
                    timers[mode].setdefault(key, []).extend(values)
                print(f"round {round_ + 1} {mode or '(config)'}: {wall:.1f} s, {figures[mode][-1]}", flush=True)
    base = args.modes[0]
    keys = sorted({k for mode in args.modes for k in timers[mode]})
    print(f"\n{args.step} -c {args.config}, {args.rounds} rounds; medians (s), ratio to the first mode")
    print(f"{'':<22}" + "".join(f"{mode or '(config)':>38}" for mode in args.modes))
    for key in ["wall", *keys]:
        row = f"{key:<22}"
        for mode in args.modes:
            values = walls[mode] if key == "wall" else timers[mode].get(key, [])
            reference = walls[base] if key == "wall" else timers[base].get(key, [])
            if not values:
                row += f"{'-':>38}"
                continue
            median, ratio = statistics.median(values), ""
            if reference and median > 0 and mode != base:
                ratio = f" ({statistics.median(reference) / median:.2f}x)"
            row += f"{f'{median:.4f}{ratio}':>38}"
        print(row)
    for mode in args.modes:
        print(f"{mode or '(config)'}: {', '.join(figures[mode])}")


if __name__ == "__main__":
    main()
