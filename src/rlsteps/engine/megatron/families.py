"""Each family's layer tensors: which Hugging Face tensors of a layer one Megatron layer tensor holds, and how.

A family's layer is the attention block (every family), its extra attention tensors (q/k norms: Qwen3, Qwen3-MoE,
Gemma 3), and one MLP: dense (gate and up fused), Gemma 3's dense MLP with its norms after attention and after the
MLP, or Qwen3-MoE's router and experts. Megatron names are under `decoder.layers.`, Hugging Face names under
`model.layers.{i}.`; shapes are one layer's (H hidden, F ffn, d head_dim, E experts, I expert ffn):

    attention   self_attention.linear_qkv.layer_norm_weight   input_layernorm.weight                 [H]
                self_attention.linear_qkv.weight              self_attn.{q,k,v}_proj.weight          [(heads + 2G) d, H]
                self_attention.linear_qkv.bias (Qwen2)        self_attn.{q,k,v}_proj.bias            [(heads + 2G) d]
                self_attention.linear_proj.weight             self_attn.o_proj.weight                [H, heads d]
    q/k norms   self_attention.q_layernorm.weight             self_attn.q_norm.weight                [d]
                self_attention.k_layernorm.weight             self_attn.k_norm.weight                [d]
    dense MLP   mlp.linear_fc1.layer_norm_weight              post_attention_layernorm.weight        [H]
                mlp.linear_fc1.weight                         mlp.{gate,up}_proj.weight              [2F, H]
                mlp.linear_fc2.weight                         mlp.down_proj.weight                   [H, F]
    Gemma 3     self_attention.linear_proj.post_layernorm.weight  post_attention_layernorm.weight    [H]
                mlp.linear_fc1.layer_norm_weight              pre_feedforward_layernorm.weight       [H]
                mlp.linear_fc2.post_layernorm.weight          post_feedforward_layernorm.weight      [H]
    MoE         pre_mlp_layernorm.weight                      post_attention_layernorm.weight        [H]
                mlp.router.weight                             mlp.gate.weight                        [E, H]
                mlp.experts.experts.linear_fc1.weight         mlp.experts.gate_up_proj               [E, 2I, H]
                mlp.experts.experts.linear_fc2.weight         mlp.experts.down_proj                  [E, H, I]

Gemma 3's norm weights are zero-centred (its RMSNorm multiplies by 1 + w): Megatron-Bridge's Gemma 3 provider sets
layernorm_zero_centered_gamma, so they are stored as they are. Experts are stored as GPTModel's sharded state dict
lays out both its grouped (TEGroupedMLP) and its sequential experts: one tensor per layer with the experts on a
second axis, each expert's fc1 its gate rows then its up rows (transformers' fused gate_up_proj is the same).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlsteps.contract.model_families import GPTShape

ATTN, MLP, EXPERTS = "self_attention.", "mlp.", "mlp.experts.experts."


def _alone(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (tensor,)


@dataclass(frozen=True)
class LayerTensor:
    """One Megatron tensor of a layer and the Hugging Face tensors of that layer it holds."""

    megatron: str  # under decoder.layers.
    hf: tuple[str, ...]  # under model.layers.{i}.
    shape: tuple[int, ...]  # one layer's
    fuse: Callable[..., torch.Tensor] = field(default=lambda tensor: tensor)  # the HF tensors -> this one
    split: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] = field(default=_alone)  # the inverse


def layer_tensors(shape: GPTShape) -> list[LayerTensor]:
    """Every tensor of one layer of a model of this shape."""
    tensors = attention(shape)
    if shape.qk_layernorm:
        tensors += qk_norms(shape)
    if shape.moe:
        return tensors + moe_mlp(shape)
    return tensors + (gemma3_mlp(shape) if shape.post_norms else dense_mlp(shape))


def extra_state_keys(shape: GPTShape) -> dict[str, tuple[int, ...]]:
    """The extra-state objects (Transformer Engine's fp8 metadata; None here) GPTModel writes, and their global
    shapes: one per layer, and per expert in an MoE layer."""
    n = shape.num_layers
    keys = {f"{ATTN}{name}._extra_state": (n,) for name in ("linear_qkv", "linear_proj", "core_attention")}
    if shape.moe:
        keys |= {f"{EXPERTS}{name}._extra_state": (n, shape.num_experts) for name in ("linear_fc1", "linear_fc2")}
    else:
        keys |= {f"{MLP}{name}._extra_state": (n,) for name in ("linear_fc1", "linear_fc2")}
    return keys


def attention(shape: GPTShape) -> list[LayerTensor]:
    h, rows = shape.hidden_size, shape.qkv_rows
    tensors = [
        LayerTensor(f"{ATTN}linear_qkv.layer_norm_weight", ("input_layernorm.weight",), (h,)),
        LayerTensor(
            f"{ATTN}linear_qkv.weight",
            tuple(f"self_attn.{p}_proj.weight" for p in "qkv"),
            (rows, h),
            lambda q, k, v: fuse_qkv(shape, q, k, v),
            lambda qkv: split_qkv(shape, qkv),
        ),  # fmt: skip
        LayerTensor(
            f"{ATTN}linear_proj.weight",
            ("self_attn.o_proj.weight",),
            (h, shape.num_attention_heads * shape.kv_channels),
        ),
    ]
    if shape.qkv_bias:
        tensors.append(
            LayerTensor(
                f"{ATTN}linear_qkv.bias",
                tuple(f"self_attn.{p}_proj.bias" for p in "qkv"),
                (rows,),
                lambda q, k, v: fuse_qkv(shape, q, k, v),
                lambda qkv: split_qkv(shape, qkv),
            )  # fmt: skip
        )
    return tensors


def qk_norms(shape: GPTShape) -> list[LayerTensor]:
    """RMSNorm over each head's query and key, one weight shared by all heads."""
    d = shape.kv_channels
    return [
        LayerTensor(f"{ATTN}q_layernorm.weight", ("self_attn.q_norm.weight",), (d,)),
        LayerTensor(f"{ATTN}k_layernorm.weight", ("self_attn.k_norm.weight",), (d,)),
    ]


def _gated_fc1(shape: GPTShape) -> LayerTensor:
    f, h = shape.ffn_hidden_size, shape.hidden_size
    return LayerTensor(
        f"{MLP}linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), (2 * f, h),
        lambda gate, up: torch.cat([gate, up]), lambda fc1: tuple(fc1.chunk(2)),
    )  # fmt: skip


def dense_mlp(shape: GPTShape) -> list[LayerTensor]:
    h, f = shape.hidden_size, shape.ffn_hidden_size
    return [
        LayerTensor(f"{MLP}linear_fc1.layer_norm_weight", ("post_attention_layernorm.weight",), (h,)),
        _gated_fc1(shape),
        LayerTensor(f"{MLP}linear_fc2.weight", ("mlp.down_proj.weight",), (h, f)),
    ]


def gemma3_mlp(shape: GPTShape) -> list[LayerTensor]:
    """Gemma 3: a norm before the MLP (fused into fc1 as for the others) and norms after attention and after the
    MLP, which Megatron-Bridge's Gemma 3 layer spec keeps inside linear_proj and linear_fc2 (post_layernorm)."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    return [
        LayerTensor(f"{ATTN}linear_proj.post_layernorm.weight", ("post_attention_layernorm.weight",), (h,)),
        LayerTensor(f"{MLP}linear_fc1.layer_norm_weight", ("pre_feedforward_layernorm.weight",), (h,)),
        _gated_fc1(shape),
        LayerTensor(f"{MLP}linear_fc2.weight", ("mlp.down_proj.weight",), (h, f)),
        LayerTensor(f"{MLP}linear_fc2.post_layernorm.weight", ("post_feedforward_layernorm.weight",), (h,)),
    ]


def moe_mlp(shape: GPTShape) -> list[LayerTensor]:
    """Qwen3-MoE: its norm before the MLP stands alone (pre_mlp_layernorm, as in Megatron's MoE layer spec), the
    router, and the experts stacked on their own axis."""
    h, e, i = shape.hidden_size, shape.num_experts, shape.moe_ffn_hidden_size
    return [
        LayerTensor("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), (h,)),
        LayerTensor(f"{MLP}router.weight", ("mlp.gate.weight",), (e, h)),
        LayerTensor(f"{EXPERTS}linear_fc1.weight", ("mlp.experts.gate_up_proj",), (e, 2 * i, h)),
        LayerTensor(f"{EXPERTS}linear_fc2.weight", ("mlp.experts.down_proj",), (e, h, i)),
    ]


def fuse_qkv(shape: GPTShape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[q; k; v] in Megatron's per-group order: weights [(H + 2G) * d, hidden], biases [(H + 2G) * d]."""
    g, d = shape.num_query_groups, shape.kv_channels
    rest = q.shape[1:]
    grouped = torch.cat(
        [q.reshape(g, shape.heads_per_group * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1
    )
    return grouped.reshape(shape.qkv_rows, *rest)


def split_qkv(shape: GPTShape, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of fuse_qkv."""
    g, d = shape.num_query_groups, shape.kv_channels
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (shape.heads_per_group + 2) * d, *rest)
    q, k, v = grouped.split([shape.heads_per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)
