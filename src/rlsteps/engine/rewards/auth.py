"""Bearer tokens for the served models: read from an environment variable (never argv), checked in constant time."""

from __future__ import annotations

import os
import secrets


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
