"""Under top-k/top-p a KL to the reference reads the policy's log-probs under the temperature alone, the ratio, the
policy gradient and the sampler comparison the filtered ones (NeMo-RL's curr_logprobs_unfiltered and curr_logprobs),
from one forward in the update and one pass in prepare.

On test_logprobs_from_update's small Qwen2 policy (moved away from its reference) at temperature 0.7 and top-k 8,
top-p 0.9: the one-pass step (the update's forward gives both sets) makes the gradient and statistics of the two-pass
step whose prepare asks its pass for both sets, and that gradient is the one made from two separate passes, one
under each distribution; the KL statistics are those of the unfiltered set, not the filtered one (asserted apart).
"""

from __future__ import annotations

import pytest
import torch

from rlsteps.engine.algorithms.recipe import Recipe
from rlsteps.engine.algorithms.reinforce import sequence_kl
from rlsteps.engine.policy.logprobs import batched_token_logprobs, token_logprobs
from rlsteps.engine.policy.sampled_distribution import SampledDistribution
from rlsteps.engine.run.update import StepStats, micro_batch_plan
from test_logprobs_from_update import (
    REWARDS,
    policy_model,
    policy_update,
    recipe,
    reference_model,
    rollouts,
)

FILTERS = {"temperature": 0.7, "top_k": 8, "top_p": 0.9}
SAMPLED = SampledDistribution(**FILTERS)
CASES = ["grpo-k3", "reinforce-absolute-kl", "reinforce-tis"]


def filtered_recipe(name: str) -> Recipe:
    chosen = recipe(name)
    dumped = chosen.cfg.model_dump()
    dumped["rollout"]["sampling"].update(FILTERS)
    return type(chosen)(type(chosen.cfg).model_validate(dumped))


def separate_passes(model: torch.nn.Module, chosen: Recipe):
    """The policy's log-probs over the update's micro-batches, in train mode, each set from a pass of its own."""

    def logprobs(batch, unfiltered: bool = False) -> torch.Tensor:
        sets = [SAMPLED, SAMPLED.without_filters()] if unfiltered else [SAMPLED]
        out = torch.zeros(len(sets), len(batch), batch.tokens.shape[1] - 1)
        with torch.no_grad():
            for rows in micro_batch_plan(batch, chosen.cfg.train, chosen):
                m = batch.select(rows)
                for k, d in enumerate(sets):
                    values = token_logprobs(model, m.tokens, m.attention_mask(), m.response_mask(), distribution=d)
                    out[k, rows, : values.shape[1]] = values
        return out if unfiltered else out[0]

    return logprobs


def never_called(batch, unfiltered: bool = False) -> torch.Tensor:
    raise AssertionError("one optimizer step: prepare must not run a pass of the policy")


def reference_logprobs(batch) -> torch.Tensor:
    return batched_token_logprobs(reference_model(), batch, 3, distribution=SAMPLED.without_filters())


def prepared(name: str, model: torch.nn.Module, two_pass: bool):
    chosen = filtered_recipe(name)
    chosen.two_pass = two_pass
    assert chosen.kl_reads_unfiltered()
    policy = separate_passes(model, chosen) if two_pass else never_called
    batch, stats = chosen.prepare(rollouts("tis" in name), REWARDS, policy, reference_logprobs)
    return chosen, batch, stats


def gradient(name: str, two_pass: bool) -> tuple[list[torch.Tensor], dict[str, float]]:
    model = policy_model()
    chosen, batch, prepare_stats = prepared(name, model, two_pass)
    stats = StepStats()
    model.train()
    policy_update(model, chosen)._accumulate(batch, chosen.loss_normaliser(batch), stats)
    stats.end_optimizer_step(0.0)
    return [p.grad.clone() for p in model.parameters()], {**prepare_stats, **stats.result()}


def step_stats(name: str, two_pass: bool) -> dict[str, float]:
    model = policy_model()
    chosen, batch, stats = prepared(name, model, two_pass)
    result = policy_update(model, chosen)(batch)
    assert result.optimizer_steps == 1
    return {**stats, **result.stats}


@pytest.mark.parametrize("name", CASES)
def test_one_forward_gives_the_gradient_of_two_passes_one_under_each_distribution(name):
    one_grads, _ = gradient(name, two_pass=False)
    two_grads, _ = gradient(name, two_pass=True)
    worst = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item() for a, b in zip(one_grads, two_grads))
    assert worst < 1e-5
    one, two = step_stats(name, False), step_stats(name, True)
    assert one.keys() == two.keys()
    assert one == pytest.approx(two, rel=1e-5, abs=1e-7)


def test_grpos_kl_statistic_is_the_unfiltered_logprobs_k3():
    """train/kl_mean: k3 of the unfiltered log-probs against the reference, token-weighted; the filtered ones give
    another number (the log of the mass the filters keep apart)."""
    from rlsteps.engine.algorithms.grpo import k3_kl
    from rlsteps.engine.algorithms.recipe import loss_mask

    model = policy_model()
    chosen, batch, _ = prepared("grpo-k3", model, two_pass=False)
    stats = step_stats("grpo-k3", two_pass=False)
    model.train()
    with torch.no_grad():
        both = token_logprobs(
            model, batch.tokens, batch.attention_mask(), batch.response_mask(), distribution=SAMPLED, unfiltered=True
        )
    mask = loss_mask(batch)
    reference = batch.extras["ref_logprobs"]
    unfiltered_kl = float((k3_kl(both[1], reference) * mask).sum() / mask.sum())
    filtered_kl = float((k3_kl(both[0], reference) * mask).sum() / mask.sum())
    assert stats["train/kl_mean"] == pytest.approx(unfiltered_kl, rel=1e-5)
    assert abs(filtered_kl - unfiltered_kl) > 0.01


def test_reinforces_kl_in_the_reward_reads_the_unfiltered_logprobs():
    model = policy_model()
    stats = step_stats("reinforce-absolute-kl", two_pass=True)
    batch = rollouts(False)
    both = separate_passes(model, filtered_recipe("reinforce-absolute-kl"))(batch, unfiltered=True)
    reference, mask = reference_logprobs(batch), batch.response_mask()
    unfiltered_kl = sequence_kl(both[1], reference, mask, absolute=True).mean().item()
    filtered_kl = sequence_kl(both[0], reference, mask, absolute=True).mean().item()
    assert stats["train/init_policy_kl"] == pytest.approx(unfiltered_kl, rel=1e-5)
    assert abs(filtered_kl - unfiltered_kl) > 0.01
