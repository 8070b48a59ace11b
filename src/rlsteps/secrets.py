"""Secrets never reach printed output, job files or logs.

A key is secret when one of its words (split on anything not a letter or digit) is a secret word:
`rm.token`, `judge.api_key`, `WANDB_API_KEY`, `db_password`; `max_new_tokens` is not. So is the password of a
URL that carries one (`http://user:pw@host` is shown `http://user:******@host`), in any string value, word or text.
"""

from __future__ import annotations

import logging
import re
from typing import Any

MASK = "******"
# scheme://user:password@ (the password up to the last @ before the host; user and password hold no / ? # or space)
URL_CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/?#@:\s]*:)(?P<password>[^/?#\s]*)@")
SECRET_WORDS = {"token", "key", "apikey", "secret", "password", "passwd", "credential", "credentials"}


def is_secret_key(key: str) -> bool:
    """A key whose last word names a secret (hf_token, api_key, password); not token_level_loss or key_prefix."""
    words = [w for w in re.split(r"[^a-z0-9]+", key.lower()) if w]
    return bool(words) and words[-1] in SECRET_WORDS


def has_url_credentials(value: Any) -> bool:
    """A string that holds a URL with a password in it."""
    return isinstance(value, str) and URL_CREDENTIALS.search(value) is not None


def mask_text(text: str) -> str:
    """Text with the password of every URL in it masked: `http://user:pw@host` -> `http://user:******@host`."""
    return URL_CREDENTIALS.sub(lambda m: m["head"] + MASK + "@" if m["password"] else m[0], text)


def is_secret(key: str, value: Any) -> bool:
    """A value that must not be shown or written: a secret key's, or a URL with a password."""
    return value not in (None, "") and (is_secret_key(key) or has_url_credentials(value))


def mask(value: Any, key: str = "") -> Any:
    """A deep copy of value with every secret's value replaced by the mask (None stays None), and every URL's
    password masked in any string."""
    if isinstance(value, dict):
        return {k: mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask(v, key) for v in value]
    if key and is_secret_key(key) and value not in (None, ""):
        return MASK
    return mask_text(value) if isinstance(value, str) else value


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
            out.append(mask_text(word))
    return out


def secret_paths(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value of every non-empty secret in a nested dict (a secret key's, or a URL with a password)."""
    found: dict[str, Any] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                found.update(secret_paths(v, path))
            elif is_secret(str(k), v):
                found[path] = v
    return found


def env_name(path: str) -> str:
    """The environment variable that carries the secret at a config path to the worker."""
    return "RLSTEPS_SECRET_" + re.sub(r"[^A-Z0-9]+", "_", path.upper()).strip("_")


class MaskingFilter(logging.Filter):
    """A handler's filter that masks URL passwords in each record's message and traceback before it is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_text(record.exc_text)
        return True
