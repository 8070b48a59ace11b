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

Its numbers are fractional, finer than the whole numbers the structured-output schema holds a judge LLM to:
the reward model's signal is kept, and the client reads any number in range.

    rlsteps serve judge --model PATH [--port 8000] [--token-env JUDGE_TOKEN]
    python -m rlsteps.engine.rewards.judge ...      (the same command)
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
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

log = logging.getLogger("rlsteps.rewards.judge_server")
MESSAGE_CHARS = 300  # the most of an error's reason an answer carries


class Scorer(Protocol):
    def prompt_text(self, conversation: list[dict[str, str]]) -> str: ...

    def score(self, prompts: list[str], responses: list[str]) -> list[float]: ...


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(x, 50.0), -50.0)))


def judgement_from_rewards(
    reward_1: float, reward_2: float, center: float = 0.0, scale: float = 2.0
) -> dict[str, float]:
    """The judge's JSON fields for two scalar rewards (see the module docstring)."""
    p = _sigmoid((reward_1 - reward_2) / scale)
    return {
        "score_1": round(1 + 4 * _sigmoid((reward_1 - center) / scale), 3),
        "score_2": round(1 + 4 * _sigmoid((reward_2 - center) / scale), 3),
        "ranking": round(1 + 5 * (1 - p), 3),
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


def create_app(scorer: Scorer, model_name: str = "tiny-judge", token: str | None = None) -> FastAPI:
    """The judge's HTTP app around any object with score(prompts, responses) -> rewards. With a token, every request
    needs it but GET /health, which then says only that the server is up."""
    app = FastAPI(title="rlsteps judge", **docs_urls(token))
    app.add_middleware(TokenGate, token=token, refuse=unauthorised)
    score_lock = threading.Lock()  # one forward pass at a time: requests arrive on several threads

    def score_pair(request: JudgeRequest) -> list[float]:
        with score_lock:
            prompt = scorer.prompt_text(request.conversation)
            return scorer.score([prompt, prompt], [request.response_1, request.response_2])

    def authorised(request: Request) -> bool:
        return bearer_matches(request.headers.get("authorization", ""), token)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = validation_errors(error.errors())
        return _error(422, f"invalid request: {fields_of(errors)}")

    @app.get(LIVENESS_PATH)
    async def health(request: Request) -> dict:
        return {"status": "ok", "model": model_name} if authorised(request) else {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "rlsteps"}]}

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        try:
            judge_request, structured = _read_request(await request.body())
        except ValueError as err:
            return _error(400, excerpt(str(err), MESSAGE_CHARS))  # a bad message is quoted in the reason
        try:
            reward_1, reward_2 = await run_in_threadpool(score_pair, judge_request)
        except Exception as err:  # noqa: BLE001 - the scorer failed; the log has the traceback
            log.exception("scoring failed")
            return _error(
                500, f"scoring failed: {type(err).__name__}: {excerpt(str(err), MESSAGE_CHARS)}", "server_error"
            )
        content = answer_text(judgement_from_rewards(reward_1, reward_2), structured)
        return JSONResponse(chat_completion(content, model_name))

    return app


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "tiny-judge",
    token: str | None = None,
    *,
    device: str = "auto",
) -> None:
    """Load the reward model at `model_path` and serve it as a judge until interrupted."""
    import uvicorn

    from rlsteps.engine.rewards.rm.scorer import RewardScorer

    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        log.warning("serving on %s without a token: anyone who can reach this port can use the judge", host)
    app = create_app(RewardScorer(model_path, device=device), model_name, token)
    log.info("judge %s (reward model %s) on http://%s:%d/v1", model_name, model_path, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")
