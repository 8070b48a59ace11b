"""Client of the reward-model server: batched, concurrent, retrying, and strict about answers.

It never returns partial or made-up rewards: every input gets the server's finite reward, or
`score` raises a `RewardError` that says what went wrong and how to fix it.

Retries: an overloaded server answers 503 with Retry-After, its own estimate of when it will have room
(whole seconds); the client waits that long plus up to RETRY_AFTER_JITTER_S more, at random, so that the
clients told the same second do not all come back at the same instant; at most MAX_DELAY_S. A failure
without Retry-After (no connection, a 5xx, a timeout) waits an exponential backoff with jitter, also capped.
"""

from __future__ import annotations

import email.utils
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Literal

import httpx

from rlsteps.engine.rewards.waiting import Waiting, minutes

MAX_DELAY_S = 30.0  # cap on one wait between attempts, Retry-After included
CONNECT_TIMEOUT_S = 10.0  # the most an attempt waits to connect (a server that is not there refuses at once)
START_ONE = (
    "start one with `rlsteps serve rm --model PATH` and point rm.url at it, or set rm.url to a server that is running"
)
RETRY_AFTER_JITTER_S = 1.0  # a Retry-After of s seconds is waited as s to s + this
INVALID_ANSWER_RETRIES = 2  # a server that answers garbage is usually the wrong server: give up soon
RETRIED_STATUS = {429, 500, 502, 503, 504}
UNAVAILABLE_STATUS = {429, 502, 503, 504}  # the server is busy or not there, rather than broken


class RewardError(RuntimeError):
    pass


class RewardServerError(RewardError):
    """The server answered, but with an error or an invalid answer."""


class RewardServerUnavailable(RewardError):
    """The server could not be reached, timed out, or stayed overloaded through every retry."""


class _Retry(Exception):
    """A failed attempt worth another try; `unavailable` says which error to raise when tries run out."""

    def __init__(self, reason: str, *, unavailable: bool, invalid_answer: bool = False, wait_s: float = 0.0) -> None:
        super().__init__(reason)
        self.unavailable, self.invalid_answer, self.wait_s = unavailable, invalid_answer, wait_s

    @classmethod
    def invalid(cls, reason: str) -> _Retry:
        return cls(reason, unavailable=False, invalid_answer=True)


class RewardClient:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 30,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        batch_size: int = 64,
        concurrency: int = 4,
        max_length: int | None = None,
        truncation_side: Literal["left", "right"] | None = None,
        unavailable_fix: str = START_ONE,
    ) -> None:
        """max_length and truncation_side go with every request (the server's own options when None).
        unavailable_fix: what the error says to do when the server stays unreachable (a server this run started:
        rerun; one given by URL: check it)."""
        if batch_size < 1 or concurrency < 1 or max_retries < 0 or (max_length is not None and max_length < 1):
            raise ValueError(
                f"need batch_size >= 1, concurrency >= 1, max_retries >= 0, max_length >= 1 or None; "
                f"got {batch_size}, {concurrency}, {max_retries}, {max_length}"
            )
        if truncation_side not in (None, "left", "right"):
            raise ValueError(f"truncation_side must be left, right or None, got {truncation_side!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward server url {url!r} needs a scheme: write http://{url}")
        self.url = url.rstrip("/")
        self.max_retries, self.backoff_s, self.timeout_s = max_retries, backoff_s, timeout_s
        self.unavailable_fix = unavailable_fix
        self.batch_size, self.concurrency = batch_size, concurrency
        options = {"max_length": max_length, "truncation_side": truncation_side}
        self.request_options = {k: v for k, v in options.items() if v is not None}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=self._connect_s),
            limits=httpx.Limits(max_connections=concurrency),
        )

    @property
    def _connect_s(self) -> float:
        return min(self.timeout_s, CONNECT_TIMEOUT_S)

    def patience_s(self) -> float:
        """The longest a call waits before it gives up: every attempt taking its whole timeout (to connect, then to
        answer), and the longest wait between attempts."""
        waits = sum(min(self.backoff_s * 2**a * 1.5, MAX_DELAY_S) for a in range(self.max_retries))
        return (self.max_retries + 1) * (self.timeout_s + self._connect_s) + waits

    def patience(self) -> str:
        """The patience in words, as the run states it where it starts."""
        return (
            f"each request waits up to {self.timeout_s:g}s and is tried {self.max_retries + 1} times "
            f"(rm.timeout_s, rm.max_retries): a server that stops answering stops the run within "
            f"{minutes(self.patience_s())}"
        )

    def _waiting(self) -> Waiting:
        return Waiting(f"the reward server at {self.url}", self.patience_s(), self.max_retries + 1)

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        """Rewards of (prompt, response) pairs; each prompt rendered as the policy saw it."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses: give one response per prompt")
        return self._score_bodies(self._bodies(prompts=list(prompts), responses=list(responses)))

    def score_conversations(
        self, conversations: Sequence[Sequence[dict[str, Any]]], responses: Sequence[str]
    ) -> list[float]:
        """Rewards of (conversation, response) pairs, rendered by the server with the reward model's chat template."""
        if len(conversations) != len(responses):
            raise ValueError(
                f"{len(conversations)} conversations but {len(responses)} responses: give one response per conversation"
            )
        rows = [[dict(message) for message in conversation] for conversation in conversations]
        return self._score_bodies(self._bodies(conversations=rows, responses=list(responses)))

    def score_tokens(self, token_ids: Sequence[Sequence[int]]) -> list[float]:
        return self._score_bodies(self._bodies(tokens=[list(map(int, ids)) for ids in token_ids]))

    def _bodies(self, **columns: list) -> list[dict[str, Any]]:
        """Request bodies of at most batch_size rows of the given columns, with the request options."""
        rows, n = len(next(iter(columns.values()))), self.batch_size
        return [{**{k: v[i : i + n] for k, v in columns.items()}, **self.request_options} for i in range(0, rows, n)]

    def health(self) -> dict[str, Any]:
        def check(response: httpx.Response) -> dict[str, Any]:
            answer = _json_of(response)
            if not isinstance(answer, dict):
                raise _Retry.invalid(f"/health answered {response.text[:200]!r}, not a JSON object")
            return answer

        with self._waiting() as waiting:
            return self._with_retries(lambda: self._http.get(f"{self.url}/health"), check, threading.Event(), waiting)

    def _score_bodies(self, bodies: list[dict[str, Any]]) -> list[float]:
        """Send the batches concurrently; on the first failure stop the others and raise it."""
        if not bodies:
            return []
        with self._waiting() as waiting:
            return self._score_waiting(bodies, waiting)

    def _score_waiting(self, bodies: list[dict[str, Any]], waiting: Waiting) -> list[float]:
        abort = threading.Event()
        if len(bodies) == 1:  # no pool (a thread per call) for one request
            return self._score_one(bodies[0], abort, waiting)
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies))) as pool:
            futures = [pool.submit(self._score_one, body, abort, waiting) for body in bodies]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:
                abort.set()
                for f in futures:
                    f.cancel()
                raise failed.exception()  # type: ignore[misc]
        return [reward for f in futures for reward in f.result()]

    def _score_one(self, body: dict[str, Any], abort: threading.Event, waiting: Waiting) -> list[float]:
        expected = len(body["tokens"] if "tokens" in body else body["responses"])
        return self._with_retries(
            lambda: self._http.post(f"{self.url}/v1/rewards", json=body),
            lambda response: _rewards_of(response, expected),
            abort,
            waiting,
        )

    def _with_retries(
        self,
        send: Callable[[], httpx.Response],
        parse: Callable[[httpx.Response], Any],
        abort: threading.Event,
        waiting: Waiting,
    ) -> Any:
        """Transport errors, timeouts, 429/5xx and invalid answers are retried (see the module's docstring for
        the waits); other 4xx answers raise at once."""
        started = time.monotonic()
        attempts = invalid_answers = 0
        while True:
            attempts += 1
            waiting.attempt(attempts)
            try:
                return parse(_checked(send(), self.url))
            except httpx.TimeoutException as error:
                retry = _Retry(f"no answer within the timeout ({type(error).__name__})", unavailable=True)
            except httpx.TransportError as error:
                retry = _Retry(f"{type(error).__name__}: {error}", unavailable=True)
            except _Retry as error:
                retry = error
            invalid_answers += retry.invalid_answer
            out_of_retries = attempts > self.max_retries or invalid_answers > INVALID_ANSWER_RETRIES
            if out_of_retries or abort.is_set():
                raise self._give_up(retry, attempts, time.monotonic() - started)
            if abort.wait(self._delay_s(retry, attempts)):
                raise self._give_up(retry, attempts, time.monotonic() - started)

    def _delay_s(self, retry: _Retry, attempts: int) -> float:
        """Retry-After when the server gave one (it knows its queue), with jitter; else exponential backoff."""
        if retry.wait_s > 0:
            delay = retry.wait_s + random.uniform(0.0, RETRY_AFTER_JITTER_S)
        else:
            delay = self.backoff_s * 2 ** (attempts - 1) * random.uniform(0.5, 1.5)
        return min(delay, MAX_DELAY_S)

    def _give_up(self, retry: _Retry, attempts: int, elapsed_s: float) -> RewardError:
        tried = f"{attempts} attempt{'s' * (attempts != 1)} over {elapsed_s:.1f}s"
        if retry.unavailable:
            return RewardServerUnavailable(
                f"reward server at {self.url} unavailable after {tried}; last error: {retry}; {self.unavailable_fix}"
            )
        return RewardServerError(f"reward server at {self.url} failed after {tried}: {retry}")


def _checked(response: httpx.Response, url: str) -> httpx.Response:
    """The response if it is a success; a retry for 429/5xx; RewardServerError for any other 4xx."""
    code = response.status_code
    if code < 300:
        return response
    detail = _detail_of(response)
    if code in RETRIED_STATUS:
        raise _Retry(f"HTTP {code}: {detail}", unavailable=code in UNAVAILABLE_STATUS, wait_s=_retry_after_s(response))
    hint = " (check the token: rm.token or the server's --token-env)" if code in (401, 403) else ""
    raise RewardServerError(f"reward server at {url} rejected the request with HTTP {code}: {detail}{hint}")


def _rewards_of(response: httpx.Response, expected: int) -> list[float]:
    answer = _json_of(response)
    rewards = answer.get("rewards") if isinstance(answer, dict) else None
    if not isinstance(rewards, list):
        raise _Retry.invalid(f'the answer has no "rewards" list: {response.text[:200]!r}')
    if len(rewards) != expected:
        raise _Retry.invalid(f"{len(rewards)} rewards for {expected} inputs")
    bad = [r for r in rewards if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r)]
    if bad:
        raise _Retry.invalid(f"rewards that are not finite numbers: {bad[:5]}")
    return [float(r) for r in rewards]


def _json_of(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise _Retry.invalid(f"the answer is not JSON: {response.text[:200]!r}") from None


def _detail_of(response: httpx.Response) -> str:
    try:
        answer = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    detail = answer.get("detail", answer) if isinstance(answer, dict) else answer
    return str(detail)[:300]


def _retry_after_s(response: httpx.Response) -> float:
    """Seconds from a Retry-After header (seconds or an HTTP date); 0 when absent or unreadable."""
    value = response.headers.get("retry-after")
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return 0.0
