"""run_config.yaml's `model:` section, both ways: Megatron-Bridge's model provider for a Hugging Face config (the
fields each family's bridge sets, serialised as Bridge serialises them), and a Hugging Face config rebuilt from such a
section (ours, or one Bridge or Megatron-LM wrote) for a checkpoint without hf_config/.

    llama, qwen2, qwen3, qwen3_moe   megatron.bridge.models.gpt_provider.GPTModelProvider
    mistral                          megatron.bridge.models.mistral.mistral_provider.MistralModelProvider
    gemma3                           megatron.bridge.models.gemma.gemma3_provider.Gemma3ModelProvider

A field not written keeps the provider class's default, as in the file Bridge writes for an imported model.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlsteps.contract.model_families import (
    LLAMA3_ROPE_FIXED,
    GPTShape,
    LayoutError,
    gemma3_attention_pattern,
    gemma3_rope,
    rope_scaling,
)

BRIDGE_MODELS = "megatron.bridge.models"
PROVIDERS = {
    "mistral": f"{BRIDGE_MODELS}.mistral.mistral_provider.MistralModelProvider",
    "gemma3": f"{BRIDGE_MODELS}.gemma.gemma3_provider.Gemma3ModelProvider",
}
BRIDGE_GPT_PROVIDER = f"{BRIDGE_MODELS}.gpt_provider.GPTModelProvider"
# Kernel choices Megatron-Bridge's Llama bridge switches on (fused where Transformer Engine is there)
BRIDGE_FUSIONS = ("bias_activation_fusion", "masked_softmax_fusion", "persist_layer_norm", "bias_dropout_fusion",
                  "apply_rope_fusion")  # fmt: skip
ONE_RANK = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
            "virtual_pipeline_model_parallel_size": None, "context_parallel_size": 1, "expert_model_parallel_size": 1,
            "sequence_parallel": False}  # fmt: skip


def callable_entry(target: str) -> dict[str, Any]:
    """A function or dtype as Megatron-Bridge serialises one: instantiated to the object itself, not called."""
    return {"_target_": target, "_call_": False}


def megatron_model_config(shape: GPTShape, hf_config: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """The `model:` section: Megatron-Bridge's provider (a Megatron-Core TransformerConfig) with the fields its bridge
    for this family sets from this Hugging Face config, and the parallel sizes of a one-rank checkpoint."""
    dtype_name = str(dtype).removeprefix("torch.")
    model = {
        "_target_": PROVIDERS.get(shape.family, BRIDGE_GPT_PROVIDER),
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "ffn_hidden_size": shape.ffn_hidden_size,
        "num_attention_heads": shape.num_attention_heads,
        "num_query_groups": shape.num_query_groups,
        "kv_channels": shape.kv_channels if hf_config.get("head_dim") is not None else None,  # None: hidden / heads
        "vocab_size": shape.vocab_size,
        "make_vocab_size_divisible_by": vocab_divisor(shape.vocab_size),
        "seq_length": int(hf_config.get("max_position_embeddings", 4096)),
        "normalization": "RMSNorm",
        "layernorm_epsilon": float(hf_config.get("rms_norm_eps", 1e-6)),
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "add_qkv_bias": shape.qkv_bias,
        "position_embedding_type": "rope",
        "rotary_percent": 1.0,
        "share_embeddings_and_output_weights": shape.tied_embeddings,
        "init_method_std": float(hf_config.get("initializer_range", 0.02)),
        "hidden_dropout": 0.0,
        "attention_dropout": float(hf_config.get("attention_dropout", 0.0)),
        "params_dtype": callable_entry(f"torch.{dtype_name}"),
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        **_by_family(shape, hf_config, dtype_name),
        **ONE_RANK,
    }
    return model


def _by_family(shape: GPTShape, hf_config: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    """What each family's bridge sets beyond the common fields (its provider_bridge)."""
    if shape.family == "gemma3":
        return _gemma3_fields(hf_config, dtype_name)
    fields = {"activation_func": callable_entry("torch.nn.functional.silu"), **_rope_fields_of(hf_config)}
    if shape.family == "llama":  # LlamaBridge: fused kernels
        fields |= dict.fromkeys(BRIDGE_FUSIONS, True)
    if shape.family in ("qwen2", "qwen3", "qwen3_moe"):  # Qwen2Bridge, Qwen3Bridge, Qwen3MoEBridge
        fields["autocast_dtype"] = callable_entry("torch.bfloat16")
    if shape.qk_layernorm:
        fields["qk_layernorm"] = True
    if shape.moe:
        fields |= _moe_fields(shape, hf_config)
    return fields


def _rope_fields_of(hf_config: dict[str, Any]) -> dict[str, Any]:
    rope = rope_scaling(hf_config)
    llama3 = rope["rope_type"] == "llama3"
    return {
        "rotary_base": float(hf_config.get("rope_theta") or rope.get("rope_theta", 10000.0)),
        "rope_scaling": llama3,
        "rope_scaling_factor": float(rope["factor"]) if llama3 else 1.0,
    }


def _moe_fields(shape: GPTShape, hf_config: dict[str, Any]) -> dict[str, Any]:
    """Qwen3MoEBridge's experts: every layer, grouped GEMM, softmax routing (top-k renormalised unless the router
    takes the softmax over all experts first), Bridge's auxiliary-loss settings."""
    return {
        "num_moe_experts": shape.num_experts,
        "moe_ffn_hidden_size": shape.moe_ffn_hidden_size,
        "moe_router_topk": shape.moe_router_topk,
        "moe_router_pre_softmax": not hf_config.get("norm_topk_prob", True),
        "moe_grouped_gemm": True,
        "moe_router_load_balancing_type": "aux_loss",
        "moe_aux_loss_coeff": 1e-3,
        "moe_token_dispatcher_type": "alltoall",
        "moe_permute_fusion": True,
    }


def _gemma3_fields(hf_config: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    """Gemma3ModelBridge: (local, global) RoPE bases, the window of its sliding layers, the attention scale of
    query_pre_attn_scalar, linear RoPE scaling of its global layers; its provider's defaults (GELU-tanh, zero-centred
    norms, q/k norms, the Gemma 3 layer spec) stand, but for the layer pattern, which is the model's."""
    full, local = gemma3_rope(hf_config, "full_attention"), gemma3_rope(hf_config, "sliding_attention")
    return {
        "rotary_base": [float(local["rope_theta"]), float(full["rope_theta"])],
        "rope_scaling_factor": float(full.get("factor", 1.0)) if full["rope_type"] == "linear" else 1.0,
        "window_size": hf_config.get("sliding_window"),
        "interleaved_attn_pattern": list(gemma3_attention_pattern(hf_config)),
        "softmax_scale": 1.0 / math.sqrt(hf_config.get("query_pre_attn_scalar", 256)),
        "autocast_dtype": callable_entry(f"torch.{dtype_name}"),
    }


def vocab_divisor(vocab_size: int) -> int:
    """Megatron-Bridge's make_vocab_size_divisible_by: the largest power of two up to 128 that divides the vocab,
    so no padding is needed."""
    base = 128
    while vocab_size % base:
        base //= 2
    return base


# ---------------------------------------------------------------------------------------------
# Back: a Hugging Face config from a `model:` section


def target_name(value: Any) -> Any:
    """A `{_target_: name, _call_: false}` entry as its dotted name; anything else as it is."""
    if isinstance(value, dict) and "_target_" in value and value.get("_call_") is False:
        return value["_target_"]
    return value


def activation_name(value: Any) -> str:
    """silu for "silu", "torch.nn.functional.silu" or Bridge's {_target_: torch.nn.functional.silu, _call_: false}."""
    return str(target_name(value)).rpartition(".")[2]


def family_of(model: dict[str, Any]) -> str:
    """The family a `model:` section describes: by its provider class, then by what the GPT provider turns on."""
    target = str(model.get("_target_", ""))
    for family, provider in PROVIDERS.items():
        if target == provider or target.endswith(provider.rpartition(".")[2]):
            return family
    if model.get("num_moe_experts"):
        return "qwen3_moe"
    if model.get("qk_layernorm"):
        return "qwen3"
    if model.get("add_qkv_bias") or "qwen" in target.lower():
        return "qwen2"
    return "llama"


ARCHITECTURES = {  # family -> (architecture, model_type)
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}


def hf_config_from_megatron(model: dict[str, Any], source: str) -> dict[str, Any]:
    """A config.json dict of the family a Megatron GPT config describes (ours or a Megatron-Bridge provider's)."""
    model = {key: target_name(value) for key, value in model.items()}
    required = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")
    missing = [key for key in required if model.get(key) is None]
    if missing:
        raise ValueError(f"{source}: model.{missing[0]} is not set, so the model cannot be rebuilt")
    family = family_of(model)
    if model.get("normalization", "RMSNorm") != "RMSNorm" or not model.get("gated_linear_unit", True):
        raise LayoutError(f"{source}: only RMSNorm models with a gated MLP are supported")
    activation = activation_name(model.get("activation_func", "fast_gelu" if family == "gemma3" else "silu"))
    expected = "fast_gelu" if family == "gemma3" else "silu"
    if activation != expected:
        raise LayoutError(f"{source}: model.activation_func is {activation}; the {family} family runs {expected}")
    architecture, model_type = ARCHITECTURES[family]
    heads = int(model["num_attention_heads"])
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "num_hidden_layers": model["num_layers"],
        "hidden_size": model["hidden_size"],
        "intermediate_size": model["ffn_hidden_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": model.get("num_query_groups") or heads,
        "head_dim": model.get("kv_channels") or model["hidden_size"] // heads,
        "vocab_size": model["vocab_size"],
        "max_position_embeddings": model.get("seq_length", 4096),
        "rms_norm_eps": model.get("layernorm_epsilon", 1e-5),
        "tie_word_embeddings": bool(model.get("share_embeddings_and_output_weights", family == "gemma3")),
        "dtype": str(model.get("params_dtype") or "float32").removeprefix("torch."),
    }
    if family == "gemma3":
        return config | _gemma3_config(model)
    config |= {"hidden_act": "silu", "rope_theta": model.get("rotary_base", 10000.0), **_llama3_rope(model)}
    if family == "mistral":
        config["sliding_window"] = None
    if family == "qwen3_moe":
        config |= _moe_config(model)
    return config


def _llama3_rope(model: dict[str, Any]) -> dict[str, Any]:
    """Llama 3.1 RoPE scaling when the Megatron config turns it on (megatron-core fixes all but the factor)."""
    if not model.get("rope_scaling"):
        return {}
    rope = {"rope_type": "llama3", "factor": float(model.get("rope_scaling_factor", 8.0)), **LLAMA3_ROPE_FIXED}
    return {"rope_parameters": {**rope, "rope_theta": model.get("rotary_base", 10000.0)}, "rope_scaling": rope}


def _moe_config(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "num_experts": model["num_moe_experts"],
        "moe_intermediate_size": model.get("moe_ffn_hidden_size") or model["ffn_hidden_size"],
        "num_experts_per_tok": model.get("moe_router_topk", 2),
        "norm_topk_prob": not model.get("moe_router_pre_softmax", False),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def _gemma3_config(model: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's fields from its provider's (defaults as Gemma3ModelProvider's)."""
    local, full = model.get("rotary_base") or (10_000.0, 1_000_000.0)
    sliding, every = model.get("interleaved_attn_pattern") or (5, 1)
    layers = int(model["num_layers"])
    factor = float(model.get("rope_scaling_factor", 1.0))
    full_rope = {"rope_type": "linear", "factor": factor} if factor != 1.0 else {"rope_type": "default"}
    scale = model.get("softmax_scale") or 1.0 / math.sqrt(256)
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": round(1.0 / scale**2),
        "sliding_window": model.get("window_size", 512),
        "layer_types": [
            "full_attention" if (i + 1) % (sliding + every) == 0 else "sliding_attention" for i in range(layers)
        ],
        "rope_parameters": {
            "full_attention": {**full_rope, "rope_theta": float(full)},
            "sliding_attention": {"rope_type": "default", "rope_theta": float(local)},
        },
    }
