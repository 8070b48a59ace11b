"""What dynamic batching buys in the reward-model server, on the tiny world's reward model.

Two real servers (`python -m rlsteps.engine.rewards.rm`, LocalServer subprocesses on loopback,
CPU, OMP_NUM_THREADS=1) serve the same model: one with --max-batch 1 (the baseline: every request
is its own forward pass) and one with the defaults, --max-batch 64 --max-wait-ms 5. Each round,
C client threads (one RewardClient each) send R requests of P (prompt, response) pairs one after
another, all threads at once. The rounds alternate between the two servers so drifting load on a
shared machine hits both alike. Prompts are the tiny world's train.jsonl rendered with its chat
template; responses are short synthetic sentences from rlsteps.tiny.task.

    python benchmarks/bench_reward_server.py                          # about a minute on 2 cores
    python benchmarks/bench_reward_server.py --clients 64 --requests 16 --pairs 2 --rounds 5

The client threads run in this process and share the machine with the server: on a 2-core
machine the figures measure the whole loopback system, not the server alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rlsteps.engine.rewards.process import LocalServer
from rlsteps.engine.rewards.rm.client import RewardClient
from rlsteps.tiny import task as tiny_task
from rlsteps.tiny.layout import TinyWorld, tiny_world_paths

SERVER_MODULE = "rlsteps.engine.rewards.rm"
SERVER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
BUILD_HINT = "python -c 'from rlsteps.tiny.build import ensure_tiny_world; ensure_tiny_world()'"

Pairs = tuple[list[str], list[str]]  # (prompts, responses) of one request


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32, help="concurrent client threads")
    parser.add_argument("--requests", type=int, default=8, help="requests per client thread per round")
    parser.add_argument("--pairs", type=int, default=4, help="(prompt, response) pairs per request")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per server, after one warm-up round")
    parser.add_argument("--max-batch", type=int, default=64, help="the batched server's --max-batch")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the batched server's --max-wait-ms")
    parser.add_argument("--seed", type=int, default=0, help="the tiny world's seed")
    args = parser.parse_args()
    if min(args.clients, args.requests, args.pairs) < 1 or args.rounds < 2:
        parser.error("--clients, --requests and --pairs must be >= 1, --rounds >= 2 (for an interquartile range)")
    return args


def find_world(seed: int) -> TinyWorld:
    world = tiny_world_paths(seed)
    if not (world.root / "world.json").is_file():
        sys.exit(f"no tiny world at {world.root}: build it first (a few minutes on a CPU) with\n    {BUILD_HINT}")
    return world


def rendered_prompts(world: TinyWorld) -> list[str]:
    """The train prompts as the policy sees them: through its tokenizer's chat template."""
    from transformers import AutoTokenizer  # slow to import: only here, once

    tokenizer = AutoTokenizer.from_pretrained(world.policy)
    records = [json.loads(line) for line in world.train_prompts.read_text().splitlines() if line.strip()]
    return [tokenizer.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in records]


def workload(prompts: list[str], args: argparse.Namespace) -> list[list[Pairs]]:
    """workload[client][request] = (prompts, responses); the same for both servers."""
    rng = random.Random(args.seed)
    jobs = []
    for _ in range(args.clients):
        requests = []
        for _ in range(args.requests):
            chosen = rng.choices(prompts, k=args.pairs)
            responses = [tiny_task.sample_response(rng, tiny_task.prompt_noun(p)) for p in chosen]
            requests.append((chosen, responses))
        jobs.append(requests)
    return jobs


@dataclass
class Setting:
    name: str
    server_args: list[str]
    throughputs: list[float] = field(default_factory=list)  # pairs/s per round
    latencies: list[float] = field(default_factory=list)  # seconds per request, all rounds
    rewards: list[float] = field(default_factory=list)  # of the last round, in workload order
    requests: int = 0  # /health counter deltas over the timed rounds
    batches: int = 0


def run_round(url: str, jobs: list[list[Pairs]], pairs: int) -> tuple[float, list[float], list[float]]:
    """All client threads start together; returns (wall seconds, request latencies, rewards)."""
    start_line = threading.Barrier(len(jobs) + 1)
    latencies: list[list[float]] = [[] for _ in jobs]
    rewards: list[list[float]] = [[] for _ in jobs]
    errors: list[BaseException] = []

    def client_thread(i: int) -> None:
        try:
            with RewardClient(url, batch_size=pairs, concurrency=1, max_retries=2) as client:
                start_line.wait()
                for prompts, responses in jobs[i]:
                    sent = time.perf_counter()
                    rewards[i] += client.score(prompts, responses)
                    latencies[i].append(time.perf_counter() - sent)
        except BaseException as error:  # reported by the main thread
            errors.append(error)
            start_line.abort()

    threads = [threading.Thread(target=client_thread, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    start_line.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"a client thread failed against {url}: {errors[0]!r}") from errors[0]
    return wall, [x for per in latencies for x in per], [x for per in rewards for x in per]


def health_counts(url: str) -> tuple[int, int]:
    with RewardClient(url) as client:
        health = client.health()
    return int(health["requests"]), int(health["batches"])


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def measure(settings: list[Setting], urls: list[str], jobs: list[list[Pairs]], args: argparse.Namespace) -> None:
    for url in urls:
        run_round(url, jobs, args.pairs)  # warm-up: first forward passes, connection set-up
    before = [health_counts(url) for url in urls]
    for _ in range(args.rounds):
        for setting, url in zip(settings, urls):  # alternate: drifting load hits both alike
            wall, latencies, rewards = run_round(url, jobs, args.pairs)
            setting.throughputs.append(args.clients * args.requests * args.pairs / wall)
            setting.latencies += latencies
            setting.rewards = rewards
    for setting, url, (requests, batches) in zip(settings, urls, before):
        now_requests, now_batches = health_counts(url)
        setting.requests, setting.batches = now_requests - requests, now_batches - batches


def report(settings: list[Setting]) -> None:
    baseline = statistics.median(settings[0].throughputs)
    print(f"{'server':34s} {'pairs/s':>8s} {'IQR':>6s} {'p50 ms':>7s} {'p95 ms':>7s} "
          f"{'requests':>8s} {'batches':>7s} {'req/batch':>9s} {'x unbatched':>11s}")  # fmt: skip
    for s in settings:
        q1, median, q3 = statistics.quantiles(s.throughputs, n=4, method="inclusive")
        print(f"{s.name:34s} {median:8.0f} {q3 - q1:6.0f} {1000 * percentile(s.latencies, 50):7.1f} "
              f"{1000 * percentile(s.latencies, 95):7.1f} {s.requests:8d} {s.batches:7d} "
              f"{s.requests / max(s.batches, 1):9.1f} {median / baseline:11.2f}")  # fmt: skip
    gap = max(abs(a - b) for a, b in zip(settings[0].rewards, settings[1].rewards))
    print(f"\nsame rewards from both servers: max |difference| = {gap:.2e} over {len(settings[0].rewards)} pairs")


def main() -> None:
    args = parse_args()
    world = find_world(args.seed)
    print(f"cores={os.cpu_count()} load average (1/5/15 min)={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    jobs = workload(rendered_prompts(world), args)
    common = ["--model", str(world.reward_model), "--device", "cpu"]
    settings = [
        Setting("unbatched (max_batch=1)", [*common, "--max-batch", "1"]),
        Setting(f"batched (max_batch={args.max_batch}, wait={args.max_wait_ms:g}ms)",
                [*common, "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms)]),
    ]  # fmt: skip
    print(f"reward model {world.reward_model} on cpu; server env {' '.join(f'{k}={v}' for k, v in SERVER_ENV.items())}")
    print(
        f"workload per round: {args.clients} client threads x {args.requests} requests x {args.pairs} pairs "
        f"= {args.clients * args.requests * args.pairs} pairs; {args.rounds} timed rounds per server, alternating\n"
    )

    with tempfile.TemporaryDirectory(prefix="bench-rm-") as logs, ExitStack() as servers:
        urls = []
        for i, setting in enumerate(settings):
            server = LocalServer(SERVER_MODULE, setting.server_args, log_path=Path(logs) / f"server{i}.log",
                                 env=SERVER_ENV, startup_timeout_s=180)  # fmt: skip
            urls.append(servers.enter_context(server).url)
        measure(settings, urls, jobs, args)
    report(settings)
    print(f"load average at the end={' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
