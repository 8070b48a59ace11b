"""From judgements to rewards: a tie in the scores is broken with the ranking; a response's reward is the mean
of its scores over its successful comparisons. A response without any gets the default score and is marked
invalid, so the training loop masks it out of the loss.

Two figures say whether the verdicts follow the responses or something else: the share of verdicts whose scores
and ranking prefer different responses (contradictions), and the share won by the response shown first. A judge
that reads the responses wins about half from either position once each pair is shown in both orders.
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


def first_shown_won(j: Judgement) -> bool | None:
    """Whether the response shown first won the verdict (by its scores, a tie broken by the ranking); None: a draw."""
    s1, s2 = pair_scores(j)
    return None if s1 == s2 else s1 > s2


def contradicts_itself(j: Judgement) -> bool:
    """The scores prefer one response and the ranking the other (3.5, the ranking's middle, prefers neither)."""
    return (j.score_1 - j.score_2) * (3.5 - j.ranking) < 0


def verdict_stats(judgements: list[Judgement]) -> dict[str, float]:
    """contradictions and contradiction_rate over the parsed verdicts, and first_position_rate over those that
    picked a winner (absent when none did)."""
    if not judgements:
        return {}
    contradictions = sum(contradicts_itself(j) for j in judgements)
    stats = {"contradictions": float(contradictions), "contradiction_rate": contradictions / len(judgements)}
    winners = [won for won in map(first_shown_won, judgements) if won is not None]
    if winners:
        stats["first_position_rate"] = sum(winners) / len(winners)
    return stats


def group_rewards(
    n: int, pairs: list[tuple[int, int]], judgements: list[Judgement | None]
) -> tuple[list[float], list[bool]]:
    """Each response's mean score over the pairs it met in a successful comparison (None = failed), and whether it
    met one. A pair shown both ways round is one pair: the two verdicts are combined first, a response's score in it
    the mean of its scores in the verdicts that succeeded (so a judge that scores each response on its own gives the
    rewards it gives shown once, to the bit)."""
    if len(pairs) != len(judgements):
        raise ValueError(f"{len(pairs)} pairs but {len(judgements)} judgements: pass one judgement (or None) per pair")
    verdicts: dict[tuple[int, int], list[tuple[float, float]]] = {}  # (i, j), i < j -> (score of i, score of j) each
    for (i, j), judgement in zip(pairs, judgements):
        if judgement is not None:
            s_i, s_j = pair_scores(judgement)
            verdicts.setdefault((min(i, j), max(i, j)), []).append((s_i, s_j) if i < j else (s_j, s_i))
    totals, counts = [0.0] * n, [0] * n
    for (i, j), scores in verdicts.items():
        totals[i] += sum(s_i for s_i, _ in scores) / len(scores)
        totals[j] += sum(s_j for _, s_j in scores) / len(scores)
        counts[i], counts[j] = counts[i] + 1, counts[j] + 1
    rewards = [total / count if count else DEFAULT_SCORE for total, count in zip(totals, counts)]
    return rewards, [count > 0 for count in counts]


def length_penalty(rewards: list[float], lengths: list[int], coef: float) -> list[float]:
    """Zero-centred length penalty within a group: r - coef * (len - mean len) / max(mean len, 1)."""
    if coef == 0 or not rewards:
        return list(rewards)
    mean_length = sum(lengths) / len(lengths)
    return [r - coef * (length - mean_length) / max(mean_length, 1.0) for r, length in zip(rewards, lengths)]
