"""The judge's cost in an rl/rlhf tiny step, beside the reward model's in an rl/reinforce tiny step.

Two parts, each a round-robin of interleaved repetitions, reported as medians and ratios:

    scoring   one step's rewards on their own: 16 prompts x 4 responses of the tiny task, scored by a judge
              server (`python -m rlsteps.engine.rewards.judge`, the tiny reward model, as a run starts it) through
              `JudgeClient` at concurrency 8 (64 circular comparisons; the tiny config sends 32; `--concurrency 8
              64`: a client at each, in turns; `--prompts`, `--group`: another step's shape), and by a reward-model
              server (`python -m rlsteps.engine.rewards.rm`) through `RewardClient` (64 rows); both servers are
              subprocesses on loopback, started once, warmed up, then called in turns
    steps     whole runs, `rlsteps run rl/reinforce -c tiny train.max_steps=S` and `rl/rlhf` (16 prompts x 4
              rollouts x 32 tokens), taking turns in fresh folders; each run's metrics.jsonl gives timers/step
              and timers/reward of steps 2..S (step 1 waits for the server to load)

With `--checkouts NAME=DIR ...` (folders holding src/, steps/ and manifests/, e.g. `mkdir /tmp/before && git
archive HEAD~1 src steps manifests | tar -x -C /tmp/before`), each checkout's judge server takes its turn in the
scoring part, and the steps part runs both steps from each checkout instead of the installed one (its src first
on PYTHONPATH: the worker and the server it starts), all in the same rounds: the before and after of a change,
measured together. A step's ratio to rl/reinforce is taken within each round (the two runs next to each other
in time), then its median over the rounds: on a shared machine the load drifts more between rounds.

    python benchmarks/bench_judge.py                                   # about 4 minutes on an idle 2-core machine
    python benchmarks/bench_judge.py --checkouts before=/tmp/before after=/tmp/after --rounds 4
    python benchmarks/bench_judge.py --skip-steps --calls 30           # the scoring part alone
    python benchmarks/bench_judge.py --skip-steps --client-checkouts before=/tmp/before   # and another client
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlsteps.engine.rewards.process import LocalServer
from rlsteps.tiny import task
from rlsteps.tiny.build import ensure_tiny_world

PROMPTS, ROLLOUTS, CONCURRENCY = 16, 4, 8  # the scoring part's default step shape and judge.concurrency


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def step_groups(
    seed: int, prompts: int = PROMPTS, group: int = ROLLOUTS
) -> list[tuple[list[dict[str, str]], list[str]]]:
    """One step's groups: a tiny-task prompt and its responses drawn as the SFT policy writes them."""
    rng = random.Random(seed)
    groups = []
    for _ in range(prompts):
        prompt, noun = task.sample_prompt(rng)
        responses = [task.sample_response(rng, noun) for _ in range(group)]
        groups.append(([{"role": "user", "content": prompt}], responses))
    return groups


def judge_name(checkout: str, concurrency: int, concurrencies: tuple[int, ...]) -> str:
    return f"judge ({checkout})" + (f", concurrency {concurrency}" if len(concurrencies) > 1 else "")


def checkout_env(checkout: str | None) -> dict[str, str]:
    """The environment of a process that runs the given checkout's source (the installed one for None)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if checkout:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(checkout, "src")), env.get("PYTHONPATH")]))
    return env


def client_class(checkout: str) -> type:
    """The JudgeClient of another checkout's source, loaded beside this one's (its helpers are this one's)."""
    path = Path(checkout, "src", "rlsteps", "engine", "rewards", "judge", "client.py")
    spec = importlib.util.spec_from_file_location(f"judge_client_of_{abs(hash(checkout))}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.JudgeClient


def scoring(
    rounds: int,
    reward_model: Path,
    folder: Path,
    checkouts: dict[str, str | None],
    client_checkouts: dict[str, str],
    concurrencies: tuple[int, ...] = (CONCURRENCY,),
    shape: tuple[int, int] = (PROMPTS, ROLLOUTS),
) -> dict[str, list[float]]:
    """Seconds per step's scoring: each checkout's judge server (through this checkout's client, at each of
    `concurrencies`), the first server through each of `client_checkouts`' clients, and the reward model, taking
    turns."""
    from rlsteps.engine.rewards.judge.client import JudgeClient
    from rlsteps.engine.rewards.rm.client import RewardClient

    threads = {"OMP_NUM_THREADS": "1"}
    judges = {
        name: LocalServer(
            "rlsteps.engine.rewards.judge", ["--model", str(reward_model), "--model-name", "tiny-judge"],
            log_path=folder / f"judge-{name}.log", env={**checkout_env(checkout), **threads},
        )
        for name, checkout in checkouts.items()
    }  # fmt: skip
    rm = LocalServer(
        "rlsteps.engine.rewards.rm", ["--model", str(reward_model)], log_path=folder / "rm.log", env=threads
    )
    times: dict[str, list[float]] = {"reward model": []}
    with contextlib.ExitStack() as stack:
        for server in [*judges.values(), rm]:
            stack.enter_context(server)
        clients = {
            judge_name(name, c, concurrencies): stack.enter_context(
                JudgeClient(f"{j.url}/v1", "tiny-judge", concurrency=c)
            )
            for name, j in judges.items()
            for c in concurrencies
        }
        first = next(iter(judges.values()))
        for name, checkout in client_checkouts.items():
            other = client_class(checkout)(f"{first.url}/v1", "tiny-judge", concurrency=CONCURRENCY)
            clients[f"judge, {name}'s client"] = stack.enter_context(contextlib.closing(other))
        times |= {name: [] for name in clients}
        rc = stack.enter_context(RewardClient(rm.url))
        for r in range(rounds + 2):  # two warm-up rounds
            groups = step_groups(r, *shape)  # the reward model's
            prompts = [c[0]["content"] for c, responses in groups for _ in responses]
            responses = [x for _, rs in groups for x in rs]
            for i, (name, client) in enumerate(clients.items()):
                # groups of their own: a judge server remembers the rewards of the rows it has scored, so a client
                # sent the same rows after another would time a server with nothing left to score
                start = time.perf_counter()
                result = client.judge(step_groups(1000 * (i + 1) + r, *shape))
                took = time.perf_counter() - start
                assert result.stats["transport_failures"] == 0 and result.stats["parse_failures"] == 0, result.stats
                if r >= 2:
                    times[name].append(took)
            start = time.perf_counter()
            rc.score(prompts, responses)
            if r >= 2:
                times["reward model"].append(time.perf_counter() - start)
    return times


def run_steps(step: str, steps: int, checkout: str | None) -> list[dict[str, float]]:
    """The step metrics of `rlsteps run STEP -c tiny train.max_steps=STEPS` in a fresh folder, steps 2.."""
    env = checkout_env(checkout)
    command = [sys.executable, "-m", "rlsteps.cli", "run", step, "-c", "tiny", f"train.max_steps={steps}"]
    with tempfile.TemporaryDirectory(prefix="bench-judge-") as folder:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            said = done.stdout[-3000:] + done.stderr[-3000:]
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{said}")
        metrics = next(Path(folder, ".rlsteps", "runs").glob("*/metrics.jsonl"))
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in rows if "timers/step" in row][1:]


def summary(rows: list[dict[str, float]]) -> tuple[float, float, float]:
    """(median step s, median reward s, median share of the step spent on the reward)."""
    steps = [r["timers/step"] for r in rows]
    rewards = [r["timers/reward"] for r in rows]
    shares = [r["timers/reward"] / r["timers/step"] for r in rows]
    return statistics.median(steps), statistics.median(rewards), statistics.median(shares)


def median_of(rows: list[dict[str, float]], key: str) -> str:
    """The median of a timer the checkout logs, or '-' where it logs none (the reference beside the scoring)."""
    values = [r[key] for r in rows if key in r]
    return f"{statistics.median(values):.3f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="timed rounds of the scoring part")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each step in the steps part")
    parser.add_argument("--steps", type=int, default=6, help="train.max_steps of each run")
    parser.add_argument("--checkouts", nargs="*", default=[], metavar="NAME=DIR", help="checkouts to compare")
    parser.add_argument(
        "--client-checkouts", nargs="*", default=[], metavar="NAME=DIR", help="judge clients to compare (scoring)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[CONCURRENCY], help="judge clients' (scoring)")
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="prompts of the scored step (scoring)")
    parser.add_argument("--group", type=int, default=ROLLOUTS, help="responses per prompt (scoring)")
    parser.add_argument("--skip-scoring", action="store_true")
    parser.add_argument("--skip-steps", action="store_true")
    args = parser.parse_args()
    checkouts: dict[str, str | None] = dict(c.split("=", 1) for c in args.checkouts) or {"installed": None}
    print(f"load average at the start: {load()}")

    if not args.skip_scoring:
        reward_model = ensure_tiny_world().reward_model
        with tempfile.TemporaryDirectory(prefix="bench-judge-") as folder:
            clients = dict(c.split("=", 1) for c in args.client_checkouts)
            shape = (args.prompts, args.group)
            times = scoring(args.calls, reward_model, Path(folder), checkouts, clients, tuple(args.concurrency), shape)
        rm = statistics.median(times["reward model"])
        rows = args.prompts * args.group
        print(f"\nscoring one step ({args.prompts} x {args.group}), median of {args.calls} calls each, taking turns")
        for name, found in times.items():
            what = f"{rows} circular comparisons" if name != "reward model" else f"{rows} rows"
            median = statistics.median(found)
            print(f"  {name:<28} {what:<36} {median:.4f} s   / reward model {median / rm:5.2f}")

    if not args.skip_steps:
        variants = [(name, step) for name in checkouts for step in ("rl/reinforce", "rl/rlhf")]
        rows: dict[tuple[str, str], list[dict[str, float]]] = {v: [] for v in variants}
        ratios: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            found = {(name, step): run_steps(step, args.steps, checkouts[name]) for name, step in variants}
            for (name, step), steps in found.items():
                rows[name, step] += steps
                ratios[name, step].append(summary(steps)[0] / summary(found[name, "rl/reinforce"])[0])
        print(f"\nsteps 2-{args.steps} of {args.rounds} runs each, taking turns (median s; the ratio to the")
        print("same round's rl/reinforce run, median over rounds, with its range); reference s: the reference's pass")
        print("when it runs beside the scoring (inside reward s), prepare s: the phase after the reward")
        print(f"  {'checkout':<10} {'step':<13} {'step s':>7} {'reward s':>9} {'reference s':>12} {'prepare s':>10} "
              f"{'reward share':>13} {'/ reinforce':>12}")  # fmt: skip
        for name, step in variants:
            step_s, reward_s, share = summary(rows[name, step])
            r = ratios[name, step]
            ratio = f"{statistics.median(r):6.2f} ({min(r):.2f}-{max(r):.2f})"
            reference, prepare = (
                median_of(rows[name, step], "timers/reference"),
                median_of(rows[name, step], "timers/prepare"),
            )
            print(f"  {name:<10} {step:<13} {step_s:7.3f} {reward_s:9.3f} {reference:>12} {prepare:>10} {share:13.0%} "
                  f"{ratio}")  # fmt: skip
    print(f"\nload average at the end: {load()}")


if __name__ == "__main__":
    main()
