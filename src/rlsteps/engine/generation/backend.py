"""What a generation backend takes (SamplingParams), what it returns (Generation), and the protocol it follows."""

from __future__ import annotations

import math
from collections.abc import Callable
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


SEED_LIMIT = 2**63  # a row's seed is an int in [0, SEED_LIMIT): it fits an int64, as vLLM's per-request seed does


class GenerationBackend(Protocol):
    """Samples one response per tokenised prompt from the current policy, each row from its own seed.

    Row i's response depends only on (prompt_token_ids[i], params, seeds[i], the weights): not on the
    other rows, their order or how the backend batches them, up to the float rounding of batched
    matmuls. So a step's rollouts are the same whether one process generates all of them or several
    data-parallel processes each generate their share, and a resumed run repeats its samples.
    vLLM's per-request `seed` has the same meaning, so a vLLM backend follows this protocol too.
    """

    samples_from_policy: bool  # True: generate reads the policy's own weights (a sharded policy is gathered first)

    def generate(
        self,
        model: nn.Module,
        prompt_token_ids: list[list[int]],
        params: SamplingParams,
        seeds: list[int],
        on_answered: Callable[[int], None] | None = None,
    ) -> Generation:
        """The responses; on_answered (when given) is called with the count of rows answered so far, as often as
        the backend can tell (a progress line's count: validation's)."""

    def load_weights(self, model: nn.Module) -> None:
        """Take the policy's current weights (after an update): a backend with its own copy replaces it."""

    def release(self) -> None:
        """Rollouts are done until the next update: give back what memory the backend can."""


def eos_token_ids(model: nn.Module, tokenizer) -> list[int]:
    """The ids that end a response: the model's generation config's EOS, else the tokenizer's."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = configured if configured is not None else tokenizer.eos_token_id
    return [ids] if isinstance(ids, int) else list(ids or [])


def check_requests(prompt_token_ids: list[list[int]], seeds: list[int]) -> None:
    """Raise a ValueError unless every prompt has a token to continue from and its own seed (check_seeds)."""
    if any(len(ids) == 0 for ids in prompt_token_ids):
        raise ValueError("every prompt needs at least one token; an empty prompt cannot be continued")
    check_seeds(seeds, len(prompt_token_ids))


def check_seeds(seeds: list[int], rows: int) -> None:
    """Raise a ValueError unless there is one seed per row, each an int in [0, 2**63)."""
    if len(seeds) != rows:
        raise ValueError(f"{len(seeds)} seeds for {rows} prompts: give one seed per prompt")
    bad = next((s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < SEED_LIMIT), None)
    if bad is not None:
        raise ValueError(f"every seed must be an int in [0, 2**63), got {bad!r}")
