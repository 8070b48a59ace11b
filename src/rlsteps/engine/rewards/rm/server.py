"""The reward-model HTTP server: POST /v1/rewards with dynamic batching, GET /health.

Requests are queued; one worker takes the first, keeps collecting until `max_batch` inputs or
`max_wait_ms` after the first, scores them together in a thread (the event loop stays free to
accept more) and answers each request with its slice. A request is never split across batches.

    rlsteps serve rm --model PATH [--port 5555] [--token-env RM_TOKEN]
    python -m rlsteps.engine.rewards.rm ...         (the same command)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, model_validator

from rlsteps.engine.rewards.auth import bearer_matches

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class Scorer(Protocol):
    name: str
    vocab_size: int

    def encode(self, prompts: list[str], responses: list[str]) -> list[list[int]]: ...

    def score_tokens(self, token_ids: list[list[int]]) -> list[float]: ...


class RewardsRequest(BaseModel):
    prompts: list[str] | None = None
    responses: list[str] | None = None
    tokens: list[list[int]] | None = None

    @model_validator(mode="after")
    def one_kind_of_input(self) -> RewardsRequest:
        texts = self.prompts is not None or self.responses is not None
        if texts == (self.tokens is not None):
            raise ValueError('give either "prompts" and "responses", or "tokens"')
        if texts and (self.prompts is None or self.responses is None):
            raise ValueError('"prompts" and "responses" must be given together')
        if texts and len(self.prompts) != len(self.responses):
            raise ValueError(
                f'"prompts" and "responses" have different lengths ({len(self.prompts)} vs {len(self.responses)})'
            )
        if self.tokens is not None and any(len(row) == 0 for row in self.tokens):
            raise ValueError('"tokens" has an empty row: every row needs at least one token id')
        return self

    def __len__(self) -> int:
        return len(self.tokens) if self.tokens is not None else len(self.prompts or [])


class RewardsResponse(BaseModel):
    rewards: list[float]


class QueueFull(Exception):
    pass


@dataclass
class _Pending:
    request: RewardsRequest
    future: asyncio.Future[list[float]]


class DynamicBatcher:
    """Queues requests and scores them in batches, one batch at a time, off the event loop."""

    def __init__(self, scorer: Scorer, max_batch: int, max_wait_s: float, max_queue: int) -> None:
        self.scorer, self.max_batch, self.max_wait_s, self.max_queue = scorer, max_batch, max_wait_s, max_queue
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.queued_inputs = 0
        self.requests = 0
        self.batches = 0

    async def submit(self, request: RewardsRequest) -> list[float]:
        if self.queued_inputs + len(request) > self.max_queue:
            raise QueueFull
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        self.queued_inputs += len(request)
        self.requests += 1
        self.queue.put_nowait(pending)
        return await pending.future

    async def run(self) -> None:
        while True:
            batch = await self._collect()
            self.queued_inputs -= sum(len(p.request) for p in batch)
            live = [p for p in batch if not p.future.done()]  # drop requests whose client went away
            if not live:
                continue
            self.batches += 1
            try:
                rewards = await asyncio.to_thread(self._score, [p.request for p in live])
            except Exception as error:  # answered as HTTP 500 to every request in the batch
                log.exception("scoring a batch of %d requests failed", len(live))
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(error)
                continue
            offset = 0
            for p in live:
                n = len(p.request)
                if not p.future.done():
                    p.future.set_result(rewards[offset : offset + n])
                offset += n

    async def _collect(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        batch = [await self.queue.get()]
        size = len(batch[0].request)
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch:
            if self.queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    pending = await asyncio.wait_for(self.queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                pending = self.queue.get_nowait()
            batch.append(pending)
            size += len(pending.request)
        return batch

    def _score(self, requests: list[RewardsRequest]) -> list[float]:
        rows: list[list[int]] = []
        for r in requests:
            rows += r.tokens if r.tokens is not None else self.scorer.encode(r.prompts, r.responses)
        return self.scorer.score_tokens(rows)


def create_app(
    scorer: Scorer,
    *,
    max_batch: int = 64,
    max_wait_ms: float = 5,
    max_queue: int = 1024,
    token: str | None = None,
) -> FastAPI:
    if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
        raise ValueError(
            f"need max_batch >= 1, max_queue >= 1, max_wait_ms >= 0; got {max_batch}, {max_queue}, {max_wait_ms}"
        )
    batcher = DynamicBatcher(scorer, max_batch, max_wait_ms / 1000, max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    def check_token(request: Request) -> None:
        if not bearer_matches(request.headers.get("authorization", ""), token):
            raise HTTPException(
                status_code=401,
                detail="missing or wrong bearer token: send the header 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    app = FastAPI(title="rlsteps reward model", lifespan=lifespan)

    @app.post("/v1/rewards", response_model=RewardsResponse, dependencies=[Depends(check_token)])
    async def rewards(body: RewardsRequest) -> Any:
        if len(body) > max_queue:
            raise HTTPException(
                status_code=413,
                detail=f"{len(body)} inputs in one request exceed the queue size {max_queue}: send smaller requests",
            )
        if body.tokens is not None:
            check_token_ids(body.tokens, scorer.vocab_size)
        if len(body) == 0:
            return RewardsResponse(rewards=[])
        try:
            return RewardsResponse(rewards=await batcher.submit(body))
        except QueueFull:
            return JSONResponse(
                status_code=503,
                content={"detail": f"the queue is full ({batcher.queued_inputs} inputs waiting): retry later"},
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        except Exception as error:  # noqa: BLE001 - the scorer failed; the log has the traceback
            raise HTTPException(status_code=500, detail=f"scoring failed: {type(error).__name__}: {error}") from error

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": scorer.name,
            "requests": batcher.requests,
            "batches": batcher.batches,
            "queue": batcher.queued_inputs,
        }

    return app


def check_token_ids(rows: list[list[int]], vocab_size: int) -> None:
    """Refuse ids outside the vocabulary here: in a batch they would fail every request scored with them."""
    bad = [i for row in rows for i in row if not 0 <= i < vocab_size]
    if bad:
        raise HTTPException(
            status_code=422,
            detail=f'"tokens" has ids outside the reward model\'s vocabulary [0, {vocab_size}): {bad[:5]}',
        )


def serve(
    model_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 5555,
    *,
    device: str = "auto",
    max_length: int = 512,
    batch_size: int = 32,
    **app_kwargs: Any,
) -> None:
    """Load the reward model and serve it until interrupted. Loopback only unless `host` says otherwise."""
    import uvicorn

    from rlsteps.engine.rewards.rm.scorer import RewardScorer

    if host not in ("127.0.0.1", "localhost", "::1") and not app_kwargs.get("token"):
        log.warning("serving on %s without a token: anyone who can reach this port can use the model", host)
    scorer = RewardScorer(model_path, device=device, max_length=max_length, batch_size=batch_size)
    app = create_app(scorer, **app_kwargs)
    log.info("reward model %s on %s, serving on http://%s:%d", scorer.name, scorer.device, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
