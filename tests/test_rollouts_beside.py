"""Rollouts beside training (rollout.max_age_steps, engine.generation.beside): the real rollout process, spawned,
draws what the trainer's own built-in sampler draws with the weights of the version it was sent; step s's
rollouts come from version max(0, s - k); the rollouts in flight at a checkpoint, kept and restored into a new
process, are the ones the process never stopped would have given; what the embedded engine cannot run beside
training is refused in one line with the fix."""

from __future__ import annotations

import pytest
import torch

from rlsteps.contract.config import RolloutConfig
from rlsteps.contract.prompts import Prompt
from rlsteps.engine.generation.backend import SamplingParams
from rlsteps.engine.generation.beside import (
    BESIDE_STATE,
    BesideSampler,
    GenerationProcess,
    GenerationProcessDied,
    in_flight_from_state,
)
from rlsteps.engine.generation.builtin import BuiltinBackend
from rlsteps.engine.generation.rollouts import Sampler, rollout_seeds, step_seed, tokenize_prompts
from test_nemo_rl_runs import compile_case

PROMPTS = [Prompt(id=f"p{i}", text=text) for i, text in enumerate(("Tell me about the tree.", "Describe the boat."))]
PER_PROMPT, SEED, STEPS = 2, 7, 5
ROLLOUT = RolloutConfig(sampling={"max_new_tokens": 12, "temperature": 0.7}, num_rollouts_per_prompt=PER_PROMPT)


@pytest.fixture(scope="module")
def policy(tiny_world):
    from rlsteps.engine.policy.model import load_policy

    torch.set_num_threads(1)  # the process draws on one thread too: the same rounding, the same tokens
    return load_policy(tiny_world.policy)


def version(model, v: int) -> torch.nn.Module:
    """The policy after v steps of 'training': each step moves every weight by a draw of its own."""
    moved = type(model)(model.config)
    moved.load_state_dict(model.state_dict())
    with torch.no_grad():
        for step in range(v):
            generator = torch.Generator().manual_seed(step)
            for parameter in moved.parameters():
                parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    return moved.eval()


def here(model, tokenizer, step: int) -> list[list[int]]:
    """Step `step`'s responses, drawn in this process by the trainer's own sampler."""
    token_ids = [ids for ids in tokenize_prompts(PROMPTS, tokenizer) for _ in range(PER_PROMPT)]
    seeds = rollout_seeds(step_seed(SEED, step), range(len(PROMPTS)), PER_PROMPT)
    params = SamplingParams(12, 0.7)
    return BuiltinBackend(tokenizer, 8).generate(model, token_ids, params, seeds).response_ids


def beside(model, tokenizer, k: int, start: int = 0, restored=None) -> BesideSampler:
    process = GenerationProcess.builtin(model, tokenizer, batch_rows=8, threads=1, device="cpu")
    sampler = BesideSampler(Sampler(tokenizer, ROLLOUT), process, k, SEED, lambda step: PROMPTS)
    sampler.start(model, start, restored)
    return sampler


def run_steps(versions: list, tokenizer, k: int, steps: range, restored=None) -> tuple[dict, dict]:
    """Each step's (responses, age) drawn beside training, the policy at version s training step s; and what a
    checkpoint after the last step keeps."""
    sampler, drawn = beside(versions[steps.start], tokenizer, k, steps.start, restored), {}
    try:
        for step in steps:
            batch = sampler.rollouts(versions[step], PROMPTS, PER_PROMPT, (SEED, step))
            drawn[step] = (batch.response_texts, sampler.step_figures()["rollout/age"])
        kept = sampler.checkpoint_state(steps.stop)[BESIDE_STATE]
    finally:
        sampler.close()
    return drawn, kept


K = 2


@pytest.fixture(scope="module")
def versions(policy) -> list:
    model, _ = policy
    return [version(model, v) for v in range(STEPS + 1)]


@pytest.fixture(scope="module")
def straight(policy, versions) -> dict:
    """A run's rollouts beside training, never stopped."""
    return run_steps(versions, policy[1], K, range(STEPS))[0]


@pytest.mark.slow  # a spawned process each (about 7 s to import torch and transformers)
def test_step_s_is_drawn_by_the_weights_after_step_s_minus_k_as_the_trainer_would_draw_them(policy, versions, straight):
    tokenizer = policy[1]
    for step in range(STEPS):
        texts, age = straight[step]
        assert age == min(step, K)
        expected = here(versions[max(0, step - K)], tokenizer, step)
        assert texts == tokenizer.batch_decode(expected, skip_special_tokens=True), step
    assert straight[3][0] != tokenizer.batch_decode(here(versions[3], tokenizer, 3), skip_special_tokens=True)


@pytest.mark.slow
def test_the_rollouts_in_flight_at_a_checkpoint_restored_into_a_new_process_are_the_ones_never_stopping_gives(
    policy, versions, straight
):
    stop_at = 2
    first, kept = run_steps(versions, policy[1], K, range(stop_at))
    assert sorted(kept) == [stop_at, stop_at + 1]  # drawn by versions 0 and 1: not in the checkpoint's weights
    second, _ = run_steps(versions, policy[1], K, range(stop_at, STEPS), in_flight_from_state(kept))
    assert {**first, **second} == straight


@pytest.mark.slow
def test_a_rollout_process_that_dies_stops_the_step_in_one_line_not_a_hang(policy, versions):
    sampler = beside(versions[0], policy[1], K)
    try:
        sampler.process._process.kill()
        with pytest.raises(GenerationProcessDied) as died:
            sampler.rollouts(versions[0], PROMPTS, PER_PROMPT, (SEED, 0))
    finally:
        sampler.close()
    assert str(died.value).startswith("the rollout process ended (exit -9) before answering: killed, or out of memory")


def sampler_that_cannot_start():
    """A rollout process's sampler whose start fails, as vLLM's does when its KV cache cannot hold a rollout."""
    raise ValueError("vLLM cannot start for rollouts of up to 96 tokens: no room (fix: rollout.vllm.kv_cache_gb)")


@pytest.mark.slow
def test_a_sampler_that_fails_to_start_in_the_rollout_process_stops_the_run_with_its_own_error():
    process = GenerationProcess(sampler_that_cannot_start, threads=1)
    try:
        with pytest.raises(GenerationProcessDied) as died:
            process.answer(0)
    finally:
        process.close()
    said = str(died.value)
    assert said.startswith("the rollout process failed (starting its sampler):"), said
    assert (
        "ValueError: vLLM cannot start for rollouts of up to 96 tokens: no room (fix: rollout.vllm.kv_cache_gb)" in said
    )


@pytest.mark.parametrize(
    ("step", "overrides", "said"),
    [
        ("rl/rs", (), "rejection sampling keeps the best rollouts of the policy now (fix: rollout.max_age_steps=0)"),
        ("rl/reinforce", (), "the importance weights correct for (fix: train.truncated_importance_sampling=true)"),
        ("rl/rlhf", ("train.truncated_importance_sampling=true", "grpo.dynamic_sampling=true"),
         "(fix: grpo.dynamic_sampling=false)"),
    ],
)  # fmt: skip
def test_what_the_embedded_engine_cannot_run_beside_training_is_refused_with_the_fix(step, overrides, said):
    from rlsteps.errors import UsageError

    with pytest.raises(UsageError) as refused:
        compile_case(step, "tiny", None, ("rollout.max_age_steps=2", *overrides))
    assert "rollout.max_age_steps=2 draws rollouts beside training; " in str(refused.value)
    assert said in str(refused.value)


def test_several_processes_are_refused_before_anything_starts():
    from rlsteps.contract.world_check import world_size_problems

    config = {"rollout": {"prompts_per_step": 8, "max_age_steps": 1}, "train": {}}
    (problem,) = world_size_problems(config, 2)
    assert "draws rollouts beside training for one process, not 2" in problem
    assert world_size_problems({**config, "rollout": {"prompts_per_step": 8, "max_age_steps": 0}}, 2) == []
