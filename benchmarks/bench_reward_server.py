"""The reward-model server under load: throughput at 64 and 256 clients, and one very large request.

Real servers (`python -m rlsteps.engine.rewards.rm`, LocalServer subprocesses on loopback, CPU,
OMP_NUM_THREADS=1) serve the tiny world's reward model to client threads in this process, each a
RewardClient with the step config's defaults (rm.max_retries 5, rm.backoff_s 1.0, so a client gives up
as a training run would) and one request of P pairs at a time. Prompts are the tiny world's train.jsonl
rendered with its chat template, responses short sentences from rlsteps.tiny.task.

  load  one server per client count C, all started first. C clients send requests of P pairs back to
        back for S seconds; R rounds, the client counts taking turns (drifting load on a shared machine
        hits all alike). useful pairs/s: pairs answered 200 within the window / S (median of the rounds);
        of peak: against the best client count; answers: every HTTP answer the clients got, the 503s among
        them; gave up: calls that raised after all their retries; latency: one score() call, retries and
        waits included; srv CPU: the server's CPU time per second of window (median); RSS: the server's
        VmRSS after the warm-up and after the last round (plus 2 s).
  big   per --big-server-args string, a fresh server: 16 clients send requests of P pairs while one request
        of about B MB (500 pairs of long prompts) is posted, 1 s in. blocked: the longest call of the small
        clients that overlapped the big request (beside their p50 otherwise); RSS sampled every 20 ms.

    python benchmarks/bench_reward_server.py                     # about 3 minutes on 2 cores
    python benchmarks/bench_reward_server.py --clients 16 64 256 --seconds 8 --rounds 3
    python benchmarks/bench_reward_server.py --big-server-args "" "--max-request-mb 16" --clients 64

The client threads share the machine with the servers: on a 2-core machine the figures are those of the
whole loopback system, not of a server alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rlsteps.engine.rewards.process import LocalServer
from rlsteps.engine.rewards.rm.client import RewardClient, RewardError
from rlsteps.tiny import task as tiny_task
from rlsteps.tiny.layout import TinyWorld, tiny_world_paths

SERVER_MODULE = "rlsteps.engine.rewards.rm"
SERVER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
BUILD_HINT = "python -c 'from rlsteps.tiny.build import ensure_tiny_world; ensure_tiny_world()'"
CLIENT_OPTIONS = {"max_retries": 5, "backoff_s": 1.0, "timeout_s": 60}  # steps/rl/reward_model.yaml
SETTLE_S = 2.0
BIG_PAIRS = 500
BIG_SMALL_CLIENTS = 16
STOP = threading.Event()  # set at the end of a timed window: client threads send no new request

Pairs = tuple[list[str], list[str]]  # (prompts, responses) of one request


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 256], help="client counts, one scenario each")
    parser.add_argument("--pairs", type=int, default=16, help="(prompt, response) pairs per request")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one timed window")
    parser.add_argument("--rounds", type=int, default=2, help="timed windows per client count")
    parser.add_argument("--big-mb", type=float, default=10.0, help="size of the big request's body (0: skip)")
    parser.add_argument("--server-args", default="", help="extra server options for every scenario (one string)")
    parser.add_argument(
        "--big-server-args", nargs="*", default=["", "--max-request-mb 16"],
        help="one big-request scenario per string: its extra server options ('' = defaults)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="the tiny world's seed")
    args = parser.parse_args()
    if min(args.clients) < 1 or args.pairs < 1 or args.rounds < 1 or args.seconds <= 0:
        parser.error("--clients, --pairs and --rounds must be >= 1 and --seconds > 0")
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


def requests_for(prompts: list[str], pairs: int, count: int, rng: random.Random) -> list[Pairs]:
    out = []
    for _ in range(count):
        chosen = rng.choices(prompts, k=pairs)
        out.append((chosen, [tiny_task.sample_response(rng, tiny_task.prompt_noun(p)) for p in chosen]))
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def counting_client(url: str, pairs: int, answers: Counter, lock: threading.Lock) -> RewardClient:
    """A RewardClient that counts every HTTP answer it gets (retries included) by status."""
    client = RewardClient(url, batch_size=pairs, concurrency=1, **CLIENT_OPTIONS)

    def count(response: httpx.Response) -> None:
        with lock:
            answers[response.status_code] += 1

    client._http.event_hooks = {"response": [count]}  # a benchmark may look inside
    return client


@dataclass
class Calls:
    """What client threads saw: (start, end, pairs, ok) per score() call, and every HTTP answer by status."""

    spans: list[tuple[float, float, int, bool]] = field(default_factory=list)
    answers: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run_clients(self, url: str, work: list[list[Pairs]], barrier: threading.Barrier) -> list[threading.Thread]:
        """One thread per client, each sending its requests in turn from the barrier until STOP is set."""

        def client_thread(requests: list[Pairs]) -> None:
            with counting_client(url, len(requests[0][0]), self.answers, self.lock) as client:
                barrier.wait()
                i = 0
                while not STOP.is_set():
                    prompts, responses = requests[i % len(requests)]
                    i += 1
                    sent = time.perf_counter()
                    try:
                        client.score(prompts, responses)
                        ok = True
                    except RewardError:
                        ok = False
                    with self.lock:
                        self.spans.append((sent, time.perf_counter(), len(prompts), ok))

        threads = [threading.Thread(target=client_thread, args=(w,), daemon=True) for w in work]
        for t in threads:
            t.start()
        return threads


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def start_server(model: Path, logs: Path, name: str, extra: str) -> LocalServer:
    server_args = ["--model", str(model), "--device", "cpu", *shlex.split(extra)]
    server = LocalServer(SERVER_MODULE, server_args, log_path=logs / f"{name}.log", env=SERVER_ENV,
                         startup_timeout_s=180)  # fmt: skip
    server.start()
    return server


def warm_up(url: str, requests: list[Pairs]) -> None:
    with RewardClient(url, batch_size=len(requests[0][0]), **CLIENT_OPTIONS) as client:
        for prompts, responses in requests[:8]:
            client.score(prompts, responses)


@dataclass
class Load:
    """One client count against its own server; rounds alternate between the client counts."""

    clients: int
    server: LocalServer
    work: list[list[Pairs]]
    rss_before: float = 0.0
    rss_after: float = 0.0
    throughputs: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    answers: Counter = field(default_factory=Counter)
    gave_up: int = 0
    calls: int = 0
    server_cpu: list[float] = field(default_factory=list)  # server CPU seconds per second of window

    def run_round(self, seconds: float) -> None:
        record = Calls()
        barrier = threading.Barrier(self.clients + 1)
        threads = record.run_clients(self.server.url, self.work, barrier)
        barrier.wait()
        cpu = cpu_s(self.server.process.pid)
        until = time.perf_counter() + seconds
        time.sleep(seconds)
        self.server_cpu.append((cpu_s(self.server.process.pid) - cpu) / seconds)
        STOP.set()
        for t in threads:
            t.join()
        STOP.clear()
        self.throughputs.append(sum(n for _, end, n, ok in record.spans if ok and end <= until) / seconds)
        self.latencies += [end - sent for sent, end, _, ok in record.spans if ok]
        self.answers += record.answers
        self.gave_up += sum(not ok for *_, ok in record.spans)
        self.calls += len(record.spans)

    def row(self, pairs: int) -> dict:
        return {
            "clients": self.clients, "pairs": pairs, "pairs_per_s": statistics.median(self.throughputs),
            "rounds": self.throughputs, "503": self.answers[503], "answers": sum(self.answers.values()),
            "other": {k: v for k, v in self.answers.items() if k not in (200, 503)}, "gave_up": self.gave_up,
            "calls": self.calls, "p50": percentile(self.latencies, 50), "p99": percentile(self.latencies, 99),
            "rss_before": self.rss_before, "rss_after": self.rss_after,
            "server_cpu": statistics.median(self.server_cpu),
        }  # fmt: skip


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_scenarios(model: Path, logs: Path, prompts: list[str], args: argparse.Namespace) -> list[dict]:
    """A server per client count, all started first; then the rounds, each client count in turn."""
    rng = random.Random(args.seed)
    loads: list[Load] = []
    try:
        for clients in args.clients:
            server = start_server(model, logs, f"load{clients}", args.server_args)
            work = [requests_for(prompts, args.pairs, 8, rng) for _ in range(clients)]
            loads.append(Load(clients, server, work))
        for load in loads:
            warm_up(load.server.url, load.work[0])
            load.rss_before = rss_mb(load.server.process.pid)
        for _ in range(args.rounds):
            for load in loads:
                load.run_round(args.seconds)
                time.sleep(SETTLE_S)
        for load in loads:
            load.rss_after = rss_mb(load.server.process.pid)
    finally:
        for load in loads:
            load.server.stop()
    return [load.row(args.pairs) for load in loads]


def big_body(prompts: list[str], megabytes: float, rng: random.Random) -> dict:
    """About `megabytes` of JSON: BIG_PAIRS pairs, each prompt a chat-templated prompt repeated to length."""
    per_pair = int(megabytes * 1e6 / BIG_PAIRS)
    long_prompts, responses = [], []
    for _ in range(BIG_PAIRS):
        base = rng.choice(prompts)
        long_prompts.append((base * (per_pair // len(base) + 1))[:per_pair])
        responses.append(tiny_task.sample_response(rng, tiny_task.prompt_noun(base)))
    return {"prompts": long_prompts, "responses": responses}


def big_scenario(model: Path, logs: Path, prompts: list[str], args: argparse.Namespace, big_args: str) -> dict:
    rng = random.Random(args.seed)
    work = [requests_for(prompts, args.pairs, 8, rng) for _ in range(BIG_SMALL_CLIENTS)]
    payload = json.dumps(big_body(prompts, args.big_mb, rng)).encode()
    extra = f"{args.server_args} {big_args}".strip()
    server = start_server(model, logs, "big", extra)
    try:
        warm_up(server.url, work[0])
        pid = server.process.pid
        rss_before = rss_mb(pid)
        peak = [rss_before]
        sampling = threading.Event()

        def sample_rss() -> None:
            while not sampling.wait(0.02):
                peak[0] = max(peak[0], rss_mb(pid))

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        record = Calls()
        barrier = threading.Barrier(BIG_SMALL_CLIENTS + 1)
        threads = record.run_clients(server.url, work, barrier)
        barrier.wait()
        time.sleep(1.0)
        big_sent = time.perf_counter()
        try:
            answer = httpx.post(f"{server.url}/v1/rewards", content=payload,
                                headers={"Content-Type": "application/json"}, timeout=300)  # fmt: skip
            big_status = str(answer.status_code)
        except httpx.HTTPError as error:  # a server may close the connection on an oversize body
            big_status = type(error).__name__
        big_done = time.perf_counter()
        time.sleep(max(0.0, args.seconds - (big_done - big_sent) - 1.0))
        STOP.set()
        for t in threads:
            t.join()
        STOP.clear()
        time.sleep(SETTLE_S)
        sampling.set()
        sampler.join()
        rss_after = rss_mb(pid)
    finally:
        server.stop()
    overlapping = [end - sent for sent, end, _, ok in record.spans if ok and sent < big_done and end > big_sent]
    alone = [end - sent for sent, end, _, ok in record.spans if ok and (end < big_sent or sent > big_done)]
    return {
        "server_args": big_args or "(defaults)", "mb": len(payload) / 1e6, "status": big_status,
        "big_s": big_done - big_sent,
        "blocked": max(overlapping, default=0.0), "small_p50": percentile(alone, 50),
        "gave_up": sum(not ok for *_, ok in record.spans), "calls": len(record.spans),
        "rss_before": rss_before, "rss_peak": peak[0], "rss_after": rss_after,
    }  # fmt: skip


def report(loads: list[dict], bigs: list[dict]) -> None:
    peak = max(r["pairs_per_s"] for r in loads)
    print(f"{'clients':>7s} {'pairs/req':>9s} {'useful pairs/s':>14s} {'of peak':>7s} {'503 / answers':>16s} "
          f"{'gave up':>9s} {'p50 s':>6s} {'p99 s':>6s} {'RSS MB before/after':>20s} {'srv CPU':>7s}  "
          "rounds")  # fmt: skip
    for r in loads:
        other = f" (+{r['other']})" if r["other"] else ""
        print(f"{r['clients']:7d} {r['pairs']:9d} {r['pairs_per_s']:14.0f} {r['pairs_per_s'] / peak:7.0%} "
              f"{r['503']:>7d} / {r['answers']:<6d} {r['gave_up']:>4d}/{r['calls']:<4d} {r['p50']:6.2f} "
              f"{r['p99']:6.2f} {r['rss_before']:9.0f} / {r['rss_after']:<8.0f} {r['server_cpu']:7.0%}  "
              f"{' '.join(f'{x:.0f}' for x in r['rounds'])}{other}")  # fmt: skip
    for big in bigs:
        print(
            f"\nbig request, server {big['server_args']}: {big['mb']:.1f} MB, {BIG_PAIRS} pairs, answered "
            f"{big['status']} in {big['big_s']:.2f} s; {BIG_SMALL_CLIENTS} small clients blocked up to "
            f"{big['blocked']:.2f} s (their p50 otherwise {big['small_p50']:.2f} s, {big['gave_up']} of {big['calls']} "
            f"calls gave up); server RSS {big['rss_before']:.0f} MB before, {big['rss_peak']:.0f} MB peak, "
            f"{big['rss_after']:.0f} MB after"
        )


def main() -> None:
    args = parse_args()
    world = find_world(args.seed)
    print(f"cores={os.cpu_count()} load average (1/5/15 min)={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"reward model {world.reward_model} on cpu; server env {' '.join(f'{k}={v}' for k, v in SERVER_ENV.items())}"
          f"; server args {args.server_args or '(defaults)'}")  # fmt: skip
    prompts = rendered_prompts(world)
    with tempfile.TemporaryDirectory(prefix="bench-rm-") as tmp:
        logs = Path(tmp)
        loads = load_scenarios(world.reward_model, logs, prompts, args)
        cases = args.big_server_args if args.big_mb > 0 else []
        bigs = [big_scenario(world.reward_model, logs, prompts, args, case) for case in cases]
    report(loads, bigs)
    print(f"load average at the end={' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
