"""The judge client: scores groups of responses with a judge LLM behind an OpenAI-compatible chat API."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from rlsteps.engine.rewards.judge.parsing import (
    JudgeParseError,
    parse_judgement,
    shorten,
)
from rlsteps.engine.rewards.judge.protocol import (
    Judgement,
    comparison_pairs,
    judge_messages,
)
from rlsteps.engine.rewards.judge.scoring import group_rewards

NO_RETRY_STATUS = {400, 401, 403, 404, 405, 422}  # the request itself is wrong: retrying cannot help


class JudgeUnavailable(RuntimeError):
    """Every comparison of a step failed at the transport level: the judge is down or unreachable."""


@dataclass
class JudgeResult:
    rewards: list[list[float]]  # [groups][responses]
    valid: list[list[bool]]  # False: no successful comparison, mask the response out of the loss
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class _Outcome:
    judgement: Judgement | None
    failure: str | None  # None, "parse" or "transport"
    retries: int
    latencies: list[float]
    error: str = ""


class JudgeClient:
    """Scores groups of responses with a judge LLM behind an OpenAI-compatible chat completions API.

    `base_url` ends in /v1, as vLLM, NIM and NeMo-Gym serve it; requests go to {base_url}/chat/completions.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout_s: float = 60,
        max_retries: int = 3,
        retry_sleep_s: float = 0.5,
        temperature: float = 0.6,
        top_p: float = 0.95,
        max_tokens: int = 256,
        pairing: str = "circular",
        principle: str | None = None,
    ):
        comparison_pairs(2, pairing)  # fail early on an unknown pairing
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.concurrency = max(1, concurrency)
        self.max_retries = max_retries
        self.retry_sleep_s = retry_sleep_s
        self.sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        self.pairing = pairing
        self.principle = principle
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        self._http = httpx.Client(headers=headers, timeout=timeout_s, limits=limits)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> JudgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def judge(self, groups: list[tuple[str, list[str]]]) -> JudgeResult:
        """Rewards for each (prompt, responses) group; all comparisons of the call run concurrently."""
        pairs = [comparison_pairs(len(responses), self.pairing) for _, responses in groups]
        jobs = [(g, pair) for g, group_pairs in enumerate(pairs) for pair in group_pairs]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            outcomes = list(pool.map(lambda job: self._compare(groups[job[0]], job[1]), jobs))
        if outcomes and all(o.failure == "transport" for o in outcomes):
            raise JudgeUnavailable(
                f"the judge at {self.url} failed all {len(outcomes)} comparisons after "
                f"{1 + self.max_retries} attempts each (last error: {outcomes[-1].error}); start the judge "
                "server (rlsteps serve judge --model PATH, or vLLM) or fix the judge URL, model name and API key"
            )
        by_group: list[list[Judgement | None]] = [[] for _ in groups]
        for (g, _), outcome in zip(jobs, outcomes):
            by_group[g].append(outcome.judgement)
        scored = [group_rewards(len(responses), pairs[g], by_group[g]) for g, (_, responses) in enumerate(groups)]
        return JudgeResult(rewards=[r for r, _ in scored], valid=[v for _, v in scored], stats=_stats(outcomes))

    def _compare(self, group: tuple[str, list[str]], pair: tuple[int, int]) -> _Outcome:
        """One comparison with retries on transport errors and unparseable answers."""
        prompt, responses = group
        messages = judge_messages(prompt, responses[pair[0]], responses[pair[1]], self.principle)
        body = {"model": self.model, "messages": messages, **self.sampling}
        latencies: list[float] = []
        failure, error = "transport", ""
        for attempt in range(1 + self.max_retries):
            if attempt:
                time.sleep(self.retry_sleep_s)
            try:
                start = time.perf_counter()
                response = self._http.post(self.url, json=body)
                latencies.append(time.perf_counter() - start)
                response.raise_for_status()
                content = response.json()["choices"][0]["message"]["content"]
            except httpx.HTTPStatusError as err:
                failure, error = "transport", f"HTTP {err.response.status_code}: {shorten(err.response.text)}"
                if err.response.status_code in NO_RETRY_STATUS:
                    return _Outcome(None, failure, attempt, latencies, error)
                continue
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as err:
                failure, error = "transport", f"{type(err).__name__}: {err}"
                continue
            try:
                return _Outcome(parse_judgement(content), None, attempt, latencies)
            except JudgeParseError as err:
                failure, error = "parse", str(err)
        return _Outcome(None, failure, self.max_retries, latencies, error)


def _stats(outcomes: list[_Outcome]) -> dict[str, float]:
    latencies = [s for o in outcomes for s in o.latencies]
    return {
        "comparisons": float(len(outcomes)),
        "parse_failures": float(sum(o.failure == "parse" for o in outcomes)),
        "transport_failures": float(sum(o.failure == "transport" for o in outcomes)),
        "retries": float(sum(o.retries for o in outcomes)),
        "latency_mean_s": sum(latencies) / len(latencies) if latencies else 0.0,
    }
