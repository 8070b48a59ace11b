"""How long a rollout may be and how many rows a batch holds: checked and chosen at the start of a run.

A rollout is a prompt of at most data.max_prompt_tokens tokens and a response of at most max_new_tokens
(training's or validation's, the larger). The policy must have positions for all of them, or a sampler fails
mid-run at the first long prompt; the check here stops the run before its first step instead.

The built-in sampler's batch (rollout.generation_batch_size, null = auto) holds one KV cache per row: on a GPU
the auto size is as many rows as half the free memory holds, on a CPU a fixed 64 (past it a CPU gains
nothing, and a laptop's memory is shared with everything else).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CPU_BATCH = 64
MAX_AUTO_BATCH = 512
FREE_MEMORY_SHARE = 0.5  # of the GPU's free memory, for the KV cache and the logits of one batch


@dataclass(frozen=True)
class RolloutShape:
    max_prompt_tokens: int
    max_new_tokens: int  # the larger of training's and validation's

    @property
    def tokens(self) -> int:
        return self.max_prompt_tokens + self.max_new_tokens


def rollout_shape(cfg: Any) -> RolloutShape:
    """The longest rollout a recipe config allows (data.max_prompt_tokens, rollout and validation max_new_tokens)."""
    new = cfg.rollout.sampling.max_new_tokens
    validation_new = cfg.validation.max_new_tokens or new
    return RolloutShape(cfg.data.max_prompt_tokens, max(new, validation_new))


def context_length(model_config: Any) -> int | None:
    """The positions a Hugging Face config allows, or None when it names no limit."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(model_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_rollout_fits(shape: RolloutShape, model_config: Any) -> None:
    """Raise a ValueError, naming the keys to change, when the longest rollout exceeds the policy's context."""
    context = context_length(model_config)
    if context is None or shape.tokens <= context:
        return
    raise ValueError(
        f"a rollout can be {shape.tokens} tokens (data.max_prompt_tokens={shape.max_prompt_tokens} + "
        f"max_new_tokens={shape.max_new_tokens}), more than the policy's context of {context} positions; lower "
        f"data.max_prompt_tokens, rollout.sampling.max_new_tokens or validation.max_new_tokens so they sum to at "
        f"most {context}"
    )


def kv_cache_bytes_per_token(model_config: Any, bytes_per_value: int) -> int:
    """Bytes of keys and values one token holds across every layer."""
    layers = getattr(model_config, "num_hidden_layers", None) or model_config.n_layer
    heads = getattr(model_config, "num_attention_heads", None) or model_config.n_head
    hidden = getattr(model_config, "hidden_size", None) or model_config.n_embd
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or hidden // heads
    return 2 * layers * kv_heads * head_dim * bytes_per_value


def auto_generation_batch_size(
    model_config: Any, shape: RolloutShape, free_bytes: int | None, bytes_per_value: int
) -> int:
    """Rows per built-in sampler batch: free_bytes None (a CPU) gives CPU_BATCH; on a GPU, the rows whose KV
    cache at full length and fp32 next-token logits fit in FREE_MEMORY_SHARE of the free memory, 1 to MAX_AUTO_BATCH."""
    if free_bytes is None:
        return CPU_BATCH
    per_row = kv_cache_bytes_per_token(model_config, bytes_per_value) * shape.tokens + 4 * model_config.vocab_size
    return max(1, min(MAX_AUTO_BATCH, int(free_bytes * FREE_MEMORY_SHARE) // per_row))
