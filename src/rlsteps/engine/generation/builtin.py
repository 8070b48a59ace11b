"""The built-in sampler: batched sampling from a Hugging Face causal LM with its KV cache, in process.

One batch: left-pad the prompts, run the prompt through the model once (prefill), then feed
one token per step with the cache. Positions come from the attention mask so padding never
shifts them; a row that has ended keeps receiving pad tokens until the whole batch is done.

Sampling draws no random state: the token of row i at response position t is the inverse-CDF
sample of the filtered distribution at the uniform number hashed from (seeds[i], t). A row's
response therefore depends on its own prompt and seed only, never on the rows that share its batch.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import nn

from rlsteps.engine.generation.backend import Generation, SamplingParams, check_seeds
from rlsteps.engine.policy.logprobs import position_ids_from_mask
from rlsteps.engine.policy.model import eval_mode


class BuiltinBackend:
    """The GenerationBackend that samples from the policy itself, in this process, with `generate`."""

    def __init__(self, tokenizer: Any, batch_size: int) -> None:
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    def generate(
        self, model: nn.Module, prompt_token_ids: list[list[int]], params: SamplingParams, seeds: list[int]
    ) -> Generation:
        return generate(
            model,
            prompt_token_ids,
            params,
            eos_token_id=self._eos_ids(model),
            pad_token_id=self.tokenizer.pad_token_id,
            seeds=seeds,
            batch_size=self.batch_size,
        )

    def _eos_ids(self, model: nn.Module) -> int | list[int]:
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        return configured if configured is not None else self.tokenizer.eos_token_id


# ---------------------------------------------------------------------------------------------
# Sampling: pure functions on a [B, V] block of next-token logits


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row (ties with the k-th kept), -inf elsewhere."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth_largest = logits.topk(k, dim=-1).values[:, -1:]  # [B, 1]
    return logits.masked_fill(logits < kth_largest, -math.inf)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p (nucleus), -inf elsewhere."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # [B, V]: mass of the strictly more likely tokens
    drop_sorted = mass_before >= p  # the most likely token always stays (mass_before = 0 < p)
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def sample_next_token(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor) -> torch.Tensor:
    """[B, V] fp32 logits, [B] uniforms in (0, 1) -> [B] token ids.

    Greedy (argmax, the uniforms unused) at temperature 0; else temperature, top-k, top-p, then
    the inverse-CDF sample of each row's filtered distribution at its own uniform number.
    """
    if params.temperature == 0:
        return logits.argmax(-1)
    filtered = top_p_filter(top_k_filter(logits / params.temperature, params.top_k), params.top_p)
    return token_from_uniform(filtered.softmax(-1), uniforms)


def token_from_uniform(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: [B, V] probabilities and [B] uniforms u in (0, 1) -> [B] token ids.

    A row's token is the first index whose cumulative probability (fp64) exceeds u * total, so
    token i is drawn for u in [c(i-1), c(i)) / total: exactly its probability, and never a token of
    probability 0 (filtered). The rows never mix. A cumulative sum done as a parallel scan (on a
    GPU) is not exactly sequential, so a u within rounding distance of a boundary could still land
    on a zero-probability token or past the end; such a row takes its most likely token instead.
    """
    cumulative = probs.double().cumsum(-1)  # [B, V]
    threshold = uniforms.to(cumulative)[:, None] * cumulative[:, -1:]  # [B, 1]
    token = torch.searchsorted(cumulative, threshold, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
    drawn_zero = probs.gather(-1, token[:, None]).squeeze(-1) == 0  # [B]
    return torch.where(drawn_zero, probs.argmax(-1), token)


# ---------------------------------------------------------------------------------------------
# Uniform numbers hashed from (row seed, response position): SplitMix64, counter-based
#
# SplitMix64 (Steele, Lea and Flood 2014; Vigna's splitmix64.c) advances a 64-bit state by the
# constant GAMMA and mixes it into its output. Its output t is mix(seed + (t + 1) * GAMMA mod 2**64),
# a function of (seed, t) alone, so the number for any row and position is computed directly,
# with no state carried from step to step or shared between rows.

GAMMA = 0x9E3779B97F4A7C15
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_MASK64 = 2**64 - 1


def splitmix64(seed: int, index: int) -> int:
    """Output `index` (0-based) of SplitMix64 seeded with `seed`, in Python ints: a 64-bit hash of (seed, index)."""
    z = (seed + (index + 1) * GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX[0]) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX[1]) & _MASK64
    return z ^ (z >> 31)


def splitmix64_stream(seeds: torch.Tensor, length: int) -> torch.Tensor:
    """[B] int64 seeds -> [B, length] int64: outputs 0 .. length-1 of SplitMix64 per seed, on the seeds' device.

    splitmix64 in vectorised int64 arithmetic: each entry holds the unsigned 64-bit output's bits
    (two's complement). Addition and multiplication wrap modulo 2**64 as unsigned arithmetic does;
    right shifts are masked so they fill with zeros (logical) rather than copies of the sign bit.
    """
    counters = torch.arange(1, length + 1, dtype=torch.int64, device=seeds.device)  # [length]
    z = seeds[:, None] + counters * _as_int64(GAMMA)  # [B, length]
    z = (z ^ _shift_right(z, 30)) * _as_int64(_MIX[0])
    z = (z ^ _shift_right(z, 27)) * _as_int64(_MIX[1])
    return z ^ _shift_right(z, 31)


def position_uniforms(seeds: torch.Tensor, length: int) -> torch.Tensor:
    """[B] int64 row seeds -> [B, length] fp64 uniforms; entry [i, t] is for row i's response position t.

    The top 52 bits of the hash, k, become (k + 1/2) / 2**52: exact in fp64 and strictly inside
    (0, 1), from 2**-53 to 1 - 2**-53.
    """
    top_bits = _shift_right(splitmix64_stream(seeds, length), 12)  # [B, length] in [0, 2**52)
    return (top_bits.double() + 0.5) * 2.0**-52


def _as_int64(value: int) -> int:
    """The int64 with the bits of an unsigned 64-bit value."""
    return value - 2**64 if value >= 2**63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits: torch's >> on int64 is arithmetic, so clear the copied sign bits."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


# ---------------------------------------------------------------------------------------------
# Generation


def generate(
    model: nn.Module,
    prompt_token_ids: list[list[int]],
    params: SamplingParams,
    *,
    eos_token_id: int | list[int],
    pad_token_id: int,
    seeds: list[int],
    batch_size: int = 64,
) -> Generation:
    """Sample one response per prompt. Prompts are batched by length; results come back in input order.

    Row i samples from seeds[i] (an int in [0, 2**63)) alone: its response depends on its prompt,
    params, seed and the weights, not on the other rows, their order or batch_size (up to the
    float rounding of batched matmuls). No random state is read or advanced.
    """
    if any(len(ids) == 0 for ids in prompt_token_ids):
        raise ValueError("every prompt needs at least one token; an empty prompt cannot be continued")
    check_seeds(seeds, len(prompt_token_ids))
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    eos_ids = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id, dtype=torch.long)
    if eos_ids.numel() == 0:
        raise ValueError("eos_token_id is an empty list; give at least one end-of-sequence token id")
    _check_context(model, max(map(len, prompt_token_ids), default=0), params.max_new_tokens)
    by_length = sorted(range(len(prompt_token_ids)), key=lambda i: len(prompt_token_ids[i]))
    response_ids: list[list[int]] = [[] for _ in prompt_token_ids]
    is_end = [False] * len(prompt_token_ids)
    logprobs: list[list[float]] = [[] for _ in prompt_token_ids]
    # no_grad, not inference_mode: a sharded (FSDP2) policy keeps the parameters it gathers here and trains with
    # them after, and autograd refuses tensors created in inference mode
    with torch.no_grad(), eval_mode(model):
        for start in range(0, len(by_length), batch_size):
            rows = by_length[start : start + batch_size]
            prompts = [prompt_token_ids[i] for i in rows]
            outputs = _generate_batch(model, prompts, [seeds[i] for i in rows], params, eos_ids, pad_token_id)
            tokens, token_logprobs, lengths, ended = (x.cpu() for x in outputs)
            for j, row in enumerate(rows):
                n = int(lengths[j])
                response_ids[row] = tokens[j, :n].tolist()
                logprobs[row] = token_logprobs[j, :n].tolist()
                is_end[row] = bool(ended[j])
    return Generation(response_ids=response_ids, is_end=is_end, logprobs=logprobs)


def _generate_batch(
    model: nn.Module,
    prompts: list[list[int]],
    seeds: list[int],
    params: SamplingParams,
    eos_ids: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Responses [B, N], their raw log-probs [B, N] fp32, lengths [B] and ended [B] for one batch."""
    device = next(model.parameters()).device
    input_ids, attention_mask = _left_pad(prompts, pad_id, device)  # [B, P]
    eos_ids = eos_ids.to(device)
    batch, steps = len(prompts), params.max_new_tokens
    uniforms = position_uniforms(torch.tensor(seeds, dtype=torch.long, device=device), steps)  # [B, N]
    responses = torch.full((batch, steps), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(batch, steps, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    ended = torch.zeros(batch, dtype=torch.bool, device=device)

    position_ids = position_ids_from_mask(attention_mask)
    prefill = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, **prefill
    )
    for t in range(steps):
        logits = out.logits[:, -1].float()  # [B, V]
        active = ~ended
        token = torch.where(active, sample_next_token(logits, params, uniforms[:, t]), pad_id)  # [B]
        raw_logprob = logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)  # [B]
        responses[:, t] = token
        logprobs[:, t] = torch.where(active, raw_logprob, 0.0)
        lengths += active.long()
        ended |= active & torch.isin(token, eos_ids)
        if t == steps - 1 or bool(ended.all()):
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, 1)], dim=1)
        position_ids = position_ids[:, -1:] + 1
        out = model(
            input_ids=token[:, None],
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    return responses, logprobs, lengths, ended


def _left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, ids in enumerate(prompts):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    """Most HF causal LMs can return the last position's logits only, saving a [B, P, V] prefill tensor."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _check_context(model: nn.Module, longest_prompt: int, max_new_tokens: int) -> None:
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context is not None and longest_prompt + max_new_tokens > context:
        raise ValueError(
            f"a prompt of {longest_prompt} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
            f"context of {context} positions; lower max_new_tokens or max_prompt_tokens"
        )
