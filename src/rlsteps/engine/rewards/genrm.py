"""The generative reward model: a judge LLM compares pairs of responses over an OpenAI-compatible API.

Semantics of NeMo-Gym's genrm_compare: the responses of a prompt are compared in pairs
((i, i+1 mod N) or all pairs); the judge answers {"score_1": 1-5, "score_2": 1-5, "ranking": 1-6};
a tie in the scores is broken with the ranking; a response's reward is the mean of its scores over
its successful comparisons. A response without any successful comparison gets the default score
and is marked invalid, so the training loop masks it out of the loss.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import combinations

import httpx

DEFAULT_SCORE = 3.0
NO_RETRY_STATUS = {400, 401, 403, 404, 405, 422}  # the request itself is wrong: retrying cannot help

SYSTEM_PROMPT = """You are an impartial judge. Compare two responses to the same conversation.
{principle}Rate each response for helpfulness on a scale of 1 (very poor) to 5 (excellent), then rank them:
1 = Response 1 is much better, 2 = better, 3 = slightly better,
4 = Response 2 is slightly better, 5 = better, 6 = much better.
Answer ONLY with a JSON object in a ```json fenced block, exactly:
```json
{{"score_1": <1-5>, "score_2": <1-5>, "ranking": <1-6>}}
```"""

# The user message is these sections in order; parse_judge_request() reads them back.
SECTION_MARKERS = ("[PROMPT]", "[/PROMPT]", "[RESPONSE 1]", "[/RESPONSE 1]", "[RESPONSE 2]", "[/RESPONSE 2]")
_REQUEST_PATTERN = re.compile(
    r"\A\[PROMPT\]\n(?P<prompt>.*)\n\[/PROMPT\]\n\n"
    r"\[RESPONSE 1\]\n(?P<response_1>.*)\n\[/RESPONSE 1\]\n\n"
    r"\[RESPONSE 2\]\n(?P<response_2>.*)\n\[/RESPONSE 2\]\Z",
    re.DOTALL,
)
_FENCED_JSON = re.compile(r"```(?:json)?[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


class JudgeParseError(ValueError):
    """The judge's answer holds no valid {score_1, score_2, ranking} object."""


class JudgeUnavailable(RuntimeError):
    """Every comparison of a step failed at the transport level: the judge is down or unreachable."""


@dataclass(frozen=True)
class Judgement:
    score_1: float  # 1-5
    score_2: float  # 1-5
    ranking: float  # 1 = response 1 much better ... 6 = response 2 much better


@dataclass
class JudgeResult:
    rewards: list[list[float]]  # [groups][responses]
    valid: list[list[bool]]  # False: no successful comparison, mask the response out of the loss
    stats: dict[str, float] = field(default_factory=dict)


def comparison_pairs(n: int, mode: str) -> list[tuple[int, int]]:
    """Which responses of a group of n are compared: "circular" (i, i+1 mod n) or "all" pairs."""
    if mode == "all":
        return list(combinations(range(n), 2))
    if mode == "circular":
        if n < 2:
            return []
        return [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]
    raise ValueError(f"unknown pairing {mode!r}: use 'circular' or 'all'")


def judge_messages(prompt: str, response_1: str, response_2: str, principle: str | None) -> list[dict]:
    """The chat request that asks the judge to compare two responses to `prompt`."""
    principle_line = f"Judge by this principle: {principle}\n" if principle else ""
    user = (
        f"[PROMPT]\n{prompt}\n[/PROMPT]\n\n"
        f"[RESPONSE 1]\n{response_1}\n[/RESPONSE 1]\n\n"
        f"[RESPONSE 2]\n{response_2}\n[/RESPONSE 2]"
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(principle=principle_line)},
        {"role": "user", "content": user},
    ]


def parse_judge_request(messages: list[dict]) -> tuple[str, str, str]:
    """(prompt, response_1, response_2) from messages built by judge_messages().

    Raises ValueError naming what is missing when the request was not built that way.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("'messages' must be a list of {role, content} objects")
    users = [m for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]
    if not users:
        raise ValueError("the request has no user message with text content")
    match = _REQUEST_PATTERN.match(users[-1]["content"])
    if match is None:
        raise ValueError(
            "the user message is not a judge request: it must hold the sections "
            + ", ".join(SECTION_MARKERS)
            + " in order, as rlsteps.engine.rewards.genrm.judge_messages() writes them"
        )
    return match["prompt"], match["response_1"], match["response_2"]


def parse_judgement(text: str) -> Judgement:
    """The judgement in a judge's answer: a fenced ```json block first, else the last {...} that parses."""
    if not isinstance(text, str) or not text.strip():
        raise JudgeParseError("the judge answered with empty content")
    fenced = [obj for block in _FENCED_JSON.findall(text) for obj in _json_objects(block)]
    fields = _last_judgement_fields(fenced) or _last_judgement_fields(_json_objects(text))
    if fields is None:
        cause = "no JSON object with score_1, score_2 and ranking" if "{" in text else "no JSON object"
        raise JudgeParseError(f"{cause} in the judge's answer: {_shorten(text)!r}")
    values, quoted = {}, repr(_shorten(text))
    for key, high in (("score_1", 5), ("score_2", 5), ("ranking", 6)):
        try:
            values[key] = _number(fields[key])
        except (TypeError, ValueError):
            raise JudgeParseError(f"{key}={fields[key]!r} is not a number in the judge's answer: {quoted}") from None
        if not 1 <= values[key] <= high:
            raise JudgeParseError(f"{key}={values[key]:g} is outside 1-{high} in the judge's answer: {quoted}")
    return Judgement(**values)


def _json_objects(text: str) -> list[dict]:
    """Every outermost {...} of `text` that parses as a JSON object, in order."""
    decoder, objects, start = json.JSONDecoder(), [], text.find("{")
    while start != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            objects.append(obj)
        start = text.find("{", end)
    return objects


def _last_judgement_fields(objects: list[dict]) -> dict | None:
    """The last object holding the three fields, itself or in a nested "overall" object."""
    keys = ("score_1", "score_2", "ranking")
    holders = [h for obj in objects for h in (obj, obj.get("overall")) if isinstance(h, dict)]
    return next((h for h in reversed(holders) if all(k in h for k in keys)), None)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(value)
    return float(value)


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[: limit // 2]} ... {text[-limit // 2 :]}"


def pair_scores(j: Judgement) -> tuple[float, float]:
    """The two responses' scores; a tie is broken with the ranking (3.5 is neutral)."""
    s1, s2 = j.score_1, j.score_2
    if s1 == s2:
        adjustment = 3.5 - j.ranking
        s1, s2 = s1 + adjustment, s2 - adjustment
    return s1, s2


def group_rewards(
    n: int, pairs: list[tuple[int, int]], judgements: list[Judgement | None]
) -> tuple[list[float], list[bool]]:
    """Each response's mean score over its successful comparisons (None = failed) and whether it had one."""
    if len(pairs) != len(judgements):
        raise ValueError(f"{len(pairs)} pairs but {len(judgements)} judgements: pass one judgement (or None) per pair")
    totals, counts = [0.0] * n, [0] * n
    for (i, j), judgement in zip(pairs, judgements):
        if judgement is None:
            continue
        s_i, s_j = pair_scores(judgement)
        totals[i], totals[j] = totals[i] + s_i, totals[j] + s_j
        counts[i], counts[j] = counts[i] + 1, counts[j] + 1
    rewards = [total / count if count else DEFAULT_SCORE for total, count in zip(totals, counts)]
    return rewards, [count > 0 for count in counts]


def length_penalty(rewards: list[float], lengths: list[int], coef: float) -> list[float]:
    """Zero-centred length penalty within a group: r - coef * (len - mean len) / max(mean len, 1)."""
    if coef == 0 or not rewards:
        return list(rewards)
    mean_length = sum(lengths) / len(lengths)
    return [r - coef * (length - mean_length) / max(mean_length, 1.0) for r, length in zip(rewards, lengths)]


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
                failure, error = "transport", f"HTTP {err.response.status_code}: {_shorten(err.response.text)}"
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
