"""The model families a policy may come from, and which of them a checkpoint_megatron can hold: an architecture's
Megatron GPT shape read from its Hugging Face config (config.json), or a LayoutError saying in one line why it has
none. Torch-free: the dry run refuses a run whose output it could not write (rlsteps.plan), and the engine's Megatron
layout (rlsteps.engine.megatron.layout) builds its tensor maps from the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Architectures with the Llama block layout; Qwen2 adds a QKV bias.
SUPPORTED = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


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


def megatron_form_refusal(hf_config: dict[str, Any]) -> str | None:
    """Why a model of this Hugging Face config cannot be written (or read) as a checkpoint_megatron, in one line; None
    when it can. The dry run asks this of a run's policy before anything starts, and the worker again at its start."""
    try:
        gpt_shape(hf_config)
    except LayoutError as error:
        return str(error)
    return None
