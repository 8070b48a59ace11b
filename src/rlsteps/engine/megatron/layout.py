"""Where each weight of a Hugging Face causal LM lives in a Megatron-Core GPT checkpoint, and back.

The names are the ones Megatron-Core's GPTModel writes into a distributed checkpoint and that
Megatron-Bridge maps for Llama- and Qwen2-family models:

    model.embed_tokens.weight                    embedding.word_embeddings.weight
    model.layers.{i}.input_layernorm.weight      decoder.layers.self_attention.linear_qkv.layer_norm_weight
    model.layers.{i}.self_attn.{q,k,v}_proj.*    decoder.layers.self_attention.linear_qkv.{weight,bias}
    model.layers.{i}.self_attn.o_proj.weight     decoder.layers.self_attention.linear_proj.weight
    model.layers.{i}.post_attention_layernorm.*  decoder.layers.mlp.linear_fc1.layer_norm_weight
    model.layers.{i}.mlp.{gate,up}_proj.weight   decoder.layers.mlp.linear_fc1.weight
    model.layers.{i}.mlp.down_proj.weight        decoder.layers.mlp.linear_fc2.weight
    model.norm.weight                            decoder.final_layernorm.weight
    lm_head.weight                               output_layer.weight (absent when tied)

Layer tensors are stacked: checkpoint key `decoder.layers.X` holds all layers, layer i at index i of
a leading axis (GPTModel's sharded_state_dict prepends that axis so pipeline stages can reshard).

Fused QKV follows Megatron's grouped layout: for each of the G query groups, that group's H/G query
heads, then its key head, then its value head, each head_dim rows. Fused fc1 is gate then up.

Torch only: nothing here imports megatron-core. Which architectures fit, and their shapes:
rlsteps.contract.model_families.
"""

from __future__ import annotations

import torch

from rlsteps.contract.model_families import GPTShape, LayoutError

LAYER_PREFIX = "decoder.layers."
# Extra-state objects GPTModel writes per linear layer (Transformer Engine's fp8 metadata; None here).
EXTRA_STATE_KEYS = (
    "decoder.layers.self_attention.linear_qkv._extra_state",
    "decoder.layers.self_attention.linear_proj._extra_state",
    "decoder.layers.self_attention.core_attention._extra_state",
    "decoder.layers.mlp.linear_fc1._extra_state",
    "decoder.layers.mlp.linear_fc2._extra_state",
)


# ---------------------------------------------------------------------------------------------
# Hugging Face -> Megatron


def to_megatron(shape: GPTShape, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron checkpoint key -> tensor (layer tensors stacked on a leading axis) from an HF state dict.

    Every HF tensor must be used: one the layout has no place for raises LayoutError naming it.
    """
    unused = set(hf_state)
    if shape.tied_embeddings:
        unused.discard("lm_head.weight")  # the same tensor as the embeddings

    def take(name: str) -> torch.Tensor:
        if name not in hf_state:
            raise LayoutError(f"the {shape.architecture} model has no tensor {name}")
        unused.discard(name)
        return hf_state[name]

    out = {
        "embedding.word_embeddings.weight": take("model.embed_tokens.weight"),
        "decoder.final_layernorm.weight": take("model.norm.weight"),
    }
    if not shape.tied_embeddings:
        out["output_layer.weight"] = take("lm_head.weight")
    per_layer: dict[str, list[torch.Tensor]] = {}
    for i in range(shape.num_layers):
        for key, tensor in _layer_to_megatron(shape, lambda n, i=i: take(f"model.layers.{i}.{n}")).items():
            per_layer.setdefault(key, []).append(tensor)
    out.update({key: torch.stack(tensors) for key, tensors in per_layer.items()})
    if unused:
        raise LayoutError(
            f"the {shape.architecture} model has tensors the Megatron GPT layout has no place for: "
            f"{', '.join(sorted(unused))}"
        )
    return out


def _layer_to_megatron(shape: GPTShape, take) -> dict[str, torch.Tensor]:
    attn = "self_attention."
    layer = {
        f"{LAYER_PREFIX}{attn}linear_qkv.layer_norm_weight": take("input_layernorm.weight"),
        f"{LAYER_PREFIX}{attn}linear_qkv.weight": fuse_qkv(
            shape, take("self_attn.q_proj.weight"), take("self_attn.k_proj.weight"), take("self_attn.v_proj.weight")
        ),
        f"{LAYER_PREFIX}{attn}linear_proj.weight": take("self_attn.o_proj.weight"),
        f"{LAYER_PREFIX}mlp.linear_fc1.layer_norm_weight": take("post_attention_layernorm.weight"),
        f"{LAYER_PREFIX}mlp.linear_fc1.weight": torch.cat([take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")]),
        f"{LAYER_PREFIX}mlp.linear_fc2.weight": take("mlp.down_proj.weight"),
    }
    if shape.qkv_bias:
        layer[f"{LAYER_PREFIX}{attn}linear_qkv.bias"] = fuse_qkv(
            shape, take("self_attn.q_proj.bias"), take("self_attn.k_proj.bias"), take("self_attn.v_proj.bias")
        )
    return layer


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


# ---------------------------------------------------------------------------------------------
# Megatron -> Hugging Face


def expected_shapes(shape: GPTShape) -> dict[str, tuple[int, ...]]:
    """Megatron checkpoint key -> global shape, for every tensor a model of this shape reads."""
    n, h, f, v = shape.num_layers, shape.hidden_size, shape.ffn_hidden_size, shape.vocab_size
    layer = LAYER_PREFIX
    shapes = {
        "embedding.word_embeddings.weight": (v, h),
        "decoder.final_layernorm.weight": (h,),
        f"{layer}self_attention.linear_qkv.layer_norm_weight": (n, h),
        f"{layer}self_attention.linear_qkv.weight": (n, shape.qkv_rows, h),
        f"{layer}self_attention.linear_proj.weight": (n, h, shape.num_attention_heads * shape.kv_channels),
        f"{layer}mlp.linear_fc1.layer_norm_weight": (n, h),
        f"{layer}mlp.linear_fc1.weight": (n, 2 * f, h),
        f"{layer}mlp.linear_fc2.weight": (n, h, f),
    }
    if not shape.tied_embeddings:
        shapes["output_layer.weight"] = (v, h)
    if shape.qkv_bias:
        shapes[f"{layer}self_attention.linear_qkv.bias"] = (n, shape.qkv_rows)
    return shapes


def to_hf(shape: GPTShape, megatron: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF state dict from Megatron checkpoint tensors (as to_megatron writes them)."""
    out = {
        "model.embed_tokens.weight": megatron["embedding.word_embeddings.weight"],
        "model.norm.weight": megatron["decoder.final_layernorm.weight"],
    }
    if not shape.tied_embeddings:
        out["lm_head.weight"] = megatron["output_layer.weight"]
    attn, mlp = f"{LAYER_PREFIX}self_attention.", f"{LAYER_PREFIX}mlp."
    for i in range(shape.num_layers):
        hf = f"model.layers.{i}."
        q, k, v = split_qkv(shape, megatron[f"{attn}linear_qkv.weight"][i])
        gate, up = megatron[f"{mlp}linear_fc1.weight"][i].chunk(2)
        out.update({
            f"{hf}input_layernorm.weight": megatron[f"{attn}linear_qkv.layer_norm_weight"][i],
            f"{hf}self_attn.q_proj.weight": q,
            f"{hf}self_attn.k_proj.weight": k,
            f"{hf}self_attn.v_proj.weight": v,
            f"{hf}self_attn.o_proj.weight": megatron[f"{attn}linear_proj.weight"][i],
            f"{hf}post_attention_layernorm.weight": megatron[f"{mlp}linear_fc1.layer_norm_weight"][i],
            f"{hf}mlp.gate_proj.weight": gate,
            f"{hf}mlp.up_proj.weight": up,
            f"{hf}mlp.down_proj.weight": megatron[f"{mlp}linear_fc2.weight"][i],
        })  # fmt: skip
        if shape.qkv_bias:
            qb, kb, vb = split_qkv(shape, megatron[f"{attn}linear_qkv.bias"][i])
            out.update(
                {f"{hf}self_attn.q_proj.bias": qb, f"{hf}self_attn.k_proj.bias": kb, f"{hf}self_attn.v_proj.bias": vb}
            )
    return {name: t.contiguous() for name, t in out.items()}
