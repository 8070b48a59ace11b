"""What a served model lets through: bearer tokens read from an environment variable (never argv) and checked in
constant time; with a token, every request needs it but the bare liveness probe; error answers that never echo
what was sent: a field is named by the server's own name for it, a value by its type and size."""

from __future__ import annotations

import difflib
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the CLI reads this module for every command and needs no ASGI stack
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

LIVENESS_PATH = "/health"  # answers without the token (status only): load balancers and rlsteps poll it
EXCERPT_CHARS = 40  # the most of a server's own text (an error's reason) an answer repeats
UNKNOWN_KEY = "(a key the server does not know)"
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


def excerpt(text: str, chars: int = EXCERPT_CHARS) -> str:
    """The start of a text of the server's own (an error's reason), with its length when it is cut."""
    return text if len(text) <= chars else text[:chars] + f"... ({len(text)} characters)"


def scrubbed(text: str, sent: Iterable[str], shortest: int = 8) -> str:
    """`text` (a template's error, say) with every sent text of `shortest` characters or more in it replaced: the
    template's own words stay, a quoted message does not."""
    for value in sorted({s for s in sent if isinstance(s, str) and len(s) >= shortest}, key=len, reverse=True):
        text = text.replace(value, "(text sent)")
    return text


def described(value: Any) -> str:
    """A sent value by its type and size, never its content."""
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    if isinstance(value, str | bytes):
        return f"a {'string' if isinstance(value, str) else 'byte string'} of {len(value)} characters"
    return f"a {type(value).__name__}"


def validation_errors(errors: Sequence[Any], known: Iterable[str] = ()) -> list[dict[str, Any]]:
    """pydantic's errors with the field each names and why, the value sent described by its type and size (never
    the value, nor pydantic's ctx and url). known: the server's field names; any other key in a location is the
    client's and is not repeated (an unknown one named by the known field it is closest to, if any)."""
    known, shown = set(known), []
    for error in list(errors)[:MAX_ERRORS]:
        loc = [_location(part, known) for part in error.get("loc", ())]
        item: dict[str, Any] = {"loc": loc, "msg": excerpt(str(error.get("msg", "")), 300), "type": error.get("type")}
        if "input" in error:
            item["input"] = described(error["input"])
        shown.append(item)
    if len(errors) > MAX_ERRORS:
        shown.append({"loc": [], "msg": f"and {len(errors) - MAX_ERRORS} more errors", "type": "more"})
    return shown


def _location(part: Any, known: set[str]) -> Any:
    if isinstance(part, int) or part == "body" or part in known:
        return part
    close = difflib.get_close_matches(str(part)[:100], known, n=1)
    return f"{UNKNOWN_KEY[:-1]}; did you mean {close[0]!r}?)" if close else UNKNOWN_KEY


def field_names(schema: dict[str, Any]) -> set[str]:
    """Every property name a JSON schema (a pydantic model's, with its nested models) declares."""
    names: set[str] = set()
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            names.update(node.get("properties", {}) if isinstance(node.get("properties"), dict) else ())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def fields_of(errors: Sequence[dict[str, Any]]) -> str:
    """The fields the errors name, as `prompts.0, truncation_side`."""
    named = (".".join(str(p) for p in e["loc"] if p != "body") or "(the body)" for e in errors if e["type"] != "more")
    return ", ".join(dict.fromkeys(named))
