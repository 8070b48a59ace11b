"""The reward-model server's batching: who is let in, which pairs make the next batch, and memory after a burst.

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

Memory: when the queue has stayed empty for a moment after work, the memory freed by the burst is given
back to the system (glibc's malloc_trim; glibc keeps freed heap otherwise), so a peak does not stay.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlsteps.engine.rewards.auth import excerpt, scrubbed
from rlsteps.engine.rewards.rm.protocol import RewardsRequest
from rlsteps.engine.rewards.text import TruncationSide, truncate

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4  # the estimate of a text's tokens before it is tokenised, for the batch's token budget
QUEUE_BATCHES = 4  # the default max_queue holds at least this many full batches,
QUEUE_SECONDS = 1.0  # and as many pairs as the server scores in this time (a Retry-After's worth)
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

    def sent_texts(self, start: int, stop: int) -> list[str]:
        """The texts the client sent for pairs [start, stop): what an error answer must not repeat."""
        r = self.request
        texts = [*(r.prompts or [])[start:stop], *(r.responses or [])[start:stop]]
        for conversation in (r.conversations or [])[start:stop]:
            texts += [text for m in conversation for text in (m.role, m.content)]
        return texts


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
                why = excerpt(scrubbed(str(error), s.job.sent_texts(s.start, s.stop)), 200)  # the template's words
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
