"""Statistics over prompt groups, broadcast back to rows.

`group_index` is a dense group number per row ([B] long, from `RolloutBatch.group_index()`), so rows
of one prompt share a number however the batch interleaves them. `counted` ([B] bool) picks the rows
a statistic is taken over; every row, counted or not, gets its group's value.
"""

from __future__ import annotations

import torch


def number_of_groups(group_index: torch.Tensor) -> int:
    return int(group_index.max()) + 1 if len(group_index) else 0


def group_totals(values: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Each row's group sum of `values`: [B] (values, group_index: [B])."""
    sums = torch.zeros(number_of_groups(group_index), dtype=values.dtype, device=values.device)
    return sums.index_add_(0, group_index, values)[group_index]


def group_mean(values: torch.Tensor, group_index: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the counted rows of each row's group: [B] (0 where a group counts no row)."""
    c = counted.float()
    return group_totals(values * c, group_index) / group_totals(c, group_index).clamp(min=1.0)


def leave_one_out_mean(values: torch.Tensor, group_index: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the counted rows of each row's group other than the row itself: [B].

    A row that is not counted gets the mean of all counted rows of its group. In a group with at most
    one counted row nobody has a peer: every row gets its own value.
    """
    c = counted.float()
    count = group_totals(c, group_index)  # [B] counted rows in the row's group
    others_sum = group_totals(values * c, group_index) - values * c  # a counted row leaves itself out
    others_mean = others_sum / (count - c).clamp(min=1.0)
    return torch.where(count <= 1, values, others_mean)
