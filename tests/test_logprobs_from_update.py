"""One optimizer step per batch: the policy's log-probs before the update are the update's own forward, detached.

On a small Qwen2 policy that has moved away from its reference, the one-pass step (prepare runs no pass of the
policy; the loss reads its forward) gives the same loss, gradient, statistics and weights as the two-pass step
(prepare's own pass for the old log-probs), for GRPO (clipped ratio, k3 KL) and REINFORCE/RLOO (KL to the
initial policy folded into the reward), with and without truncated importance sampling. Exactly, when the
separate pass runs the micro-batches the update runs; to rounding with the loop's pass (eval mode, its own
micro-batch size).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlsteps.contract.config import GRPOConfig, ReinforceConfig
from rlsteps.engine.algorithms.grpo import GRPO
from rlsteps.engine.algorithms.recipe import Recipe
from rlsteps.engine.algorithms.reinforce import ReinforceRLOO
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.policy.logprobs import batched_token_logprobs, token_logprobs
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler
from rlsteps.engine.rewards.scores import Scores
from rlsteps.engine.run.update import PolicyUpdate, StepStats, micro_batch_plan

VOCAB, PROMPTS, PER_PROMPT = 96, 2, 4
ROWS = PROMPTS * PER_PROMPT
CPU = torch.device("cpu")


def reference_model() -> torch.nn.Module:
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval().requires_grad_(False)


def policy_model() -> torch.nn.Module:
    """The reference moved by noise: a policy some steps into training (the KL to the reference is not 0)."""
    model = copy.deepcopy(reference_model()).requires_grad_(True)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model


def rollouts(with_sampler: bool) -> RolloutBatch:
    """Two prompts of four rollouts, of different lengths, right-padded; one rollout of each prompt did not end."""
    generator = torch.Generator().manual_seed(1)
    prompt_lengths = torch.tensor([3, 3, 3, 3, 5, 5, 5, 5])
    response_lengths = torch.tensor([4, 2, 7, 5, 3, 6, 1, 4])
    width = int((prompt_lengths + response_lengths).max())
    tokens = torch.randint(1, VOCAB, (ROWS, width), generator=generator)
    for i in range(ROWS):
        tokens[i, int(prompt_lengths[i] + response_lengths[i]) :] = 0
    batch = RolloutBatch(
        tokens=tokens, prompt_lengths=prompt_lengths, response_lengths=response_lengths,
        is_end=torch.tensor([True, True, False, True, True, True, True, False]),
        prompt_ids=["a"] * PER_PROMPT + ["b"] * PER_PROMPT, prompt_texts=[""] * ROWS, response_texts=[""] * ROWS,
        pad_id=0,
    )  # fmt: skip
    if with_sampler:  # the sampler's log-probs: the trainer's give or take up to 0.5
        sampler = batched_token_logprobs(policy_model(), batch, ROWS) + torch.rand(ROWS, width - 1, generator=generator)
        batch.gen_logprobs = (sampler - 0.5) * batch.response_mask()
    return batch


REWARDS = Scores(
    rewards=torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 0.25, 3.0, 1.0]),
    valid=torch.tensor([True, True, True, True, True, False, True, True]),
)


MAX_PROMPT, MAX_NEW = 5, 7  # the rollouts' longest: with train.dynamic_batching, micro-batches of 4 x 12 tokens


def recipe(
    name: str, micro: int = 4, global_batch: int = ROWS, dynamic: bool = False, packing: bool = False, max_new=MAX_NEW
) -> Recipe:
    section = {
        "grpo-k3": ("grpo", {"kl_beta": 0.05, "eps_low": 0.2, "eps_high": 0.28}, False),
        "grpo-tis-dynamic": ("grpo", {"kl_beta": 0.05, "dynamic_sampling": True, "overlong_filtering": True}, True),
        "reinforce-absolute-kl": ("reinforce", {"initial_policy_kl_penalty": 0.2, "use_absolute_kl": True}, False),
        "reinforce-tis": ("reinforce", {"initial_policy_kl_penalty": 0.2, "use_absolute_kl": False}, True),
    }
    algorithm, options, tis = section[name]
    cfg = {
        "algorithm": algorithm,
        "inputs": {"prompts": "-", "policy": "-"},
        "output": {"dir": "-"},
        "data": {"max_prompt_tokens": MAX_PROMPT},
        "rollout": {
            "prompts_per_step": PROMPTS, "num_rollouts_per_prompt": PER_PROMPT,
            "sampling": {"max_new_tokens": max_new},
        },
        "train": {
            "global_batch_size": global_batch, "micro_batch_size": micro, "lr": 1e-3, "warmup_steps": 0,
            "truncated_importance_sampling": tis, "importance_sampling_cap": 1.5, "dynamic_batching": dynamic,
            "sequence_packing": packing,
        },
        algorithm: options,
    }  # fmt: skip
    return GRPO(GRPOConfig.model_validate(cfg)) if algorithm == "grpo" else ReinforceRLOO(ReinforceConfig(**cfg))


def uses_sampler(name: str) -> bool:
    return "tis" in name


def as_the_update_runs(model: torch.nn.Module, name: str):
    """The policy's log-probs without gradient, over the micro-batches the update runs, in train mode."""
    chosen = recipe(name)

    def logprobs(batch: RolloutBatch) -> torch.Tensor:
        out = torch.zeros(len(batch), batch.tokens.shape[1] - 1)
        with torch.no_grad():
            for rows in micro_batch_plan(batch, chosen.cfg.train, chosen):
                m = batch.select(rows)
                values = token_logprobs(model, m.tokens, m.attention_mask(), positions=m.response_mask())
                out[rows, : values.shape[1]] = values
        return out

    return logprobs


def as_the_loop_runs(model: torch.nn.Module):
    return lambda batch: batched_token_logprobs(model, batch, 3)  # eval mode, its own micro-batch size


def never_called(batch: RolloutBatch) -> torch.Tensor:
    raise AssertionError("one optimizer step: prepare must not run a pass of the policy")


def policy_update(model: torch.nn.Module, chosen: Recipe, **train: object) -> PolicyUpdate:
    """The update of `chosen`'s config, `train` set over its train section."""
    optimizer = build_optimizer(model, 1e-3, 0.0)
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=4, schedule="constant")
    return PolicyUpdate(model, optimizer, scheduler, chosen, chosen.cfg.train.model_copy(update=train), CPU)


def prepared(name: str, model: torch.nn.Module, two_pass: bool, policy_logprobs=None):
    chosen = recipe(name)
    chosen.two_pass = two_pass
    assert chosen.logprobs_from_update() is not two_pass
    reference = reference_model()
    batch, stats = chosen.prepare(
        rollouts(uses_sampler(name)),
        REWARDS,
        policy_logprobs or never_called,
        lambda b: batched_token_logprobs(reference, b, 3),
    )
    return chosen, batch, stats


def gradient(name: str, two_pass: bool, policy_logprobs=None) -> tuple[list[torch.Tensor], dict[str, float]]:
    model = policy_model()
    chosen, batch, _ = prepared(name, model, two_pass, policy_logprobs and policy_logprobs(model))
    update = policy_update(model, chosen)
    stats = StepStats()
    model.train()
    update._accumulate(batch, chosen.loss_normaliser(batch), stats)
    stats.end_optimizer_step(0.0)
    return [p.grad.clone() for p in model.parameters()], stats.result()


def step(name: str, two_pass: bool, policy_logprobs=None) -> tuple[dict[str, float], dict[str, torch.Tensor], int]:
    model = policy_model()
    chosen, batch, stats = prepared(name, model, two_pass, policy_logprobs and policy_logprobs(model))
    result = policy_update(model, chosen)(batch)
    return {**stats, **result.stats}, model.state_dict(), result.optimizer_steps


CASES = ["grpo-k3", "grpo-tis-dynamic", "reinforce-absolute-kl", "reinforce-tis"]


@pytest.mark.parametrize("name", CASES)
def test_one_pass_gives_the_two_pass_gradient_exactly(name):
    two_grads, two_stats = gradient(name, True, lambda model: as_the_update_runs(model, name))
    one_grads, one_stats = gradient(name, False)
    assert all(torch.equal(a, b) for a, b in zip(one_grads, two_grads))
    assert one_stats == two_stats  # the loss among them
    assert any(g.abs().max() > 0 for g in one_grads)


@pytest.mark.parametrize("name", CASES)
def test_one_pass_makes_the_two_pass_step_exactly_with_its_statistics(name):
    two_stats, two_weights, two_steps = step(name, True, lambda model: as_the_update_runs(model, name))
    one_stats, one_weights, one_steps = step(name, False)
    assert one_steps == two_steps == 1
    assert one_stats == two_stats  # prepare's statistics (KL, rewards with KL, sampler gap) from the update's forward
    assert all(torch.equal(one_weights[k], two_weights[k]) for k in two_weights)
    if name.startswith("reinforce"):
        assert one_stats["train/init_policy_kl"] != 0
    if uses_sampler(name):
        assert one_stats["train/token_mult_prob_error"] > 1.0


@pytest.mark.parametrize("name", CASES)
def test_one_pass_agrees_with_the_loops_separate_pass_to_rounding(name):
    two_grads, _ = gradient(name, True, as_the_loop_runs)
    one_grads, _ = gradient(name, False)
    worst = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item() for a, b in zip(one_grads, two_grads))
    assert worst < 1e-4
    two_stats, _, _ = step(name, True, as_the_loop_runs)
    one_stats, _, _ = step(name, False)
    assert one_stats.keys() == two_stats.keys()
    assert one_stats == pytest.approx(two_stats, rel=1e-4, abs=1e-6)


def test_several_optimizer_steps_keep_the_separate_pass():
    chosen = recipe("grpo-k3", micro=2, global_batch=4)
    assert not chosen.logprobs_from_update()
    model = policy_model()
    batch, _ = chosen.prepare(rollouts(False), REWARDS, as_the_loop_runs(model), as_the_loop_runs(reference_model()))
    assert "old_logprobs" in batch.extras
    assert policy_update(model, chosen)(batch).optimizer_steps == 2


def test_a_reinforce_micro_batch_that_splits_a_group_keeps_the_separate_pass():
    assert recipe("reinforce-tis", micro=8).logprobs_from_update()
    assert not recipe("reinforce-tis", micro=2).logprobs_from_update()
    assert recipe("grpo-k3", micro=2).logprobs_from_update()  # a per-token loss: any micro-batch


def test_the_update_refuses_a_batch_of_several_steps_without_the_old_logprobs():
    chosen = recipe("grpo-k3")
    model = policy_model()
    batch, _ = chosen.prepare(rollouts(False), REWARDS, never_called, as_the_loop_runs(reference_model()))
    twice = RolloutBatch.concat([batch, batch])
    with pytest.raises(RuntimeError, match="one step only"):
        policy_update(model, chosen)(twice)


@pytest.mark.slow  # compiling the small policy forward and backward: about a minute on 2 cores
def test_a_compiled_training_forward_gives_the_eager_gradient_and_statistics():
    # train.compile: the update's passes run the model through torch.compile; the optimizer keeps the model itself
    eager_grads, eager_stats = gradient("grpo-k3", False)
    model = policy_model()
    chosen, batch, _ = prepared("grpo-k3", model, False)
    optimizer = build_optimizer(model, 1e-3, 0.0)
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=4, schedule="constant")
    train = chosen.cfg.train.model_copy(update={"compile": True})
    update = PolicyUpdate(model, optimizer, scheduler, chosen, train, CPU)
    assert update.forward is not model and update.forward._orig_mod is model
    stats = StepStats()
    model.train()
    update._accumulate(batch, chosen.loss_normaliser(batch), stats)
    stats.end_optimizer_step(0.0)
    for compiled, eager in zip([p.grad for p in model.parameters()], eager_grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-6)
    assert stats.result().keys() == eager_stats.keys()
    assert stats.result()["train/loss"] == pytest.approx(eager_stats["train/loss"], rel=1e-5)
