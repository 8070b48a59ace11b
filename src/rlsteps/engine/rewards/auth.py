"""What a served model lets through: bearer tokens read from an environment variable (never argv) and checked in
constant time; with a token, every request needs it but the bare liveness probe; error answers that never echo
more than a short excerpt of what was sent."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the CLI reads this module for every command and needs no ASGI stack
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

LIVENESS_PATH = "/health"  # answers without the token (status only): load balancers and rlsteps poll it
EXCERPT_CHARS = 40  # the most of a sent value an error answer repeats
MAX_ERRORS = 10  # the most validation errors an answer lists


def token_from_env(variable: str | None) -> str | None:
    """The token held by `variable`; None when no variable is named. An unset or empty variable is an error."""
    if variable is None:
        return None
    token = os.environ.get(variable)
    if not token:
        raise ValueError(f"--token-env {variable}: that environment variable is unset or empty; export it first")
    return token


def bearer_matches(authorization_header: str, token: str | None) -> bool:
    """True when no token is required, or the header is `Bearer <token>`."""
    if token is None:
        return True
    scheme, _, given = authorization_header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(given.encode(), token.encode())


def docs_urls(token: str | None) -> dict[str, Any]:
    """FastAPI's arguments for /docs, /redoc and /openapi.json: off when a token is required (a browser opening
    /docs would fetch /openapi.json without it)."""
    return {"docs_url": None, "redoc_url": None, "openapi_url": None} if token else {}


class TokenGate:
    """ASGI middleware: with a token, a request without it gets `refuse()` before any route runs (unknown paths,
    docs and wrong methods included), except at `open_paths`, whose routes answer without it what they choose."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        refuse: Callable[[], Response],
        open_paths: Iterable[str] = (LIVENESS_PATH,),
    ) -> None:
        self.app, self.token, self.refuse, self.open_paths = app, token, refuse, frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        if bearer_matches(header.decode("latin-1"), self.token):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await self.refuse()(scope, receive, send)


def excerpt(value: Any, chars: int = EXCERPT_CHARS) -> str:
    """A short description of a sent value: the start of a string or number, the size of a list or object."""
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= chars else text[:chars] + f"... ({len(text)} characters)"


def validation_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """pydantic's errors with the field each names, why, and at most an excerpt of the value sent (never the whole
    value, nor pydantic's ctx and url)."""
    shown = []
    for error in list(errors)[:MAX_ERRORS]:
        loc = [part if isinstance(part, int) else excerpt(str(part)) for part in error.get("loc", ())]
        item: dict[str, Any] = {"loc": loc, "msg": excerpt(str(error.get("msg", "")), 300), "type": error.get("type")}
        if "input" in error:
            item["input"] = excerpt(error["input"])
        shown.append(item)
    if len(errors) > MAX_ERRORS:
        shown.append({"loc": [], "msg": f"and {len(errors) - MAX_ERRORS} more errors", "type": "more"})
    return shown


def fields_of(errors: Sequence[dict[str, Any]]) -> str:
    """The fields the errors name, as `prompts.0, truncation_side`."""
    named = (".".join(str(p) for p in e["loc"] if p != "body") or "(the body)" for e in errors if e["type"] != "more")
    return ", ".join(dict.fromkeys(named))
