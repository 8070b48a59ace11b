"""Prompt files: a JSONL prompt file read, checked and measured line by line, rendered with chat templates; torch-free
(the command line checks a run's prompt files with it before submitting, the worker reads them with it).

Each line of a prompt file is one JSON object:
    {"prompt": "raw text fed to the policy verbatim", "id": "optional"}
    {"messages": [{"role": "user", "content": "..."}], "id": 7}
    {"responses_create_params": {"input": [{"role": "user", "content": "..."}]}, "prompt_id": 7}   (a NeMo-Gym row)
Chat messages are rendered with the tokenizer's chat template and the generation prompt. A NeMo-Gym row's input (its
messages, or a string as one user message) is the prompt and its prompt_id the id.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from fsspec.core import url_to_fs

CHAT_ROLES = ("system", "user", "assistant")
GYM_ROW_KEY = "responses_create_params"  # a NeMo-Gym rollout row: its Responses API request
PROMPT_KEYS = frozenset({"id", "prompt", "messages", GYM_ROW_KEY})  # the rest of a line are its fields


Message = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class Prompt:
    id: str  # the group key of its rollouts
    text: str  # the rendered prompt string fed to the policy
    messages: tuple[Message, ...] = ()  # the line's own chat messages; () for a raw "prompt" line
    # the line's other keys (e.g. "answer"): what reward functions take by name (rlsteps.engine.rewards.functions)
    fields: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def conversation(self) -> list[dict[str, str]]:
        """The conversation as chat messages, free of any template markup: the line's own messages, or its raw
        text as one user message. A judge reads this, never the policy's rendering."""
        if not self.messages:
            return [{"role": "user", "content": self.text}]
        return [{"role": role, "content": content} for role, content in self.messages]


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message starts with "<path>:<line>:" (or "<path>:" when the file cannot
    be read at all). fix: what to do, where it is not the usual one (a line of the right shape)."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.fix = fix


ENCODING_FIX = "save the file as UTF-8 text (e.g. iconv -f LATIN1 -t UTF-8)"
LENGTH_BATCH = 1024  # prompts measured per call of the tokenizer
PROGRESS_S = float(os.environ.get("RLSTEPS_PROGRESS_S", "10"))  # a large prompt file's progress: a line this often


# ---------------------------------------------------------------------------------------------
# Loading


def check_prompt_file(path: str) -> int:
    """Every line's structure (JSON, "prompt" or "messages", roles, ids), as far as it can be checked without the
    policy's tokenizer: in seconds, before a run starts anything. The number of prompts, or PromptFileError."""
    return len(load_prompts(path, tokenizer=None))


def load_prompts(
    path: str,
    tokenizer: Any | None,
    max_prompt_tokens: int | None = None,
    say: Callable[[str], None] | None = None,
) -> list[Prompt]:
    """Read and validate every line of a prompt JSONL file (a local path or an fsspec URL).

    tokenizer None checks the structure only (check_prompt_file): chat messages are not rendered then, nor measured.
    say: where a large file's progress goes, a line every PROGRESS_S seconds (reading, then measuring).
    """
    stem = PurePosixPath(path).stem
    numbered: list[tuple[int, Prompt]] = []
    first_line_of: dict[str, int] = {}
    try:
        fs, local = url_to_fs(path)
        progress = _Progress(path, fs.size(local) or 1, say)
        with fs.open(local, "rb") as f:
            for line_number, raw in enumerate(f, start=1):
                progress.read(len(raw), line_number)
                prompt = _read_line(path, stem, line_number, raw, tokenizer, first_line_of)
                if prompt is not None:
                    first_line_of[prompt.id] = line_number
                    numbered.append((line_number, prompt))
    except OSError as error:  # unreadable (permissions, a folder, a remote filesystem's refusal)
        raise PromptFileError(f"{path}: cannot be read: {error}", fix="check the path and its permissions") from None
    if not numbered:
        raise PromptFileError(f"{path}:1: the file has no prompts; write one JSON object per line")
    if tokenizer is not None and max_prompt_tokens is not None:
        _check_lengths(path, numbered, tokenizer, max_prompt_tokens, progress)
    progress.done(len(numbered))
    return [prompt for _, prompt in numbered]


def _read_line(
    path: str, stem: str, line_number: int, raw: bytes, tokenizer: Any, first_line_of: dict[str, int]
) -> Prompt | None:
    """One line of a prompt file as a Prompt (None for a blank line), or PromptFileError naming it."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptFileError(
            f"{path}:{line_number}: not UTF-8 text: the line's byte {e.start + 1} is 0x{raw[e.start]:02x}",
            fix=ENCODING_FIX,
        ) from None
    if not line.strip():
        return None
    try:
        prompt = _parse_line(line, f"{stem}:{line_number}", tokenizer)
        if prompt.id in first_line_of:
            raise ValueError(f"duplicate id {prompt.id!r} (first used on line {first_line_of[prompt.id]})")
    except ValueError as e:
        raise PromptFileError(f"{path}:{line_number}: {e}") from None
    return prompt


def _check_lengths(
    path: str, numbered: list[tuple[int, Prompt]], tokenizer: Any, max_prompt_tokens: int, progress: _Progress
) -> None:
    """Every prompt measured as the policy will see it (in batches: one call of a fast tokenizer each), the first
    one over max_prompt_tokens a PromptFileError naming its line."""
    for start in range(0, len(numbered), LENGTH_BATCH):
        batch = numbered[start : start + LENGTH_BATCH]
        for (line_number, _), length in zip(batch, prompt_lengths([p.text for _, p in batch], tokenizer)):
            if length > max_prompt_tokens:
                raise PromptFileError(
                    f"{path}:{line_number}: the prompt has {length} tokens, more than "
                    f"max_prompt_tokens={max_prompt_tokens}",
                    fix="shorten that prompt, or raise data.max_prompt_tokens (rollouts grow with it)",
                )
        progress.measured(start + len(batch), len(numbered))


class _Progress:
    """A line every PROGRESS_S seconds while a prompt file is read and measured, and one at the end when it took
    that long: a large file (200k prompts) takes minutes, which must not pass in silence."""

    def __init__(self, path: str, total_bytes: int, say: Callable[[str], None] | None) -> None:
        self.path, self.total_bytes, self.say = path, total_bytes, say
        self.started = self.last = time.monotonic()
        self.bytes_read = 0
        self.spoke = False

    def read(self, line_bytes: int, lines: int) -> None:
        self.bytes_read += line_bytes
        if self._due():
            self._tell(f"read {lines:,} lines ({self.bytes_read / self.total_bytes:.0%} of the file)")

    def measured(self, done: int, total: int) -> None:
        if self._due():
            self._tell(f"measured {done:,} of {total:,} prompts against max_prompt_tokens ({done / total:.0%})")

    def done(self, prompts: int) -> None:
        if self.spoke:
            self._tell(f"{prompts:,} prompts read and checked in {time.monotonic() - self.started:.0f}s", at_end=True)

    def _due(self) -> bool:
        return self.say is not None and time.monotonic() - self.last >= PROGRESS_S

    def _tell(self, what: str, at_end: bool = False) -> None:
        self.last, self.spoke = time.monotonic(), True
        self.say(f"prompt file {self.path}: {what}" + ("" if at_end else f", {self.last - self.started:.0f}s so far"))


def _parse_line(line: str, default_id: str, tokenizer: Any) -> Prompt:
    try:
        record = json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if GYM_ROW_KEY in record:
        record = _from_gym_row(record)
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt == has_messages:
        which = "both" if has_prompt else "neither"
        raise ValueError(f'a line needs exactly one of "prompt" or "messages", this one has {which}')
    messages: tuple[Message, ...] = ()
    if has_prompt:
        text = record["prompt"]
        if not isinstance(text, str):
            raise ValueError(f'"prompt" must be a string, got {type(text).__name__}')
    else:
        checked = _check_messages(record["messages"])
        text = _render_chat(checked, tokenizer) if tokenizer is not None else "".join(m["content"] for m in checked)
        messages = tuple((m["role"], m["content"]) for m in checked)
    if not text:
        raise ValueError("the prompt is empty")
    fields = {key: value for key, value in record.items() if key not in PROMPT_KEYS}
    return Prompt(id=_parse_id(record.get("id"), default_id), text=text, messages=messages, fields=fields)


def _from_gym_row(record: dict[str, Any]) -> dict[str, Any]:
    """A NeMo-Gym row as the equivalent "messages" line (its input) with its prompt_id as the id."""
    params = record[GYM_ROW_KEY]
    given = params.get("input") if isinstance(params, dict) else None
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    if not isinstance(given, list):
        raise ValueError(f'a NeMo-Gym row needs "{GYM_ROW_KEY}": {{"input": [messages] or "text"}}')
    rest = {key: value for key, value in record.items() if key not in (GYM_ROW_KEY, "prompt_id")}
    return {**rest, "messages": given, "id": record.get("prompt_id", record.get("id"))}


def _parse_id(value: Any, default_id: str) -> str:
    if value is None:
        return default_id
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f'"id" must be a string or an integer, got {type(value).__name__}')
    if value == "":
        raise ValueError('"id" must not be empty')
    return str(value)


def _check_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise ValueError('"messages" must be a non-empty list of {"role", "content"} objects')
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be an object, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, got {type(content).__name__}")
    return messages


def _render_chat(messages: list[dict[str, str]], tokenizer: Any) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            'a "messages" line needs a chat template and the tokenizer has none; '
            'write {"prompt": "..."} lines or use a tokenizer with a chat_template'
        )
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # a template may reject a conversation (e.g. roles that do not alternate)
        raise ValueError(f"the chat template rejected these messages: {e}") from None


# ---------------------------------------------------------------------------------------------
# Tokenising


def encode_prompt_text(text: str, tokenizer: Any) -> list[int]:
    """The token ids the policy sees for a rendered prompt.

    No special tokens are added except one: a tokenizer that adds a BOS by default (Llama-2 style)
    gets its BOS prepended when the text does not already start with it. A chat template that
    writes the BOS itself therefore never yields two, and a raw prompt still gets the BOS the
    model was trained with. Tokenizers that add nothing (GPT-2, Qwen2) get nothing.
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = _bos_to_add(tokenizer)
    return [bos, *ids] if bos is not None and ids[:1] != [bos] else ids


def prompt_lengths(texts: list[str], tokenizer: Any) -> list[int]:
    """len(encode_prompt_text(text)) of each text, from one call of the tokenizer."""
    bos = _bos_to_add(tokenizer)
    rows = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [len(ids) + (bos is not None and ids[:1] != [bos]) for ids in rows]


def _bos_to_add(tokenizer: Any) -> int | None:
    """The BOS id when the tokenizer adds one by default, else None."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bos if probe[:1] == [bos] else None
