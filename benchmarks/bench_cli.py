"""Start-up time of the command line's fast paths, which must never import torch.

Each command runs as a fresh subprocess, N times, round-robin with two baselines measured in the
same run: `python -c pass` (interpreter start) and `python -c "import torch"` (what one torch
import would cost). Then each CLI command runs once more through a small wrapper that calls
rlsteps.cli.main([...]) in-process and reports whether torch or transformers got imported.

    python benchmarks/bench_cli.py                  # 10 repeats, well under two minutes
    python benchmarks/bench_cli.py --repeats 20

Exits with status 1 if a command fails or imports torch/transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BASELINES = {
    "python -c pass": ["-c", "pass"],
    "python -c 'import torch'": ["-c", "import torch"],
}
TORCH = "python -c 'import torch'"
CLI_COMMANDS = {
    "rlsteps --help": ["--help"],
    "rlsteps list": ["list"],
    "rlsteps run rl/rs -c tiny --dry-run": ["run", "rl/rs", "-c", "tiny", "--dry-run"],
}
HEAVY_MODULES = ("torch", "transformers")
MARK = "BENCH_CLI_MODULES "

# Runs one CLI command in-process, then prints which heavy modules it left in sys.modules.
CHECK_WRAPPER = f"""
import json, sys
from rlsteps.cli import main
argv = json.loads(sys.argv[1])
try:
    code = main(argv)
except SystemExit as done:
    code = done.code
heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]
print({MARK!r} + json.dumps({{"code": code or 0, "heavy": heavy}}))
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per command (after one warm-up)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to time (default: this one)")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error("--repeats must be >= 2 for an interquartile range")
    return args


def cli_argv(words: list[str]) -> list[str]:
    return ["-m", "rlsteps.cli", *words]


def run_once(python: str, argv: list[str]) -> float:
    """Wall seconds of one subprocess; raises with its stderr if it fails."""
    start = time.perf_counter()
    done = subprocess.run([python, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"`python {' '.join(argv)}` exited with {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed


def time_all(python: str, commands: dict[str, list[str]], repeats: int) -> dict[str, list[float]]:
    """Round-robin, so drifting load on a shared machine hits every command alike."""
    for argv in commands.values():
        run_once(python, argv)  # warm-up: file-system caches, .pyc files
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, argv in commands.items():
            times[name].append(run_once(python, argv))
    return times


def heavy_imports(python: str, words: list[str]) -> tuple[int, list[str]]:
    """(exit code, heavy modules imported) of one CLI command run through rlsteps.cli.main."""
    done = subprocess.run([python, "-c", CHECK_WRAPPER, json.dumps(words)], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the import check of `rlsteps {' '.join(words)}` failed:\n{done.stderr[-2000:]}")
    report = json.loads(lines[-1][len(MARK) :])
    return int(report["code"]), report["heavy"]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def main() -> int:
    args = parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"cores={os.cpu_count()} load average (1/5/15 min)={load} python={args.python}")
    print(f"repeats={args.repeats} per command, round-robin after one warm-up; wall seconds per subprocess\n")

    commands = {**BASELINES, **{name: cli_argv(words) for name, words in CLI_COMMANDS.items()}}
    times = time_all(args.python, commands, args.repeats)
    torch_median = statistics.median(times[TORCH])
    print(f"{'command':40s} {'median s':>9s} {'IQR s':>7s} {'/ import torch':>15s}")
    for name, values in times.items():
        q1, median, q3 = quartiles(values)
        print(f"{name:40s} {median:9.3f} {q3 - q1:7.3f} {median / torch_median:15.2f}")

    print(f"\nmodules in sys.modules after rlsteps.cli.main([...]) (must not contain {', '.join(HEAVY_MODULES)}):")
    ok = True
    for name, words in CLI_COMMANDS.items():
        code, heavy = heavy_imports(args.python, words)
        verdict = "ok" if code == 0 and not heavy else "FAIL"
        ok &= verdict == "ok"
        print(f"  {name:38s} exit={code} heavy={heavy or 'none'} {verdict}")
    print(f"\nload average at the end={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
