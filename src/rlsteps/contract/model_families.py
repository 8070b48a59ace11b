"""The model families a policy may come from, and which of them a checkpoint_megatron can hold: an architecture's
Megatron GPT shape read from its Hugging Face config (config.json), or a LayoutError saying in one line why it has
none. Torch-free: the dry run refuses a run whose output it could not write (rlsteps.plan), and the engine's Megatron
layout (rlsteps.engine.megatron.layout, .families) builds its tensor maps from the same shape.

The families are the ones Megatron-Bridge maps onto Megatron-Core's GPTModel, with Bridge's names:

    llama      LlamaForCausalLM (Llama 2, Llama 3.x with llama3 RoPE scaling)
    mistral    MistralForCausalLM (without a sliding window: Bridge's MistralModelProvider)
    qwen2      Qwen2ForCausalLM (Qwen2, Qwen2.5: a QKV bias)
    qwen3      Qwen3ForCausalLM (q/k norms)
    qwen3_moe  Qwen3MoeForCausalLM (q/k norms, a router and grouped experts in every layer)
    gemma3     Gemma3ForCausalLM (text: q/k norms, norms after attention and MLP, zero-centred norm weights,
               a scaled embedding, sliding-window layers beside global ones)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Gemma3ForCausalLM": "gemma3",
}
# Architectures users bring that have no checkpoint_megatron form here, and why. The dry run and the worker add the
# fix to the message: write the Hugging Face form, output.type=checkpoint_hf.
REFUSED = {
    "NemotronHForCausalLM": "a hybrid Mamba model, which Megatron-Bridge writes as a MambaModel (its "
    "HybridModelProvider), not the GPT layout checkpoint_megatron holds",
    "Gemma3ForConditionalGeneration": "Gemma 3 with its vision tower; the text model (Gemma3ForCausalLM) is supported",
}
GEMMA3_LAYER_TYPES = ("sliding_attention", "full_attention")


class LayoutError(ValueError):
    """A model or checkpoint that does not fit the supported Megatron GPT layout; the message names the tensor."""


@dataclass(frozen=True)
class GPTShape:
    """What fixes every tensor shape of a GPT model of one of the families."""

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
    family: str = "llama"
    qk_layernorm: bool = False  # q_norm / k_norm over each head: [kv_channels] each
    post_norms: bool = False  # Gemma 3's norms after attention and after the MLP
    num_experts: int = 0  # 0: a dense MLP in every layer; else a router and this many experts in every layer
    moe_ffn_hidden_size: int = 0
    moe_router_topk: int = 0

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def qkv_rows(self) -> int:
        return (self.num_attention_heads + 2 * self.num_query_groups) * self.kv_channels

    @property
    def moe(self) -> bool:
        return self.num_experts > 0


def gpt_shape(hf_config: dict[str, Any]) -> GPTShape:
    """The GPT shape of a Hugging Face config (a config.json dict), or a LayoutError saying why it is not supported."""
    archs = hf_config.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED), None)
    if arch is None:
        refused = next((a for a in archs if a in REFUSED), None)
        if refused is not None:
            raise LayoutError(f"{refused} cannot be a checkpoint_megatron: {REFUSED[refused]}")
        raise LayoutError(
            f"architecture {', '.join(archs) or '(none in config.json)'} is not supported for Megatron checkpoints; "
            f"supported: {', '.join(sorted(SUPPORTED))}"
        )
    family = SUPPORTED[arch]
    _refuse_unsupported_options(arch, family, hf_config)
    heads = int(hf_config["num_attention_heads"])
    groups = int(hf_config.get("num_key_value_heads") or heads)
    if heads % groups:
        raise LayoutError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}")
    hidden = int(hf_config["hidden_size"])
    experts = (
        int(hf_config.get("num_experts") or hf_config.get("num_local_experts") or 0) if family == "qwen3_moe" else 0
    )
    return GPTShape(
        architecture=arch,
        num_layers=int(hf_config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(hf_config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=int(hf_config.get("head_dim") or hidden // heads),
        vocab_size=int(hf_config["vocab_size"]),
        qkv_bias=family == "qwen2",
        tied_embeddings=bool(hf_config.get("tie_word_embeddings", family == "gemma3")),
        family=family,
        qk_layernorm=family in ("qwen3", "qwen3_moe", "gemma3"),
        post_norms=family == "gemma3",
        num_experts=experts,
        moe_ffn_hidden_size=int(hf_config.get("moe_intermediate_size") or 0) if experts else 0,
        moe_router_topk=int(hf_config.get("num_experts_per_tok") or 0) if experts else 0,
    )


# Llama 3.1's RoPE scaling: megatron-core's GPTModel takes only the factor and fixes these.
LLAMA3_ROPE_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _refuse_unsupported_options(arch: str, family: str, hf_config: dict[str, Any]) -> None:
    """Options a Megatron GPTModel would run differently: refused, so no checkpoint claims a model it is not."""
    if hf_config.get("attention_bias") or hf_config.get("mlp_bias"):
        raise LayoutError(
            f"{arch} with attention_bias or mlp_bias has bias tensors the Megatron GPT layout has no place for"
        )
    if family == "gemma3":
        _refuse_gemma3_options(arch, hf_config)
        return
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
    if family == "qwen3_moe":
        _refuse_qwen3_moe_options(arch, hf_config)
    rope = rope_scaling(hf_config)
    if rope["rope_type"] not in ("default", "llama3"):
        raise LayoutError(
            f"{arch} with rope_type={rope['rope_type']!r}: only default RoPE and Llama 3.1 scaling are supported"
        )
    if rope["rope_type"] == "llama3" and any(float(rope.get(k, v)) != v for k, v in LLAMA3_ROPE_FIXED.items()):
        raise LayoutError(
            f"{arch} with Llama 3.1 RoPE scaling other than {LLAMA3_ROPE_FIXED}: megatron-core fixes those values"
        )


def _refuse_qwen3_moe_options(arch: str, hf_config: dict[str, Any]) -> None:
    """Megatron-Bridge's Qwen3-MoE provider puts experts in every layer and no shared expert."""
    if int(hf_config.get("decoder_sparse_step", 1)) != 1 or hf_config.get("mlp_only_layers"):
        raise LayoutError(
            f"{arch} with decoder_sparse_step={hf_config.get('decoder_sparse_step')} or mlp_only_layers="
            f"{hf_config.get('mlp_only_layers')}: Megatron-Bridge's Qwen3-MoE layout has experts in every layer"
        )
    if hf_config.get("shared_expert_intermediate_size"):
        raise LayoutError(f"{arch} with a shared expert: Megatron-Bridge's Qwen3-MoE layout has none")


def _refuse_gemma3_options(arch: str, hf_config: dict[str, Any]) -> None:
    """What Megatron-Bridge's Gemma 3 provider (gemma3_layer_spec, GELU-tanh, tied output) cannot express."""
    if hf_config.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise LayoutError(
            f"{arch} with hidden_activation={hf_config['hidden_activation']!r}: Megatron-Bridge's Gemma 3 runs the "
            "tanh-approximated GELU (gelu_pytorch_tanh)"
        )
    for option in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf_config.get(option) is not None:
            raise LayoutError(f"{arch} with {option}={hf_config[option]}: Megatron's GPTModel has no soft-capping")
    if not hf_config.get("tie_word_embeddings", True):
        raise LayoutError(f"{arch} with untied embeddings: Megatron-Bridge's Gemma 3 layout has no output_layer")
    gemma3_attention_pattern(hf_config)  # raises for a pattern Megatron cannot express
    full = gemma3_rope(hf_config, "full_attention")
    if full["rope_type"] not in ("default", "linear") or gemma3_rope(hf_config, "sliding_attention")["rope_type"] != (
        "default"
    ):
        raise LayoutError(
            f"{arch} with rope_type={full['rope_type']!r}: Megatron-Bridge's Gemma 3 takes default RoPE, and linear "
            "scaling on its global layers"
        )


def gemma3_attention_pattern(hf_config: dict[str, Any]) -> tuple[int, int]:
    """(sliding, global): Gemma 3's layer_types as Megatron's interleaved_attn_pattern, every (a + b)-th layer global.
    Megatron-Bridge's provider fixes (5, 1), the pattern of every released Gemma 3."""
    layers = int(hf_config["num_hidden_layers"])
    types = hf_config.get("layer_types")
    if types is None:
        every = int(hf_config.get("sliding_window_pattern") or hf_config.get("_sliding_window_pattern") or 6)
        types = [GEMMA3_LAYER_TYPES[(i + 1) % every == 0] for i in range(layers)]
    if "full_attention" not in types:
        every = layers + 1  # no global layer within the model: any period past its depth
    else:
        every = types.index("full_attention") + 1
    expected = [GEMMA3_LAYER_TYPES[(i + 1) % every == 0] for i in range(layers)]
    if list(types) != expected:
        raise LayoutError(
            f"Gemma3ForCausalLM with layer_types={list(types)}: Megatron's Gemma 3 makes every n-th layer global "
            "(interleaved_attn_pattern), and these are not"
        )
    return every - 1, 1


def gemma3_rope(hf_config: dict[str, Any], layer_type: str) -> dict[str, Any]:
    """Gemma 3's RoPE parameters of one layer type: transformers 5's per-type rope_parameters, or the older fields
    (rope_theta and rope_scaling for global layers, rope_local_base_freq for sliding ones)."""
    params = hf_config.get("rope_parameters") or {}
    if layer_type in params:
        rope = dict(params[layer_type])
    elif layer_type == "full_attention":
        rope = {**(hf_config.get("rope_scaling") or {}), "rope_theta": hf_config.get("rope_theta", 1_000_000.0)}
    else:
        rope = {"rope_theta": hf_config.get("rope_local_base_freq", 10_000.0)}
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    return rope


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
