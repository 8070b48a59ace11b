"""The built-in sampler: batched sampling from a Hugging Face causal LM with its KV cache, in process.

One batch: left-pad the prompts, run the prompt through the model once (prefill), then feed
one token per step with the cache. Copies of one prompt in a batch (a group's rollouts) are prefilled once and
their cache rows copied (DecodeOptions.share_prefill). Positions come from the attention mask so padding never
shifts them; a row that has ended keeps receiving pad tokens until the whole batch is done.

Sampling draws no random state: the token of row i at response position t is the inverse-CDF sample of the
filtered distribution (generation.sampling) at the uniform number hashed from (seeds[i], t) (generation.uniforms).
A row's response therefore depends on its own prompt and seed only, never on the rows that share its batch.

The decode loop allocates the attention mask, the positions and the KV cache for the whole batch
once, and reads nothing back from the device per step but, every few steps, whether every row has
ended. One decode step (feed a token, sample the next) is one function, `decode_step`: on a GPU it is
compiled (CUDA graphs, over transformers' StaticCache so that its shapes stay fixed); see DecodeOptions.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, StaticCache

from rlsteps.engine.generation.backend import Generation, SamplingParams, check_requests, eos_token_ids
from rlsteps.engine.generation.sampling import choose_token
from rlsteps.engine.generation.sizing import context_length
from rlsteps.engine.generation.uniforms import position_uniforms
from rlsteps.engine.policy.logprobs import position_ids_from_mask
from rlsteps.engine.policy.model import eval_mode, underlying_model

STATIC_CACHE_MULTIPLE = 64  # a static cache's length is rounded up to this, so batches of similar length share a graph


@dataclass(frozen=True)
class DecodeOptions:
    """How the decode loop runs; None picks by device. None of them changes a row's tokens, up to float rounding."""

    compile: bool | None = None  # torch.compile the decode step (CUDA graphs on a GPU); None: on CUDA only
    compile_backend: str = "inductor"  # torch.compile's backend ("eager" checks the traced step without inductor)
    static_cache: bool | None = None  # transformers' StaticCache, not a preallocated dynamic one; None: if compiled
    end_check_interval: int | None = None  # steps between looks at whether every row ended; None: 1 on CPU, else 8
    # a batch's copies of one prompt (a group's rollouts) prefilled once, its cache then copied to each; a model
    # whose cache layers cannot be copied by row (a static cache's) prefills every copy
    share_prefill: bool = True

    def for_device(self, device: torch.device) -> DecodeOptions:
        """These options with every None decided for `device`; a ValueError for a combination that cannot work."""
        compiled = device.type == "cuda" if self.compile is None else self.compile
        static = compiled if self.static_cache is None else self.static_cache
        interval = (1 if device.type == "cpu" else 8) if self.end_check_interval is None else self.end_check_interval
        if compiled and not static:
            raise ValueError("a compiled decode step needs the static cache (static_cache=True): its shapes stay fixed")
        if interval < 1:
            raise ValueError(f"end_check_interval must be at least 1, got {interval}")
        return DecodeOptions(compiled, self.compile_backend, static, interval, self.share_prefill)


class BuiltinBackend:
    """The GenerationBackend that samples from the policy itself, in this process, with `generate`."""

    samples_from_policy = True

    def __init__(self, tokenizer: Any, batch_size: int, *, decode: DecodeOptions = DecodeOptions()) -> None:
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.decode = decode

    def generate(
        self,
        model: nn.Module,
        prompt_token_ids: list[list[int]],
        params: SamplingParams,
        seeds: list[int],
        on_answered: Callable[[int], None] | None = None,
    ) -> Generation:
        return generate(
            model,
            prompt_token_ids,
            params,
            eos_token_id=eos_token_ids(model, self.tokenizer),
            pad_token_id=self.tokenizer.pad_token_id,
            seeds=seeds,
            batch_size=self.batch_size,
            decode=self.decode,
            on_answered=on_answered,
        )

    def load_weights(self, model: nn.Module) -> None:
        """Nothing to load: generate reads the policy's weights as they are."""

    def release(self) -> None:
        """Nothing held between steps: each batch's cache is freed when the batch is done."""


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
    decode: DecodeOptions = DecodeOptions(),
    on_answered: Callable[[int], None] | None = None,
) -> Generation:
    """Sample one response per prompt. Prompts are batched by length; results come back in input order.
    on_answered: called with the count of rows answered so far, as rows end (at each look at whether they did).

    Row i samples from seeds[i] (an int in [0, 2**63)) alone: its response depends on its prompt,
    params, seed and the weights, not on the other rows, their order or batch_size (up to the
    float rounding of batched matmuls). No random state is read or advanced.
    """
    check_requests(prompt_token_ids, seeds)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    eos_ids = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id, dtype=torch.long)
    if eos_ids.numel() == 0:
        raise ValueError("eos_token_id is an empty list; give at least one end-of-sequence token id")
    _check_context(model, max(map(len, prompt_token_ids), default=0), params.max_new_tokens)
    options = decode.for_device(next(model.parameters()).device)
    by_length = sorted(range(len(prompt_token_ids)), key=lambda i: len(prompt_token_ids[i]))
    caches: dict[tuple[int, int], Cache] = {}  # static caches by shape, reused from batch to batch
    response_ids: list[list[int]] = [[] for _ in prompt_token_ids]
    is_end = [False] * len(prompt_token_ids)
    logprobs: list[list[float]] = [[] for _ in prompt_token_ids]
    # no_grad, not inference_mode: a sharded (FSDP2) policy keeps the parameters it gathers here and trains with
    # them after, and autograd refuses tensors created in inference mode
    with torch.no_grad(), eval_mode(model):
        for start in range(0, len(by_length), batch_size):
            rows = by_length[start : start + batch_size]
            prompts = [prompt_token_ids[i] for i in rows]
            row_seeds = [seeds[i] for i in rows]
            counted = None if on_answered is None else (lambda ended, before=start: on_answered(before + ended))
            outputs = _generate_batch(
                model, prompts, row_seeds, params, eos_ids, pad_token_id, options, caches, counted
            )
            tokens, token_logprobs, lengths, ended = (x.cpu() for x in outputs)
            for j, row in enumerate(rows):
                n = int(lengths[j])
                response_ids[row] = tokens[j, :n].tolist()
                logprobs[row] = token_logprobs[j, :n].tolist()
                is_end[row] = bool(ended[j])
            if on_answered is not None:
                on_answered(start + len(rows))
    return Generation(response_ids=response_ids, is_end=is_end, logprobs=logprobs)


def decode_step(
    model: nn.Module,
    token: torch.Tensor,
    position: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: Cache | None,
    keyword: str,
    uniforms: torch.Tensor,
    params: SamplingParams,
) -> tuple[torch.Tensor, ...]:
    """One decode step: feed each row's token [B] at its position [B, 1] with the cache (the forward's argument
    `keyword`, from cache_keyword outside the compiled region), and sample the next.

    Returns the next tokens [B] and their raw log-probs [B]. The unit that DecodeOptions.compile compiles.
    """
    out = model(
        input_ids=token[:, None],
        attention_mask=attention_mask,
        position_ids=position,
        use_cache=True,
        **{keyword: cache},
    )
    return choose_token(out.logits[:, -1].float(), params, uniforms)


def _generate_batch(
    model: nn.Module,
    prompts: list[list[int]],
    seeds: list[int],
    params: SamplingParams,
    eos_ids: torch.Tensor,
    pad_id: int,
    options: DecodeOptions,
    caches: dict[tuple[int, int], Cache],
    on_ended: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Responses [B, N], their raw log-probs [B, N] fp32, lengths [B] and ended [B] for one batch."""
    device = next(model.parameters()).device
    batch = _Batch.build(prompts, seeds, pad_id, params.max_new_tokens, options.static_cache, device)
    cache = _kv_cache(model, len(prompts), batch.attention_mask.shape[1], options.static_cache, caches)
    logits, cache = _prefill_distinct(model, prompts, batch, cache, options.share_prefill)  # [B, V]
    first = choose_token(logits, params, batch.uniforms[:, 0])
    is_eos = _eos_table(eos_ids, logits.shape[-1], device)
    return _decode(model, cache, batch, first, params, is_eos, pad_id, options, on_ended)


@dataclass(frozen=True)
class _Batch:
    """A batch's inputs for every step, allocated once: nothing is concatenated or rebuilt per step."""

    input_ids: torch.Tensor  # [B, P] left-padded prompts
    prompt_mask: torch.Tensor  # [B, P]
    attention_mask: torch.Tensor  # [B, L]: the prompt mask, then ones up to the cache's length L >= P + N
    positions: torch.Tensor  # [B, N]: where response token t sits (a row's prompt length + t)
    uniforms: torch.Tensor  # [B, N] fp64: the uniform number of response position t
    static: bool  # attend to the whole static cache, not to the slots filled so far

    @classmethod
    def build(
        cls, prompts: list[list[int]], seeds: list[int], pad_id: int, steps: int, static: bool, device: torch.device
    ) -> _Batch:
        input_ids, prompt_mask = _left_pad(prompts, pad_id, device)
        width = prompt_mask.shape[1] + steps
        if static:  # rounded up, so that batches of similar length share a compiled graph
            width = -(-width // STATIC_CACHE_MULTIPLE) * STATIC_CACHE_MULTIPLE
        attention_mask = prompt_mask.new_ones(len(prompts), width)
        attention_mask[:, : prompt_mask.shape[1]] = prompt_mask
        positions = prompt_mask.sum(-1, keepdim=True) + torch.arange(steps, device=device)
        uniforms = position_uniforms(torch.tensor(seeds, dtype=torch.long, device=device), steps)
        return cls(input_ids, prompt_mask, attention_mask, positions, uniforms, static)

    def step_mask(self, t: int) -> torch.Tensor:
        """The mask with which response token t is fed: it sits at slot P + t. A static cache is attended whole
        (the causal mask hides the slots not written yet); a dynamic one holds the slots up to P + t."""
        return self.attention_mask if self.static else self.attention_mask[:, : self.prompt_mask.shape[1] + t + 1]


def _decode(
    model: nn.Module,
    cache: Cache | None,
    batch: _Batch,
    first: tuple[torch.Tensor, ...],
    params: SamplingParams,
    is_eos: torch.Tensor,
    pad_id: int,
    options: DecodeOptions,
    on_ended: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decode loop from the first sampled tokens and their log-probs: responses, log-probs, lengths, ended;
    on_ended told the count of rows ended at each look at whether all did."""
    rows, steps = batch.positions.shape
    device = batch.positions.device
    responses = torch.full((rows, steps), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(rows, steps, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    ended = torch.zeros(rows, dtype=torch.bool, device=device)
    step = _decode_function(options, device)
    keyword = cache_keyword(model)
    token, logprob = first
    for t in range(steps):
        active = ~ended
        token = torch.where(active, token, pad_id)  # a row that has ended is fed padding
        responses[:, t] = token
        logprobs[:, t] = torch.where(active, logprob, 0.0)
        lengths += active
        ended |= is_eos[token]
        # the look at whether all rows ended waits for the device: only every end_check_interval steps
        if t + 1 == steps or ((t + 1) % options.end_check_interval == 0 and _all_ended(ended, on_ended)):
            break
        position, uniforms = batch.positions[:, t : t + 1], batch.uniforms[:, t + 1]
        token, logprob = step(model, token, position, batch.step_mask(t), cache, keyword, uniforms, params)
    return responses, logprobs, lengths, ended


def _all_ended(ended: torch.Tensor, on_ended: Callable[[int], None] | None) -> bool:
    """Whether every row ended (one wait for the device), the count told to on_ended."""
    if on_ended is None:
        return bool(ended.all())
    count = int(ended.sum())
    on_ended(count)
    return count == ended.numel()


def _prefill(
    model: nn.Module, input_ids: torch.Tensor, mask: torch.Tensor, cache: Cache | None
) -> tuple[torch.Tensor, Cache]:
    """Run the prompts through the model: the logits of each row's first response token [B, V] and the filled cache
    (the one given, or the model's own where none was)."""
    last_only = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}
    keyword = cache_keyword(model)
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask),
        use_cache=True,
        **{keyword: cache},
        **last_only,
    )
    return out.logits[:, -1].float(), out[keyword]


def _prefill_distinct(
    model: nn.Module, prompts: list[list[int]], batch: _Batch, cache: Cache | None, share: bool
) -> tuple[torch.Tensor, Cache]:
    """_prefill of each distinct prompt of the batch once, its logits and cache rows then copied to each row that
    holds it: [B, V] and a cache of B rows, as the prefill of every row gives them (up to the float rounding of a
    smaller batch). A group's rollouts share their prompt, so a prompt sampled n times costs one prefill, not n."""
    firsts, copies = distinct_rows(prompts)
    if not share or len(firsts) == len(prompts) or not _selects_rows(cache):
        return _prefill(model, batch.input_ids, batch.prompt_mask, cache)
    index = torch.tensor(firsts, device=batch.input_ids.device)
    logits, cache = _prefill(model, batch.input_ids[index], batch.prompt_mask[index], cache)
    copy_index = torch.tensor(copies, device=logits.device)
    cache.batch_select_indices(copy_index)
    return logits[copy_index], cache


def distinct_rows(prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """The first row of each distinct prompt, and for each row the position of its prompt among those firsts."""
    position_of: dict[tuple[int, ...], int] = {}
    firsts, copies = [], []
    for row, prompt in enumerate(prompts):
        key = tuple(prompt)
        if key not in position_of:
            position_of[key] = len(firsts)
            firsts.append(row)
        copies.append(position_of[key])
    return firsts, copies


def _selects_rows(cache: Cache | None) -> bool:
    """Whether every layer of `cache` can keep a selection of its rows (transformers' dynamic layers and
    PreallocatedLayer can; a static cache's buffers are sized for the batch)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(callable(getattr(layer, "batch_select_indices", None)) for layer in layers)


def _decode_function(options: DecodeOptions, device: torch.device) -> Callable[..., tuple[torch.Tensor, ...]]:
    if not options.compile:
        return decode_step
    compiled = _compiled_decode_step(options.compile_backend, device.type == "cuda")
    if device.type != "cuda":
        return compiled

    def step(*args: Any) -> tuple[torch.Tensor, ...]:
        torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs have been read: they may be reused
        return compiled(*args)

    return step


@functools.cache
def _compiled_decode_step(backend: str, cuda_graphs: bool) -> Callable[..., tuple[torch.Tensor, ...]]:
    """decode_step compiled once per process: shapes are static (dynamic=False), one graph per batch shape."""
    mode = "reduce-overhead" if cuda_graphs and backend == "inductor" else None
    return torch.compile(decode_step, backend=backend, mode=mode, dynamic=False)


def _eos_table(eos_ids: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """[V] bool: which token ids end a response (ids outside the vocabulary are never sampled)."""
    table = torch.zeros(vocab, dtype=torch.bool)
    table[eos_ids[(eos_ids >= 0) & (eos_ids < vocab)]] = True
    return table.to(device)


def _kv_cache(
    model: nn.Module, rows: int, length: int, static: bool, caches: dict[tuple[int, int], Cache]
) -> Cache | None:
    """A KV cache for `rows` x `length` tokens: transformers' StaticCache, or a dynamic one with preallocated layers.

    A static cache is kept in `caches` and reset for the next batch of its shape: a compiled step sees the same
    buffers again (CUDA graphs replay rather than record anew). None for a model without a config: it makes its own.
    """
    config = getattr(model, "config", None)
    if config is None:
        return None
    if not static:
        return preallocated_cache(config, length)
    if (rows, length) in caches:
        caches[rows, length].reset()
    else:
        caches[rows, length] = StaticCache(config=config, max_cache_len=length)
    return caches[rows, length]


def preallocated_cache(config: Any, length: int) -> DynamicCache:
    """transformers' DynamicCache for `config`, its plain layers preallocated (sliding-window ones stay as they are)."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer(length) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    if cache.layer_class_to_replicate is DynamicLayer:
        cache.layer_class_to_replicate = functools.partial(PreallocatedLayer, length)
    return cache


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live in buffers of `length` tokens allocated at its first update.

    Each update writes into the buffers in place and returns views of the part filled so far, where DynamicLayer
    concatenates: appending a token copies one token's keys and values, not the whole cache. Attention sees
    exactly the tokens seen so far, as with DynamicLayer; `length` is a hard limit.
    """

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = key_states.new_empty(*key_states.shape[:2], self.length, key_states.shape[-1])
        self._value_buffer = value_states.new_empty(*value_states.shape[:2], self.length, value_states.shape[-1])
        self.keys, self.values = self._key_buffer[:, :, :0], self._value_buffer[:, :, :0]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` (repeats allowed) of the buffers, and the views of their filled part with them."""
        if self.is_initialized:
            end = self.keys.shape[-2]
            self._key_buffer, self._value_buffer = self._key_buffer[indices], self._value_buffer[indices]
            self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row `repeats` times in a row, as DynamicLayer does, in the buffers and their views."""
        if self.is_initialized:
            rows = torch.arange(self._key_buffer.shape[0], device=self._key_buffer.device)
            self.batch_select_indices(rows.repeat_interleave(repeats))


def _left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, ids in enumerate(prompts):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def cache_keyword(model: nn.Module) -> str:
    """The name of a forward's KV cache argument (and of its output field): transformers renamed past_key_values to
    cache in 5.2x, where the old name warns and is to go in 5.40; a model of an older release (or remote code) still
    takes past_key_values. Decided once per model class."""
    return _cache_keyword(type(underlying_model(model)))


@functools.cache
def _cache_keyword(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    """Most HF causal LMs can return the last position's logits only, saving a [B, P, V] prefill tensor."""
    return "logits_to_keep" in inspect.signature(underlying_model(model).forward).parameters


def _check_context(model: nn.Module, longest_prompt: int, max_new_tokens: int) -> None:
    """A guard for callers of generate: a run has checked its longest rollout at its start (sizing)."""
    config = getattr(model, "config", None)
    context = context_length(config) if config is not None else None
    if context is not None and longest_prompt + max_new_tokens > context:
        raise ValueError(
            f"a prompt of {longest_prompt} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
            f"context of {context} positions; lower max_new_tokens or max_prompt_tokens"
        )
