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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from fsspec.core import url_to_fs

from rlsteps.contract.prompt_errors import PromptFileError

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


DATASET_ROW_FIX = 'each row needs a "prompt" (text) or "messages" column, or pass data.prompt_column=COLUMN'
COLUMN_FIX = "each line needs the key data.prompt_column names ({}), or unset data.prompt_column"
ENCODING_FIX = "save the file as UTF-8 text (e.g. iconv -f LATIN1 -t UTF-8)"
LENGTH_BATCH = 1024  # prompts measured per call of the tokenizer
PROGRESS_S = float(os.environ.get("RLSTEPS_PROGRESS_S", "10"))  # a large prompt file's progress: a line this often


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class PromptOptions:
    """How rows become prompts (the run's data.* keys): the column holding each prompt (None: a JSONL line's keys),
    the split a dataset of several splits is read from (the first of splits it has; split_key sets it), and the chat
    template's extra arguments."""

    prompt_column: str | None = None
    splits: tuple[str, ...] = ("train",)
    split_key: str = "data.split"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)


NO_OPTIONS = PromptOptions()
VALIDATION_SPLITS = ("validation", "test")  # val_prompts' split when data.val_split is unset: the first there is
RESERVED_TEMPLATE_KWARGS = ("messages", "conversation", "tools", "documents", "add_generation_prompt", "tokenize")


def template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """data.chat_template_kwargs, checked: none of the names apply_chat_template sets itself."""
    taken = [key for key in kwargs or {} if key in RESERVED_TEMPLATE_KWARGS]
    if taken:
        raise ValueError(f"data.chat_template_kwargs: {', '.join(taken)} cannot be set: apply_chat_template sets it")
    return kwargs


Row = tuple[str, str, str, Any]  # (how a message names it, how another row's message names it, default id, its record)


def prompt_options(data: Mapping[str, Any] | None, input_name: str = "prompts") -> PromptOptions:
    """The run's data.* keys as the options one prompt input is read with (val_prompts: data.val_split)."""
    data = data or {}
    if input_name == "val_prompts":
        splits, key = ((data["val_split"],) if data.get("val_split") else VALIDATION_SPLITS), "data.val_split"
    else:
        splits, key = (data.get("split") or "train",), "data.split"
    return PromptOptions(data.get("prompt_column"), splits, key, dict(data.get("chat_template_kwargs") or {}))


def check_prompt_file(path: str, options: PromptOptions = NO_OPTIONS) -> int:
    """Every row's structure (JSON, "prompt" or "messages", roles, ids), as far as it can be checked without the
    policy's tokenizer: in seconds, before a run starts anything. The number of prompts, or PromptFileError."""
    return len(load_prompts(path, tokenizer=None, options=options))


def load_prompts(
    path: str,
    tokenizer: Any | None,
    max_prompt_tokens: int | None = None,
    say: Callable[[str], None] | None = None,
    options: PromptOptions = NO_OPTIONS,
) -> list[Prompt]:
    """Read and validate every row of a prompt JSONL file (a local path or an fsspec URL) or of a Hugging Face dataset
    (rlsteps.contract.prompt_datasets: saved to disk, parquet, arrow, a Hub dataset's snapshot).

    tokenizer None checks the structure only (check_prompt_file): chat messages are not rendered then, nor measured.
    say: where a large file's progress goes, a line every PROGRESS_S seconds (reading, then measuring).
    """
    from rlsteps.contract.prompt_datasets import dataset_rows, is_prompt_dataset

    try:
        if is_prompt_dataset(path):
            progress = _Progress(path, None, say)
            rows = dataset_rows(path, options.splits, options.split_key, progress.read)
            numbered = _prompts_of(rows, tokenizer, options, fix=DATASET_ROW_FIX)
        else:
            fs, local = url_to_fs(path)
            progress = _Progress(path, fs.size(local) or 1, say)
            with fs.open(local, "rb") as f:
                fix = COLUMN_FIX.format(options.prompt_column) if options.prompt_column else None
                numbered = _prompts_of(_jsonl_rows(path, f, progress.read), tokenizer, options, fix)
    except OSError as error:  # unreadable (permissions, a folder, a remote filesystem's refusal)
        raise PromptFileError(f"{path}: cannot be read: {error}", fix="check the path and its permissions") from None
    if not numbered:
        raise PromptFileError(f"{path}:1: the file has no prompts; write one JSON object per line")
    if tokenizer is not None and max_prompt_tokens is not None:
        _check_lengths(numbered, tokenizer, max_prompt_tokens, progress)
    progress.done(len(numbered))
    return [prompt for _, prompt in numbered]


def _jsonl_rows(path: str, lines: Iterable[bytes], read: Callable[[int, int], None]) -> Iterator[Row]:
    """A JSONL file's lines as rows (its blank lines left out), each decoded as UTF-8 or a PromptFileError naming it."""
    stem = PurePosixPath(path).stem
    for line_number, raw in enumerate(lines, start=1):
        read(len(raw), line_number)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PromptFileError(
                f"{path}:{line_number}: not UTF-8 text: the line's byte {e.start + 1} is 0x{raw[e.start]:02x}",
                fix=ENCODING_FIX,
            ) from None
        if line.strip():
            yield f"{path}:{line_number}", f"line {line_number}", f"{stem}:{line_number}", line


def _prompts_of(
    rows: Iterable[Row], tokenizer: Any, options: PromptOptions, fix: str | None = None
) -> list[tuple[str, Prompt]]:
    """Each row as a Prompt, with the label a message names it by; the first bad row a PromptFileError."""
    numbered: list[tuple[str, Prompt]] = []
    first_place_of: dict[str, str] = {}
    for label, place, default_id, record in rows:
        try:
            prompt = _parse_record(record, default_id, tokenizer, options)
            if prompt.id in first_place_of:
                raise ValueError(f"duplicate id {prompt.id!r} (first used on {first_place_of[prompt.id]})")
        except ValueError as e:
            raise PromptFileError(f"{label}: {e}", fix=fix) from None
        first_place_of[prompt.id] = place
        numbered.append((label, prompt))
    return numbered


def _check_lengths(
    numbered: list[tuple[str, Prompt]], tokenizer: Any, max_prompt_tokens: int, progress: _Progress
) -> None:
    """Every prompt measured as the policy will see it (in batches: one call of a fast tokenizer each), the first
    one over max_prompt_tokens a PromptFileError naming its row."""
    for start in range(0, len(numbered), LENGTH_BATCH):
        batch = numbered[start : start + LENGTH_BATCH]
        for (label, _), length in zip(batch, prompt_lengths([p.text for _, p in batch], tokenizer)):
            if length > max_prompt_tokens:
                raise PromptFileError(
                    f"{label}: the prompt has {length} tokens, more than max_prompt_tokens={max_prompt_tokens}",
                    fix="shorten that prompt, or raise data.max_prompt_tokens (rollouts grow with it)",
                )
        progress.measured(start + len(batch), len(numbered))


class _Progress:
    """A line every PROGRESS_S seconds while a prompt file is read and measured, and one at the end when it took
    that long: a large file (200k prompts) takes minutes, which must not pass in silence."""

    def __init__(self, path: str, total_bytes: int | None, say: Callable[[str], None] | None) -> None:
        self.path, self.total_bytes, self.say = path, total_bytes, say
        self.started = self.last = time.monotonic()
        self.bytes_read = 0
        self.spoke = False

    def read(self, line_bytes: int, lines: int) -> None:
        self.bytes_read += line_bytes
        if self._due() and self.total_bytes is None:
            self._tell(f"read {lines:,} rows")
        elif self._due():
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


def _parse_record(record: Any, default_id: str, tokenizer: Any, options: PromptOptions) -> Prompt:
    """A JSONL line (text) or a dataset row (a mapping) as a Prompt; ValueError says what is wrong with it."""
    record = _decoded(record) if isinstance(record, str) else record
    if options.prompt_column is not None:
        record = _from_column(record, options.prompt_column)
    elif GYM_ROW_KEY in record:
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
        if not any(m["content"].strip() for m in checked):  # the template's markup alone: refused with or without it
            raise ValueError("the prompt is empty: every message's content is empty")
        kwargs = options.chat_template_kwargs
        text = (
            _render_chat(checked, tokenizer, kwargs)
            if tokenizer is not None
            else "".join(m["content"] for m in checked)
        )
        messages = tuple((m["role"], m["content"]) for m in checked)
    if not text:
        raise ValueError("the prompt is empty")
    fields = {key: value for key, value in record.items() if key not in PROMPT_KEYS}
    return Prompt(id=_parse_id(record.get("id"), default_id), text=text, messages=messages, fields=fields)


def _decoded(line: str) -> dict[str, Any]:
    try:
        record = json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    return record


def _from_column(record: dict[str, Any], key: str) -> dict[str, Any]:
    """A row whose prompt is in the column data.prompt_column names: a list of messages, or a string (verbatim text
    under "prompt", else one user message, rendered with the chat template); its other columns are its fields."""
    if key not in record:
        raise ValueError(
            f"no column {key!r} (data.prompt_column); this row has {', '.join(map(repr, record)) or 'none'}"
        )
    value = record[key]
    rest = {k: v for k, v in record.items() if k not in (key, "prompt", "messages")}
    if isinstance(value, str) and key == "prompt":
        return {**rest, "prompt": value}
    if isinstance(value, str):
        return {**rest, "messages": [{"role": "user", "content": value}]}
    if isinstance(value, list):
        return {**rest, "messages": value}
    raise ValueError(
        f"column {key!r} (data.prompt_column) must hold a string or a list of messages, got {type(value).__name__}"
    )


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


def _check_messages(messages: Any) -> list[dict[str, Any]]:
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
    # keys without a value left out, as transformers leaves them out (a dataset's rows hold every key of any row)
    return [{key: value for key, value in message.items() if value is not None} for message in messages]


def _render_chat(messages: list[dict[str, Any]], tokenizer: Any, kwargs: dict[str, Any]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            'a "messages" line needs a chat template and the tokenizer has none; '
            'write {"prompt": "..."} lines or use a tokenizer with a chat_template'
        )
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
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
