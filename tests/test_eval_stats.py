"""The eval report's statistics on hand-computed examples: pass@k, the sign test, the bootstrap interval of a mean
and of a win rate, and the report's judge figures from verdicts laid out by hand."""

import math

import pytest

from rlsteps.engine.eval.report import Figures, judge_report, source_report
from rlsteps.engine.eval.stats import (
    mean_interval,
    outcome_scores,
    paired_counts,
    pass_at_k,
    percentile,
    sign_test,
)


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the share correct
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0 and pass_at_k(3, 2, 2) == 1.0
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def test_sign_test_is_the_two_sided_binomial_tail():
    assert sign_test(5, 0) == pytest.approx(2 / 32)  # 2 * P(X <= 0), X ~ Bin(5, 1/2)
    assert sign_test(8, 2) == pytest.approx(2 * (1 + 10 + 45) / 1024)  # 0.109375
    assert sign_test(2, 8) == sign_test(8, 2)
    assert sign_test(3, 3) == 1.0 and sign_test(0, 0) == 1.0


def test_percentile_is_the_nearest_rank():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0.0) == 1.0 and percentile(values, 0.25) == 1.0
    assert percentile(values, 0.26) == 2.0 and percentile(values, 1.0) == 4.0


def test_bootstrap_interval_of_a_mean_matches_the_exact_bootstrap_distribution():
    # [0, 0, 0, 1]: a resample's mean is Bin(4, 1/4) / 4: P(0) = 81/256, P(<= 0.5) = 243/256 = 0.949 and
    # P(<= 0.75) = 255/256 = 0.996, so the 2.5% point is 0 and the 97.5% point 0.75
    estimate = mean_interval([0.0, 0.0, 0.0, 1.0], resamples=4000, seed=1)
    assert (estimate.mean, estimate.low, estimate.high, estimate.n) == (0.25, 0.0, 0.75, 4)
    # [0, 0, 1]: Bin(3, 1/3) / 3, P(<= 2/3) = 26/27 = 0.963: under 0.975 (the 95% interval reaches 1) and over 0.95
    # (the 90% interval stops at 2/3)
    assert mean_interval([0.0, 0.0, 1.0], resamples=8000, seed=2).high == 1.0
    assert mean_interval([0.0, 0.0, 1.0], resamples=8000, confidence=0.9, seed=2).high == pytest.approx(2 / 3)
    assert mean_interval([2.0] * 7).as_dict() == {"mean": 2.0, "low": 2.0, "high": 2.0, "n": 7, "confidence": 0.95}
    assert math.isnan(mean_interval([]).mean)


def test_win_rate_interval_and_the_judge_figures():
    # 3 prompts won and 1 lost, each shown both ways round; the judge agrees with itself on all but prompt d, where
    # the side shown first won both verdicts (a tie), and prompt e failed
    def verdicts(first: str, second: str) -> list[dict]:
        return [
            {"policy_first": True, "outcome": "ok", "winner": first, "contradiction": False},
            {"policy_first": False, "outcome": "ok", "winner": second, "contradiction": second == "baseline"},
        ]

    records = [
        {"id": "a", "outcome": "win", "verdicts": verdicts("policy", "policy")},
        {"id": "b", "outcome": "win", "verdicts": verdicts("policy", "policy")},
        {"id": "c", "outcome": "win", "verdicts": verdicts("policy", "policy")},
        {"id": "d", "outcome": "tie", "verdicts": verdicts("policy", "baseline")},
        {"id": "e", "outcome": "failed", "verdicts": [{"policy_first": True, "outcome": "transport"}]},
    ]
    judge = judge_report(records, Figures(4000, 0.95, 0))
    # scores 1, 1, 1, 0.5: mean 0.875; a resample's mean is at least 0.5 (all the tie) and the chance it is 0.5 or
    # 0.625 (the tie drawn 4 or 3 times) is (1 + 12) / 256 = 0.051 > 0.025, so the 2.5% point is 0.625, and 1.0
    # (no tie drawn: (3/4)^4 = 0.316) the 97.5% point
    assert judge["win_rate"] == {"mean": 0.875, "low": 0.625, "high": 1.0, "n": 4, "confidence": 0.95}
    assert judge["baseline_win_rate"]["mean"] == 0.125 and judge["baseline_win_rate"]["low"] == 0.0
    assert (judge["wins"], judge["losses"], judge["ties"], judge["failed"]) == (3, 0, 1, 1)
    assert judge["sign_test_p"] == pytest.approx(2 / 8)
    assert judge["win_rate_policy_shown_first"]["mean"] == 1.0
    assert judge["win_rate_policy_shown_second"]["mean"] == 0.75
    assert judge["first_position_rate"] == pytest.approx(5 / 8)  # 4 of 4 first-shown wins, 1 of 4 second-shown
    assert judge["contradiction_rate"] == pytest.approx(1 / 8) and judge["verdicts"] == 8


def test_source_figures_pair_the_two_policies_by_prompt():
    def record(pid: str, greedy: float, samples: list[float]) -> dict:
        return {
            "id": pid,
            "greedy": {"rewards": {"correct": greedy}},
            "samples": [{"rewards": {"correct": s}} for s in samples],
        }

    policy = [record("a", 1.0, [1, 1, 0, 0]), record("b", 1.0, [1, 0, 0, 0]), record("c", 0.0, [0, 0, 0, 0])]
    baseline = [record("a", 0.0, [1, 0, 0, 0]), record("b", 1.0, [0, 0, 0, 0]), record("c", 1.0, [0, 0, 0, 0])]
    report = source_report("correct", policy, baseline, Figures(500, 0.95, 0), correct_at=1.0, ks=[1, 2])
    difference = report["greedy"]["difference"]
    assert (difference["gains"], difference["losses"], difference["ties"]) == (1, 1, 1)
    assert difference["mean"] == 0.0 and difference["sign_test_p"] == 1.0
    assert difference["largest_gains"] == [{"id": "a", "gain": 1.0}]
    assert difference["largest_losses"] == [{"id": "c", "gain": -1.0}]
    assert report["accuracy"]["policy"]["mean"] == pytest.approx(2 / 3)
    # pass@2 per prompt: a 1 - C(2,2)/C(4,2) = 5/6, b 1 - C(3,2)/C(4,2) = 1/2, c 0
    assert report["pass_at_k"]["2"]["policy"]["mean"] == pytest.approx((5 / 6 + 1 / 2) / 3)
    assert report["pass_at_k"]["1"]["baseline"]["mean"] == pytest.approx((1 / 4) / 3)
    assert report["sampled"]["policy"]["mean"] == pytest.approx((0.5 + 0.25 + 0) / 3)


def test_paired_counts_and_outcome_scores():
    assert paired_counts([0.5, -0.25, 0.0, 1e-12]) == (1, 1, 2)
    assert outcome_scores(2, 1, 1) == [1.0, 1.0, 0.0, 0.5]
