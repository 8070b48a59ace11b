"""The reward-model HTTP server: POST /v1/rewards with fair dynamic batching, GET /health.

Admission, the fair scheduling of batches and the memory given back after a burst: batching.py.

Text: a request sends the policy's rendered prompts, or the conversations (scored through the reward
model's own chat template), or token ids. Each pair keeps at most `max_length` tokens, cut from
`truncation_side`: the server's options by default, a request's own fields when it gives them.

    rlsteps serve rm --model PATH [--port 5555] [--token-env RM_TOKEN]
    python -m rlsteps.engine.rewards.rm ...         (the same command)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from rlsteps.engine.rewards.auth import (
    LIVENESS_PATH,
    TokenGate,
    bearer_matches,
    docs_urls,
    field_names,
    fields_of,
    validation_errors,
)
from rlsteps.engine.rewards.rm.batching import FairBatcher, InputError, Scorer
from rlsteps.engine.rewards.rm.protocol import RewardsRequest, RewardsResponse
from rlsteps.engine.rewards.text import TruncationSide

log = logging.getLogger(__name__)

BATCH_TOKENS_PER_PAIR = 4  # the default max_batch_tokens: max_batch pairs of max_length / this tokens
DOOR_WAIT_S = 1.0  # the longest a request waits for room before 503: a Retry-After's worth
REQUEST_FIELDS = field_names(RewardsRequest.model_json_schema())  # what an error answer may name of a request


def create_app(
    scorer: Scorer,
    *,
    max_batch: int = 64,
    max_wait_ms: float = 5,
    max_queue: int | None = None,
    max_batch_tokens: int | None = None,
    max_request_mb: float = 8,
    token: str | None = None,
    door_wait_s: float = DOOR_WAIT_S,
) -> FastAPI:
    """The app. max_queue: pairs waiting before new requests get 503; None sizes it to QUEUE_BATCHES full
    batches, or to QUEUE_SECONDS of the measured throughput when that is more (a queue of about one
    Retry-After's worth of work keeps a client no longer than a refusal would). max_batch_tokens: the token
    budget of a batch; None: max_batch pairs of a quarter of the scorer's max_length. door_wait_s: the longest a
    request waits for room before 503."""
    if max_batch_tokens is None:
        max_batch_tokens = max_batch * max(1, scorer.max_length // BATCH_TOKENS_PER_PAIR)
    if max_batch < 1 or (max_queue is not None and max_queue < 1) or max_wait_ms < 0 or max_request_mb <= 0:
        raise ValueError(
            "need max_batch >= 1, max_queue >= 1, max_wait_ms >= 0, max_request_mb > 0; "
            f"got {max_batch}, {max_queue}, {max_wait_ms}, {max_request_mb}"
        )
    if max_batch_tokens < 1 or door_wait_s < 0:
        raise ValueError(f"need max_batch_tokens >= 1 and door_wait_s >= 0, got {max_batch_tokens}, {door_wait_s}")
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
        errors = validation_errors(error.errors(), REQUEST_FIELDS)
        return JSONResponse(status_code=422, content={"detail": errors, "fields": fields_of(errors)})

    @app.post("/v1/rewards", response_model=RewardsResponse)
    async def rewards(request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_request_bytes:
            return too_large(int(declared))  # the body is never read (the server discards it as it arrives)
        reserved = await batcher.enter(door_wait_s)
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
            detail=f'"tokens" has {len(bad)} ids outside the reward model\'s vocabulary [0, {vocab_size})',
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
    log.info("reward model %s on %s, serving on http://%s:%d", scorer.name, scorer.placement, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
