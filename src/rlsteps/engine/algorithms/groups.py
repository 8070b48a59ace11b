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


def group_std(values: torch.Tensor, group_index: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """Unbiased std of `values` over the counted rows of each row's group: [B] (0 with fewer than two)."""
    c = counted.float()
    count = group_totals(c, group_index)
    squares = group_totals((values - group_mean(values, group_index, counted)) ** 2 * c, group_index)
    return torch.where(count >= 2, (squares / (count - 1).clamp(min=1.0)).sqrt(), torch.zeros_like(values))


def leave_one_out_std(values: torch.Tensor, group_index: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """Unbiased std of `values` over the counted rows of each row's group other than the row itself: [B].

    The set of leave_one_out_mean: an uncounted row's set is all counted rows of its group. A set of
    fewer than two rows has no spread: 0. Sums are taken around the group mean, so a large common
    offset of the rewards does not cancel the small differences that matter.
    """
    c = counted.float()
    m = group_mean(values, group_index, counted)  # [B]
    n = group_totals(c, group_index) - c  # [B] rows in the row's set
    deviation = values - m
    set_mean = (group_totals(deviation * c, group_index) - deviation * c) / n.clamp(min=1.0)  # mean of set - m
    set_squares = group_totals(deviation**2 * c, group_index) - deviation**2 * c  # about m
    variance = (set_squares - n * set_mean**2).clamp(min=0.0) / (n - 1).clamp(min=1.0)
    return torch.where(n >= 2, variance.sqrt(), torch.zeros_like(values))
