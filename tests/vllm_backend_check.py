"""The vLLM rollout backend against the real vLLM (CPU build), run in the vLLM environment by test_vllm_rollouts.py.

    .venv-vllm/bin/python tests/vllm_backend_check.py POLICY_DIR   # prints one JSON object of measurements

POLICY_DIR is a Hugging Face causal LM with its tokenizer (the tiny world's policy). The test asserts on the
measurements; this script only takes them, so a failure shows every figure at once.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch

from rlsteps.contract.config import VllmConfig
from rlsteps.engine.generation.backend import SamplingParams, eos_token_ids
from rlsteps.engine.generation.builtin import BuiltinBackend
from rlsteps.engine.generation.vllm_backend import VllmBackend
from rlsteps.engine.policy.model import load_policy

PROMPTS = ["Describe the cat.", "What do you think of the lake?", "Tell me about the school."]
SAMPLED = SamplingParams(max_new_tokens=24, temperature=1.0)
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


def trainer_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logprobs = model(ids).logits.float().log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]
    return logprobs[len(prompt) - 1 :]


def largest_gap(model, prompts: list[list[int]], generation) -> float:
    """The largest |trainer - sampler| log-prob of any sampled token."""
    gaps = [
        (trainer_logprobs(model, prompt, response) - torch.tensor(sampler)).abs().max().item()
        for prompt, response, sampler in zip(prompts, generation.response_ids, generation.logprobs)
        if response
    ]
    return max(gaps)


def tiny_cpu_backend(policy: Path, model, tokenizer) -> VllmBackend:
    """vLLM on the CPU for the tiny policy: eager, float32, a 1 GB KV cache, rows of up to 96 tokens."""
    return VllmBackend(
        policy,
        VllmConfig(kv_cache_gb=1, enforce_eager=True),
        max_model_len=96,
        dtype=torch.float32,
        device=torch.device("cpu"),
        eos_token_ids=eos_token_ids(model, tokenizer),
        seed=0,
    )


def main() -> None:
    torch.set_num_threads(1)
    policy = Path(sys.argv[1])
    model, tokenizer = load_policy(policy)
    model.eval()
    chats = [[{"role": "user", "content": text}] for text in PROMPTS]  # chat-templated, as the tiny policy learned
    texts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    random.seed(7)
    torch.manual_seed(7)
    before = (random.random(), torch.rand(1).item())
    random.seed(7)
    torch.manual_seed(7)
    backend = tiny_cpu_backend(policy, model, tokenizer)
    after = (random.random(), torch.rand(1).item())
    report: dict = {"random_state_kept": before == after}

    rows = [prompts[i % 3] for i in range(6)]
    seeds = [11, 12, 13, 14, 15, 16]
    batch = backend.generate(model, rows, SAMPLED, seeds)
    alone = backend.generate(model, [rows[4]], SAMPLED, [seeds[4]])
    reordered = backend.generate(model, rows[::-1], SAMPLED, seeds[::-1])
    report["row_alone_equals_row_in_batch"] = alone.response_ids[0] == batch.response_ids[4]
    report["reordered_rows_equal"] = reordered.response_ids[::-1] == batch.response_ids
    report["same_prompt_other_seed_differs"] = batch.response_ids[0] != batch.response_ids[3]
    report["ended_rows_end_with_eos"] = all(
        ids[-1] in backend.eos_token_ids for ids, ended in zip(batch.response_ids, batch.is_end) if ended
    )
    report["cut_rows_are_full_length"] = all(
        len(ids) == SAMPLED.max_new_tokens for ids, ended in zip(batch.response_ids, batch.is_end) if not ended
    )
    report["any_ended"] = any(batch.is_end)
    report["logprob_gap_initial"] = largest_gap(model, rows, batch)

    builtin = BuiltinBackend(tokenizer, batch_size=8)
    with torch.no_grad():  # an update: every weight moves, the tied embedding and output layer included
        for parameter in model.parameters():
            parameter.mul_(1.03).add_(torch.randn_like(parameter) * 0.02)
    stale = backend.generate(model, rows, SAMPLED, seeds)
    report["logprob_gap_before_sync"] = largest_gap(model, rows, stale)
    backend.load_weights(model)
    synced = backend.generate(model, rows, SAMPLED, seeds)
    report["logprob_gap_after_sync"] = largest_gap(model, rows, synced)
    greedy_vllm = backend.generate(model, prompts, GREEDY, [0, 1, 2]).response_ids
    greedy_builtin = builtin.generate(model, prompts, GREEDY, [0, 1, 2]).response_ids
    report["greedy_equals_builtin_after_sync"] = greedy_vllm == greedy_builtin
    print(json.dumps(report))


if __name__ == "__main__":
    main()
