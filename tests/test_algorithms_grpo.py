import math

import pytest
import torch

from rlsteps.engine.algorithms.grpo import clipped_policy_loss, group_advantages, k3_kl, zero_variance_groups

E = math.e


def _close(actual: torch.Tensor, expected: list[float], abs: float = 1e-6) -> None:
    assert actual.flatten().tolist() == pytest.approx(expected, abs=abs)


def _advantages(rewards, group=None, valid=None, **kwargs) -> torch.Tensor:
    rewards = torch.tensor(rewards)
    group = torch.zeros(len(rewards), dtype=torch.long) if group is None else torch.tensor(group)
    valid = torch.ones(len(rewards), dtype=torch.bool) if valid is None else torch.tensor(valid)
    return group_advantages(rewards, group, valid, **kwargs)


def test_group_mean_baseline_with_and_without_std():
    # mean 3; deviations -2, -1, 0, 3; unbiased var = (4 + 1 + 0 + 9) / 3
    _close(_advantages([1.0, 2.0, 3.0, 6.0], leave_one_out=False, normalize_std=False), [-2.0, -1.0, 0.0, 3.0])
    std = math.sqrt(14 / 3)
    _close(
        _advantages([1.0, 2.0, 3.0, 6.0], leave_one_out=False, normalize_std=True), [-2 / std, -1 / std, 0.0, 3 / std]
    )


def test_leave_one_out_baseline():
    # b = mean of the three others: 11/3, 10/3, 3, 2
    _close(_advantages([1.0, 2.0, 3.0, 6.0], leave_one_out=True, normalize_std=False), [-8 / 3, -4 / 3, 0.0, 4.0])


def test_group_of_two():
    root2 = math.sqrt(2)
    _close(_advantages([1.0, 3.0], leave_one_out=False, normalize_std=True), [-1 / root2, 1 / root2])
    # leave-one-out: each row's set is the other row alone, which has no spread: no division
    _close(_advantages([1.0, 3.0], leave_one_out=True, normalize_std=True), [-2.0, 2.0])


def test_leave_one_out_divides_by_the_std_of_the_same_leave_one_out_set():
    # row 0: others [2, 3, 6], mean 11/3, unbiased var ((5/3)^2 + (2/3)^2 + (7/3)^2) / 2 = 13/3
    # row 1: others [1, 3, 6], mean 10/3, var ((7/3)^2 + (1/3)^2 + (8/3)^2) / 2 = 19/3
    # row 2: others [1, 2, 6], mean 3, var (4 + 1 + 9) / 2 = 7;  row 3: others [1, 2, 3], mean 2, var 1
    expected = [(1 - 11 / 3) / math.sqrt(13 / 3), (2 - 10 / 3) / math.sqrt(19 / 3), 0.0, (6 - 2) / 1.0]
    _close(_advantages([1.0, 2.0, 3.0, 6.0], leave_one_out=True, normalize_std=True), expected, abs=1e-5)
    # a large common offset changes nothing: the sums are taken around the group mean
    _close(
        _advantages([1e4 + 1, 1e4 + 2, 1e4 + 3, 1e4 + 6], leave_one_out=True, normalize_std=True), expected, abs=1e-3
    )


def test_leave_one_out_std_leaves_out_invalid_rows():
    # valid rows 1, 5, 3 (row 3 invalid): row 0's set is [5, 3] (mean 4, std sqrt(2)); row 1's [1, 3] (2, sqrt(2));
    # row 2's [1, 5] (3, sqrt(8))
    advantages = _advantages(
        [1.0, 5.0, 3.0, 100.0], valid=[True, True, True, False], leave_one_out=True, normalize_std=True
    )
    _close(advantages, [-3 / math.sqrt(2), 3 / math.sqrt(2), 0.0, 0.0], abs=1e-6)


def test_zero_variance_group_gets_zero_advantage():
    for loo in (False, True):
        _close(_advantages([2.0, 2.0, 2.0], leave_one_out=loo, normalize_std=True), [0.0, 0.0, 0.0], abs=0)


def test_tiny_std_below_the_floor_is_not_blown_up():
    # unbiased std of [-d, 0, d] is d = 1e-5 < floor 1e-3: advantages stay r - mean
    tiny = [-1e-5, 0.0, 1e-5]
    _close(_advantages(tiny, leave_one_out=False, normalize_std=True), tiny, abs=1e-9)
    # without the floor the same group is scaled to unit advantages
    _close(_advantages(tiny, leave_one_out=False, normalize_std=True, std_floor=1e-7), [-1.0, 0.0, 1.0], abs=1e-4)


def test_invalid_rows_are_left_out_and_get_zero():
    # group 0: valid rewards 1, 5, 3 (mean 3, std 2), row 3 invalid; group 1: a single valid row
    advantages = _advantages(
        [1.0, 5.0, 3.0, 100.0, 7.0, 9.0],
        group=[0, 0, 0, 0, 1, 1],
        valid=[True, True, True, False, True, False],
        leave_one_out=False,
        normalize_std=True,
    )
    _close(advantages, [-1.0, 1.0, 0.0, 0.0, 0.0, 0.0])


def test_interleaved_groups():
    advantages = _advantages([1.0, 10.0, 3.0, 30.0], group=[0, 1, 0, 1], leave_one_out=False, normalize_std=False)
    _close(advantages, [-1.0, -10.0, 1.0, 10.0])


def test_zero_variance_groups():
    rewards = torch.tensor([1.0, 1.0, 2.0, 3.0, 5.0, 9.0, 4.0, 8.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    valid = torch.tensor([True, True, True, True, True, False, False, False])
    # group 2's only valid reward is 5: no two differ; group 3 has no valid row
    assert zero_variance_groups(rewards, group, valid).tolist() == [True, True, False, False, True, True, True, True]


def test_k3_kl_hand_points_and_clamps():
    logprobs = torch.zeros(1, 5)
    ref = torch.tensor([[0.0, 1.0, -1.0, 30.0, -30.0]])
    # exp(logr) - 1 - logr at 0, 1, -1; +-30 clamp to +-20, then the result is clamped to 10
    _close(k3_kl(logprobs, ref), [0.0, E - 2, 1 / E, 10.0, 10.0], abs=1e-5)
    _close(k3_kl(torch.zeros(1, 1), torch.tensor([[3.0]]), clamp=2.0), [E**2 - 3], abs=1e-5)
    _close(k3_kl(torch.zeros(1, 1), torch.tensor([[-3.0]]), clamp=2.0), [E**-2 + 1], abs=1e-5)


def test_clipped_loss_inside_and_outside_the_clip_range():
    # one token per row, old log-prob 0, so ratio = exp(logp)
    ratios = torch.tensor([1.1, 1.5, 0.5, 0.5, 1.5, 0.9])
    advantages = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
    logprobs = ratios.log()[:, None].clone().requires_grad_(True)
    loss, stats = clipped_policy_loss(logprobs, torch.zeros(6, 1), advantages, torch.ones(6, 1), normaliser=6.0)
    # per token: -1.1 (inside), -1.2 (clipped high, A>0), -0.5 (low ratio, A>0: not clipped),
    #            0.8 (clipped low, A<0), 1.5 (high ratio, A<0: not clipped), 0.9 (inside)
    assert loss.item() == pytest.approx((-1.1 - 1.2 - 0.5 + 0.8 + 1.5 + 0.9) / 6, abs=1e-6)
    loss.backward()
    # d/dlogp of -A * ratio is -A * ratio where unclipped; zero where the clip is active
    _close(logprobs.grad.squeeze(1), [-1.1 / 6, 0.0, -0.5 / 6, 0.0, 1.5 / 6, 0.9 / 6])
    assert stats["clip_fraction"] == pytest.approx(2 / 6)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["ratio_min"] == pytest.approx(0.5)
    assert stats["ratio_max"] == pytest.approx(1.5)
    assert stats["entropy_proxy"] == pytest.approx(
        -(2 * math.log(1.5) + math.log(1.1) + 2 * math.log(0.5) + math.log(0.9)) / 6
    )
    assert stats["kl_mean"] == 0.0


def test_clipped_loss_asymmetric_upper_bound():
    logprobs = torch.tensor([[math.log(1.25)]])
    one = torch.tensor([1.0])
    at_02, _ = clipped_policy_loss(logprobs, torch.zeros(1, 1), one, torch.ones(1, 1), 1.0)
    at_028, _ = clipped_policy_loss(logprobs, torch.zeros(1, 1), one, torch.ones(1, 1), 1.0, eps_high=0.28)
    assert at_02.item() == pytest.approx(-1.2)
    assert at_028.item() == pytest.approx(-1.25)


def test_clipped_loss_adds_beta_times_k3():
    logprobs = torch.zeros(1, 2)
    ref = torch.tensor([[1.0, 0.0]])
    loss, stats = clipped_policy_loss(
        logprobs, torch.zeros(1, 2), torch.tensor([0.0]), torch.ones(1, 2), 2.0, ref_logprobs=ref, kl_beta=0.1
    )
    assert loss.item() == pytest.approx(0.1 * (E - 2) / 2, abs=1e-6)
    assert stats["kl_mean"] == pytest.approx((E - 2) / 2, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        clipped_policy_loss(logprobs, logprobs, torch.tensor([1.0]), torch.ones(1, 2), 2.0, kl_beta=0.1)


def test_token_level_normalisation_across_micro_batches_is_the_global_token_mean():
    torch.manual_seed(0)
    logprobs = -torch.rand(8, 7)
    old = logprobs + 0.3 * torch.randn(8, 7)
    ref = logprobs + 0.3 * torch.randn(8, 7)
    advantages = torch.randn(8)
    # very different token counts per micro-batch, so a mean of micro-batch means would differ
    mask = torch.zeros(8, 7)
    mask[:4, :1] = 1
    mask[4:, :] = 1
    total = float(mask.sum())
    whole, _ = clipped_policy_loss(logprobs, old, advantages, mask, total, ref_logprobs=ref, kl_beta=0.05)
    micro = sum(
        clipped_policy_loss(
            logprobs[i : i + 4],
            old[i : i + 4],
            advantages[i : i + 4],
            mask[i : i + 4],
            total,
            ref_logprobs=ref[i : i + 4],
            kl_beta=0.05,
        )[0]
        for i in (0, 4)
    )
    ratio = (logprobs - old).exp()
    a = advantages[:, None]
    token = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2)) + 0.05 * k3_kl(logprobs, ref)
    expected = float((token * mask).sum() / mask.sum())
    assert whole.item() == pytest.approx(expected, rel=1e-5)
    assert micro.item() == pytest.approx(expected, rel=1e-5)
