"""The built-in sampler: batched sampling from a Hugging Face causal LM with its KV cache, in process.

One batch: left-pad the prompts, run the prompt through the model once (prefill), then feed
one token per step with the cache. Positions come from the attention mask so padding never
shifts them; a row that has ended keeps receiving pad tokens until the whole batch is done.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import nn

from rlsteps.engine.generation.backend import Generation, SamplingParams
from rlsteps.engine.policy.logprobs import position_ids_from_mask
from rlsteps.engine.policy.model import eval_mode


class BuiltinBackend:
    """The GenerationBackend that samples from the policy itself, in this process, with `generate`."""

    def __init__(self, tokenizer: Any, batch_size: int, device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = device

    def generate(
        self, model: nn.Module, prompt_token_ids: list[list[int]], params: SamplingParams, seed: int
    ) -> Generation:
        generator = torch.Generator(device=self.device).manual_seed(seed)
        return generate(
            model,
            prompt_token_ids,
            params,
            eos_token_id=self._eos_ids(model),
            pad_token_id=self.tokenizer.pad_token_id,
            generator=generator,
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


def sample_next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """[B, V] fp32 logits -> [B] token ids: greedy at temperature 0, else temperature, top-k, top-p, sample."""
    if params.temperature == 0:
        return logits.argmax(-1)
    filtered = top_p_filter(top_k_filter(logits / params.temperature, params.top_k), params.top_p)
    return torch.multinomial(filtered.softmax(-1), 1, generator=generator).squeeze(-1)


# ---------------------------------------------------------------------------------------------
# Generation


def generate(
    model: nn.Module,
    prompt_token_ids: list[list[int]],
    params: SamplingParams,
    *,
    eos_token_id: int | list[int],
    pad_token_id: int,
    generator: torch.Generator,
    batch_size: int = 64,
) -> Generation:
    """Sample one response per prompt. Prompts are batched by length; results come back in input order.

    Sampling draws only from `generator`, which must live on the model's device.
    """
    if any(len(ids) == 0 for ids in prompt_token_ids):
        raise ValueError("every prompt needs at least one token; an empty prompt cannot be continued")
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
    with torch.inference_mode(), eval_mode(model):
        for start in range(0, len(by_length), batch_size):
            rows = by_length[start : start + batch_size]
            prompts = [prompt_token_ids[i] for i in rows]
            outputs = _generate_batch(model, prompts, params, eos_ids, pad_token_id, generator)
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
    params: SamplingParams,
    eos_ids: torch.Tensor,
    pad_id: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Responses [B, N], their raw log-probs [B, N] fp32, lengths [B] and ended [B] for one batch."""
    device = next(model.parameters()).device
    input_ids, attention_mask = _left_pad(prompts, pad_id, device)  # [B, P]
    eos_ids = eos_ids.to(device)
    batch, steps = len(prompts), params.max_new_tokens
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
        token = torch.where(active, sample_next_token(logits, params, generator), pad_id)  # [B]
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
