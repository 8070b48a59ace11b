"""The first minute of a tiny run: where the time goes from the command to the first step, and a rerun.

Each round runs `rlsteps run rl/<step> -c tiny train.max_steps=STEPS` in a fresh folder (the tiny world
already built and cached), then the same command again there (a rerun of a finished run). It reads the
command's output as it arrives and the run's train.log, and prints the phases:

    job line      the CLI has compiled, checked the inputs and started the worker (its `job ...` line)
    worker up     the worker has read its config and checked its inputs (`run directory ...`)
    first step    train.log's `step 1/` line
    last step     train.log's last step line
    output        the output artifact is written
    end           the command exits

with two floors measured in the same rounds: a Python that imports torch and transformers' causal-LM classes,
and one that imports transformers' modeling code as well (which the first, a lazy import, leaves out and building
any model needs): what any process that trains a Hugging Face model pays before it can start (the worker pays it,
and so does the reward server it starts, on the other core).

    python benchmarks/bench_startup.py                     # rl/rs, 3 rounds, about two minutes on 2 cores
    python benchmarks/bench_startup.py --step rl/reinforce --rounds 5
    python benchmarks/bench_startup.py --step rl/reinforce --steps 16 --no-rerun --sources before=/tmp/a after=.

Then where the seconds of a run go: the sum of its steps' own timers (timers/step), what comes before the first
step starts, what lies between steps (validations, checkpoints) and what follows the last step line (the last
checkpoint, the output, the plot, the exit); and the run's end over (each floor + sum of steps). --sources compares
checkouts (each one's src/ first on PYTHONPATH), taking turns in each round.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PHASES = ("job line", "worker up", "first step", "last step", "output", "end")
WHERE = ("before step 1", "sum of steps", "between steps", "after last step")
MARKERS = {"job line": "job ", "worker up": "run directory", "output": "output artifact"}
# What a Python pays before it can train a Hugging Face model. The first is the floor named in the targets; transformers
# imports its modeling code lazily, so it leaves out what building any model imports (transformers.modeling_utils:
# torch.distributed.tensor, torch._dynamo; 1.3 s on a quiet 2-core machine), which the second adds.
FLOOR = "import torch; from transformers import AutoModelForCausalLM"
FLOORS = {"floor": FLOOR, "floor + modeling": f"{FLOOR}; import transformers.modeling_utils"}


def timed_lines(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, list[tuple[float, str]], int]:
    """(wall-clock start, [(seconds since start, line)] of stdout and stderr as they arrive, exit code)."""
    env = {**env, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    wall, start = time.time(), time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read(stream) -> None:
        for line in stream:
            lines.append((time.monotonic() - start, line.rstrip()))

    readers = [threading.Thread(target=read, args=(s,)) for s in (process.stdout, process.stderr)]
    for reader in readers:
        reader.start()
    code = process.wait()
    for reader in readers:
        reader.join()
    lines.append((time.monotonic() - start, "<exit>"))
    return wall, sorted(lines), code


def log_time(line: str) -> datetime.datetime:
    """The time a train.log line was written (its first 23 characters); ValueError for a line without one."""
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def step_times(train_log: Path, wall_start: float) -> list[float]:
    """Seconds from the command's start to each `step N/` line of train.log (its timestamps are wall-clock)."""
    found = []
    for line in train_log.read_text().splitlines() if train_log.exists() else []:
        if " INFO rlsteps.steps: step " in line:
            stamp = log_time(line).timestamp()
            found.append(stamp - wall_start)
    return found


def run_tiny(step: str, steps: int, cwd: Path, env: dict[str, str]) -> tuple[float, list[tuple[float, str]]]:
    """`rlsteps run STEP -c tiny train.max_steps=STEPS` in cwd: (wall-clock start, timed lines); exits on failure."""
    command = [sys.executable, "-m", "rlsteps.cli", "run", step, "-c", "tiny", f"train.max_steps={steps}"]
    wall, lines, code = timed_lines(command, cwd, env)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited {code}:\n" + "\n".join(text for _, text in lines[-20:]))
    return wall, lines


def one_run(step: str, steps: int, cwd: Path, env: dict[str, str]) -> dict[str, float]:
    wall, lines = run_tiny(step, steps, cwd, env)
    phases = {name: next((t for t, text in lines if marker in text), float("nan")) for name, marker in MARKERS.items()}
    run_dir = next((cwd / ".rlsteps" / "runs").iterdir())
    steps_at = step_times(run_dir / "train.log", wall)
    phases["first step"] = steps_at[0] if steps_at else float("nan")
    phases["last step"] = steps_at[-1] if steps_at else float("nan")
    phases["end"] = lines[-1][0]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    seconds = [r["timers/step"] for r in records if r.get("timers/step") is not None]
    # where the seconds go: the steps themselves (their own timers), what comes before the first one starts
    # (start-up, the policy, the reward server, the first validation), what lies between steps (validations,
    # checkpoints, logging) and what follows the last one (its checkpoint, the output, the plot, the exit)
    phases["sum of steps"] = sum(seconds)
    phases["before step 1"] = phases["first step"] - (seconds[0] if seconds else 0.0)
    phases["between steps"] = phases["last step"] - phases["first step"] - sum(seconds[1:])
    phases["after last step"] = phases["end"] - phases["last step"]
    return phases


def rerun(step: str, steps: int, cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    _, lines = run_tiny(step, steps, cwd, env)
    said = [text for _, text in lines if text and text != "<exit>"]
    return lines[-1][0], said[-1] if said else ""


def source_env(path: str | None) -> dict[str, str]:
    """The environment that runs the rlsteps at `path` (its src/ first on PYTHONPATH, its manifests and steps)."""
    if path is None:
        return dict(os.environ)
    root = Path(path).resolve()
    return {**os.environ, "PYTHONPATH": str(root / "src"), "RLSTEPS_ROOT": str(root)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", default="rl/rs")
    parser.add_argument("--steps", type=int, default=2, help="train.max_steps of each run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sources",
        nargs="+",
        metavar="NAME=PATH",
        help="checkouts to compare, taking turns in each round (default: the rlsteps this Python imports)",
    )
    parser.add_argument("--no-rerun", action="store_true", help="skip the rerun of each finished run")
    args = parser.parse_args()
    sources = dict(item.split("=", 1) for item in args.sources) if args.sources else {"this": None}
    runs: dict[str, list] = {name: [] for name in sources}
    reruns: dict[str, list] = {name: [] for name in sources}
    floors: dict[str, list[float]] = {name: [] for name in FLOORS}
    last_said = ""
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for _ in range(args.rounds):
        for floor_name, code in FLOORS.items():
            start = time.monotonic()
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            floors[floor_name].append(time.monotonic() - start)
        for name, path in sources.items():
            with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
                runs[name].append(one_run(args.step, args.steps, Path(folder), source_env(path)))
                if not args.no_rerun:
                    seconds, last_said = rerun(args.step, args.steps, Path(folder), source_env(path))
                    reruns[name].append(seconds)
    print(f"load average at end: {os.getloadavg()}")
    print(f"{args.step} -c tiny train.max_steps={args.steps}: median of {args.rounds} rounds, seconds from the command")
    print(f"  {'phase':<16}" + "".join(f"{name:>24}" for name in sources))
    for phase in PHASES + WHERE:
        cells = []
        for name in sources:
            values = [run[phase] for run in runs[name]]
            cells.append(f"{statistics.median(values):7.2f} ({'/'.join(f'{v:.1f}' for v in values)})")
        print(f"  {phase:<16}" + "".join(f"{cell:>24}" for cell in cells))
    for floor_name, code in FLOORS.items():
        floor = statistics.median(floors[floor_name])
        print(f"  {floor_name}: {code}  {floor:.2f}")
        for name in sources:
            ratios = [run["end"] / (floor + run["sum of steps"]) for run in runs[name]]
            print(f"    {name}: end / ({floor_name} + sum of steps) = {statistics.median(ratios):.2f}")
    for name in sources:
        if reruns[name]:
            print(f"  {name}: rerun of the finished run {statistics.median(reruns[name]):.2f}")
    if last_said:
        print(f"    the rerun's last line: {last_said}")


if __name__ == "__main__":
    main()
