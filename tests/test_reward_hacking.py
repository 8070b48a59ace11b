"""What reward hacking looks like on record: the figures of a step's rollouts and of a validation, each sign said once
in one line with two samples and the remedies, recorded, and repeated by the end summary."""

from __future__ import annotations

import json
import logging

import pandas
import pytest
import torch

from rlsteps.contract.config import RewardHackingConfig
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.records.reward_hacking import (
    HackingWatch,
    Remedies,
    rank_correlation,
    rollout_signs,
    validation_correlations,
)
from rlsteps.engine.records.run_end import summarise

REMEDIES = Remedies("reinforce.initial_policy_kl_penalty", ["reward_model"])


def batch(responses: list[str], group: int = 2, logprobs: list[list[float]] | None = None) -> RolloutBatch:
    """Rows of one prompt token and two response tokens; prompts of `group` rows each."""
    n = len(responses)
    gen = torch.zeros(n, 2)
    if logprobs is not None:
        gen[:, :2] = torch.tensor(logprobs)
    return RolloutBatch(
        tokens=torch.ones(n, 3, dtype=torch.long),
        prompt_lengths=torch.ones(n, dtype=torch.long),
        response_lengths=torch.tensor([2] * (n - 1) + [1]),  # the last row answered in one token
        is_end=torch.ones(n, dtype=torch.bool),
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
        "raise the KL penalty (reinforce.initial_policy_kl_penalty), lower the learning rate (train.lr), "
        "or add reward clipping (rewards.reward_model.clip)"
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
    said = str(Remedies(None, ["judge", "length"]))
    assert said == (
        "lower the learning rate (train.lr) or add reward clipping (rewards.judge.clip, rewards.length.clip); "
        "this recipe has no KL penalty"
    )


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
