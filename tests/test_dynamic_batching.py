"""train.dynamic_batching: micro-batches by tokens, rows sorted by length, against micro_batch_size rows in order.

The plan on hand-computed examples (rows, whole groups, a unit over the budget), then the update itself on the small
Qwen2 policy of test_logprobs_from_update: the same loss, statistics, gradient and weights as the padded path, to
float rounding, for GRPO and REINFORCE (whose one-pass loss reads whole groups), with fewer padded tokens.
"""

from __future__ import annotations

import pytest
import torch

from rlsteps.engine.algorithms.reinforce import reinforce_loss
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.policy.logprobs import batched_token_logprobs, token_logprobs
from rlsteps.engine.run.update import StepStats, micro_batch_plan
from test_logprobs_from_update import CASES, REWARDS, policy_model, policy_update, recipe, reference_model, rollouts


def lengths_batch(lengths: list[int], prompt_ids: list[str]) -> RolloutBatch:
    rows = len(lengths)
    return RolloutBatch(
        tokens=torch.ones(rows, max(lengths), dtype=torch.long), prompt_lengths=torch.ones(rows, dtype=torch.long),
        response_lengths=torch.tensor(lengths) - 1, is_end=torch.ones(rows, dtype=torch.bool), prompt_ids=prompt_ids,
        prompt_texts=[""] * rows, response_texts=[""] * rows, pad_id=0,
    )  # fmt: skip


def test_rows_fill_each_micro_batch_longest_first_within_the_token_budget():
    batch = lengths_batch([8, 3, 9, 2, 5, 5], ["a", "a", "b", "b", "c", "c"])
    assert batch.micro_batch_rows(2) == [[0, 1], [2, 3], [4, 5]]  # no budget: rows in order
    # sorted 9 8 5 5 3 2; a micro-batch is its rows times its longest: 9, then 8 (2 x 9 > 12), 5 5 (10), 3 2 (6)
    assert batch.micro_batch_rows(2, max_tokens=12) == [[2], [0], [4, 5], [1, 3]]
    # whole groups: b (longest 9), a (8), c (5); 2 x 9 = 18 <= 20, then 4 x 9 > 20
    assert batch.micro_batch_rows(2, max_tokens=20, whole_groups=True) == [[2, 3], [0, 1], [4, 5]]
    assert batch.micro_batch_rows(2, max_tokens=40, whole_groups=True) == [[2, 3, 0, 1], [4, 5]]
    assert batch.micro_batch_rows(2, max_tokens=4) == [[2], [0], [4], [5], [1], [3]]  # over the budget: alone


def padded_tokens(batch: RolloutBatch, plan: list[list[int]]) -> int:
    return sum(len(rows) * int(batch.sequence_lengths[rows].max()) for rows in plan)


def test_the_plan_follows_the_recipe_and_pads_less():
    batch = rollouts(False)
    dynamic, padded = recipe("grpo-k3", micro=4, dynamic=True), recipe("grpo-k3", micro=4)
    rows_plan = micro_batch_plan(batch, padded.cfg.train, padded)
    assert rows_plan == [[0, 1, 2, 3], [4, 5, 6, 7]]
    plan = micro_batch_plan(batch, dynamic.cfg.train, dynamic)  # 4 x 12 tokens: lengths 7 5 10 8 | 8 11 6 9
    assert plan == [[5, 2, 7, 3], [4, 0, 6, 1]]
    assert padded_tokens(batch, plan) == 76 < padded_tokens(batch, rows_plan) == 84
    groups = recipe("reinforce-tis", micro=4, dynamic=True)  # the one-pass loss reads whole groups: b, then a
    assert micro_batch_plan(batch, groups.cfg.train, groups) == [[4, 5, 6, 7], [0, 1, 2, 3]]


def update_of(name: str, dynamic: bool, micro: int, **options) -> tuple[list[torch.Tensor], dict[str, float], dict]:
    """One optimizer step on the same prepared rollouts: its gradient, statistics and weights (options: recipe's)."""
    chosen = recipe(name, micro=micro, dynamic=dynamic, **options)
    model = policy_model()
    reference = reference_model()
    batch, prepared = chosen.prepare(
        rollouts("tis" in name), REWARDS, lambda b: batched_token_logprobs(model, b, 3),
        lambda b: batched_token_logprobs(reference, b, 3),
    )  # fmt: skip
    update = policy_update(model, chosen)
    stats = StepStats()
    model.train()
    update._accumulate(batch, chosen.loss_normaliser(batch), stats)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    result = update(batch)
    return grads, {**prepared, **result.stats}, model.state_dict()


@pytest.mark.parametrize("micro", [2, 4])
@pytest.mark.parametrize("name", CASES)
def test_dynamic_batching_gives_the_padded_paths_gradient_and_step(name, micro):
    padded_grads, padded_stats, padded_weights = update_of(name, False, micro)
    grads, stats, weights = update_of(name, True, micro)
    assert any(g.abs().max() > 0 for g in grads)
    for dynamic, padded in zip(grads, padded_grads):
        torch.testing.assert_close(dynamic, padded, rtol=1e-5, atol=1e-7)
    assert stats.keys() == padded_stats.keys()
    assert stats == pytest.approx(padded_stats, rel=1e-5, abs=1e-7)  # the loss among them
    # the weights after the AdamW step: equal but where a gradient is about 0, whose rounding can turn the sign of
    # Adam's step (lr 1e-3)
    for key, value in padded_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=2e-3)
        assert (weights[key] - value).abs().gt(1e-5).float().mean() < 0.01


def test_the_one_pass_log_probs_land_on_their_own_rows():
    # the update's forward gives prepare's log-probs (one optimizer step); sorted micro-batches write them back to
    # the rows they came from
    chosen = recipe("grpo-k3", micro=4, dynamic=True)
    model = policy_model()
    batch, _ = chosen.prepare(rollouts(False), REWARDS, None, lambda b: batched_token_logprobs(reference_model(), b, 3))
    out = torch.zeros(len(batch), batch.tokens.shape[1] - 1)
    model.train()
    policy_update(model, chosen)._accumulate(batch, chosen.loss_normaliser(batch), StepStats(), out)
    for row in range(len(batch)):
        alone = batch.select([row])
        with torch.no_grad():
            expected = token_logprobs(model, alone.tokens, alone.attention_mask(), positions=alone.response_mask())
        torch.testing.assert_close(out[row, : expected.shape[1]], expected[0], rtol=1e-5, atol=1e-6)


def test_reinforce_loss_reports_the_advantage_over_its_loss_tokens():
    # rows of 3 and 1 loss tokens with advantages 1 and -1: (3 - 1) / 4 over the tokens (the row mean, 0, would
    # change with how rows are batched, since the update weighs each micro-batch by its tokens)
    logprobs = torch.full((2, 3), -1.0)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, stats = reinforce_loss(logprobs, torch.tensor([1.0, -1.0]), mask, normaliser=4.0)
    assert stats["advantage_mean"] == 0.5 and stats["tokens"] == 4.0
    assert loss.item() == pytest.approx((3 * 1.0 - 1 * 1.0) / 4)  # -(-1) x A per token, over the normaliser
