"""Prompt-id groups: sums over the rows of each row's group. Rows carry a dense group number
(`RolloutBatch.group_index()`), never "rows with equal padded tokens"."""

from __future__ import annotations

import torch


def group_count(group_index: torch.Tensor) -> int:
    """The number of groups of a dense group index [B] (0 for an empty batch)."""
    return int(group_index.max()) + 1 if len(group_index) else 0


def group_totals(values: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Each row's group sum of `values`: [B] (values, group_index: [B])."""
    sums = torch.zeros(group_count(group_index), dtype=values.dtype, device=values.device)
    return sums.index_add_(0, group_index, values)[group_index]
