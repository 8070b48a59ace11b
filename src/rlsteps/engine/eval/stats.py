"""The statistics of an evaluation, as pure functions of per-prompt numbers: a mean with its percentile-bootstrap
interval, the unbiased pass@k, a win rate with its interval, and the two-sided sign test.

Every interval is a percentile bootstrap over prompts (the prompt is the unit that was sampled), drawn from a seeded
generator so that a report is the same each time it is made from the same results.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Estimate:
    """A mean over prompts and its bootstrap interval at `confidence`."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = 0.95

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted values by the nearest-rank rule: the smallest value with at least a
    share q of the values at or below it (q = 0: the smallest)."""
    if not sorted_values:
        raise ValueError("the percentile of no values is undefined")
    rank = max(1, math.ceil(q * len(sorted_values) - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def bootstrap_means(values: Sequence[float], resamples: int, seed: int) -> list[float]:
    """The means of `resamples` resamples of the values drawn with replacement, sorted."""
    rng = random.Random(seed)
    n = len(values)
    return sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))


def mean_interval(values: Sequence[float], resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Estimate:
    """The mean of the values and its percentile-bootstrap interval; NaN throughout for no values."""
    if not values:
        return Estimate(math.nan, math.nan, math.nan, 0, confidence)
    means = bootstrap_means(values, resamples, seed)
    tail = (1.0 - confidence) / 2
    mean = sum(values) / len(values)
    return Estimate(mean, percentile(means, tail), percentile(means, 1.0 - tail), len(values), confidence)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (Chen et al.
    2021), the chance that k samples drawn from the n without replacement hold at least one correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def outcome_scores(wins: int, losses: int, ties: int) -> list[float]:
    """Per-prompt scores of a comparison: 1 a win, 0 a loss, 0.5 a tie (AlpacaEval's win rate is their mean)."""
    return [1.0] * wins + [0.0] * losses + [0.5] * ties


def sign_test(wins: int, losses: int) -> float:
    """The two-sided sign test's p-value: under no difference, wins ~ Binomial(wins + losses, 1/2); ties are left
    out. 1.0 when there is nothing to test."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_counts(diffs: Sequence[float], tolerance: float = 1e-9) -> tuple[int, int, int]:
    """(gains, losses, ties) of per-prompt differences policy - baseline."""
    gains = sum(d > tolerance for d in diffs)
    losses = sum(d < -tolerance for d in diffs)
    return gains, losses, len(diffs) - gains - losses
