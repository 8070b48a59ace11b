"""A scalar reward model: a Hugging Face sequence-classification model with one output.

The reward is the model's output at the last non-pad token. Rows are right-padded, so under
causal attention the padding never reaches the tokens that are read: a reward does not depend
on the batch it was scored in.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlsteps.engine.device import resolve_device
from rlsteps.engine.rewards.text import reward_input_text


class RewardScorer:
    def __init__(
        self, model_path: str | Path, device: str = "cpu", max_length: int = 512, batch_size: int = 32
    ) -> None:
        if max_length < 1 or batch_size < 1:
            raise ValueError(f"max_length and batch_size must be >= 1, got {max_length} and {batch_size}")
        self.name = str(model_path)
        self.device = resolve_device(device)
        self.max_length = max_length
        self.batch_size = batch_size

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                f"the tokenizer of the reward model {model_path} has no pad token: "
                "set one (tokenizer.pad_token = ...) and save it with the model"
            )
        # Keep the end of an over-long input: the reward is read at the last token, and the end
        # holds the response and its EOS. Cutting the end would score an unfinished response.
        self.tokenizer.truncation_side = "left"

        self.model = AutoModelForSequenceClassification.from_pretrained(model_path)
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

    def encode(self, prompts: list[str], responses: list[str]) -> list[list[int]]:
        """Token ids of `reward_input_text` per pair, truncated from the left to max_length."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses: give one response per prompt")
        eos = self.tokenizer.eos_token
        texts = [reward_input_text(p, r, eos) for p, r in zip(prompts, responses)]
        return self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"] if texts else []

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        return self.score_tokens(self.encode(prompts, responses))

    @torch.no_grad()
    def score_tokens(self, token_ids: list[list[int]]) -> list[float]:
        """One reward per row; rows are sorted by length into sub-batches to waste little padding."""
        rows = [ids[-self.max_length :] for ids in token_ids]
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
