"""A small OpenAI-compatible judge for the tiny world: a scalar reward model behind /v1/chat/completions.

It reads the conversation and the two responses back from a request built by protocol.judge_messages(),
renders the conversation with the reward model's own chat template, scores both responses in one batch,
and answers as a judge LLM would: a bare JSON object when the request asks for structured output
(response_format json_schema or json_object), else a fenced json block. Like a judge LLM's, each score
rates its response on its own, so a group's mean score rises as the policy improves; the ranking says
which of the two is better:

    score_i = 1 + 4 sigmoid((reward_i - center) / scale)     1-5 helpfulness of response i
    p       = sigmoid((reward_1 - reward_2) / scale)         how likely response 1 is the better one
    ranking = 1 + 5 (1 - p)                                  1 = response 1 much better ... 6 = response 2

center and scale are the reward model's own (judge/scale.py: the spread of its rewards, from its config.json, or
--center and --scale), so the scores grade the answers a policy gives rather than saying 5 to all above a point.

Its verdict on a pair shown the other way round is the mirror of the first (scores swapped, ranking 7 minus it), so
its entry in /v1/models says `"rlsteps": {"position_independent": true}` and rlsteps' judge client shows it each pair
once (judge/client.py). Its numbers are fractional, finer than the whole numbers the structured-output schema holds
a judge LLM to: the reward model's signal is kept, and the client reads any number in range.

Batching, as the reward-model server does it: a chat completion holds one comparison, and a client sends a
step's comparisons at once, so each admitted comparison waits in a queue; a batch takes up to `max_batch` of
them, waiting at most `max_wait_ms` after the oldest arrived for the batch to fill, and scores all their
responses in one call of the scorer (one forward pass while `batch_size` rows hold them), in a thread, one
batch at a time; the event loop only reads, parses and answers. A reward does not depend on its batch (see
rm/scorer.py), so an answer is the one the comparison would get alone, and a (prompt, response) is scored
once: each response of a group takes part in two comparisons or more, and the last REMEMBERED_REWARDS rewards
are kept (the reward model does not change while it serves). While `max_queue` comparisons wait, a
new one gets 503 with Retry-After (the client retries it).

    rlsteps serve judge --model PATH [--port 8000] [--max-batch 64] [--max-wait-ms 2] [--token-env JUDGE_TOKEN]
                        [--center C --scale S]
    python -m rlsteps.engine.rewards.judge ...      (the same command)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from rlsteps.engine.rewards.auth import (
    LIVENESS_PATH,
    TokenGate,
    bearer_matches,
    docs_urls,
    excerpt,
    fields_of,
    validation_errors,
)
from rlsteps.engine.rewards.judge.protocol import JudgeRequest, parse_judge_request
from rlsteps.engine.rewards.judge.scale import DEFAULT_SCALE, RewardScale, reward_scale_of

log = logging.getLogger("rlsteps.rewards.judge_server")
MESSAGE_CHARS = 300  # the most of an error's reason an answer carries
QUEUE_BATCHES = 4  # the default max_queue: this many full batches
RETRY_AFTER_S = 1  # a refused comparison's Retry-After
MAX_BODY_BYTES = 8_000_000  # a conversation and two responses: far less
REMEMBERED_REWARDS = 16384  # (prompt, response) rewards kept: a response is in several comparisons of its group


class Scorer(Protocol):
    def prompt_text(self, conversation: list[dict[str, str]]) -> str: ...

    def score(self, prompts: list[str], responses: list[str]) -> list[float]: ...


def judgement_from_rewards(reward_1: float, reward_2: float, scale: RewardScale = DEFAULT_SCALE) -> dict[str, float]:
    """The judge's JSON fields for two scalar rewards (see the module docstring)."""
    return {
        "score_1": round(scale.score(reward_1), 3),
        "score_2": round(scale.score(reward_2), 3),
        "ranking": round(1 + 5 * (1 - scale.first_better(reward_1, reward_2)), 3),
    }


def chat_completion(content: str, model_name: str) -> dict:
    """A standard chat.completion object carrying `content` as the assistant's message."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind}})


def unauthorised() -> JSONResponse:
    return _error(
        401, "missing or wrong bearer token: send the header 'Authorization: Bearer <token>'", "authentication_error"
    )


def _read_request(raw: bytes) -> tuple[JudgeRequest, bool]:
    """The judge request of a chat completions body and whether it asks for structured output, or ValueError
    with the reason."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("the request body is not JSON") from None
    if not isinstance(body, dict) or "messages" not in body:
        raise ValueError("the request body has no 'messages'")
    response_format = body.get("response_format") or {}
    structured = isinstance(response_format, dict) and response_format.get("type") in ("json_schema", "json_object")
    return parse_judge_request(body["messages"]), structured


def answer_text(judgement: dict[str, float], structured: bool) -> str:
    """The judge's answer: a bare JSON object under structured output, else a fenced json block."""
    text = json.dumps(judgement)
    return text if structured else f"```json\n{text}\n```"


@dataclass(eq=False)
class _Comparison:
    request: JudgeRequest
    future: asyncio.Future[tuple[float, float]]
    arrived: float  # the event loop's clock


class JudgeBatcher:
    """Scores queued comparisons in batches of up to max_batch, one batch at a time, off the event loop."""

    def __init__(
        self,
        scorer: Scorer,
        max_batch: int = 64,
        max_wait_s: float = 0.002,
        max_queue: int = 256,
        remembered: int = REMEMBERED_REWARDS,
    ) -> None:
        if max_batch < 1 or max_wait_s < 0 or max_queue < 1:
            raise ValueError(
                f"need max_batch >= 1, max_wait_ms >= 0, max_queue >= 1; got {max_batch}, {max_wait_s * 1000:g}, "
                f"{max_queue}"
            )
        self.scorer, self.max_batch, self.max_wait_s, self.max_queue = scorer, max_batch, max_wait_s, max_queue
        self.queue: deque[_Comparison] = deque()
        self.rewards: OrderedDict[tuple[str, str], float] = OrderedDict()  # (prompt, response) -> reward, recent last
        self.remembered = remembered
        self.work = asyncio.Event()
        self.requests = self.batches = self.rejected = 0
        self.scoring_s = 0.0  # time spent rendering, tokenising and scoring: busy time

    @property
    def full(self) -> bool:
        return len(self.queue) >= self.max_queue

    def add(self, request: JudgeRequest) -> asyncio.Future[tuple[float, float]]:
        """Queue a comparison; the future of its two rewards (cancelled: it is dropped unscored)."""
        loop = asyncio.get_running_loop()
        comparison = _Comparison(request, loop.create_future(), loop.time())
        self.queue.append(comparison)
        self.requests += 1
        self.work.set()
        return comparison.future

    async def run(self) -> None:
        """Form and score batches until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            if not self.queue:
                self.work.clear()
                await self.work.wait()
            await self._fill(loop)
            batch = self._take()
            if not batch:
                continue
            self.batches += 1
            started = loop.time()
            try:
                results = await asyncio.to_thread(self._score, [c.request for c in batch])
            except Exception as error:  # the forward pass failed: HTTP 500 to every comparison of the batch
                log.exception("scoring a batch of %d comparisons failed", len(batch))
                results = [error] * len(batch)
            self.scoring_s += loop.time() - started
            for comparison, result in zip(batch, results):
                if comparison.future.done():  # its client went away
                    continue
                if isinstance(result, Exception):
                    comparison.future.set_exception(result)
                else:
                    comparison.future.set_result(result)

    async def _fill(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a full batch, at most until max_wait_s after the oldest waiting comparison arrived."""
        while self.queue and len(self.queue) < self.max_batch:
            remaining = self.queue[0].arrived + self.max_wait_s - loop.time()
            if remaining <= 0:
                return
            self.work.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.work.wait(), remaining)

    def _take(self) -> list[_Comparison]:
        batch: list[_Comparison] = []
        while self.queue and len(batch) < self.max_batch:
            comparison = self.queue.popleft()
            if not comparison.future.done():
                batch.append(comparison)
        return batch

    def _score(self, requests: list[JudgeRequest]) -> list[tuple[float, float] | Exception]:
        """In the scoring thread: each conversation rendered once (a conversation the scorer cannot render fails
        its comparisons alone), then every (prompt, response) not scored before, once however many comparisons
        hold it (a group's responses each take part in two or more), in one call."""
        rendered: dict[str, str | Exception] = {}
        pairs: list[tuple[str, str, str] | Exception] = []
        new: dict[tuple[str, str], int] = {}  # (prompt, response) to score -> its row
        for request in requests:
            key = json.dumps(request.conversation)
            if key not in rendered:
                try:
                    rendered[key] = self.scorer.prompt_text(request.conversation)
                except Exception as error:  # noqa: BLE001 - e.g. a chat template that refuses the messages
                    rendered[key] = error
            prompt = rendered[key]
            if isinstance(prompt, Exception):
                pairs.append(prompt)
                continue
            pairs.append((prompt, request.response_1, request.response_2))
            for response in (request.response_1, request.response_2):
                if (prompt, response) not in self.rewards:
                    new.setdefault((prompt, response), len(new))
        if new:
            scored = self.scorer.score([p for p, _ in new], [r for _, r in new])
            for pair, row in new.items():
                self.rewards[pair] = scored[row]
        results = [
            pair if isinstance(pair, Exception) else (self.rewards[pair[0], pair[1]], self.rewards[pair[0], pair[2]])
            for pair in pairs
        ]
        for pair in pairs:  # the most recently asked stay; the longest unasked go first
            if not isinstance(pair, Exception):
                self.rewards.move_to_end((pair[0], pair[1]))
                self.rewards.move_to_end((pair[0], pair[2]))
        while len(self.rewards) > self.remembered:
            self.rewards.popitem(last=False)
        return results


def create_app(
    scorer: Scorer,
    model_name: str = "tiny-judge",
    token: str | None = None,
    *,
    max_batch: int = 64,
    max_wait_ms: float = 2,
    max_queue: int | None = None,
    reward_scale: RewardScale = DEFAULT_SCALE,
) -> Any:
    """The judge's HTTP app (ASGI) around any object with score(prompts, responses) -> rewards. With a token, every
    request needs it but GET /health, which then says only that the server is up. max_batch: most comparisons scored
    together; max_wait_ms: how long a batch waits to fill after its oldest comparison arrived; max_queue:
    comparisons waiting before new ones get 503 (None: QUEUE_BATCHES full batches); reward_scale: how a reward reads
    as a score (judge/scale.py)."""
    batcher = JudgeBatcher(scorer, max_batch, max_wait_ms / 1000, max_queue or QUEUE_BATCHES * max_batch)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    app = FastAPI(title="rlsteps judge", lifespan=lifespan, **docs_urls(token))
    app.state.batcher = batcher

    def authorised(request: Request) -> bool:
        return bearer_matches(request.headers.get("authorization", ""), token)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = validation_errors(error.errors())
        return _error(422, f"invalid request: {fields_of(errors)}")

    @app.get(LIVENESS_PATH)
    async def health(request: Request) -> dict:
        """Liveness for anyone; the model and the counters only with the token (when one is required)."""
        if not authorised(request):
            return {"status": "ok"}
        return {
            "status": "ok",
            "model": model_name,
            "requests": batcher.requests,
            "batches": batcher.batches,
            "queue": len(batcher.queue),
            "max_batch": batcher.max_batch,
            "max_queue": batcher.max_queue,
            "rejected": batcher.rejected,
            "remembered": len(batcher.rewards),
            "scoring_s": round(batcher.scoring_s, 3),
            "reward_scale": {"center": reward_scale.center, "scale": reward_scale.scale},
        }

    @app.get("/v1/models")
    async def models() -> dict:
        entry = {"id": model_name, "object": "model", "owned_by": "rlsteps", "rlsteps": {"position_independent": True}}
        return {"object": "list", "data": [entry]}

    async def answer(body: bytes) -> JSONResponse:
        """The answer to a chat completion's body: the completion, or an error."""
        try:
            judge_request, structured = _read_request(body)
        except ValueError as err:
            return _error(400, excerpt(str(err), MESSAGE_CHARS))  # the protocol's own reason: it quotes nothing sent
        if batcher.full:
            batcher.rejected += 1
            refused = _error(
                503, f"busy: {len(batcher.queue)} comparisons waiting (at most {batcher.max_queue}); retry shortly",
                "server_error",
            )  # fmt: skip
            refused.headers["Retry-After"] = str(RETRY_AFTER_S)
            return refused
        try:
            reward_1, reward_2 = await batcher.add(judge_request)
        except Exception as err:  # noqa: BLE001 - the scorer failed; the log has the traceback
            log.exception("scoring failed")
            message = f"scoring failed: {type(err).__name__}: {excerpt(str(err), MESSAGE_CHARS)}"
            return _error(500, message, "server_error")
        content = answer_text(judgement_from_rewards(reward_1, reward_2, reward_scale), structured)
        return JSONResponse(chat_completion(content, model_name))

    return TokenGate(ChatCompletions(app, answer), token=token, refuse=unauthorised)


class ChatCompletions:
    """ASGI: POST /v1/chat/completions is answered here, ahead of FastAPI's middleware and routing (a step sends a
    request per comparison, so their cost per request counts); any other request goes on to `app`. A body over
    MAX_BODY_BYTES gets 413 before more of it is read."""

    PATH = "/v1/chat/completions"

    def __init__(self, app: FastAPI, answer: Any) -> None:
        self.app, self.answer = app, answer

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES:
                await _error(413, f"the request body is over {MAX_BODY_BYTES} bytes")(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        response = await self.answer(bytes(body))
        await response(scope, receive, send)


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "tiny-judge",
    token: str | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    max_length: int = 512,
    batch_size: int = 128,
    center: float | None = None,
    scale: float | None = None,
    **app_kwargs: Any,
) -> None:
    """Load the reward model at `model_path` and serve it as a judge until interrupted. batch_size: rows per
    forward pass (at most two a comparison); center, scale: how a reward reads as a score, in place of the model's
    own (judge/scale.py); app_kwargs: create_app's batching options."""
    import uvicorn

    from rlsteps.engine.rewards.rm.scorer import RewardScorer

    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        log.warning("serving on %s without a token: anyone who can reach this port can use the judge", host)
    scorer = RewardScorer(model_path, device=device, dtype=dtype, max_length=max_length, batch_size=batch_size)
    own = reward_scale_of(model_path)
    reward_scale = RewardScale(own.center if center is None else center, own.scale if scale is None else scale)
    app = create_app(scorer, model_name, token, reward_scale=reward_scale, **app_kwargs)
    where = scorer.placement
    log.info(
        "judge %s (reward model %s on %s, score = 1 + 4 sigmoid((reward - %g) / %g)) on http://%s:%d/v1",
        model_name, model_path, where, reward_scale.center, reward_scale.scale, host, port,
    )  # fmt: skip
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
