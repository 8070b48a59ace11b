"""The reward-model HTTP server: POST /v1/rewards with fair dynamic batching, GET /health.

Admission, decided before a body is read: 401 without the token; 413 when the body is over
`max_request_mb` (by its Content-Length, or counted as it streams in: an oversize body is never held).
While `max_queue` pairs wait to be scored, a request waits at the door, its body unread, in arrival order
(a client just answered, who sends again at once, queues behind those already waiting), and is let in as
room is made; after DOOR_WAIT_S, or at once when the door already holds more than the server scores in
that time, it gets 503 with Retry-After: the whole seconds until what is ahead of it (the queue, the door
and the clients refused before it, who come back first) has been scored at the throughput measured over
the last batches, so that refused clients are spread over the seconds their work needs.

Scheduling: each admitted request waits in a round-robin with its pairs not yet scored. A batch takes the
first request's next pairs, up to `max_batch` pairs and `max_batch_tokens` tokens, then the next request's,
and so on; a request with pairs left goes to the back, behind the requests that came meanwhile. A large
request is thus scored in pieces between the small ones instead of ahead of them all, and the token budget
keeps a piece of long pairs from making a batch that the small ones wait for many times longer than usual
(a pair's tokens are estimated before tokenising: its characters / 4, at most its max_length). A batch that
is not full waits up to `max_wait_ms` for more. Pairs are tokenised and scored in a thread, one batch at a
time, so the event loop only reads, parses and answers; a reward does not depend on its batch (see
scorer.py), so a request split across batches gets the rewards it would get alone.

Text: a request sends the policy's rendered prompts, or the conversations (scored through the reward
model's own chat template), or token ids. Each pair keeps at most `max_length` tokens, cut from
`truncation_side`: the server's options by default, a request's own fields when it gives them.

Memory: when the queue has stayed empty for a moment after work, the memory freed by the burst is given
back to the system (glibc's malloc_trim; glibc keeps freed heap otherwise), so a peak does not stay.

    rlsteps serve rm --model PATH [--port 5555] [--token-env RM_TOKEN]
    python -m rlsteps.engine.rewards.rm ...         (the same command)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import json
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, PositiveInt, ValidationError, model_validator

from rlsteps.engine.rewards.auth import (
    LIVENESS_PATH,
    TokenGate,
    bearer_matches,
    docs_urls,
    excerpt,
    fields_of,
    validation_errors,
)
from rlsteps.engine.rewards.text import TruncationSide, truncate

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4  # the estimate of a text's tokens before it is tokenised, for the batch's token budget
BATCH_TOKENS_PER_PAIR = 4  # the default max_batch_tokens: max_batch pairs of max_length / this tokens
QUEUE_BATCHES = 4  # the default max_queue holds at least this many full batches,
QUEUE_SECONDS = 1.0  # and as many pairs as the server scores in this time (a Retry-After's worth)
DOOR_WAIT_S = 1.0  # the longest a request waits for room before 503: a Retry-After's worth
RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S = 1, 60
IDLE_BEFORE_TRIM_S = 0.5  # quiet time after work before freed memory is given back
THROUGHPUT_SMOOTHING = 0.3  # weight of the newest batch in the measured pairs/s


class Scorer(Protocol):
    name: str
    vocab_size: int
    max_length: int
    truncation_side: TruncationSide
    has_chat_template: bool

    def encode(
        self, prompts: list[str], responses: list[str], *, max_length: int, truncation_side: TruncationSide
    ) -> list[list[int]]: ...

    def encode_conversations(
        self,
        conversations: list[list[dict[str, Any]]],
        responses: list[str],
        *,
        max_length: int,
        truncation_side: TruncationSide,
    ) -> list[list[int]]: ...

    def score_tokens(self, token_ids: list[list[int]]) -> list[float]: ...


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # a template may read more than role and content
    role: str
    content: str


class RewardsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts: list[str] | None = None  # rendered as the policy saw them
    conversations: list[list[Message]] | None = None  # rendered with the reward model's chat template
    responses: list[str] | None = None
    tokens: list[list[int]] | None = None
    max_length: PositiveInt | None = None  # tokens kept per pair; the server's --max-length when absent
    truncation_side: Literal["left", "right"] | None = None  # the server's --truncation-side when absent

    @model_validator(mode="after")
    def one_kind_of_input(self) -> RewardsRequest:
        given = [name for name in ("prompts", "conversations", "tokens") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError('give either "prompts" or "conversations" (each with "responses"), or "tokens"')
        if self.tokens is not None:
            if self.responses is not None:
                raise ValueError('"responses" go with "prompts" or "conversations", not with "tokens"')
            if any(len(row) == 0 for row in self.tokens):
                raise ValueError('"tokens" has an empty row: every row needs at least one token id')
            return self
        if self.responses is None:
            raise ValueError(f'"{given[0]}" and "responses" must be given together')
        inputs = self.prompts if self.prompts is not None else self.conversations
        if len(inputs) != len(self.responses):
            raise ValueError(
                f'"{given[0]}" and "responses" have different lengths ({len(inputs)} vs {len(self.responses)})'
            )
        return self

    def __len__(self) -> int:
        inputs = next(x for x in (self.tokens, self.prompts, self.conversations, []) if x is not None)
        return len(inputs)


class RewardsResponse(BaseModel):
    rewards: list[float]


class InputError(ValueError):
    """The scorer could not read a request's input (a chat template refused its messages): HTTP 422."""


@dataclass(eq=False)
class _Job:
    """One admitted request: its pairs are scored in slices, its future resolved when the last slice is."""

    request: RewardsRequest
    future: asyncio.Future[list[float]]
    max_length: int
    truncation_side: TruncationSide
    size: int
    costs: list[int]  # [size] estimated tokens per pair
    taken: int = 0  # pairs already put into a batch
    scored: int = 0
    rewards: list[float] = field(default_factory=list)

    def encode(self, scorer: Scorer, start: int, stop: int) -> list[list[int]]:
        """Token ids of pairs [start, stop), truncated: runs in the scoring thread."""
        r, options = self.request, {"max_length": self.max_length, "truncation_side": self.truncation_side}
        if r.tokens is not None:
            return [truncate(ids, self.max_length, self.truncation_side) for ids in r.tokens[start:stop]]
        if r.conversations is not None:
            conversations = [[m.model_dump() for m in c] for c in r.conversations[start:stop]]
            return scorer.encode_conversations(conversations, r.responses[start:stop], **options)
        return scorer.encode(r.prompts[start:stop], r.responses[start:stop], **options)


@dataclass
class _Slice:
    job: _Job
    start: int
    stop: int


class FairBatcher:
    """Scores admitted requests in batches formed round-robin across them, one batch at a time, off the loop."""

    def __init__(
        self,
        scorer: Scorer,
        max_batch: int,
        max_wait_s: float,
        max_queue: int | None = None,
        max_batch_tokens: int | None = None,
        trim: Callable[[], None] | None = None,
    ) -> None:
        """max_queue None: QUEUE_BATCHES batches, or QUEUE_SECONDS of the measured throughput if that is more.
        max_batch_tokens None: no token budget."""
        self.scorer, self.max_batch, self.max_wait_s, self.fixed_queue = scorer, max_batch, max_wait_s, max_queue
        self.max_batch_tokens = max_batch_tokens or math.inf
        self.trim = trim or release_free_memory
        self.jobs: deque[_Job] = deque()  # requests with pairs not yet in a batch, in turn order
        self.pending = 0  # pairs admitted and not yet scored (waiting or in the batch being scored)
        self.untaken = 0  # pairs admitted and not yet in a batch
        self.work = asyncio.Event()
        self.door: deque[asyncio.Future[float]] = deque()  # requests waiting for room, unread, in arrival order
        self.reserved = 0.0  # pairs expected of the requests let in whose bodies are not parsed yet
        self.throughput: float | None = None  # pairs/s over the last batches
        self.promised: list[tuple[float, float]] = []  # heap of (when, pairs): refused requests told to come back
        self.promised_pairs = 0.0
        self.requests = self.batches = self.rejected = self.trims = 0
        self.admitted_pairs = 0
        self.scoring_s = 0.0  # time spent tokenising and scoring: busy time

    @property
    def max_queue(self) -> int:
        if self.fixed_queue is not None:
            return self.fixed_queue
        return max(QUEUE_BATCHES * self.max_batch, round((self.throughput or 0.0) * QUEUE_SECONDS))

    def expected_pairs(self) -> float:
        """The pairs of a request whose body is not read yet: the mean so far (a full batch before any)."""
        return self.admitted_pairs / self.requests if self.requests else float(self.max_batch)

    def _has_room(self) -> bool:
        return self.pending + self.reserved < self.max_queue

    async def enter(self, wait_s: float) -> float | None:
        """Let a request in: at once when the queue has room and nobody waits at the door, else in its turn as
        room is made, waiting at most wait_s. Returns the pairs reserved for it (handed to add, or given back
        with leave), or None: refused (the door holds more than the server scores in wait_s, or wait_s passed)."""
        if not self.door and self._has_room():
            return self._reserve()
        if self.throughput and len(self.door) * self.expected_pairs() > self.throughput * wait_s:
            return None
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.door.append(waiter)
        try:
            return await asyncio.wait_for(waiter, wait_s)
        except TimeoutError:
            return waiter.result() if waiter.done() and not waiter.cancelled() else None  # let in as time ran out
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # let in just as the handler was cancelled
                self.leave(waiter.result())
            raise
        finally:
            if waiter in self.door:
                self.door.remove(waiter)

    def leave(self, reserved: float) -> None:
        """Give back the reservation of a request let in but not added (refused, or nothing to score)."""
        self.reserved -= reserved
        self._open_door()

    def _reserve(self) -> float:
        expected = self.expected_pairs()
        self.reserved += expected
        return expected

    def _open_door(self) -> None:
        while self.door and self._has_room():
            waiter = self.door.popleft()
            if not waiter.done():
                waiter.set_result(self._reserve())

    def refuse(self) -> int:
        """Count a refused request; the whole seconds it should wait (its Retry-After): until the queue, the door
        and the requests refused before it, which come back before it, have been scored at the measured
        throughput. Clients told the same wait come back together: this spreads them over the seconds the work
        needs."""
        self.rejected += 1
        if not self.throughput:
            return RETRY_AFTER_MIN_S
        now = time.monotonic()
        while self.promised and self.promised[0][0] <= now:  # those have come back, or given up
            self.promised_pairs -= heapq.heappop(self.promised)[1]
        expected = self.expected_pairs()  # the refused body was not read: a mean request
        at_door = len(self.door) * expected
        ahead = self.pending + self.reserved + at_door + self.promised_pairs + expected
        wait_s = min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(ahead / self.throughput)))
        heapq.heappush(self.promised, (now + wait_s, expected))
        self.promised_pairs += expected
        return wait_s

    def add(
        self, request: RewardsRequest, max_length: int, truncation_side: TruncationSide, reserved: float = 0.0
    ) -> asyncio.Future[list[float]]:
        """Queue a request let in (its reservation becomes its pairs); the future of its rewards. Cancelling it
        (the handler is cancelled) drops the pairs not scored yet."""
        n = len(request)
        self.reserved -= reserved
        future = asyncio.get_running_loop().create_future()
        costs = estimated_tokens(request, max_length)
        job = _Job(request, future, max_length, truncation_side, n, costs, rewards=[0.0] * n)
        self.jobs.append(job)
        self.pending += n
        self.untaken += n
        self.requests += 1
        self.admitted_pairs += n
        self.work.set()
        self._open_door()  # it may hold fewer pairs than were reserved for it
        return future  # cancelled with the handler (the client went away): its pairs are dropped

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        worked = False  # since memory was last given back
        while True:
            if not self.jobs:
                self.work.clear()
                if not worked:
                    await self.work.wait()
                    continue
                try:
                    await asyncio.wait_for(self.work.wait(), IDLE_BEFORE_TRIM_S)
                except TimeoutError:
                    await asyncio.to_thread(self.trim)
                    self.trims += 1
                    worked = False
                continue
            await self._fill(loop)
            slices = self._take()
            if not slices:
                continue
            self.batches += 1
            started = loop.time()
            try:
                results = await asyncio.to_thread(self._score, slices)
            except Exception as error:  # the forward pass failed: HTTP 500 to every request in the batch
                log.exception("scoring a batch of %d pairs failed", sum(s.stop - s.start for s in slices))
                results = [error] * len(slices)
            else:
                self._measure(sum(s.stop - s.start for s in slices), loop.time() - started)
            self.scoring_s += loop.time() - started
            self._deliver(slices, results)
            worked = True

    async def _fill(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait up to max_wait_s for a full batch."""
        deadline = loop.time() + self.max_wait_s
        while self.untaken < self.max_batch:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self.work.clear()
            try:
                await asyncio.wait_for(self.work.wait(), remaining)
            except TimeoutError:
                return

    def _take(self) -> list[_Slice]:
        """The next batch, round-robin: each request in turn gives as many pairs as fit (in pairs and in tokens);
        one with pairs left goes to the back of the line. A batch holds at least one pair, however long."""
        slices: list[_Slice] = []
        room, tokens = self.max_batch, self.max_batch_tokens
        while room and self.jobs:
            job = self.jobs.popleft()
            if job.future.done():  # its client went away, or an earlier piece failed: drop the rest
                left = job.size - job.taken
                self.untaken -= left
                self.pending -= left
                self._open_door()
                continue
            start = stop = job.taken
            while stop < min(job.size, start + room) and (job.costs[stop] <= tokens or not slices and stop == start):
                tokens -= job.costs[stop]
                stop += 1
            if stop == start:  # its next pair does not fit what is left of this batch: it opens the next one
                self.jobs.appendleft(job)
                break
            slices.append(_Slice(job, start, stop))
            job.taken = stop
            self.untaken -= stop - start
            room -= stop - start
            if job.taken < job.size:
                self.jobs.append(job)
        return slices

    def _score(self, slices: list[_Slice]) -> list[list[float] | Exception]:
        """In the scoring thread: encode each piece (a piece the scorer cannot read fails alone), then one
        forward pass over the rest."""
        rows: list[list[int]] = []
        spans: list[tuple[int, int] | Exception] = []
        for s in slices:
            try:
                ids = s.job.encode(self.scorer, s.start, s.stop)
            except Exception as error:  # noqa: BLE001 - e.g. a chat template that refuses the messages
                why = excerpt(str(error), 200)  # a template's message may quote the input
                spans.append(InputError(f"the reward model could not read the input: {type(error).__name__}: {why}"))
                continue
            spans.append((len(rows), len(rows) + len(ids)))
            rows += ids
        rewards = self.scorer.score_tokens(rows) if rows else []
        return [span if isinstance(span, Exception) else rewards[span[0] : span[1]] for span in spans]

    def _deliver(self, slices: list[_Slice], results: list[list[float] | Exception]) -> None:
        for s, result in zip(slices, results):
            self.pending -= s.stop - s.start
            job = s.job
            if job.future.done():
                continue
            if isinstance(result, Exception):
                job.future.set_exception(result)
                continue
            job.rewards[s.start : s.stop] = result
            job.scored += s.stop - s.start
            if job.scored == job.size:
                job.future.set_result(job.rewards)
        self._open_door()

    def _measure(self, pairs: int, seconds: float) -> None:
        if seconds <= 0:
            return
        rate = pairs / seconds
        old = self.throughput
        self.throughput = rate if old is None else (1 - THROUGHPUT_SMOOTHING) * old + THROUGHPUT_SMOOTHING * rate


def estimated_tokens(request: RewardsRequest, max_length: int) -> list[int]:
    """Each pair's tokens as it will be scored, estimated before tokenising (exact for token ids)."""
    if request.tokens is not None:
        return [min(len(ids), max_length) for ids in request.tokens]
    if request.prompts is not None:
        chars = [len(p) + len(r) for p, r in zip(request.prompts, request.responses)]
    else:
        chars = [sum(len(m.content) for m in c) + len(r) for c, r in zip(request.conversations, request.responses)]
    return [min(max_length, 1 + n // CHARS_PER_TOKEN) for n in chars]


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory() -> None:
    """Give the heap memory freed by a burst back to the system: glibc keeps it for reuse otherwise, so the
    server's RSS would stay at its peak. A no-op without glibc."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def create_app(
    scorer: Scorer,
    *,
    max_batch: int = 64,
    max_wait_ms: float = 5,
    max_queue: int | None = None,
    max_batch_tokens: int | None = None,
    max_request_mb: float = 8,
    token: str | None = None,
) -> FastAPI:
    """The app. max_queue: pairs waiting before new requests get 503; None sizes it to QUEUE_BATCHES full
    batches, or to QUEUE_SECONDS of the measured throughput when that is more (a queue of about one
    Retry-After's worth of work keeps a client no longer than a refusal would). max_batch_tokens: the token
    budget of a batch; None: max_batch pairs of a quarter of the scorer's max_length."""
    if max_batch_tokens is None:
        max_batch_tokens = max_batch * max(1, scorer.max_length // BATCH_TOKENS_PER_PAIR)
    if max_batch < 1 or (max_queue is not None and max_queue < 1) or max_wait_ms < 0 or max_request_mb <= 0:
        raise ValueError(
            "need max_batch >= 1, max_queue >= 1, max_wait_ms >= 0, max_request_mb > 0; "
            f"got {max_batch}, {max_queue}, {max_wait_ms}, {max_request_mb}"
        )
    if max_batch_tokens < 1:
        raise ValueError(f"need max_batch_tokens >= 1, got {max_batch_tokens}")
    max_request_bytes = int(max_request_mb * 1_000_000)
    batcher = FairBatcher(scorer, max_batch, max_wait_ms / 1000, max_queue, max_batch_tokens)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    def unauthorised() -> JSONResponse:
        return JSONResponse(
            status_code=401,
            content={"detail": "missing or wrong bearer token: send the header 'Authorization: Bearer <token>'"},
            headers={"WWW-Authenticate": "Bearer"},
        )

    def too_large(size: int | None) -> JSONResponse:
        told = f"({size} bytes) " if size is not None else ""
        return JSONResponse(
            status_code=413,
            content={
                "detail": f"the request body {told}is over the server's limit of {max_request_bytes} bytes "
                f"(--max-request-mb {max_request_mb:g}): send smaller requests (fewer pairs: rm.batch_size)"
            },
        )

    def busy() -> JSONResponse:
        wait_s = batcher.refuse()
        return JSONResponse(
            status_code=503,
            content={
                "detail": f"busy: {batcher.pending} pairs waiting (at most {batcher.max_queue}); retry in {wait_s}s"
            },
            headers={"Retry-After": str(wait_s)},
        )

    app = FastAPI(title="rlsteps reward model", lifespan=lifespan, **docs_urls(token))
    app.add_middleware(TokenGate, token=token, refuse=unauthorised)  # every path but the bare liveness probe

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = validation_errors(error.errors())
        return JSONResponse(status_code=422, content={"detail": errors, "fields": fields_of(errors)})

    @app.post("/v1/rewards", response_model=RewardsResponse)
    async def rewards(request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_request_bytes:
            return too_large(int(declared))  # the body is never read (the server discards it as it arrives)
        reserved = await batcher.enter(DOOR_WAIT_S)
        if reserved is None:
            return busy()  # the body was never read: an overloaded server spends little on a refusal
        queued = None
        try:
            body = await _read_body(request, max_request_bytes)
            if body is None:
                return too_large(None)
            parsed = _parse(body)
            max_length, side = _truncation(parsed, scorer)
            if parsed.tokens is not None:
                check_token_ids(parsed.tokens, scorer.vocab_size)
            if parsed.conversations is not None and not scorer.has_chat_template:
                raise HTTPException(
                    status_code=422,
                    detail=f'the reward model {scorer.name} has no chat template to render "conversations": send '
                    '"prompts" rendered by the policy instead (rm.chat_template: policy)',
                )
            if len(parsed) == 0:
                return _rewards_response([])
            queued = batcher.add(parsed, max_length, side, reserved)
        finally:
            if queued is None:  # refused or answered without scoring: its place goes to the next at the door
                batcher.leave(reserved)
        try:
            return _rewards_response(await queued)
        except InputError as error:
            raise HTTPException(status_code=422, detail=str(error)) from error
        except Exception as error:  # noqa: BLE001 - the scorer failed; the log has the traceback
            raise HTTPException(status_code=500, detail=f"scoring failed: {type(error).__name__}: {error}") from error

    @app.get(LIVENESS_PATH)
    async def health(request: Request) -> dict[str, Any]:
        """Liveness for anyone; the model and the counters only with the token (when one is required)."""
        if not bearer_matches(request.headers.get("authorization", ""), token):
            return {"status": "ok"}
        return {
            "status": "ok",
            "model": scorer.name,
            "requests": batcher.requests,
            "batches": batcher.batches,
            "queue": batcher.pending,
            "waiting": len(batcher.door),
            "max_queue": batcher.max_queue,
            "max_batch_tokens": max_batch_tokens,
            "rejected": batcher.rejected,
            "pairs_per_s": round(batcher.throughput or 0.0, 1),
            "scoring_s": round(batcher.scoring_s, 3),
            "max_length": scorer.max_length,
            "truncation_side": scorer.truncation_side,
            "chat_template": scorer.has_chat_template,
        }

    return app


def _rewards_response(rewards: list[float]) -> Response:
    """The answer, serialised once here (FastAPI would validate the list again against the response model)."""
    return Response(content=json.dumps({"rewards": rewards}), media_type="application/json")


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it grows over `limit` bytes (what is left is discarded unread)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(body: bytes) -> RewardsRequest:
    try:
        return RewardsRequest.model_validate_json(body)
    except ValidationError as error:  # answered 422 like any FastAPI body error
        raise RequestValidationError(error.errors(include_url=False)) from None


def _truncation(request: RewardsRequest, scorer: Scorer) -> tuple[int, TruncationSide]:
    """The request's max_length and truncation side, the server's where it gives none."""
    max_length = request.max_length or scorer.max_length
    if max_length > scorer.max_length:
        raise HTTPException(
            status_code=422,
            detail=f'"max_length" {max_length} is over the server\'s --max-length {scorer.max_length}: ask for at '
            "most that (rm.max_length), or restart the server with a larger --max-length",
        )
    return max_length, request.truncation_side or scorer.truncation_side


def check_token_ids(rows: list[list[int]], vocab_size: int) -> None:
    """Refuse ids outside the vocabulary here: in a batch they would fail every request scored with them."""
    if all(0 <= min(row) and max(row) < vocab_size for row in rows):  # C loops: the common case stays cheap
        return
    bad = [i for row in rows for i in row if not 0 <= i < vocab_size]
    if bad:
        raise HTTPException(
            status_code=422,
            detail=f'"tokens" has ids outside the reward model\'s vocabulary [0, {vocab_size}): '
            + excerpt(str(bad[:5])),
        )


def serve(
    model_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 5555,
    *,
    device: str = "auto",
    dtype: str = "auto",
    max_length: int = 512,
    truncation_side: TruncationSide = "left",
    batch_size: int = 32,
    **app_kwargs: Any,
) -> None:
    """Load the reward model and serve it until interrupted. Loopback only unless `host` says otherwise."""
    import uvicorn

    from rlsteps.engine.rewards.rm.scorer import RewardScorer

    if host not in ("127.0.0.1", "localhost", "::1") and not app_kwargs.get("token"):
        log.warning("serving on %s without a token: anyone who can reach this port can use the model", host)
    scorer = RewardScorer(
        model_path,
        device=device,
        dtype=dtype,
        max_length=max_length,
        batch_size=batch_size,
        truncation_side=truncation_side,
    )
    app = create_app(scorer, **app_kwargs)
    where = f"{scorer.device} ({scorer.model.dtype})"
    log.info("reward model %s on %s, serving on http://%s:%d", scorer.name, where, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
