"""The rollout batch: what generation produces and every algorithm consumes.

Layout: each row is prompt tokens followed by response tokens, right-padded with the pad id.
Log-probs are indexed by the position of the *predicted* token minus one, so a [B, T-1]
log-prob tensor lines up with `response_mask()`: entry t scores token t+1.
Groups are explicit prompt ids, never equal padded tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RolloutBatch:
    tokens: torch.Tensor  # [B, T] long: prompt + response, right-padded with pad_id
    prompt_lengths: torch.Tensor  # [B] long
    response_lengths: torch.Tensor  # [B] long: generated tokens, EOS included when ended
    is_end: torch.Tensor  # [B] bool: the response ended with EOS (not truncated)
    prompt_ids: list[str]  # [B] explicit prompt id: the group key
    prompt_texts: list[str]  # [B] the rendered prompt the policy saw
    response_texts: list[str]  # [B] decoded response, special tokens skipped
    pad_id: int
    gen_logprobs: torch.Tensor | None = None  # [B, T-1] fp32 sampler log-probs on response positions
    conversations: list[list[dict[str, str]]] | None = None  # [B] the prompt as chat messages, no template markup
    fields: list[dict[str, Any]] | None = None  # [B] the prompt line's other keys (e.g. "answer"), for reward functions
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # per-row tensors added by the loop

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def sequence_lengths(self) -> torch.Tensor:  # [B]
        return self.prompt_lengths + self.response_lengths

    def attention_mask(self) -> torch.Tensor:  # [B, T] long
        positions = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return (positions[None, :] < self.sequence_lengths[:, None]).long()

    def response_mask(self) -> torch.Tensor:  # [B, T-1] float
        """1.0 where the predicted token (t+1) is a response token, EOS included."""
        predicted = torch.arange(1, self.tokens.shape[1], device=self.tokens.device)[None, :]
        start = self.prompt_lengths[:, None]
        end = self.sequence_lengths[:, None]
        return ((predicted >= start) & (predicted < end)).float()

    def group_index(self) -> tuple[torch.Tensor, int]:
        """Dense group number per row (in order of first appearance) and the number of groups."""
        first_seen: dict[str, int] = {}
        index = [first_seen.setdefault(pid, len(first_seen)) for pid in self.prompt_ids]
        return torch.tensor(index, dtype=torch.long), len(first_seen)

    def conversation(self, row: int) -> list[dict[str, str]]:
        """Row `row`'s prompt as chat messages; a batch built from raw text holds it as one user message."""
        if self.conversations is not None:
            return self.conversations[row]
        return [{"role": "user", "content": self.prompt_texts[row]}]

    def fields_of(self, row: int) -> dict[str, Any]:
        """Row `row`'s prompt fields ({} for a batch without them)."""
        return self.fields[row] if self.fields is not None else {}

    def select(self, rows: torch.Tensor | list[int]) -> RolloutBatch:
        """A new batch of the given rows, trimmed to its longest sequence."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.sequence_lengths[rows].max()) if len(rows) else 1
        pick = rows.tolist()
        return RolloutBatch(
            tokens=self.tokens[rows, :width],
            prompt_lengths=self.prompt_lengths[rows],
            response_lengths=self.response_lengths[rows],
            is_end=self.is_end[rows],
            prompt_ids=[self.prompt_ids[i] for i in pick],
            prompt_texts=[self.prompt_texts[i] for i in pick],
            response_texts=[self.response_texts[i] for i in pick],
            pad_id=self.pad_id,
            gen_logprobs=None if self.gen_logprobs is None else self.gen_logprobs[rows, : width - 1],
            conversations=None if self.conversations is None else [self.conversations[i] for i in pick],
            fields=None if self.fields is None else [self.fields[i] for i in pick],
            extras={k: _select_rows(v, rows, width) for k, v in self.extras.items()},
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The tensors on a device (rows, texts and ids unchanged)."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return RolloutBatch(
            tokens=move(self.tokens),
            prompt_lengths=move(self.prompt_lengths),
            response_lengths=move(self.response_lengths),
            is_end=move(self.is_end),
            prompt_ids=self.prompt_ids,
            prompt_texts=self.prompt_texts,
            response_texts=self.response_texts,
            pad_id=self.pad_id,
            gen_logprobs=move(self.gen_logprobs),
            conversations=self.conversations,
            fields=self.fields,
            extras={k: v.to(device) for k, v in self.extras.items()},
        )

    @classmethod
    def concat(cls, parts: list[RolloutBatch]) -> RolloutBatch:
        """The rows of every part in order, padded to the widest (what the main process scores)."""
        if len(parts) == 1:
            return parts[0]
        width = max(part.tokens.shape[1] for part in parts)

        def padded(name: str, fill: float, columns: int) -> torch.Tensor | None:
            tensors = [getattr(part, name) for part in parts]
            if any(t is None for t in tensors):
                return None
            return torch.cat([torch.nn.functional.pad(t, (0, columns - t.shape[1]), value=fill) for t in tensors])

        return cls(
            tokens=padded("tokens", parts[0].pad_id, width),
            prompt_lengths=torch.cat([part.prompt_lengths for part in parts]),
            response_lengths=torch.cat([part.response_lengths for part in parts]),
            is_end=torch.cat([part.is_end for part in parts]),
            prompt_ids=[i for part in parts for i in part.prompt_ids],
            prompt_texts=[t for part in parts for t in part.prompt_texts],
            response_texts=[t for part in parts for t in part.response_texts],
            pad_id=parts[0].pad_id,
            gen_logprobs=padded("gen_logprobs", 0.0, width - 1),
            conversations=None
            if any(part.conversations is None for part in parts)
            else [c for part in parts for c in part.conversations],
            fields=None if any(part.fields is None for part in parts) else [f for part in parts for f in part.fields],
        )

    def micro_batches(self, size: int) -> list[RolloutBatch]:
        return [self.select(rows) for rows in self.micro_batch_rows(size)]

    def micro_batch_rows(
        self, size: int, max_tokens: int | None = None, whole_groups: bool = False, bin_tokens: int | None = None
    ) -> list[list[int]]:
        """The rows of each micro-batch. Without a token budget: `size` rows at a time, in order. With one (dynamic
        batching): units (single rows, or whole prompt groups with whole_groups; a group's rows are adjacent)
        sorted by length, longest first, each micro-batch taking units while its rows times its longest sequence
        stay within max_tokens: short rows share a micro-batch, padded to each other's length rather than to a long
        one's. A unit over the budget on its own makes a micro-batch of its own. With bin_tokens (sequence packing),
        the units longest first, each micro-batch taking units while its rows pack (first_fit_bins) into at most
        `size` bins of bin_tokens tokens."""
        if max_tokens is None and bin_tokens is None:
            return [list(range(i, min(i + size, len(self)))) for i in range(0, len(self), size)]
        lengths = self.sequence_lengths.tolist()
        units = _group_runs(self.prompt_ids) if whole_groups else [[row] for row in range(len(self))]
        units.sort(key=lambda unit: -max(lengths[row] for row in unit))  # stable: equal lengths keep their order
        plan: list[list[int]] = []
        width = 0
        for unit in units:
            if plan and bin_tokens is not None:
                fits = len(first_fit_bins([lengths[row] for row in plan[-1] + unit], bin_tokens)) <= size
            else:
                fits = bool(plan) and (len(plan[-1]) + len(unit)) * width <= max_tokens
            if fits:
                plan[-1].extend(unit)
            else:
                plan.append(list(unit))
                width = max(lengths[row] for row in unit)  # the longest: units come longest first
        return plan


def first_fit_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indexes into `lengths` in bins of at most `capacity` tokens: longest first, each into the first bin with room
    (first-fit decreasing). A length over the capacity gets a bin of its own. Equal lengths keep their order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        fit = next((b for b, left in enumerate(room) if lengths[i] <= left), None)
        if fit is None:
            bins.append([i])
            room.append(capacity - lengths[i])
        else:
            bins[fit].append(i)
            room[fit] -= lengths[i]
    return bins


def _group_runs(prompt_ids: list[str]) -> list[list[int]]:
    """The rows of each run of equal prompt ids, in order."""
    runs: list[list[int]] = []
    for row, pid in enumerate(prompt_ids):
        if runs and prompt_ids[runs[-1][0]] == pid:
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def _select_rows(value: torch.Tensor, rows: torch.Tensor, width: int) -> torch.Tensor:
    """Per-row extras: [B] tensors keep their shape; [B, T-1] token tensors are trimmed to the new width."""
    picked = value[rows]
    return picked[:, : width - 1] if picked.dim() == 2 else picked
