import pytest
import torch

from rlsteps.engine.algorithms.rs import masked_nll_loss, select_topk
from rlsteps.engine.batch import RolloutBatch


def test_topk_tie_goes_to_the_later_rollout():
    rewards = torch.tensor([1.0, 2.0, 2.0, 0.0])
    group = torch.zeros(4, dtype=torch.long)
    assert select_topk(rewards, group, 1).tolist() == [2]
    assert select_topk(rewards, group, 2).tolist() == [1, 2]
    assert select_topk(rewards, group, 3).tolist() == [0, 1, 2]


def test_topk_all_equal_rewards_keep_the_last_rollouts():
    rewards = torch.tensor([5.0, 5.0, 5.0])
    assert select_topk(rewards, torch.zeros(3, dtype=torch.long), 2).tolist() == [1, 2]


def test_topk_n_equal_to_group_size_keeps_all_and_larger_is_an_error():
    rewards = torch.tensor([3.0, 1.0, 2.0, 0.5, 0.7, 0.1])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    assert select_topk(rewards, group, 3).tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="top_n=4 exceeds the 3 rollouts"):
        select_topk(rewards, group, 4)
    with pytest.raises(ValueError, match="at least 1"):
        select_topk(rewards, group, 0)


def test_topk_one_per_group_with_interleaved_groups():
    # rows: g0 g1 g0 g1 g0 g1 -> g0 rewards [0.1, 0.9, 0.5] at rows 0, 2, 4; g1 [0.3, 0.3, 0.2] at rows 1, 3, 5
    rewards = torch.tensor([0.1, 0.3, 0.9, 0.3, 0.5, 0.2])
    group = torch.tensor([0, 1, 0, 1, 0, 1])
    assert select_topk(rewards, group, 1).tolist() == [2, 3]
    assert select_topk(rewards, group, 2).tolist() == [1, 2, 3, 4]


def _batch(prompt_ids: list[str], prompt_texts: list[str]) -> RolloutBatch:
    n = len(prompt_ids)
    return RolloutBatch(
        tokens=torch.ones(n, 4, dtype=torch.long),
        prompt_lengths=torch.full((n,), 2),
        response_lengths=torch.full((n,), 2),
        is_end=torch.ones(n, dtype=torch.bool),
        prompt_ids=prompt_ids,
        prompt_texts=prompt_texts,
        response_texts=["r"] * n,
        pad_id=0,
    )


def test_duplicate_prompt_text_with_distinct_ids_are_distinct_groups():
    batch = _batch(["a", "a", "b", "b"], ["same prompt"] * 4)
    group, num_groups = batch.group_index()
    assert num_groups == 2
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # one group per id: the best of each id, not the best of all identical texts
    assert select_topk(rewards, group, 1).tolist() == [0, 3]


def test_masked_nll_hand_example():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, stats = masked_nll_loss(logprobs, mask, normaliser=4.0)
    # (2 + 3 + 0.5 + 4) / 4
    assert loss.item() == pytest.approx(2.375)
    assert stats["tokens"] == 4.0
    loss.backward()
    assert torch.equal(logprobs.grad, -mask / 4.0)


def test_masked_nll_micro_batches_add_up_to_the_global_token_mean():
    torch.manual_seed(0)
    logprobs = -torch.rand(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    total_tokens = float(mask.sum())
    whole, _ = masked_nll_loss(logprobs, mask, total_tokens)
    parts = [masked_nll_loss(logprobs[i : i + 2], mask[i : i + 2], total_tokens)[0] for i in range(0, 6, 2)]
    assert torch.stack(parts).sum().item() == pytest.approx(whole.item(), rel=1e-6)
    assert whole.item() == pytest.approx(float((-logprobs * mask).sum() / mask.sum()), rel=1e-6)


def test_masked_nll_with_no_valid_token_is_zero():
    loss, _ = masked_nll_loss(torch.full((2, 3), -1.0), torch.zeros(2, 3), normaliser=0.0)
    assert loss.item() == 0.0
