"""The judge's comparison of the policy with the baseline: for each prompt, their greedy responses shown to the judge
both ways round (whatever the judge says of itself: which position wins is one of the figures), each verdict kept
with the side it favoured, and the prompt's outcome from the two verdicts together, as the RL steps' rewards are
(each response's score the mean of its scores; rlsteps.engine.rewards.judge.scoring).
"""

from __future__ import annotations

from typing import Any

from rlsteps.contract.prompts import Prompt
from rlsteps.engine.rewards.judge.parsing import JudgeParseError, parse_judgement
from rlsteps.engine.rewards.judge.scoring import contradicts_itself, pair_scores

POLICY, BASELINE = 0, 1  # the responses' places in each comparison group


def judge_prompts(
    judge: Any, prompts: list[Prompt], policy: list[dict[str, Any]], baseline: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A record per prompt: the verdicts in both orders and the outcome (win, loss, tie; failed when no verdict).

    judge: the run's JudgeSource (its client and its server's readiness)."""
    judge.ready()
    judge.client.position_independent = False  # both orders, always: the position rate is measured, not assumed
    groups = [
        (prompt.conversation, [p["greedy"]["response"], b["greedy"]["response"]])
        for prompt, p, b in zip(prompts, policy, baseline)
    ]
    result = judge.client.judge(groups)
    by_group: list[list[dict[str, Any]]] = [[] for _ in groups]
    for answer in result.answers:
        by_group[answer.group].append(verdict_record(answer))
    return [
        {
            "id": prompt.id,
            "verdicts": verdicts,
            "policy_score": result.rewards[g][POLICY] if result.valid[g][POLICY] else None,
            "baseline_score": result.rewards[g][BASELINE] if result.valid[g][BASELINE] else None,
            "outcome": outcome(result.rewards[g], result.valid[g][POLICY]),
        }
        for g, (prompt, verdicts) in enumerate(zip(prompts, by_group))
    ]


def outcome(scores: list[float], valid: bool) -> str:
    """win, loss or tie of the policy by its mean score against the baseline's; failed without a verdict."""
    if not valid:
        return "failed"
    policy, baseline = scores[POLICY], scores[BASELINE]
    return "win" if policy > baseline else "loss" if policy < baseline else "tie"


def verdict_record(answer: Any) -> dict[str, Any]:
    """One comparison: which side was shown first, which side won it, whether its scores and ranking disagree."""
    policy_first = answer.pair[0] == POLICY
    record: dict[str, Any] = {"policy_first": policy_first, "outcome": answer.failure or "ok", "answer": answer.content}
    if answer.failure is not None:
        return record
    try:
        judgement = parse_judgement(answer.content)
    except JudgeParseError:  # parsed once by the client: not expected to fail again
        return {**record, "outcome": "parse"}
    first, second = pair_scores(judgement)
    policy, baseline = (first, second) if policy_first else (second, first)
    winner = "policy" if policy > baseline else "baseline" if policy < baseline else "tie"
    return {**record, "winner": winner, "contradiction": contradicts_itself(judgement)}
