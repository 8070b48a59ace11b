"""Client of a reward-model server: batched, concurrent, retrying, and strict about answers.

It speaks rlsteps's own protocol, vLLM's pooling server or NeMo-Aligner's PyTriton server (apis.py says what
each is sent), with the same batching, retries, timeouts, bearer token and failure rules. It never returns partial
or made-up rewards: every input gets the server's finite reward, or `score` raises a `RewardError` that says what
went wrong and how to fix it.

Retries: an overloaded server answers 503 with Retry-After, its own estimate of when it will have room
(whole seconds); the client waits that long plus up to RETRY_AFTER_JITTER_S more, at random, so that the
clients told the same second do not all come back at the same instant; at most MAX_DELAY_S. A failure
without Retry-After (no connection, a 5xx, a timeout) waits an exponential backoff with jitter, also capped.
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Literal

import httpx

from rlsteps.engine.rewards.rm.apis import APIS, InvalidAnswer, Request
from rlsteps.engine.rewards.waiting import Waiting, minutes

MAX_DELAY_S = 30.0  # cap on one wait between attempts, Retry-After included
RETRY_AFTER_JITTER_S = 1.0  # a Retry-After of s seconds is waited as s to s + this
INVALID_ANSWER_RETRIES = 2  # a server that answers garbage is usually the wrong server: give up soon
RETRIED_STATUS = {429, 500, 502, 503, 504}
UNAVAILABLE_STATUS = {429, 502, 503, 504}  # the server is busy or not there, rather than broken
CONNECT_TIMEOUT_S = 10.0  # the most an attempt waits to connect (a server that is not there refuses at once)


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
        api: str = "rlsteps",
        model: str | None = None,
        unavailable_fix: str | None = None,
    ) -> None:
        """max_length and truncation_side go with every request (the server's own options when None); api is the
        server's protocol (rlsteps, vllm, triton), model its served model's name where it serves several;
        unavailable_fix: what the error says to do when the server stays unreachable (a server this run started:
        rerun; one given by URL: check it; by default, how to start one of the api's kind)."""
        if batch_size < 1 or concurrency < 1 or max_retries < 0 or (max_length is not None and max_length < 1):
            raise ValueError(
                f"need batch_size >= 1, concurrency >= 1, max_retries >= 0, max_length >= 1 or None; "
                f"got {batch_size}, {concurrency}, {max_retries}, {max_length}"
            )
        if truncation_side not in (None, "left", "right"):
            raise ValueError(f"truncation_side must be left, right or None, got {truncation_side!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward server url {url!r} needs a scheme: write http://{url}")
        if api not in APIS:
            raise ValueError(f"unknown reward server api {api!r}: use one of {', '.join(APIS)}")
        self.url = url.rstrip("/")
        self.max_retries, self.backoff_s, self.timeout_s = max_retries, backoff_s, timeout_s
        self.batch_size, self.concurrency = batch_size, concurrency
        self.api = APIS[api](model, max_length, truncation_side)
        start = self.api.start_hint
        self.unavailable_fix = (
            unavailable_fix or f"{start[0].upper()}{start[1:]}, or set rm.url to a server that is running"
        )
        self._eos: str | None = None  # the EOS text the server names, asked once (vLLM's texts end with it)
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
        eos = self._eos_text() if self.api.eos_path and prompts else None
        return self._send(self.api.prompt_requests(list(prompts), list(responses), self.batch_size, eos))

    def score_conversations(
        self, conversations: Sequence[Sequence[dict[str, Any]]], responses: Sequence[str]
    ) -> list[float]:
        """Rewards of (conversation, response) pairs, rendered by the server with the reward model's chat template."""
        if len(conversations) != len(responses):
            raise ValueError(
                f"{len(conversations)} conversations but {len(responses)} responses: give one response per conversation"
            )
        rows = [[dict(message) for message in conversation] for conversation in conversations]
        return self._send(self.api.conversation_requests(rows, list(responses), self.batch_size))

    def score_tokens(self, token_ids: Sequence[Sequence[int]]) -> list[float]:
        return self._send(self.api.token_requests([list(map(int, ids)) for ids in token_ids], self.batch_size))

    def health(self) -> dict[str, Any]:
        """The server's health answer ({"status": "ok"} from a server that answers with an empty body)."""

        def check(response: httpx.Response) -> dict[str, Any]:
            if not response.content:
                return {"status": "ok"}
            answer = _json_of(response)
            if not isinstance(answer, dict):
                raise _Retry.invalid(f"{self.api.health_path} answered {response.text[:200]!r}, not a JSON object")
            return answer

        with self._waiting() as waiting:
            return self._with_retries(lambda: self._get(self.api.health_path), check, threading.Event(), waiting)

    def _eos_text(self) -> str:
        """The EOS text the server's tokenizer has, asked once."""
        if self._eos is None:
            try:
                with self._waiting() as waiting:
                    self._eos = self._with_retries(
                        lambda: self._get(self.api.eos_path),
                        lambda r: self.api.eos_of(_json_of(r)),
                        threading.Event(),
                        waiting,
                    )
            except RewardServerError as error:
                raise RewardServerError(
                    f"{error}; a text's reward is read at the reward tokenizer's EOS, which vLLM names at "
                    f"GET {self.api.eos_path} when started with --enable-tokenizer-info-endpoint (or set "
                    "rm.chat_template=reward_model: vLLM then renders the conversation with the model's chat template)"
                ) from None
        return self._eos

    def _get(self, path: str) -> httpx.Response:
        return self._http.get(f"{self.url}{path}")

    def _send(self, requests: list[Request]) -> list[float]:
        """Send the requests concurrently; on the first failure stop the others and raise it."""
        if not requests:
            return []
        with self._waiting() as waiting:
            return self._send_waiting(requests, waiting)

    def _send_waiting(self, requests: list[Request], waiting: Waiting) -> list[float]:
        abort = threading.Event()
        if len(requests) == 1:  # no pool (a thread per call) for one request
            return self._send_one(requests[0], abort, waiting)
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            futures = [pool.submit(self._send_one, request, abort, waiting) for request in requests]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:
                abort.set()
                for f in futures:
                    f.cancel()
                raise failed.exception()  # type: ignore[misc]
        return [reward for f in futures for reward in f.result()]

    def _send_one(self, request: Request, abort: threading.Event, waiting: Waiting) -> list[float]:
        def rewards(response: httpx.Response) -> list[float]:
            return self.api.rewards_of(_json_of(response), request.size)

        url = f"{self.url}{request.path}"
        return self._with_retries(lambda: self._http.post(url, json=request.body), rewards, abort, waiting)

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
                return parse(self._checked(send()))
            except InvalidAnswer as error:
                retry = _Retry.invalid(str(error))
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

    def _checked(self, response: httpx.Response) -> httpx.Response:
        """The response if it is a success; a retry for 429/5xx; RewardServerError for any other 4xx."""
        code = response.status_code
        if code < 300:
            return response
        detail = _detail_of(response)
        if code in RETRIED_STATUS:
            wait_s = _retry_after_s(response)
            raise _Retry(f"HTTP {code}: {detail}", unavailable=code in UNAVAILABLE_STATUS, wait_s=wait_s)
        hints = {401: "check the token: rm.token or the server's --token-env", 404: self._not_found_hint()}
        hint = f" ({hints[401 if code == 403 else code]})" if code in (401, 403, 404) else ""
        raise RewardServerError(
            f"{self.api.name} reward server at {self.url} rejected the request with HTTP {code}: {detail}{hint}"
        )

    def _not_found_hint(self) -> str:
        """What a 404 means at this server: an API that can tell (Triton's metadata) asks the server once more."""
        explain = getattr(self.api, "explain_not_found", None)
        if explain is None:
            return self.api.not_found_hint
        try:
            answer = self._get(self.api.metadata_path)
            metadata = answer.json() if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            metadata = None
        return explain(metadata)

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


def _json_of(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise _Retry.invalid(f"the answer is not JSON: {response.text[:200]!r}") from None


def _detail_of(response: httpx.Response) -> str:
    """The reason an error answer gives: FastAPI's "detail", Triton's "error" or vLLM's error's "message"."""
    try:
        answer = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(answer, dict):
        answer = next((answer[k] for k in ("detail", "error") if k in answer), answer)
    detail = answer.get("message", answer) if isinstance(answer, dict) else answer
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
