"""A scalar reward model: a Hugging Face sequence-classification model with one output.

The reward is the model's output at the last non-pad token. Rows are right-padded, so under
causal attention the padding never reaches the tokens that are read: a reward does not depend
on the batch it was scored in.

A pair is read as one of two texts: the policy's rendered prompt, the response and the reward
tokenizer's EOS (`encode`, the text the tiny reward model is trained on), or the conversation and
the response through the reward model's own chat template (`encode_conversations`). Each keeps at
most `max_length` tokens, cut from `truncation_side`; both have defaults that a call may override.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlsteps.engine.device import resolve_device
from rlsteps.engine.rewards.text import TRUNCATION_SIDES, TruncationSide, reward_input_text, truncate


class RewardScorer:
    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        max_length: int = 512,
        batch_size: int = 32,
        truncation_side: TruncationSide = "left",
        dtype: str = "auto",
    ) -> None:
        """dtype: the weights' dtype (float32, bfloat16), or auto: the one the checkpoint stores."""
        if max_length < 1 or batch_size < 1:
            raise ValueError(f"max_length and batch_size must be >= 1, got {max_length} and {batch_size}")
        if truncation_side not in TRUNCATION_SIDES:
            raise ValueError(f"truncation_side must be left or right, got {truncation_side!r}")
        self.name = str(model_path)
        self.device = resolve_device(device)
        self.max_length = max_length
        self.batch_size = batch_size
        # Left by default: the reward is read at the last token, and the end holds the response and its EOS.
        # Cutting the end would score an unfinished response.
        self.truncation_side = truncation_side
        self._tokenizer_lock = threading.Lock()  # the truncation side is the tokenizer's state

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                f"the tokenizer of the reward model {model_path} has no pad token: "
                "set one (tokenizer.pad_token = ...) and save it with the model"
            )

        self.model = AutoModelForSequenceClassification.from_pretrained(model_path, dtype=_torch_dtype(dtype))
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"{model_path} has num_labels={self.model.config.num_labels}; a scalar reward model needs num_labels=1"
            )
        self.pad_id = self._pad_id_shared_with_model()
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.model.to(self.device).eval().requires_grad_(False)

    def _pad_id_shared_with_model(self) -> int:
        """The model finds the last token by the config's pad id, so it must be the tokenizer's pad id."""
        config = self.model.config
        if config.pad_token_id is None:
            config.pad_token_id = self.tokenizer.pad_token_id
        if config.pad_token_id != self.tokenizer.pad_token_id:
            raise ValueError(
                f"the reward model's config.pad_token_id ({config.pad_token_id}) differs from its "
                f"tokenizer's pad id ({self.tokenizer.pad_token_id}): make them equal and save the model again"
            )
        return int(config.pad_token_id)

    def prompt_text(self, conversation: list[dict[str, str]]) -> str:
        """A conversation as this model reads a prompt: its own chat template with the generation prompt, or
        the messages' contents one after another when its tokenizer has no template."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return "\n\n".join(message["content"] for message in conversation)

    @property
    def placement(self) -> str:
        """Where and how it computes, for a server's first log line: 'cpu (torch.float32, 2 CPU threads)'."""
        threads = torch.get_num_threads()
        return f"{self.device} ({self.model.dtype}, {threads} CPU thread{'s' if threads != 1 else ''})"

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(
        self,
        prompts: list[str],
        responses: list[str],
        *,
        max_length: int | None = None,
        truncation_side: TruncationSide | None = None,
    ) -> list[list[int]]:
        """Token ids of `reward_input_text` per pair (the policy's rendered prompt), truncated to max_length."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses: give one response per prompt")
        eos = self.tokenizer.eos_token
        texts = [reward_input_text(p, r, eos) for p, r in zip(prompts, responses)]
        return self._tokenize(texts, max_length, truncation_side)

    def encode_conversations(
        self,
        conversations: list[list[dict[str, Any]]],
        responses: list[str],
        *,
        max_length: int | None = None,
        truncation_side: TruncationSide | None = None,
    ) -> list[list[int]]:
        """Token ids of each conversation followed by the response as the assistant's turn, rendered with this
        model's own chat template (which writes its special tokens: none are added), truncated to max_length."""
        if len(conversations) != len(responses):
            raise ValueError(
                f"{len(conversations)} conversations but {len(responses)} responses: give one response per conversation"
            )
        if not self.has_chat_template:
            raise ValueError(f"the tokenizer of the reward model {self.name} has no chat template")
        texts = [self.conversation_text(c, r) for c, r in zip(conversations, responses)]
        return self._tokenize(texts, max_length, truncation_side, add_special_tokens=False)

    def conversation_text(self, conversation: list[dict[str, Any]], response: str) -> str:
        """The conversation and the response as the assistant's last turn, in this model's chat template."""
        return self.tokenizer.apply_chat_template(
            [*conversation, {"role": "assistant", "content": response}], tokenize=False
        )

    def _tokenize(
        self, texts: list[str], max_length: int | None, side: TruncationSide | None, add_special_tokens: bool = True
    ) -> list[list[int]]:
        if not texts:
            return []
        side = side or self.truncation_side
        if side not in TRUNCATION_SIDES:
            raise ValueError(f"truncation_side must be left or right, got {side!r}")
        with self._tokenizer_lock:
            self.tokenizer.truncation_side = side
            encoded = self.tokenizer(
                texts, truncation=True, max_length=max_length or self.max_length, add_special_tokens=add_special_tokens
            )
        return encoded["input_ids"]

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        return self.score_tokens(self.encode(prompts, responses))

    @torch.no_grad()
    def score_tokens(
        self,
        token_ids: list[list[int]],
        *,
        max_length: int | None = None,
        truncation_side: TruncationSide | None = None,
    ) -> list[float]:
        """One reward per row, each truncated to max_length; rows are sorted by length into sub-batches to waste
        little padding."""
        length, side = max_length or self.max_length, truncation_side or self.truncation_side
        rows = [truncate(list(ids), length, side) for ids in token_ids]
        if any(len(ids) == 0 for ids in rows):
            raise ValueError("an empty token sequence cannot be scored: every row needs at least one token")
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        rewards = [0.0] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            scores = self._forward([rows[i] for i in chunk])
            for i, value in zip(chunk, scores):
                rewards[i] = value
        return rewards

    def _forward(self, rows: list[list[int]]) -> list[float]:
        width = max(len(ids) for ids in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # [B, T], right-padded
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, ids in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        logits = self.model(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)
        ).logits  # [B, 1]
        return logits[:, 0].float().cpu().tolist()


def _torch_dtype(name: str) -> torch.dtype | str:
    if name == "auto":
        return "auto"
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {name!r}")
    return getattr(torch, name)
