"""What reward hacking looks like on record: the figures of a step's rollouts and of a validation, each sign said once
in one line with two samples and the remedy that fits, recorded, and repeated by the end summary; no sign of a
collapse while the validation functions stand at their best."""

from __future__ import annotations

import json
import logging

import pandas
import pytest
import torch

from rlsteps.contract.config import RewardHackingConfig
from rlsteps.contract.reward_config import RewardEntry
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.records.reward_hacking import (
    HackingWatch,
    Remedies,
    rank_correlation,
    repeated_word,
    rollout_signs,
    said_words,
    validation_correlations,
)
from rlsteps.engine.records.run_end import summarise
from rlsteps.engine.rewards.combined import CombinedSource, RewardTerm
from rlsteps.engine.rewards.scores import Scores
from rlsteps.tiny.hacks import per_repeat, per_word

KL = "reinforce.initial_policy_kl_penalty"
REMEDIES = Remedies(KL, {"reward_model": RewardEntry(source="reward_model")})
TWO_TERMS = Remedies(
    KL, {"reward_model": RewardEntry(source="reward_model"), "hack": RewardEntry(function="m:f", weight=3)}
)


def batch(
    responses: list[str], group: int = 2, logprobs: list[list[float]] | None = None, ended: list[bool] | None = None
) -> RolloutBatch:
    """Rows of one prompt token and two response tokens; prompts of `group` rows each; ended: each row's EOS."""
    n = len(responses)
    gen = torch.zeros(n, 2)
    if logprobs is not None:
        gen[:, :2] = torch.tensor(logprobs)
    return RolloutBatch(
        tokens=torch.ones(n, 3, dtype=torch.long),
        prompt_lengths=torch.ones(n, dtype=torch.long),
        response_lengths=torch.tensor([2] * (n - 1) + [1]),  # the last row answered in one token
        is_end=torch.tensor(ended) if ended is not None else torch.ones(n, dtype=torch.bool),
        prompt_ids=[f"p{i // group}" for i in range(n)],
        prompt_texts=["q"] * n,
        response_texts=responses,
        pad_id=0,
        gen_logprobs=gen,
    )


def test_a_steps_signs_by_hand():
    rows = batch(["a", "a", "b", "c", "d", "d"], logprobs=[[-1.0, -2.0]] * 5 + [[-6.0, -9.0]])
    signs = rollout_signs(rows)
    assert signs["train/entropy"] == pytest.approx((5 * 3.0 + 6.0) / 11)  # -log p over the 11 response tokens
    assert signs["train/distinct_responses"] == pytest.approx((1 / 2 + 1 + 1 / 2) / 3)
    assert signs["train/identical_groups"] == pytest.approx(2 / 3)  # p0 and p2 said one answer
    assert signs["train/repeated_word_share"] == 0.0


def test_a_word_said_again_is_a_whitespace_token_whatever_its_case_and_punctuation():
    assert said_words("The cat is Kind, kind and  kind.") == ["the", "cat", "is", "kind", "kind", "and", "kind"]
    assert repeated_word("The cat is Kind, kind and kind.") == ("kind", 3)
    assert repeated_word("The cat is kind, lovely and bright.") is None and repeated_word("") is None
    rows = batch(["It is kind, kind.", "It is kind.", "It it.", "x"])
    assert rollout_signs(rows)["train/repeated_word_share"] == 0.5
    assert per_word([{"role": "user", "content": "Describe the cat."}], "The cat is kind, kind.") == 5.0
    assert per_repeat("Describe the cat.", "The cat is kind, kind and kind.") == 2.0


@pytest.mark.parametrize(
    "first, second",
    [([1, 2, 3, 4], [1, 3, 2, 4]), ([1, 1, 2, 3, 3], [5, 4, 4, 1, 0]), ([0.5, 2, 2, 2, -1, 7], [1, 2, 3, 4, 5, 6])],
)
def test_rank_correlation_is_spearmans_with_ties(first, second):
    spearman = pandas.DataFrame({"a": first, "b": second}).corr(method="spearman").iloc[0, 1]  # its own ranks
    assert rank_correlation(first, second) == pytest.approx(spearman)


def test_rank_correlation_of_too_few_or_constant_values_is_nan_and_not_logged():
    assert torch.isnan(torch.tensor(rank_correlation([1, 2], [2, 1])))
    assert torch.isnan(torch.tensor(rank_correlation([1, 1, 1], [1, 2, 3])))
    rewards, valid = torch.tensor([3.0, 2.0, 1.0, 9.0]), torch.tensor([True, True, True, False])
    assert validation_correlations(rewards, valid, {"val/true": [0.0, 1.0, None, 5.0]}) == {}  # two both scored
    same = validation_correlations(rewards, valid, {"val/true": [1.0, 1.0, 1.0, 5.0]})  # the tiny SFT policy's step 0
    assert same == {}
    assert validation_correlations(rewards, valid, {"val/true": [0.0, 1.0, 2.0, 5.0]}) == {
        "val/rank_correlation/true": -1.0
    }


def watch(tmp_path, **thresholds) -> HackingWatch:
    return HackingWatch(RewardHackingConfig(**thresholds), REMEDIES, tmp_path / "reward_hacking.jsonl")


def test_a_collapsing_entropy_is_said_once_while_it_lasts_with_two_samples_and_the_remedies(tmp_path, caplog):
    w = watch(tmp_path, min_entropy_share=0.2)
    rows = batch(["The cat is kind."] * 3 + ["The dog is kind.", "It is old.", "x"], group=3)
    with caplog.at_level(logging.WARNING):
        for step, entropy in enumerate([1.0, 0.5, 0.15, 0.1, 0.5, 0.05], start=1):
            w.rollouts(step, rows, {"train/entropy": entropy, "train/identical_groups": 0.0})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[0].startswith("reward hacking? step 3: the policy's entropy collapsing: 0.15 nats")
    assert "15% of the first step's 1 (logging.reward_hacking.min_entropy_share 0.2)" in said[0]
    assert '"The cat is kind." (3 of the 3 rollouts of p0) / "The dog is kind." (1 of the 3 rollouts of p1)' in said[0]
    assert said[0].endswith(
        "the reward has one term (reward_model): raise the KL penalty (reinforce.initial_policy_kl_penalty) or lower "
        "the learning rate (train.lr), or clip it (rewards.reward_model.clip)"
    )
    assert said[1].startswith("reward hacking? step 6: the policy's entropy collapsing: 0.05")  # back after step 5
    w.close()
    records = [json.loads(line) for line in (tmp_path / "reward_hacking.jsonl").read_text().splitlines()]
    assert [(r["step"], r["sign"]) for r in records] == [(3, "entropy"), (6, "entropy")]
    assert records[0]["line"] == said[0]


def test_groups_of_identical_answers_are_a_sign(tmp_path, caplog):
    w = watch(tmp_path, max_identical_groups=0.5)
    rows = batch(["same"] * 4, group=2)
    with caplog.at_level(logging.WARNING):
        w.rollouts(1, rows, {"train/identical_groups": 0.25})
        w.rollouts(2, rows, {"train/identical_groups": 0.5})
    (line,) = [r.getMessage() for r in caplog.records]
    assert "step 2: groups of identical answers: every rollout of 50% of this step's prompts said the same" in line


def validation_samples(rewards: list[float], true: list[float]) -> list[dict]:
    return [{"response": f"answer {i}", "reward": r, "valid": True, "val/true": t} for i, (r, t) in
            enumerate(zip(rewards, true))]  # fmt: skip


def test_the_trained_reward_rising_while_the_validation_function_falls_is_a_sign(tmp_path, caplog):
    w = watch(tmp_path, max_validation_fall=0.1)
    samples = validation_samples([1.0, 9.0, 5.0, 8.0], [2.0, 0.0, 1.0, 0.5])
    history = [  # (val/reward_mean, val/true): a rise of both, a dip of both, then the reward up and the function down
        (1.0, 0.0), (3.0, 2.0), (2.5, 1.85), (2.9, 1.5), (4.0, 1.5),
    ]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        for step, (reward, true) in enumerate(history):
            w.validation(step * 4, samples, {"val/reward_mean": reward, "val/true": true}, ["val/true"])
    (line,) = [r.getMessage() for r in caplog.records]
    # step 12: 1.5 is 0.5 below the best 2.0 (more than 0.1 of its rise of 2.0), but the reward fell too (2.9 < 3.0)
    assert line.startswith("reward hacking? step 16: the trained reward rising while val/true falls: val/reward_mean")
    assert "3 -> 4, val/true 2 -> 1.5 since step 4" in line
    assert '"answer 1" (reward 9, true 0) / "answer 3" (reward 8, true 0.5)' in line  # ranked apart the most


def test_a_recipe_without_a_kl_penalty_names_the_other_remedies():
    terms = {"judge": RewardEntry(source="judge"), "length": RewardEntry(function="m:f")}
    assert Remedies(None, terms).advice([], 2) == (
        "lower the learning rate (train.lr; this recipe has no KL penalty), or clip the term the answers game "
        "(rewards.judge.clip, rewards.length.clip)"
    )


class Fixed:
    """A reward source that gives each row the reward it was made with (NaN: the row has none)."""

    def __init__(self, rewards: list[float]) -> None:
        self.rewards = torch.tensor(rewards)

    def score(self, batch: RolloutBatch) -> Scores:
        return Scores(rewards=self.rewards, valid=~self.rewards.isnan())

    score_alone = score


def test_a_terms_spread_is_its_mean_standard_deviation_within_a_prompts_answers_over_the_rows_the_loss_keeps():
    rows = batch(["a", "b", "c", "d", "e", "f"], group=3)  # p0: rows 0-2, p1: rows 3-5
    nan = float("nan")
    model = RewardTerm("model", 1.0, Fixed([1.0, 2.0, 3.0, 0.0, 2.0, 7.0]))
    hack = RewardTerm("hack", -10.0, Fixed([0.0, 6.0, 2.0, 1.0, 3.0, nan]), clip=(0.0, 4.0), scale=0.5)
    metrics = CombinedSource([model, hack]).score(rows).metrics
    # model: p0 1, 2, 3 (std 1); p1 without row 5, which the hack could not score: 0, 2 (std sqrt 2)
    assert metrics["reward/model/spread"] == pytest.approx((1 + 2**0.5) / 2)
    # hack, shaped (clipped to [0, 4], then halved; the weight aside): p0 0, 2, 1 (std 1); p1 0.5, 1.5 (std sqrt 0.5)
    assert metrics["reward/hack/spread"] == pytest.approx((1 + 0.5**0.5) / 2)
    assert metrics["reward/hack"] == pytest.approx(12 / 5)  # the mean stays the raw one over the rows it scored
    alone = CombinedSource([RewardTerm("model", 1.0, Fixed([1.0, 2.0]))]).score_alone(batch(["a", "b"], group=1))
    assert "reward/model/spread" not in alone.metrics  # one answer a prompt: nothing paid between answers


def term_history(model: list[tuple[float, float]], hack: list[tuple[float, float]]) -> list[dict]:
    """Steps' reward/<term> means and reward/<term>/spread (each term's (mean, spread) a step), with a validation
    record between them (it has no train figure)."""
    steps = [
        {"step": i + 1, **term_figures("reward_model", *m), **term_figures("hack", *h)}
        for i, (m, h) in enumerate(zip(model, hack))
    ]
    return [*steps[:2], {"step": 2, "val/reward_mean": 9.0}, *steps[2:]]


def term_figures(name: str, mean: float, spread: float) -> dict[str, float]:
    return {f"reward/{name}": mean, f"reward/{name}/spread": spread}


def test_the_advice_names_the_term_that_outweighs_the_others_between_answers_and_the_clip_that_caps_it():
    # |3| x hack's spread: 1.5 over the first two steps, (6 + 9) / 2 = 7.5 over the last two, against the reward
    # model's 1.5; a clip of width 1.5 / 3 = 0.5 around the hack's first mean, 4, pays at most 1.5 between answers
    model = [(9.0, 2.0), (9.0, 2.0), (9.0, 1.5), (9.0, 1.5), (9.0, 1.5)]
    history = term_history(model, hack=[(4.0, 0.5), (4.0, 0.5), (5.0, 1.0), (6.0, 2.0), (7.0, 3.0)])
    assert TWO_TERMS.advice(history, 2) == (
        "the term hack grew to outweigh the others: |weight| x reward/hack/spread 1.5 -> 7.5 since the first steps, "
        "against reward_model 2 -> 1.5; cap it at their size with rewards.hack.clip=[3.75,4.25], then raise the KL "
        "penalty (reinforce.initial_policy_kl_penalty) or lower the learning rate (train.lr)"
    )
    steady = term_history(history_of(2.0), hack=[(4.0, 0.5), (4.0, 0.5), (50.0, 0.5), (60.0, 0.5), (70.0, 0.5)])
    assert TWO_TERMS.advice(steady, 2).startswith(  # a mean that grew, paid alike to every answer, moves nothing
        "the term reward_model outweighs the others: |weight| x reward/reward_model/spread 2 -> 2 since the first "
        "steps, against hack 1.5 -> 1.5; cap it at their size with rewards.reward_model.clip=[0.25,1.75], then "
    )
    alike = term_history(history_of(6.0), hack=history_of(2.0))
    assert TWO_TERMS.advice(alike, 2) == (
        "no reward term outweighs the others (|weight| x spread reward_model 6 -> 6, hack 6 -> 6); raise the KL "
        "penalty (reinforce.initial_policy_kl_penalty) or lower the learning rate (train.lr)"
    )


def history_of(spread: float) -> list[tuple[float, float]]:
    return [(1.0, spread)] * 5


def test_a_term_with_a_negative_weight_is_sized_by_what_it_pays_between_answers_not_by_its_shrinking_mean():
    """The tiny world's hidden true reward at weight -10 pays for leaving the task's sentence: its mean falls as the
    hack succeeds (|weight x mean| 25 -> 7.5, smaller, as the watch once sized it), while what it pays between the
    answers of a prompt grows from 0.5 to 8."""
    remedies = Remedies(
        KL, {"reward_model": RewardEntry(source="reward_model"), "hack": RewardEntry(function="m:f", weight=-10)}
    )
    model = [(10.0, 2.0)] * 5
    history = term_history(model, hack=[(2.5, 0.05), (2.5, 0.05), (2.0, 0.2), (1.0, 0.6), (0.5, 1.0)])
    # the clip's width: the reward model's spread 2 over |-10| = 0.2, around the first steps' mean 2.5
    assert remedies.advice(history, 2).startswith(
        "the term hack grew to outweigh the others: |weight| x reward/hack/spread 0.5 -> 8 since the first steps, "
        "against reward_model 2 -> 2; cap it at their size with rewards.hack.clip=[2.4,2.6], then "
    )
    scaled = Remedies(KL, {**remedies.reward_terms, "hack": RewardEntry(function="m:f", weight=-10, scale=4)})
    assert "rewards.hack.clip=[2.475,2.525]" in scaled.advice(history, 2)  # a quarter of the width: 4x the pay
    ahead = term_history(model, hack=[(2.5, 0.72), (2.5, 0.72), (2.0, 0.7), (1.0, 0.7), (0.5, 0.7)])
    assert remedies.advice(ahead, 2).startswith(  # ahead from the first step: the policy learns from it all along
        "the term hack outweighs the others: |weight| x reward/hack/spread 7.2 -> 7 since the first steps, against "
        "reward_model 2 -> 2; cap it at their size with rewards.hack.clip=[2.4,2.6], then "
    )
    # as measured at seed 1: the hack term rose to pay as much as the reward model, whose pull fell (14 -> 10)
    gaining = term_history(
        [(7.0, 14.0), (7.0, 14.0), (20.0, 12.0), (25.0, 10.0), (25.0, 10.0)],
        hack=[(1.0, 0.76), (1.0, 0.76), (1.5, 0.8), (1.7, 1.0), (1.4, 1.0)],
    )
    assert remedies.advice(gaining, 2).startswith(
        "the term hack gained on the others: |weight| x reward/hack/spread 7.6 -> 10 since the first steps, against "
        "reward_model 14 -> 10; cap it at their size with rewards.hack.clip=[0.5,1.5], then "
    )
    unpaid = term_history([(10.0, 0.0)] * 5, hack=[(2.5, 0.05), (2.5, 0.05), (2.0, 0.2), (1.0, 0.6), (0.5, 1.0)])
    assert "cap it at their size with rewards.hack.clip, then " in remedies.advice(unpaid, 2)  # nothing to size by


def rollout_figures(**figures: float) -> dict[str, float]:
    return {"train/identical_groups": 0.0, **figures}


def said_signs(w: HackingWatch, steps: list[tuple[RolloutBatch, dict[str, float]]], caplog) -> list[str]:
    """What the watch says over the steps (each its rollouts and figures), numbered from 1."""
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for step, (rows, figures) in enumerate(steps, start=1):
            w.rollouts(step, rows, figures)
    return [r.getMessage() for r in caplog.records]


def test_fewer_answers_ending_is_a_sign_quoting_two_that_ran_on(tmp_path, caplog):
    w = watch(tmp_path, min_ended_share=0.5, first_steps=2)
    ended = batch(["It is kind."] * 4)
    running = batch(["It is kind, a, b, c", "It is kind.", "It is a, b, c, d", "x"], ended=[False, True, False, True])
    shares = [0.9, 1.0, 0.6, 0.45]  # the first steps' 0.95: 0.45 is below half of it
    said = said_signs(w, [(running if s < 0.5 else ended, rollout_figures(**{"train/fraction_ended": s})) for s in
                          shares], caplog)  # fmt: skip
    assert len(said) == 1 and said[0].startswith("reward hacking? step 4: fewer answers ending: 45% of the rollouts")
    assert "against 95% in the first steps (logging.reward_hacking.min_ended_share 0.5)" in said[0]
    assert '"It is kind, a, b, c" (no end in 2 tokens) / "It is a, b, c, d" (no end in 2 tokens)' in said[0]


def test_answers_growing_far_beyond_the_first_steps_are_a_sign_quoting_the_longest(tmp_path, caplog):
    w = watch(tmp_path, max_length_growth=2.0, first_steps=2)
    rows = batch(["long one", "short", "long two", "s"])
    lengths = [8.0, 10.0, 17.0, 19.0, 12.0, 18.5]  # the first steps' 9: above 18 is growing
    said = said_signs(w, [(rows, rollout_figures(**{"train/response_length": n})) for n in lengths], caplog)
    assert [line.split(":")[0] for line in said] == ["reward hacking? step 4", "reward hacking? step 6"]
    assert (
        "answers growing: 19 tokens on average, 2.1x the first steps' 9 (logging.reward_hacking.max_length_growth"
        in said[0]
    )
    assert '"long one" (2 tokens) / "short" (2 tokens)' in said[0]


def test_more_rollouts_saying_a_word_again_is_a_sign_quoting_the_word(tmp_path, caplog):
    w = watch(tmp_path, max_repeated_word_rise=0.3, first_steps=2)
    rows = batch(["The cat is kind.", "It is kind, kind and kind.", "It is old.", "It is it."])
    shares = [0.0, 0.1, 0.3, 0.5]  # the first steps' 0.05: 0.5 rose by more than 0.3
    said = said_signs(w, [(rows, rollout_figures(**{"train/repeated_word_share": s})) for s in shares], caplog)
    assert len(said) == 1 and said[0].startswith("reward hacking? step 4: words said again: 50% of the rollouts")
    assert '"It is kind, kind and kind." ("kind" 3 times) / "It is it." ("it" 2 times)' in said[0]


def test_a_run_converged_on_its_validation_function_says_no_collapse_until_the_function_falls(tmp_path, caplog):
    """Entropy collapsed and identical answers, while val/true stands at its best: nothing said, nor after one low
    validation; once it stood below its best by more than max_validation_fall of its rise at two validations in a
    row, both are said at the next step."""
    thresholds = RewardHackingConfig(max_validation_fall=0.1, validations_fallen=2)
    w = HackingWatch(thresholds, REMEDIES, tmp_path / "r.jsonl", functions=["val/true"])
    collapsed = (batch(["same"] * 4), {"train/entropy": 0.05, "train/identical_groups": 1.0})
    with caplog.at_level(logging.WARNING):
        w.validation(0, [], {"val/reward_mean": 1.0, "val/true": 1.0}, ["val/true"])
        w.rollouts(1, batch(["a", "b", "c", "d"]), {"train/entropy": 1.0, "train/identical_groups": 0.0})
        for step, true in [(2, 3.0), (3, 2.85), (4, 2.5), (5, 3.0), (6, 2.5)]:  # 2.85: within 0.1 of its rise of 2
            w.validation(step - 1, [], {"val/reward_mean": 2.0, "val/true": true}, ["val/true"])
            w.rollouts(step, *collapsed)
        assert not caplog.records  # 2.5 once at step 3, then back at its best
        w.validation(6, [], {"val/reward_mean": 2.0, "val/true": 2.4}, ["val/true"])  # the reward did not rise
        w.rollouts(7, *collapsed)
    said = [r.getMessage().split(";")[0] for r in caplog.records]
    assert said == [
        "reward hacking? step 7: the policy's entropy collapsing: 0.05 nats a token, 5% of the first step's 1 "
        "(logging.reward_hacking.min_entropy_share 0.2)",
        "reward hacking? step 7: groups of identical answers: every rollout of 100% of this step's prompts said the "
        "same (logging.reward_hacking.max_identical_groups 0.5)",
    ]


def test_the_end_summary_repeats_each_sign(tmp_path, caplog):
    (tmp_path / "metrics.jsonl").write_text("")
    w = watch(tmp_path)
    w.rollouts(1, batch(["a", "a"]), {"train/identical_groups": 1.0})
    w.close()
    with open(tmp_path / "reward_hacking.jsonl", "a") as records:
        records.write('{"step": 2, "si')  # a torn line is left out
    with caplog.at_level(logging.INFO):
        summarise(tmp_path, [])
    said = [r.getMessage() for r in caplog.records if r.name == "rlsteps"]
    assert said[0] == "signs of reward hacking over the run (reward_hacking.jsonl):"
    assert said[1].startswith("  reward hacking? step 1: groups of identical answers") and len(said) == 2
