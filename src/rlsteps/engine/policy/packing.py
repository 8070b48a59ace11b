"""Sequence packing: several rollouts end to end in one row of a forward pass, each attending only to itself.

A micro-batch's rows (prompt + response, of different lengths) are laid into bins of at most `capacity` tokens (first
fit, longest first), so a pass runs on fewer rows with little padding, instead of one row per rollout padded to the
longest. Each sequence's position ids start at 0 in its bin and the model gets no 2D attention mask: Hugging Face
causal LMs read restarting position ids as packed sequences and keep attention within each (a block-diagonal causal
mask under sdpa, eager and flex attention; variable-length kernels under flash attention). The padding after a bin's
last sequence is a sequence of its own. The log-probs come back in the RolloutBatch layout [B, T-1], so the losses
never see the packing (rlsteps.engine.policy.logprobs.packed_token_logprobs).

A model whose forward does not read packed sequences (custom code that builds its own mask) would attend across
them: each model is probed once (logprobs.reads_packed_sequences), and one that does is passed padded rows, with a
warning that names the model's family and, where its structure tells, why. Of the families users bring (tests/
test_family_runs.py), Llama 3, Mistral, Qwen2.5, Qwen3, Qwen3-MoE and Gemma 3 (its sliding-window layers too) pack;
Nemotron-H does not: its Mamba layers carry their state across the sequences of a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rlsteps.engine.batch import RolloutBatch, first_fit_bins
from rlsteps.engine.policy.model import underlying_model


@dataclass(frozen=True)
class PackedRows:
    tokens: torch.Tensor  # [P, L] long: the bins' sequences end to end, then padding
    position_ids: torch.Tensor  # [P, L] long: 0, 1, ... from each sequence's start (and the padding's)
    wanted: torch.Tensor  # [P, L-1] bool: entries to score (never one that predicts the next sequence's first token)
    source: torch.Tensor  # [N] long: each wanted entry's flat index in the [B, T-1] layout, in packed order
    filled: int  # tokens that belong to a sequence

    @property
    def padding(self) -> int:
        """Tokens of the packed rows that belong to no sequence."""
        return self.tokens.numel() - self.filled


def pack(
    tokens: torch.Tensor, lengths: Sequence[int], wanted: torch.Tensor, bins: list[list[int]], pad_id: int
) -> PackedRows:
    """tokens [B, T] right-padded, lengths [B], wanted [B, T-1] bool, bins of row indexes -> PackedRows."""
    width = tokens.shape[1] - 1  # of the [B, T-1] layout
    longest = max(sum(lengths[row] for row in rows) for rows in bins)
    packed = torch.full((len(bins), longest), pad_id, dtype=tokens.dtype, device=tokens.device)
    positions = torch.zeros_like(packed)
    packed_wanted = torch.zeros(len(bins), longest - 1, dtype=torch.bool, device=tokens.device)
    source = torch.zeros(len(bins), longest - 1, dtype=torch.long, device=tokens.device)
    steps = torch.arange(longest, device=tokens.device)
    for b, rows in enumerate(bins):
        start = 0
        for row in rows:
            n = lengths[row]
            packed[b, start : start + n] = tokens[row, :n]
            positions[b, start : start + n] = steps[:n]
            packed_wanted[b, start : start + n - 1] = wanted[row, : n - 1]
            source[b, start : start + n - 1] = row * width + steps[: n - 1]
            start += n
        positions[b, start:] = steps[: longest - start]  # the padding: a sequence of its own
    return PackedRows(packed, positions, packed_wanted, source[packed_wanted], sum(lengths))


def pack_batch(batch: RolloutBatch, capacity: int) -> PackedRows:
    """The batch's rows packed into bins of `capacity` tokens (first-fit decreasing); the response entries wanted."""
    lengths = batch.sequence_lengths.tolist()
    wanted = batch.response_mask().bool() & batch.attention_mask()[:, 1:].bool()
    return pack(batch.tokens, lengths, wanted, first_fit_bins(lengths, capacity), batch.pad_id)


def probed_name(model: nn.Module) -> str:
    """The probed model as a warning names it: its class and model type, compiled or not, under adapters or not."""
    inner = underlying_model(model)
    model_type = getattr(getattr(inner, "config", None), "model_type", None)
    name = type(inner).__name__ + (f" ({model_type})" if model_type else "")
    if inner is not model and hasattr(model, "get_base_model"):
        name += " with LoRA adapters"
    return name + (" compiled (train.compile)" if hasattr(model, "_orig_mod") else "")


def attends_across_reason(model: nn.Module) -> str:
    """Why a model's forward reads packed sequences as one, as far as its structure tells."""
    inner = underlying_model(model)
    if any("A_log" in module._parameters for module in inner.modules()):  # Mamba, Mamba2, Nemotron-H, Jamba...
        return (
            "its Mamba layers carry their state from one packed sequence into the next (transformers passes them "
            "no sequence boundaries, only attention reads restarting position ids)"
        )
    if hasattr(model, "_orig_mod"):
        return "its forward attends across packed sequences once torch compiles it"
    return (
        "its forward attends across packed sequences (it does not read restarting position ids without an attention "
        "mask as Hugging Face's own models do)"
    )
