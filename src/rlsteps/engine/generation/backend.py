"""What a generation backend takes (SamplingParams), what it returns (Generation), and the protocol it follows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from torch import nn


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")


@dataclass
class Generation:
    response_ids: list[list[int]]  # per prompt, the EOS included when the response ended
    is_end: list[bool]  # per prompt: ended with EOS rather than cut at max_new_tokens
    logprobs: list[list[float]]  # per response token: fp32 log-prob under the raw model distribution


class GenerationBackend(Protocol):
    """Samples one response per tokenised prompt from the current policy.

    The same (prompts, params, seed) draws the same responses, so a resumed run repeats its samples.
    """

    def generate(
        self, model: nn.Module, prompt_token_ids: list[list[int]], params: SamplingParams, seed: int
    ) -> Generation: ...
