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

Torch only: nothing here imports megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Architectures with the Llama block layout; Qwen2 adds a QKV bias.
SUPPORTED = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}

LAYER_PREFIX = "decoder.layers."
# Extra-state objects GPTModel writes per linear layer (Transformer Engine's fp8 metadata; None here).
EXTRA_STATE_KEYS = (
    "decoder.layers.self_attention.linear_qkv._extra_state",
    "decoder.layers.self_attention.linear_proj._extra_state",
    "decoder.layers.self_attention.core_attention._extra_state",
    "decoder.layers.mlp.linear_fc1._extra_state",
    "decoder.layers.mlp.linear_fc2._extra_state",
)


class LayoutError(ValueError):
    """A model or checkpoint that does not fit the supported Megatron GPT layout; the message names the tensor."""


@dataclass(frozen=True)
class GPTShape:
    """What fixes every tensor shape of a Llama-family GPT model."""

    architecture: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    qkv_bias: bool
    tied_embeddings: bool

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def qkv_rows(self) -> int:
        return (self.num_attention_heads + 2 * self.num_query_groups) * self.kv_channels


def gpt_shape(hf_config: dict[str, Any]) -> GPTShape:
    """The GPT shape of a Hugging Face config (a config.json dict), or a LayoutError saying why it is not supported."""
    archs = hf_config.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED), None)
    if arch is None:
        raise LayoutError(
            f"architecture {', '.join(archs) or '(none in config.json)'} is not supported for Megatron checkpoints; "
            f"supported: {', '.join(sorted(SUPPORTED))}"
        )
    _refuse_unsupported_options(arch, hf_config)
    heads = int(hf_config["num_attention_heads"])
    groups = int(hf_config.get("num_key_value_heads") or heads)
    if heads % groups:
        raise LayoutError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}")
    hidden = int(hf_config["hidden_size"])
    return GPTShape(
        architecture=arch,
        num_layers=int(hf_config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(hf_config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=int(hf_config.get("head_dim") or hidden // heads),
        vocab_size=int(hf_config["vocab_size"]),
        qkv_bias=SUPPORTED[arch] == "qwen2",
        tied_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
    )


# Llama 3.1's RoPE scaling: megatron-core's GPTModel takes only the factor and fixes these.
LLAMA3_ROPE_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _refuse_unsupported_options(arch: str, hf_config: dict[str, Any]) -> None:
    """Options a Megatron GPTModel would run differently: refused, so no checkpoint claims a model it is not."""
    if hf_config.get("attention_bias") or hf_config.get("mlp_bias"):
        raise LayoutError(
            f"{arch} with attention_bias or mlp_bias has bias tensors the Megatron GPT layout has no place for"
        )
    if hf_config.get("hidden_act", "silu") != "silu":
        raise LayoutError(
            f"{arch} with hidden_act={hf_config['hidden_act']!r}: only the SwiGLU (silu) MLP is supported"
        )
    window = hf_config.get("sliding_window")
    uses_window = hf_config.get("use_sliding_window", True) and window is not None
    if uses_window and window < hf_config.get("max_position_embeddings", 0):
        raise LayoutError(
            f"{arch} with sliding_window={window}: sliding-window attention is not carried into the "
            "Megatron GPT config (set sliding_window to null if the model does not need it)"
        )
    rope = rope_scaling(hf_config)
    if rope["rope_type"] not in ("default", "llama3"):
        raise LayoutError(
            f"{arch} with rope_type={rope['rope_type']!r}: only default RoPE and Llama 3.1 scaling are supported"
        )
    if rope["rope_type"] == "llama3" and any(float(rope.get(k, v)) != v for k, v in LLAMA3_ROPE_FIXED.items()):
        raise LayoutError(
            f"{arch} with Llama 3.1 RoPE scaling other than {LLAMA3_ROPE_FIXED}: megatron-core fixes those values"
        )


def rope_scaling(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The RoPE parameters of a config, in either transformers' rope_parameters or the older rope_scaling form."""
    params = dict(hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {})
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


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
