"""Secrets never reach printed output, job files or logs.

A key is secret when one of its words (split on anything not a letter or digit) is a secret word:
`rm.token`, `judge.api_key`, `WANDB_API_KEY`, `db_password`; `max_new_tokens` is not.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "******"
SECRET_WORDS = {"token", "key", "apikey", "secret", "password", "passwd", "credential", "credentials"}


def is_secret_key(key: str) -> bool:
    """A key whose last word names a secret (hf_token, api_key, password); not token_level_loss or key_prefix."""
    words = [w for w in re.split(r"[^a-z0-9]+", key.lower()) if w]
    return bool(words) and words[-1] in SECRET_WORDS


def mask(value: Any, key: str = "") -> Any:
    """A deep copy of value with every secret's value replaced by the mask (None stays None)."""
    if isinstance(value, dict):
        return {k: mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask(v, key) for v in value]
    if key and is_secret_key(key) and value not in (None, ""):
        return MASK
    return value


def mask_argv(argv: list[str]) -> list[str]:
    """Mask key=value and --key=value words whose key is secret, and the word after a secret `--key`."""
    out = []
    for i, word in enumerate(argv):
        key, sep, val = word.partition("=")
        follows_flag = (
            i > 0 and argv[i - 1].startswith("-") and "=" not in argv[i - 1] and is_secret_key(argv[i - 1].lstrip("-"))
        )
        if (sep and val and is_secret_key(key.lstrip("+-"))) or (follows_flag and not word.startswith("-")):
            out.append(f"{key}={MASK}" if sep and not follows_flag else MASK)
        else:
            out.append(word)
    return out


def secret_paths(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value of every non-empty secret in a nested dict."""
    found: dict[str, Any] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                found.update(secret_paths(v, path))
            elif is_secret_key(str(k)) and v not in (None, ""):
                found[path] = v
    return found


def env_name(path: str) -> str:
    """The environment variable that carries the secret at a config path to the worker."""
    return "RLSTEPS_SECRET_" + re.sub(r"[^A-Z0-9]+", "_", path.upper()).strip("_")
