"""Rollouts: N samples per prompt for training, greedy (or a few samples) for validation."""

from __future__ import annotations

import torch

from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.config import RolloutConfig
from rlsteps.engine.data import Prompt
from rlsteps.engine.generate import SamplingParams, build_rollout_batch, generate, tokenize_prompts


def step_seed(seed: int, step: int) -> int:
    """A sampling seed per (run seed, step): resumed runs draw exactly the samples they would have."""
    return (seed * 1_000_003 + step * 7_919 + 17) % (2**63 - 1)


class Sampler:
    def __init__(self, tokenizer, rollout: RolloutConfig, device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.rollout = rollout
        self.device = device

    def rollouts(self, model, prompts: list[Prompt], n: int, seed: tuple[int, int]) -> RolloutBatch:
        s = self.rollout.sampling
        params = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        return self._sample(model, prompts, n, params, step_seed(*seed))

    def validation_rollouts(self, model, prompts: list[Prompt], n: int, max_new_tokens: int | None, seed: int) -> RolloutBatch:
        """One greedy response per prompt, or n sampled ones where the scorer compares responses."""
        s = self.rollout.sampling
        params = SamplingParams(max_new_tokens=max_new_tokens or s.max_new_tokens,
                                temperature=0.0 if n == 1 else s.temperature, top_p=s.top_p, top_k=s.top_k)
        return self._sample(model, prompts, n, params, step_seed(seed, -1))

    def _sample(self, model, prompts: list[Prompt], n: int, params: SamplingParams, seed: int) -> RolloutBatch:
        repeated = [p for p in prompts for _ in range(n)]  # rows of one prompt are adjacent; groups are by id
        token_ids = [ids for ids in tokenize_prompts(prompts, self.tokenizer) for _ in range(n)]
        generator = torch.Generator(device=self.device).manual_seed(seed)
        generation = generate(model, token_ids, params, eos_token_id=self._eos_ids(model),
                              pad_token_id=self.tokenizer.pad_token_id, generator=generator,
                              batch_size=self.rollout.generation_batch_size)
        return build_rollout_batch(repeated, token_ids, generation, self.tokenizer)

    def _eos_ids(self, model) -> int | list[int]:
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        return configured if configured is not None else self.tokenizer.eos_token_id
