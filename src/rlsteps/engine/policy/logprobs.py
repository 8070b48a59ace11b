"""Token log-probs of the policy in the RolloutBatch layout.

A [B, T-1] tensor whose entry t is log p(token t+1 | tokens <= t), always computed in fp32 whatever the
model's dtype; old, new and reference log-probs share that layout, so they subtract cleanly.

Only the wanted entries are computed (the response positions, in training), and never through the full
[B, T, V] logits: the model's output embedding W [V, H] is swapped, for the one forward call, for a head that
takes the final hidden states of the wanted positions h [N, H] and scores their targets over chunks of
`vocab_chunk` rows of W, log p(target) = h·W[target] - logsumexp(h·W^T). Backward recomputes each chunk's logits,
so the extra memory is O(N * vocab_chunk) in both directions, not O(B * T * V) (about 16 GB of bf16 logits,
their fp32 copy and log_softmax for a 128k vocabulary, T=1536 and 8 rows). The model's own root forward still
runs, so hooks on it (FSDP2's parameter gathering) run too.
Heads this cannot reproduce (a bias, logits changed after the head, not an nn.Linear) take the full path.

The rows can be passed packed (packed_token_logprobs: several sequences end to end in a row, rlsteps.engine.policy.
packing) and the log-probs come back in the same layout; reads_packed_sequences probes once per model that its
forward keeps packed sequences apart.

Under a top-k/top-p distribution a KL to the reference reads the policy's log-probs under the temperature alone
(rlsteps.engine.policy.sampled_distribution): `unfiltered=True` returns both sets of the one forward, stacked
[2, ...] (the sampled distribution's first), the second from the same rows of logits the filter reads.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.device import tf32_matmuls
from rlsteps.engine.policy.model import eval_mode, underlying_model
from rlsteps.engine.policy.packing import attends_across_reason, pack_batch, probed_name
from rlsteps.engine.policy.sampled_distribution import SampledDistribution

log = logging.getLogger(__name__)

VOCAB_CHUNK = 8192  # rows of W per logits chunk: [N, 8192] fp32 is 32 MB per 1024 scored tokens
FILTER_CHUNK = 256  # positions a time whose whole logit rows a top-k/top-p distribution reads (NeMo-RL's chunk too)

# Config fields of architectures whose forward changes the logits after the head (softcapping, scaling):
# the chunked head would score the unchanged logits, so these models take the full path.
POST_HEAD_LOGIT_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling")

_warned: set[tuple[str, str]] = set()

# Mean absolute difference of the probe's log-probs, packed against padded, on the sequences that follow another in
# the packed row (the only ones attention across sequences can reach), that still counts as rounding: the attention
# kernels differ between the two layouts (a block-diagonal mask against a padding mask). bf16, fp16 and fp32 matmuls
# on TF32 tensor cores (10-bit mantissas) round alike. Measured on SmolLM2-135M-Instruct (30 layers, trained), CPU
# autocast: rounding 4e-8 in fp32, 3e-4 in fp16, 5e-4 in bf16 (6e-3 over every sequence: the first one's rounding
# is the largest); its forward made to attend across the sequences, 2.3 nats in all three.
AGREEMENT = {torch.float32: 1e-4, torch.float64: 1e-8}
HALF_PRECISION_AGREEMENT = 2e-2

PROBE_LENGTHS = (24, 17, 9)  # the probe's sequences, packed in this order: the second and third follow another

_checked: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T]
    """Positions count real tokens only, so left or right padding never shifts them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(
    model: nn.Module,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor | None = None,
    vocab_chunk: int = VOCAB_CHUNK,
    distribution: SampledDistribution | None = None,
    unfiltered: bool = False,
) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for right-padded rows: [B, T] -> [B, T-1] fp32.

    positions: [B, T-1] bool or float mask of the entries wanted (the response mask, in training); None wants every
    non-padding entry. Entries not wanted, and predictions of padding, are 0. Differentiable with respect to the
    model's parameters; equals logits.float().log_softmax(-1) gathered at the targets, in value and gradient.
    distribution: the sampled distribution to score under (temperature, top-k, top-p); None: the model's own.
    unfiltered: [2, B, T-1], those and the log-probs under the distribution's temperature alone, of one forward.
    """
    if vocab_chunk < 1:
        raise ValueError(f"vocab_chunk must be a positive number of vocabulary rows, got {vocab_chunk}")
    wanted = _wanted_entries(attention_mask, positions)  # [B, T-1] bool
    targets = tokens[:, 1:][wanted]  # [N]
    inputs = forward_inputs(model, tokens, attention_mask, position_ids_from_mask(attention_mask))
    picked = wanted_logprobs(model, inputs, wanted, targets, vocab_chunk, distribution, unfiltered)  # [(2,) N]
    out = torch.zeros((*picked.shape[:-1], *wanted.shape), dtype=torch.float32, device=picked.device)
    return out.masked_scatter(wanted, picked)


def wanted_logprobs(
    model: nn.Module,
    inputs: dict,
    wanted: torch.Tensor,
    targets: torch.Tensor,
    vocab_chunk: int = VOCAB_CHUNK,
    distribution: SampledDistribution | None = None,
    unfiltered: bool = False,
) -> torch.Tensor:
    """The log-probs [N] fp32 of the `wanted` entries [B, T-1] of the forward on `inputs` (forward_inputs), whose
    predicted tokens are `targets` [N]: through the chunked head where it reproduces the logits, else the full ones.
    Under a distribution with top-k or top-p, each wanted position's whole row of logits is needed (the filter reads
    it): the head scores FILTER_CHUNK positions at a time, recomputed in backward. unfiltered: [2, N], those and the
    log-probs under the temperature alone (the same set where nothing is filtered)."""
    distribution = None if distribution is None or distribution.is_raw else distribution
    pair = unfiltered and distribution is not None and distribution.filtered  # two different sets
    reason = full_logits_reason(model)
    if reason is None:
        picked = _chunked_path(model, inputs, wanted, targets, vocab_chunk, distribution, pair)
    else:
        _warn_once(model, reason)
        picked = _full_path(model, inputs, wanted, targets, distribution, pair)
    return torch.stack([picked, picked]) if unfiltered and not pair else picked


def batched_token_logprobs(
    model: nn.Module,
    batch: RolloutBatch,
    micro_batch_size: int,
    bin_tokens: int | None = None,
    distribution: SampledDistribution | None = None,
    unfiltered: bool = False,
) -> torch.Tensor:
    """token_logprobs of the response positions over micro-batches without gradients, at the batch's full width.

    [B, T-1] fp32, 0 outside `batch.response_mask()`: old, new and reference log-probs computed this way share one
    layout, so they subtract cleanly, and prompt positions (which no algorithm scores) cost nothing. bin_tokens:
    sequence packing, micro_batch_size rows of bin_tokens tokens a pass (packed_token_logprobs). unfiltered:
    [2, B, T-1], those and the log-probs under the distribution's temperature alone (token_logprobs).
    """
    device = next(model.parameters()).device
    out = torch.zeros(*((2,) if unfiltered else ()), len(batch), batch.tokens.shape[1] - 1)
    with torch.no_grad(), eval_mode(model):
        for rows in batch.micro_batch_rows(micro_batch_size, bin_tokens=bin_tokens):
            micro = batch.select(rows).to(device)
            if bin_tokens is None:
                mask, wanted = micro.attention_mask(), micro.response_mask()
                logprobs = token_logprobs(
                    model, micro.tokens, mask, positions=wanted, distribution=distribution, unfiltered=unfiltered
                )
            else:
                logprobs = packed_token_logprobs(
                    model, micro, bin_tokens, distribution=distribution, unfiltered=unfiltered
                )
            out[..., rows, : logprobs.shape[-1]] = logprobs.cpu()
    return out.to(batch.tokens.device)


def packed_token_logprobs(
    model: nn.Module,
    batch: RolloutBatch,
    capacity: int,
    vocab_chunk: int = VOCAB_CHUNK,
    distribution: SampledDistribution | None = None,
    unfiltered: bool = False,
) -> torch.Tensor:
    """token_logprobs of the batch's response positions, its rows packed into bins of `capacity` tokens: [B, T-1]
    fp32 ([2, B, T-1] with unfiltered), 0 outside the response mask; the padded pass's to rounding, in value and
    gradient, for a model that reads packed sequences (reads_packed_sequences)."""
    packed = pack_batch(batch, capacity)
    inputs = forward_inputs(model, packed.tokens, None, packed.position_ids)
    targets = packed.tokens[:, 1:][packed.wanted]
    picked = wanted_logprobs(model, inputs, packed.wanted, targets, vocab_chunk, distribution, unfiltered)
    lead, rows, width = picked.shape[:-1], len(batch), batch.tokens.shape[1] - 1
    flat = torch.zeros((*lead, rows * width), dtype=picked.dtype, device=picked.device)
    return flat.index_copy(-1, packed.source, picked).view(*lead, rows, width)


def reads_packed_sequences(model: nn.Module, device: torch.device, autocast=nullcontext) -> bool:
    """Whether `model` keeps packed sequences apart: three sequences of random tokens, packed in one row, against the
    same three padded, in eval mode and under `autocast` (the passes' own precision), judged on the second and third
    (what attention across sequences changes). Probed once per model; every process runs the same probe, so
    distributed forwards stay in step."""
    if model in _checked:
        return _checked[model]
    generator = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    lengths = torch.tensor(PROBE_LENGTHS)
    tokens = torch.randint(0, vocab, (len(lengths), int(lengths.max())), generator=generator)
    probe = RolloutBatch(
        tokens=tokens, prompt_lengths=torch.ones_like(lengths), response_lengths=lengths - 1,
        is_end=torch.ones(len(lengths), dtype=torch.bool), prompt_ids=["probe"] * len(lengths),
        prompt_texts=[""] * len(lengths), response_texts=[""] * len(lengths), pad_id=0,
    ).to(device)  # fmt: skip
    with torch.no_grad(), eval_mode(model), autocast():
        packed = packed_token_logprobs(model, probe, capacity=int(lengths.sum()))
        padded = token_logprobs(model, probe.tokens, probe.attention_mask(), probe.response_mask())
        tolerance = _rounding(model, device)
    following = probe.response_mask().bool()
    following[0] = False  # the row's first sequence: nothing before it to attend to
    gap = (packed - padded)[following].abs().mean().item()
    _checked[model] = gap <= tolerance
    if not _checked[model]:
        log.warning(
            "train.sequence_packing: the log-probs of %s on packed rows differ from the padded rows' by %.3g on "
            "average (more than rounding, %.0e): %s. Its rows are passed padded.",
            probed_name(model), gap, tolerance, attends_across_reason(model),
        )  # fmt: skip
    return _checked[model]


def _rounding(model: nn.Module, device: torch.device) -> float:
    """The probe's tolerance for the precision its passes compute in."""
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    else:
        dtype = next(model.parameters()).dtype
    if dtype == torch.float32 and device.type == "cuda" and tf32_matmuls():
        return HALF_PRECISION_AGREEMENT
    return AGREEMENT.get(dtype, HALF_PRECISION_AGREEMENT)


def full_logits_reason(model: nn.Module) -> str | None:
    """Why `model`'s log-probs need its full logits (None when the chunked head reproduces them).

    The chunked head computes h·W^T with the output embedding's weight alone, so it needs that embedding to be a
    bias-free nn.Linear with a floating-point weight, and logits the model uses unchanged.
    """
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Linear):
        return f"its output embedding is {type(head).__name__}, not an nn.Linear"
    if head.bias is not None:
        return "its output embedding has a bias"
    if not head.weight.is_floating_point():
        return f"its output embedding's weight is {head.weight.dtype}, not floating point"
    config = getattr(model, "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    for cfg in (config, get_text_config() if callable(get_text_config) else None):
        for field in POST_HEAD_LOGIT_FIELDS:
            if getattr(cfg, field, None) is not None:
                return f"config.{field} is set: its forward changes the logits after the head"
    return None


def linear_head_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_chunk: int = VOCAB_CHUNK
) -> torch.Tensor:
    """log softmax(hidden @ weight^T)[target] without the [N, V] logits: [N, H], [V, H], [N] -> [N] fp32.

    The matmuls run in hidden's dtype, or the autocast dtype when autocast is on (as nn.Linear would); each
    [N, vocab_chunk] logits chunk is upcast to fp32 (fp64 for fp64 hidden) before exp and logsumexp. Gradients reach
    hidden and weight in their own dtypes, with each chunk's logits recomputed in backward rather than saved.
    """
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = hidden.dtype
    return _ChunkedLinearLogprobs.apply(hidden, weight, targets, vocab_chunk, dtype)


class _ChunkedLinearLogprobs(torch.autograd.Function):
    """linear_head_logprobs' autograd: saves h, W, targets and the logsumexp [N], recomputes logits per chunk.

    With p = softmax(h W^T) and g the incoming gradient [N], d log p(target) / d logits = onehot(target) - p, so
    grad_h = sum over chunks of ((onehot - p_chunk) * g) @ W_chunk and grad_W_chunk = ((onehot - p_chunk) * g)^T @ h.
    Autocast is off inside: the dtypes are explicit, the same in forward and backward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_chunk, dtype):
        h = hidden.to(dtype)  # [N, H]
        with torch.autocast(hidden.device.type, enabled=False):
            chunk_lse, picked = [], torch.zeros(targets.shape, dtype=_accumulation_dtype(h), device=h.device)
            for start, _, logits in _logit_chunks(h, weight, vocab_chunk):
                chunk_lse.append(logits.logsumexp(-1))  # [N]
                index, inside = _local_targets(targets, start, logits.shape[1])
                picked = torch.where(inside, logits.gather(1, index).squeeze(1), picked)
            lse = torch.stack(chunk_lse, -1).logsumexp(-1)  # [N]
        ctx.save_for_backward(h, weight, targets, lse)
        ctx.vocab_chunk, ctx.hidden_dtype = vocab_chunk, hidden.dtype
        return picked - lse

    @staticmethod
    def backward(ctx, grad_out):  # grad_out: [N]
        h, weight, targets, lse = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[:2]
        grad_h = torch.zeros(h.shape, dtype=_accumulation_dtype(h), device=h.device) if want_h else None
        grad_w = torch.empty_like(weight) if want_w else None
        with torch.autocast(h.device.type, enabled=False):
            for start, w, logits in _logit_chunks(h, weight, ctx.vocab_chunk):
                coeff = logits.sub_(lse[:, None]).exp_().mul_(-grad_out[:, None])  # -p * g: [N, C]
                index, inside = _local_targets(targets, start, logits.shape[1])
                coeff.scatter_add_(1, index, (grad_out * inside)[:, None])  # + onehot * g
                coeff = coeff.to(h.dtype)
                if want_h:
                    grad_h += coeff @ w
                if want_w:
                    grad_w[start : start + w.shape[0]] = coeff.T @ h
        return None if grad_h is None else grad_h.to(ctx.hidden_dtype), grad_w, None, None, None


def _logit_chunks(h: torch.Tensor, weight: torch.Tensor, vocab_chunk: int) -> Iterator:
    """(start, W chunk [C, H] in h's dtype, logits chunk [N, C] upcast) over rows start:start+C of weight [V, H]."""
    for start in range(0, weight.shape[0], vocab_chunk):
        w = weight[start : start + vocab_chunk].to(h.dtype)
        yield start, w, (h @ w.T).to(_accumulation_dtype(h))


def _accumulation_dtype(h: torch.Tensor) -> torch.dtype:
    """fp32 for bf16, fp16 and fp32 matmuls; fp64 stays fp64 (gradcheck)."""
    return torch.promote_types(h.dtype, torch.float32)


def _local_targets(targets: torch.Tensor, start: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets as columns of the chunk starting at vocabulary row `start`: index [N, 1] (clamped), inside [N] bool."""
    local = targets - start
    inside = (local >= 0) & (local < width)
    return local.clamp(0, width - 1)[:, None], inside


def _wanted_entries(attention_mask: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """[B, T-1] bool: entries whose predicted token is real and, when `positions` is given, wanted."""
    real = attention_mask[:, 1:].bool()
    if positions is None:
        return real
    if positions.shape != real.shape:
        raise ValueError(
            f"positions must be a [B, T-1] mask like the log-probs, {list(real.shape)} here, "
            f"got {list(positions.shape)}"
        )
    return real & positions.to(real.device).bool()


def forward_inputs(
    model: nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor
) -> dict:
    """The root forward's arguments: no KV cache, and every position's hidden state reaching the head. No attention
    mask (None): the position ids alone say where sequences start (packed rows).

    The arguments are those the model under any wrapper takes (peft's and torch.compile's forwards take **kwargs and
    pass them on): a model that builds a KV cache would read packed rows as one sequence."""
    inputs = dict(input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids)
    accepted = inspect.signature(underlying_model(model).forward).parameters
    if "use_cache" in accepted:
        inputs["use_cache"] = False
    if "logits_to_keep" in accepted:
        inputs["logits_to_keep"] = 0  # keep all
    return inputs


def _chunked_path(
    model: nn.Module,
    inputs: dict,
    wanted: torch.Tensor,
    targets: torch.Tensor,
    vocab_chunk: int,
    distribution: SampledDistribution | None = None,
    unfiltered: bool = False,
) -> torch.Tensor:
    """The wanted entries' log-probs [N] ([2, N] unfiltered, under a filtered distribution) from the root forward, its
    output embedding scoring only the targets."""
    head = model.get_output_embeddings()
    rows, width = wanted.shape[0], wanted.shape[1] + 1

    def score_targets(hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [N]
        if hidden.shape[:2] != (rows, width):
            raise RuntimeError(
                f"{type(model).__name__} called its output embedding on hidden states of shape {list(hidden.shape)}, "
                f"not [B, T, H] for tokens [{rows}, {width}]; its log-probs cannot be chunked"
            )
        picked = hidden[:, :-1][wanted]  # [N, H]
        if distribution is not None and distribution.filtered:
            return filtered_head_logprobs(picked, head.weight, targets, distribution, unfiltered)
        scaled = picked if distribution is None else distribution.scaled(picked)  # h / T: logits / T
        return linear_head_logprobs(scaled, head.weight, targets, vocab_chunk)

    with _forward_replaced(head, score_targets):
        picked = model(**inputs).logits  # what score_targets returned, passed through the root's hooks
    if picked.shape != ((2,) if unfiltered else ()) + tuple(targets.shape):
        raise RuntimeError(
            f"{type(model).__name__} reshaped its output embedding's output to {list(picked.shape)}; "
            "its log-probs cannot be chunked"
        )
    return picked.float()


def _full_path(
    model: nn.Module,
    inputs: dict,
    wanted: torch.Tensor,
    targets: torch.Tensor,
    distribution: SampledDistribution | None = None,
    unfiltered: bool = False,
) -> torch.Tensor:
    """The wanted entries' log-probs [N] ([2, N] unfiltered) from the model's full logits [B, T, V], normalised at
    those entries only."""
    logits = model(**inputs).logits[:, :-1][wanted].float()  # [N, V]
    if distribution is not None:
        return distribution.logprobs(logits, targets, unfiltered)
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


def filtered_head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    distribution: SampledDistribution,
    unfiltered: bool = False,
) -> torch.Tensor:
    """log p(target) under a filtered distribution from hidden states [N, H] and the head's weight [V, H]: the logits
    of FILTER_CHUNK positions at a time (fp32, the matmul in hidden's or autocast's dtype), each chunk recomputed in
    backward rather than saved, so the memory stays O(FILTER_CHUNK * V). unfiltered: [2, N], those and the log-probs
    under the temperature alone, from the same chunks of logits."""
    device_type = hidden.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype

    def score(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, enabled=False):
            return distribution.logprobs((h.to(dtype) @ w.to(dtype).T).float(), t, unfiltered)

    parts = [
        checkpoint(score, hidden[start : start + FILTER_CHUNK], weight, targets[start : start + FILTER_CHUNK],
                   use_reentrant=False)
        for start in range(0, len(targets), FILTER_CHUNK)
    ]  # fmt: skip
    if not parts:
        return hidden.new_zeros(*((2,) if unfiltered else ()), 0, dtype=torch.float32)
    return torch.cat(parts, dim=-1)


@contextmanager
def _forward_replaced(module: nn.Module, forward: Callable) -> Iterator[None]:
    """`module.forward` is `forward` inside the block; an instance-level forward set before comes back after it."""
    own = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def _warn_once(model: nn.Module, reason: str) -> None:
    key = (type(model).__name__, reason)
    if key not in _warned:
        _warned.add(key)
        log.warning("token log-probs of %s use its full [B, T, V] logits: %s", key[0], reason)
