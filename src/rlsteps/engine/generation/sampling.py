"""Choosing the next token: pure functions on a [B, V] block of next-token logits (temperature, top-k, top-p, the
inverse-CDF draw at a given uniform number), shared by the built-in sampler and the tests that compare it with
vLLM's."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rlsteps.engine.generation.backend import SamplingParams

# The longest scan over a row taken in one piece. Inductor compiles a longer one on CUDA as a split scan across
# blocks, which fails to generate code for a [B, V] cumulative sum in torch 2.11 (a vocabulary of 32768 at 64 rows);
# scans of at most 8192 elements are never split, so a row is scanned in blocks of this many, then the block totals.
SCAN_BLOCK = 4096


def row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """x.cumsum(-1) of a [B, V] block, as scans of at most SCAN_BLOCK elements: each block's own cumulative sum plus
    the total of the blocks before it (the same sums, added in another order)."""
    rows, length = x.shape
    if length <= SCAN_BLOCK:
        return x.cumsum(-1)
    blocks = -(-length // SCAN_BLOCK)
    within = F.pad(x, (0, blocks * SCAN_BLOCK - length)).view(rows, blocks, SCAN_BLOCK).cumsum(-1)
    totals = within[..., -1]  # [B, blocks]
    before = totals.cumsum(-1) - totals
    return (within + before[..., None]).view(rows, -1)[:, :length]


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
    mass_before = row_cumsum(probs) - probs  # [B, V]: mass of the strictly more likely tokens
    drop_sorted = mass_before >= p  # the most likely token always stays (mass_before = 0 < p)
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def sample_next_token(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor) -> torch.Tensor:
    """[B, V] fp32 logits, [B] uniforms in (0, 1) -> [B] token ids.

    Greedy (argmax, the uniforms unused) at temperature 0; else temperature, top-k, top-p, then
    the inverse-CDF sample of each row's filtered distribution at its own uniform number. Top-k
    sorts the k largest logits only (top_k_weights), not the vocabulary; a filter that is off costs nothing.
    """
    if params.temperature == 0:
        return logits.argmax(-1)
    weights, most_likely = sampling_weights(logits, params)
    return token_from_uniform(weights, uniforms, most_likely)


def sampling_weights(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The unnormalised probabilities [B, V] a row is drawn from (temperature, then top-k, then top-p; 0 where
    filtered), and each row's most likely token [B] where top-k knows it without an argmax (else None)."""
    scaled = logits if params.temperature == 1 else logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        return top_k_weights(scaled, params.top_k, params.top_p)
    return top_p_filter(scaled, params.top_p).softmax(-1), None


def top_k_weights(logits: torch.Tensor, k: int, p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The unnormalised probabilities [B, V] of top-k then top-p sampling, and each row's most likely token [B].

    The distribution of top_p_filter(top_k_filter(logits, k), p), without sorting the vocabulary: only the k
    largest logits are sorted (topk). Tokens tied with the k-th are kept, as top_k_filter keeps them; where
    top-p keeps only some of the tokens that share a logit (the same probability), it keeps those of lowest id.
    """
    top, top_ids = logits.topk(k)  # [B, k], descending
    keep = logits >= top[:, -1:]
    if p < 1.0:
        cut, quota = _nucleus_cut(top, keep.sum(-1, keepdim=True) - k, p)
        tied = logits == cut
        keep = (logits > cut) | (tied & (row_cumsum(tied.int()) <= quota))
    return (logits - top[:, :1]).exp() * keep, top_ids[:, 0]


def _nucleus_cut(top: torch.Tensor, tied_beyond: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p within the top-k: the smallest logit kept [B, 1], and how many tokens of that logit are kept [B, 1].

    top: the k largest logits [B, k], descending; tied_beyond [B, 1]: the tokens outside them tied with the k-th,
    which follow it in descending order. As in top_p_filter, a token is kept while the probability of the tokens
    before it in that order stays below p: a prefix of `top`, then maybe some of the tied tokens beyond it.
    """
    weights = (top - top[:, :1]).exp()  # [B, k]: unnormalised probabilities, the first 1
    kth = weights[:, -1:]
    top_mass = weights.sum(-1, keepdim=True)
    budget = p * (top_mass + tied_beyond * kth)  # p times the mass of every token that top-k keeps
    kept_top = ((weights.cumsum(-1) - weights) < budget).sum(-1, keepdim=True)  # [B, 1], at least 1
    tied_kept = ((budget - top_mass) / kth).ceil().clamp(min=0).minimum(tied_beyond)  # none where kth is 0 (-inf)
    kept = kept_top + torch.where(kept_top == top.shape[-1], tied_kept, 0).long()
    cut = top.gather(-1, kept_top - 1)
    return cut, kept - (top > cut).sum(-1, keepdim=True)


def token_from_uniform(
    probs: torch.Tensor, uniforms: torch.Tensor, most_likely: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse-CDF sampling: [B, V] probabilities and [B] uniforms u in (0, 1) -> [B] token ids.

    A row's token is the first index whose cumulative probability (fp64) exceeds u * total, so
    token i is drawn for u in [c(i-1), c(i)) / total: exactly its probability, and never a token of
    probability 0 (filtered). The rows never mix. A cumulative sum done as a parallel scan (on a
    GPU) is not exactly sequential, so a u within rounding distance of a boundary could still land
    on a zero-probability token or past the end; such a row takes its most likely token instead
    (`most_likely` [B] where the caller knows it, else the argmax of `probs`).
    """
    cumulative = row_cumsum(probs.double())  # [B, V]
    threshold = uniforms.to(cumulative)[:, None] * cumulative[:, -1:]  # [B, 1]
    # the count of cumulative sums <= the threshold, which is searchsorted(right=True) on a sorted row: Inductor in
    # torch 2.11 cannot lower searchsorted over a computed [B, V] (a View without strides); a count it can
    token = (cumulative <= threshold).sum(-1).clamp_(max=probs.shape[-1] - 1)
    drawn_zero = probs.gather(-1, token[:, None]).squeeze(-1) == 0  # [B]
    return torch.where(drawn_zero, probs.argmax(-1) if most_likely is None else most_likely, token)


def choose_token(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[B, V] fp32 logits -> the sampled tokens [B] and their log-probs [B] under the distribution they were drawn
    from (temperature, top-k and top-p applied, renormalised: vLLM's processed_logprobs, what training scores them
    under, rlsteps.engine.policy.sampled_distribution); greedy tokens under the raw distribution."""
    if params.temperature == 0:
        token = logits.argmax(-1)
        # log_softmax then gather: on a CPU one fused pass, cheaper than logsumexp's several
        return token, logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
    weights, most_likely = sampling_weights(logits, params)
    token = token_from_uniform(weights, uniforms, most_likely)
    return token, weights.gather(-1, token[:, None]).squeeze(-1).log() - weights.sum(-1).log()
