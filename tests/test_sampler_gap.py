"""The sampler's agreement with the trainer, and truncated importance sampling, on hand-computed examples."""

import math

import pytest
import torch
from pydantic import ValidationError

from rlsteps.contract.config import RSConfig
from rlsteps.engine.algorithms.grpo import clipped_policy_loss
from rlsteps.engine.algorithms.reinforce import reinforce_loss
from rlsteps.engine.algorithms.sampler_gap import (
    sampler_gap_stats,
    token_mult_prob_error,
    truncated_importance_weights,
)

HALF, QUARTER = math.log(0.5), math.log(0.25)
TRAINER = torch.tensor([[HALF, QUARTER, 0.0]])  # the trainer: p = 0.5, 0.25 on the response, a prompt slot after
SAMPLER = torch.tensor([[QUARTER, QUARTER, -9.0]])  # the sampler: 0.25, 0.25
MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_token_mult_prob_error_is_the_mean_probability_ratio_over_response_tokens():
    # exp(|log .5 - log .25|) = 2 and exp(0) = 1: mean 1.5; the masked slot's gap of 9 counts for nothing
    assert token_mult_prob_error(TRAINER, SAMPLER, MASK) == pytest.approx(1.5)
    assert token_mult_prob_error(SAMPLER, TRAINER, MASK) == pytest.approx(1.5)  # |.|: either side may be larger
    assert token_mult_prob_error(TRAINER, TRAINER, MASK) == 1.0
    assert token_mult_prob_error(TRAINER, SAMPLER, torch.zeros_like(MASK)) == 1.0  # no token: nothing disagrees


def test_sampler_gap_stats_name_the_metric_and_say_nothing_without_sampler_logprobs():
    assert sampler_gap_stats(TRAINER, SAMPLER, MASK) == {"train/token_mult_prob_error": pytest.approx(1.5)}
    assert sampler_gap_stats(TRAINER, None, MASK) == {}


def test_with_the_cap_the_stats_add_the_importance_weights_mean_max_and_clipped_share():
    # ratios p_trainer / p_sampler: 2 (capped at 1.5) and 1 on the response; the masked slot's e^9 counts for nothing
    stats = sampler_gap_stats(TRAINER, SAMPLER, MASK, cap=1.5)
    assert stats == {
        "train/token_mult_prob_error": pytest.approx(1.5),
        "train/importance_weight_mean": pytest.approx(1.25),  # (1.5 + 1) / 2
        "train/importance_weight_max": pytest.approx(1.5),
        "train/importance_weight_clipped": pytest.approx(0.5),  # one token of two cut by the cap
    }
    assert sampler_gap_stats(TRAINER, SAMPLER, MASK, cap=4.0)["train/importance_weight_clipped"] == 0.0


def test_truncated_importance_weights_are_capped_ratios_without_gradient():
    trainer = TRAINER.clone().requires_grad_()
    weights = truncated_importance_weights(trainer, SAMPLER, cap=1.5)
    assert torch.allclose(weights[:, :2], torch.tensor([[1.5, 1.0]]))  # 0.5 / 0.25 = 2, capped at 1.5; 1
    assert not weights.requires_grad
    assert torch.allclose(truncated_importance_weights(TRAINER, SAMPLER, cap=4.0)[:, :2], torch.tensor([[2.0, 1.0]]))


def test_reinforce_loss_weighs_each_token_by_its_importance_weight():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    advantages, mask, weights = torch.tensor([2.0]), torch.ones(1, 2), torch.tensor([[1.5, 1.0]])
    loss, _ = reinforce_loss(logprobs, advantages, mask, normaliser=2.0, importance_weights=weights)
    assert loss.item() == pytest.approx((1.0 * 2 * 1.5 + 2.0 * 2 * 1.0) / 2)  # 3.5
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-1.5, -1.0]]))  # -A * w / normaliser
    plain, _ = reinforce_loss(logprobs.detach(), advantages, mask, normaliser=2.0)
    assert plain.item() == pytest.approx(3.0)  # (2 + 4) / 2 without weights


def test_clipped_policy_loss_weighs_each_token_by_its_importance_weight():
    logprobs = torch.tensor([[-1.0, -2.0]])
    weights = torch.tensor([[1.5, 1.0]])
    loss, _ = clipped_policy_loss(
        logprobs, logprobs, torch.tensor([1.0]), torch.ones(1, 2), normaliser=2.0, importance_weights=weights
    )
    assert loss.item() == pytest.approx((-1.5 - 1.0) / 2)  # ratio 1, advantage 1: -w per token


def test_rejection_sampling_refuses_truncated_importance_sampling():
    base = {"algorithm": "rs", "inputs": {"prompts": "p", "policy": "m"}, "output": {"dir": "o"}}
    base["rollout"] = {"top_n_rollouts": 1}
    with pytest.raises(ValidationError, match="truncated_importance_sampling is for policy-gradient losses"):
        RSConfig.model_validate({**base, "train": {"truncated_importance_sampling": True}})
    assert RSConfig.model_validate(base).train.truncated_importance_sampling is False
