"""From judgements to rewards: a tie in the scores is broken with the ranking; a response's reward is the mean
of its scores over its successful comparisons. A response without any gets the default score and is marked
invalid, so the training loop masks it out of the loss.
"""

from __future__ import annotations

from rlsteps.engine.rewards.judge.protocol import Judgement

DEFAULT_SCORE = 3.0


def pair_scores(j: Judgement) -> tuple[float, float]:
    """The two responses' scores; a tie is broken with the ranking (3.5 is neutral)."""
    s1, s2 = j.score_1, j.score_2
    if s1 == s2:
        adjustment = 3.5 - j.ranking
        s1, s2 = s1 + adjustment, s2 - adjustment
    return s1, s2


def group_rewards(
    n: int, pairs: list[tuple[int, int]], judgements: list[Judgement | None]
) -> tuple[list[float], list[bool]]:
    """Each response's mean score over its successful comparisons (None = failed) and whether it had one."""
    if len(pairs) != len(judgements):
        raise ValueError(f"{len(pairs)} pairs but {len(judgements)} judgements: pass one judgement (or None) per pair")
    totals, counts = [0.0] * n, [0] * n
    for (i, j), judgement in zip(pairs, judgements):
        if judgement is None:
            continue
        s_i, s_j = pair_scores(judgement)
        totals[i], totals[j] = totals[i] + s_i, totals[j] + s_j
        counts[i], counts[j] = counts[i] + 1, counts[j] + 1
    rewards = [total / count if count else DEFAULT_SCORE for total, count in zip(totals, counts)]
    return rewards, [count > 0 for count in counts]


def length_penalty(rewards: list[float], lengths: list[int], coef: float) -> list[float]:
    """Zero-centred length penalty within a group: r - coef * (len - mean len) / max(mean len, 1)."""
    if coef == 0 or not rewards:
        return list(rewards)
    mean_length = sum(lengths) / len(lengths)
    return [r - coef * (length - mean_length) / max(mean_length, 1.0) for r, length in zip(rewards, lengths)]
