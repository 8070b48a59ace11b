"""The policy's tokenizer read from its files alone, for measuring prompts where neither torch nor transformers is
imported (a dry run): transformers' AutoTokenizer imports torch, through its model configs.

Its tokenizer.json goes to the `tokenizers` package, which encodes as transformers' fast tokenizers do (they are
that package underneath); its chat template is rendered with jinja2 in the environment transformers renders it in
(a sandbox, trim_blocks and lstrip_blocks, loop controls, the {% generation %} tag, tojson, raise_exception,
strftime_now), with the special tokens the folder names. A tokenizer without a tokenizer.json (a slow,
sentencepiece-only one) is left to the run, which measures every prompt again with the class the policy names.
"""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from rlsteps.contract.megatron_files import TOKENIZER_DIR, find_checkpoint_dir

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
TEMPLATE_FILE = "chat_template.jinja"  # where transformers saves the chat template (else in CONFIG_FILE)
ENGINE_EXTRA = "pip install 'rlsteps[engine]'"  # brings the tokenizers package and jinja2


def tokenizer_folder(policy: str | Path) -> Path:
    """Where a policy keeps its tokenizer: a Hugging Face folder itself, or a Megatron checkpoint's tokenizer/."""
    megatron, _ = find_checkpoint_dir(LocalFileSystem(), str(Path(policy).absolute()))
    return Path(megatron) / TOKENIZER_DIR if megatron else Path(policy)


def tokenizer_from_files(policy: str | Path) -> tuple[FileTokenizer | None, str]:
    """(the policy's tokenizer, "") or (None, why it cannot be read here)."""
    folder = tokenizer_folder(policy)
    if not (folder / TOKENIZER_FILE).is_file():
        return None, f"{folder} has no {TOKENIZER_FILE}"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None, f"the tokenizers package is not installed here ({ENGINE_EXTRA})"
    try:
        config = _json(folder / CONFIG_FILE)
        special = {**_tokens(_json(folder / SPECIAL_TOKENS_FILE)), **_tokens(config)}
        template = _template(folder, config)
        if template is not None and importlib.util.find_spec("jinja2") is None:
            return None, f"jinja2 is not installed here to render its chat template ({ENGINE_EXTRA})"
        return FileTokenizer(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), special, template), ""
    except (OSError, ValueError, TypeError) as error:  # the tokenizers package raises Exception subclasses of its own
        return None, f"the tokenizer in {folder} cannot be read: {error}"
    except Exception as error:  # noqa: BLE001 - tokenizers' own errors (a file of another version, say)
        return None, f"the tokenizer in {folder} cannot be read: {type(error).__name__}: {error}"


class FileTokenizer:
    """What measuring a prompt asks of a tokenizer (rlsteps.contract.prompts): encode text, with or without the
    special tokens its post-processor adds, its BOS id, and its chat template rendered as text."""

    def __init__(self, tokenizer: Any, special_tokens: dict[str, str], chat_template: str | None) -> None:
        self.tokenizer, self.special_tokens, self.chat_template = tokenizer, special_tokens, chat_template
        bos = special_tokens.get("bos_token")
        self.bos_token_id = tokenizer.token_to_id(bos) if bos else None
        self._compiled = None

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}
        rows = self.tokenizer.encode_batch(text, add_special_tokens=add_special_tokens)
        return {"input_ids": [row.ids for row in rows]}

    def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> str:
        """The conversation rendered as transformers renders it; kwargs (data.chat_template_kwargs, such as
        enable_thinking) reach the template beside the special tokens, over them where both name one."""
        if tokenize:
            raise ValueError("FileTokenizer renders text only: encode the text it returns")
        if self._compiled is None:
            self._compiled = compiled_template(self.chat_template)
        return self._compiled.render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **kwargs},
        )


def compiled_template(source: str) -> Any:
    """A chat template compiled as transformers compiles it (transformers.utils.chat_template_utils)."""
    return _environment().from_string(source)


def unread_template_kwargs(template: Any, kwargs: dict[str, Any] | None) -> list[str]:
    """The names of kwargs (data.chat_template_kwargs) that a chat template never reads: given, they change
    nothing (a template of another family than the one the keys were written for, or a misspelt key)."""
    if not isinstance(template, str) or not kwargs:
        return []
    from jinja2 import meta

    read = meta.find_undeclared_variables(_environment().parse(template))
    return [name for name in kwargs if name not in read]


def unread_kwargs_note(template: Any, kwargs: dict[str, Any] | None) -> str | None:
    """What a run and its dry run say of kwargs the chat template never reads; None when it reads them all."""
    unread = unread_template_kwargs(template, kwargs)
    if not unread:
        return None
    return (
        f"data.chat_template_kwargs: the policy's chat template never reads {', '.join(unread)}, so it changes "
        "nothing (check the name against the template, or leave it out)"
    )


def _environment() -> Any:
    """jinja2's environment as transformers builds it for chat templates."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """{% generation %}...{% endgeneration %}: the assistant's part, rendered as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f), dict=dict)
    return env


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _tokens(config: dict[str, Any]) -> dict[str, str]:
    """bos_token, eos_token, ...: as a string, or an added token's content."""
    found = {}
    for key, value in config.items():
        if key.endswith("_token") and isinstance(value, dict) and isinstance(value.get("content"), str):
            value = value["content"]
        if key.endswith("_token") and isinstance(value, str):
            found[key] = value
    return found


def _template(folder: Path, config: dict[str, Any]) -> str | None:
    """The chat template transformers would read: chat_template.jinja, else the config's (the "default" one of a
    list of named templates)."""
    if (folder / TEMPLATE_FILE).is_file():
        return (folder / TEMPLATE_FILE).read_text()
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
