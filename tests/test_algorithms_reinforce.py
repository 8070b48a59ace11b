import pytest
import torch

from rlsteps.engine.algorithms.groups import group_totals
from rlsteps.engine.algorithms.reinforce import (
    kl_penalised_rewards,
    reinforce_loss,
    rloo_baseline,
    sequence_kl,
)


def _close(actual: torch.Tensor, expected: list[float]) -> None:
    assert actual.tolist() == pytest.approx(expected, abs=1e-6)


def test_rloo_baseline_hand_example_non_ended_sample_gets_mean_of_ended_peers():
    rewards = torch.tensor([2.0, 7.0, -1.0, 0.0])
    ended = torch.tensor([True, True, True, False])
    # (7-1)/2, (2-1)/2, (2+7)/2, and (2+7-1)/3 where NeMo-Aligner gives 8/2 = 4
    _close(rloo_baseline(rewards, torch.zeros(4, dtype=torch.long), ended), [3.0, 0.5, 4.5, 8 / 3])


def test_rloo_baseline_groups_with_zero_or_one_ended_sample_use_their_own_reward():
    rewards = torch.tensor([1.0, 2.0, 4.0, 5.0, 6.0])
    group = torch.tensor([0, 0, 1, 1, 1])
    ended = torch.tensor([False, False, False, True, False])
    _close(rloo_baseline(rewards, group, ended), [1.0, 2.0, 4.0, 5.0, 6.0])


def test_rloo_baseline_group_of_two_and_interleaved_groups():
    # group 0 = rows 0, 2 (rewards 1, 3); group 1 = rows 1, 3, 5 (rewards 10, 20, 60, all ended); row 4 alone
    rewards = torch.tensor([1.0, 10.0, 3.0, 20.0, 7.0, 60.0])
    group = torch.tensor([0, 1, 0, 1, 2, 1])
    ended = torch.ones(6, dtype=torch.bool)
    _close(rloo_baseline(rewards, group, ended), [3.0, 40.0, 1.0, 35.0, 7.0, 15.0])


def test_group_totals():
    _close(group_totals(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1, 0, 1])), [5.0, 2.0, 5.0])


def test_sequence_kl_with_and_without_absolute_value():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    init = torch.tensor([[-1.5, -1.0, -7.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # row 0: kl = [0.5, -1.0] on its two tokens; row 1 has none
    _close(sequence_kl(logprobs, init, mask, absolute=False), [-0.25, 0.0])
    _close(sequence_kl(logprobs, init, mask, absolute=True), [0.75, 0.0])


def test_kl_penalised_rewards():
    _close(kl_penalised_rewards(torch.tensor([1.0, 2.0]), torch.tensor([0.5, -0.25]), beta=0.1), [0.95, 2.025])


def test_reinforce_loss_broadcasts_one_advantage_per_sequence():
    # b == T-1 == 2, so a [b] advantage wrongly broadcast along the tokens would give (0 + 6) / 3 = 2
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    advantages = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = reinforce_loss(logprobs, advantages, mask, normaliser=3.0)
    # row 0: 1*2 + 2*2 = 6; row 1: 3*(-1) = -3; (6 - 3) / 3
    assert loss.item() == pytest.approx(1.0)
    assert stats["tokens"] == 3.0
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))


def test_reinforce_loss_equals_per_row_and_micro_batch_sums():
    torch.manual_seed(0)
    logprobs = -torch.rand(8, 6)
    advantages = torch.randn(8)
    mask = (torch.rand(8, 6) > 0.4).float()
    normaliser = float(mask.sum())
    whole, _ = reinforce_loss(logprobs, advantages, mask, normaliser)
    per_row = sum(
        reinforce_loss(logprobs[i : i + 1], advantages[i : i + 1], mask[i : i + 1], normaliser)[0] for i in range(8)
    )
    micro = sum(
        reinforce_loss(logprobs[i : i + 4], advantages[i : i + 4], mask[i : i + 4], normaliser)[0]
        for i in range(0, 8, 4)
    )
    expected = float((-logprobs * advantages[:, None] * mask).sum() / mask.sum())
    assert whole.item() == pytest.approx(expected, rel=1e-5)
    assert per_row.item() == pytest.approx(expected, rel=1e-5)
    assert micro.item() == pytest.approx(expected, rel=1e-5)


def test_reinforce_counts_only_ended_samples_when_the_caller_folds_them_into_the_mask():
    logprobs = torch.tensor([[-1.0, -1.0], [-5.0, -5.0]])
    is_end = torch.tensor([True, False])
    mask = torch.ones(2, 2) * is_end[:, None]
    loss, _ = reinforce_loss(logprobs, torch.tensor([1.0, 100.0]), mask, normaliser=float(mask.sum()))
    assert loss.item() == pytest.approx(1.0)
