"""The judge client: scores groups of responses with a judge LLM behind an OpenAI-compatible chat API.

Each pair is shown both ways round (judge.both_orders) unless the judge says, in its entry of GET {base_url}/models,
that its verdicts do not depend on which response is shown first (`"rlsteps": {"position_independent": true}`, as
`rlsteps serve judge` says of itself: it scores each response on its own). Shown the other way round, such a judge
answers the mirror of its first verdict, so the second order is skipped: the rewards are the ones both orders give,
in half the requests. A judge that says nothing (vLLM, NIM, NeMo-Gym) is shown both orders.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from rlsteps.engine.rewards.json_post import TransportError, json_poster
from rlsteps.engine.rewards.judge.parsing import (
    JudgeParseError,
    parse_judgement,
    shorten,
)
from rlsteps.engine.rewards.judge.protocol import (
    RESPONSE_FORMATS,
    Judgement,
    comparison_pairs,
    judge_messages,
)
from rlsteps.engine.rewards.judge.scoring import group_rewards, verdict_stats
from rlsteps.engine.rewards.waiting import Waiting, minutes

log = logging.getLogger(__name__)
MODELS_TIMEOUT_S = 5.0  # the one question to /v1/models; unanswered in time, both orders (it adds this much at most)
NO_RETRY_STATUS = {400, 401, 403, 404, 405, 422}  # the request itself is wrong: retrying cannot help
START_ONE = (
    "start the judge server (rlsteps serve judge --model PATH, or vLLM) or fix the judge URL, model name and API key"
)


class JudgeUnavailable(RuntimeError):
    """Every comparison of a step failed at the transport level: the judge is down or unreachable."""


class JudgeAnswersUnusable(JudgeUnavailable):
    """The judge answers, but too many of its answers hold no judgement: its rewards cannot be trusted."""


@dataclass
class JudgeAnswer:
    """One comparison's outcome: the judge's last answer, and why it did not count when it did not."""

    group: int
    pair: tuple[int, int]
    content: str | None  # the raw text of the last answer; None when no answer arrived
    failure: str | None  # None, "parse" or "transport"
    error: str = ""  # the parse or transport error of the last attempt

    def as_record(self) -> dict:
        return {"pair": list(self.pair), "answer": self.content, "outcome": self.failure or "ok", "error": self.error}


@dataclass
class JudgeResult:
    rewards: list[list[float]]  # [groups][responses]
    valid: list[list[bool]]  # False: no successful comparison, mask the response out of the loss
    stats: dict[str, float] = field(default_factory=dict)
    answers: list[JudgeAnswer] = field(default_factory=list)  # one per comparison, in order

    @property
    def parse_failure_rate(self) -> float:
        return sum(a.failure == "parse" for a in self.answers) / len(self.answers) if self.answers else 0.0


@dataclass
class _Outcome:
    judgement: Judgement | None
    failure: str | None  # None, "parse" or "transport"
    retries: int
    latencies: list[float]
    error: str = ""
    content: str | None = None


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
        both_orders: bool = True,
        principle: str | None = None,
        structured_output: str = "json_schema",
        extra_body: dict | None = None,
        unavailable_fix: str = START_ONE,
    ):
        comparison_pairs(2, pairing)  # fail early on an unknown pairing
        if structured_output not in RESPONSE_FORMATS:
            choices = ", ".join(RESPONSE_FORMATS)
            raise ValueError(f"unknown structured_output {structured_output!r}: use one of {choices}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.models_url = base_url.rstrip("/") + "/models"
        self.model = model
        self.concurrency = max(1, concurrency)
        self.max_retries, self.retry_sleep_s, self.timeout_s = max_retries, retry_sleep_s, timeout_s
        self.unavailable_fix = unavailable_fix
        response_format = RESPONSE_FORMATS[structured_output]
        # extra_body is merged last, as the OpenAI client does: server-specific keys (guided decoding, chat
        # template arguments) and overrides of the ones before it
        self.request_options = {
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
            **({"response_format": response_format} if response_format else {}),
            **(extra_body or {}),
        }
        self.pairing = pairing
        self.both_orders = both_orders  # each pair is also shown the other way round, its two verdicts averaged
        self.position_independent: bool | None = None  # what the judge says of itself, asked at the first call
        self.principle = principle
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._poster = json_poster(self.url, self.headers, timeout_s, self.concurrency)

    def close(self) -> None:
        self._poster.close()

    def patience_s(self) -> float:
        """How long a judge may give no answer at all before a step's scoring gives up: one comparison's every
        attempt taking its whole timeout, and the pauses. It bounds the whole step's comparisons, not each one: once
        the judge has been silent this long, no comparison starts another attempt, and none waits past it."""
        comparison = (1 + self.max_retries) * self.timeout_s + self.max_retries * self.retry_sleep_s
        return comparison + self._position_question_s()

    def _position_question_s(self) -> float:
        """The longest the one question to /v1/models may take, while it is still to be asked (the first call)."""
        pending = self.both_orders and self.position_independent is None
        return min(self.timeout_s, MODELS_TIMEOUT_S) if pending else 0.0

    def patience(self) -> str:
        """The patience in words, as the run states it where it starts."""
        return (
            f"each comparison waits up to {self.timeout_s:g}s and is tried {1 + self.max_retries} times "
            f"(judge.timeout_s, judge.max_retries): a judge that stops answering stops the run within "
            f"{minutes(self.patience_s())}, all of a step's comparisons together"
        )

    def __enter__(self) -> JudgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def judge(self, groups: list[tuple[list[dict[str, str]], list[str]]]) -> JudgeResult:
        """Rewards for each (conversation, responses) group.

        The call's comparisons go out as one burst, `concurrency` requests in flight at once (each comparison is
        one chat completion, the only unit an OpenAI-compatible server takes), each worker taking the next as
        soon as its own is answered, so a server that batches concurrent requests (vLLM, `rlsteps serve judge`)
        scores them together; answers, rewards and failures are kept in the comparisons' order.
        A conversation is the prompt's chat messages ({"role", "content"}), never a rendered template.
        """
        waiting = Waiting(f"the judge at {self.url}", self.patience_s(), 1 + self.max_retries)
        with waiting:  # said while it lasts, the question of the first call to /v1/models included
            both_orders = self.shows_both_orders()
            pairs = [comparison_pairs(len(responses), self.pairing, both_orders) for _, responses in groups]
            jobs = [(g, pair) for g, group_pairs in enumerate(pairs) for pair in group_pairs]
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                outcomes = list(pool.map(lambda job: self._compare(groups[job[0]], job[1], waiting), jobs))
        if outcomes and all(o.failure == "transport" for o in outcomes):
            raise JudgeUnavailable(
                f"the judge at {self.url} failed all {len(outcomes)} comparisons after "
                f"{1 + self.max_retries} attempts each (last error: {outcomes[-1].error}); {self.unavailable_fix}"
            )
        by_group: list[list[Judgement | None]] = [[] for _ in groups]
        for (g, _), outcome in zip(jobs, outcomes):
            by_group[g].append(outcome.judgement)
        scored = [group_rewards(len(responses), pairs[g], by_group[g]) for g, (_, responses) in enumerate(groups)]
        answers = [JudgeAnswer(g, pair, o.content, o.failure, o.error) for (g, pair), o in zip(jobs, outcomes)]
        stats = _stats(outcomes)
        if self.position_independent:  # which position won is then the data's doing, not the judge's
            stats.pop("first_position_rate", None)
        return JudgeResult(rewards=[r for r, _ in scored], valid=[v for _, v in scored], stats=stats, answers=answers)

    def shows_both_orders(self) -> bool:
        """judge.both_orders, unless the judge says its verdicts do not depend on position (asked once, said once)."""
        if not self.both_orders:
            return False
        if self.position_independent is None:
            self.position_independent = self._says_position_independent()
            if self.position_independent:
                log.info(
                    "the judge at %s says its verdicts do not depend on which response is shown first "
                    "(position_independent, at %s): each pair is shown once, which gives the rewards both orders would",
                    self.url,
                    self.models_url,
                )
        return not self.position_independent

    def _says_position_independent(self) -> bool:
        """Whether the judge's entry for our model at GET {base_url}/models says so; False for any other answer."""
        try:
            reply = httpx.get(self.models_url, headers=self.headers, timeout=min(self.timeout_s, MODELS_TIMEOUT_S))
            entries = reply.json().get("data", []) if reply.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and entry.get("id") == self.model:
                extension = entry.get("rlsteps")
                return isinstance(extension, dict) and extension.get("position_independent") is True
        return False

    def _compare(self, group: tuple[str, list[str]], pair: tuple[int, int], waiting: Waiting) -> _Outcome:
        """One comparison with retries on transport errors and unparseable answers."""
        conversation, responses = group
        messages = judge_messages(conversation, responses[pair[0]], responses[pair[1]], self.principle)
        body = {"model": self.model, "messages": messages, **self.request_options}
        latencies: list[float] = []
        failure, error, content = "transport", "", None
        for attempt in range(1 + self.max_retries):
            waiting.attempt(attempt + 1)
            if attempt:
                time.sleep(self.retry_sleep_s)
            if waiting.left_s() <= 0:  # silent for the whole patience: no attempt starts after it
                failure = "transport"
                error = f"no answer from the judge for {minutes(self.patience_s())}" + (f" ({error})" if error else "")
                break
            try:
                start = time.perf_counter()
                reply = self._poster.post(body, timeout_s=min(self.timeout_s, waiting.left_s()))
                latencies.append(time.perf_counter() - start)
                waiting.heard()
                if reply.status >= 400:
                    failure, error = "transport", f"HTTP {reply.status}: {shorten(reply.text)}"
                    if reply.status in NO_RETRY_STATUS:
                        return _Outcome(None, failure, attempt, latencies, error, content)
                    continue
                content = reply.json()["choices"][0]["message"]["content"]
            except TransportError as err:
                failure, error = "transport", str(err)
                continue
            except (ValueError, KeyError, IndexError, TypeError) as err:  # an answer that is no chat completion
                failure, error = "transport", f"{type(err).__name__}: {err}"
                continue
            try:
                return _Outcome(parse_judgement(content), None, attempt, latencies, content=content)
            except JudgeParseError as err:
                failure, error = "parse", str(err)
        return _Outcome(None, failure, attempt, latencies, error, content)


def _stats(outcomes: list[_Outcome]) -> dict[str, float]:
    latencies = [s for o in outcomes for s in o.latencies]
    verdicts = [o.judgement for o in outcomes if o.judgement is not None]
    return {
        **verdict_stats(verdicts),
        "comparisons": float(len(outcomes)),
        "parse_failures": float(sum(o.failure == "parse" for o in outcomes)),
        "transport_failures": float(sum(o.failure == "transport" for o in outcomes)),
        "retries": float(sum(o.retries for o in outcomes)),
        "latency_mean_s": sum(latencies) / len(latencies) if latencies else 0.0,
    }
