"""The tiny byte-level BPE tokenizer, its special tokens and its chat template."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rlsteps.tiny.hyperparameters import TOKENIZER_VOCAB

PAD, EOS = "<|pad|>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('tiny chat roles are system, user and assistant, got ' + message['role']) }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>\n{% endif -%}"
)


def train_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE (any text encodes) with pad, eos and role tokens, and the tiny chat template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=[PAD, EOS, *ROLE_TOKENS.values()],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        chat_template=CHAT_TEMPLATE,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    """save_pretrained, with a tokenizer_config.json that older transformers versions read too."""
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.pop("extra_special_tokens", None)  # transformers 5: the role tokens; 4.x: {} (named extras)
    config["additional_special_tokens"] = extra if isinstance(extra, list) and extra else list(ROLE_TOKENS.values())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def word_token(tokenizer: PreTrainedTokenizerFast, word: str) -> int:
    """The id of " word" as a response says it; the tiny tokenizer keeps every task word whole (a split word is
    refused: read by its first piece it would be another word)."""
    pieces = tokenizer(f" {word}", add_special_tokens=False)["input_ids"]
    if len(pieces) != 1:
        raise ValueError(f"{word!r} is {len(pieces)} tokens of this tokenizer: a task word must be one")
    return pieces[0]


def chat_prompt(tokenizer: PreTrainedTokenizerFast, user_text: str) -> str:
    """The rendered prompt the policy sees, ending with the assistant header."""
    messages = [{"role": "user", "content": user_text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
