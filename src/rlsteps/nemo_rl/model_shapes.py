"""The policy's own shapes against the parallelism a NeMo-RL job asks of it, read from its config.json (a local
checkpoint_hf, or a checkpoint_megatron's hf_config/) without torch; pure but for that read.

What the setups refuse, with the sizes that pass (the largest not above the one asked for):
- NeMo-RL's DTensor worker (nemo_rl/models/dtensor/parallelize.py): num_key_value_heads and num_attention_heads
  divisible by the tensor-parallel size;
- Megatron-Core (TransformerConfig.__post_init__; transformer_block.get_num_layers_to_build; MoELayer): attention
  heads a multiple of tensor_model_parallel_size, the query groups a multiple or a divisor of it, the layers
  divisible by pipeline_model_parallel_size, the experts by expert_model_parallel_size (and experts to have any);
- vLLM (ModelConfig.verify_with_parallel_config): attention heads divisible by vllm_cfg.tensor_parallel_size.
A policy on a cluster path or named by Hub id is not readable here: the job checks it, and a note says so.
The same read gives the sizes the memory estimate counts parameters from (rlsteps.nemo_rl.memory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsteps.nemo_rl.environments import NemoRlConfigError

HF_CONFIG_DIR = "hf_config"  # where a checkpoint_megatron keeps the model's config.json (Megatron-Bridge's layout)
VLLM_TP = "policy.generation.vllm_cfg.tensor_parallel_size"


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    layers: int
    experts: int  # 0: dense
    source: str  # the config.json read
    hidden: int = 0
    intermediate: int = 0  # a dense layer's MLP
    vocab: int = 0
    head_dim: int = 0
    tied: bool = False  # the output layer is the embedding's matrix
    expert_intermediate: int = 0  # one routed expert's MLP
    experts_per_token: int = 0
    shared_intermediate: int = 0  # the shared experts' MLP, all of them together; 0: none
    shared_gate: bool = False  # a sigmoid gate over the shared expert (Qwen2-MoE)
    dense_layers: int = 0  # of an MoE model's layers, those with a dense MLP
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorms over each head's queries and keys (Qwen3)
    counted: bool = True  # False: not a Llama-like text decoder (MLA, Mamba, a vision tower): no parameter count


def read_shape(ref: str | None) -> tuple[Shape | None, str]:
    """The policy's shape, or None and why it could not be read here."""
    if not ref:
        return None, "no policy is named"
    for config in _config_files(Path(ref)):
        if config.is_file():
            return _shape_of(json.loads(config.read_text()), str(config)), ""
    from rlsteps.contract.hub import is_hub_id

    if is_hub_id(ref):
        return None, f"{ref} is a Hub id (the job fetches it)"
    return None, f"{ref} is not readable here (a path on the cluster)"


def _config_files(path: Path) -> list[Path]:
    found = [path / "config.json", path / HF_CONFIG_DIR / "config.json"]
    if path.is_dir():  # a checkpoint_megatron root: its iteration folders, newest first
        found += [folder / HF_CONFIG_DIR / "config.json" for folder in sorted(path.glob("iter_*"), reverse=True)]
        found.append(path / "release" / HF_CONFIG_DIR / "config.json")
    return found


QKV_BIAS_FAMILIES = ("qwen2", "qwen2_moe")  # transformers' Qwen2 attention: bias on q, k and v, never on o
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")
UNCOUNTED_KEYS = ("kv_lora_rank", "hybrid_override_pattern", "linear_num_value_heads", "linear_attn_config")


def _shape_of(config: dict[str, Any], source: str) -> Shape:
    text = config.get("text_config") or config  # a multimodal model's language part
    heads = int(text["num_attention_heads"])
    experts = int(text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts") or 0)
    hidden, family = int(text.get("hidden_size") or 0), str(text.get("model_type") or "")
    intermediate = int(text.get("intermediate_size") or 0)
    return Shape(
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        layers=int(text["num_hidden_layers"]),
        experts=experts,
        source=source,
        hidden=hidden,
        intermediate=intermediate,
        vocab=int(text.get("vocab_size") or config.get("vocab_size") or 0),
        head_dim=int(text.get("head_dim") or (hidden // heads if heads else 0)),
        tied=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        expert_intermediate=int(text.get("moe_intermediate_size") or intermediate) if experts else 0,
        experts_per_token=int(text.get("num_experts_per_tok") or 0),
        shared_intermediate=_shared_intermediate(text),
        shared_gate=family == "qwen2_moe" and bool(text.get("shared_expert_intermediate_size")),
        dense_layers=_dense_layers(text) if experts else 0,
        qkv_bias=bool(text.get("attention_bias")) or family in QKV_BIAS_FAMILIES,
        o_bias=bool(text.get("attention_bias")),
        mlp_bias=bool(text.get("mlp_bias")),
        qk_norm=family in QK_NORM_FAMILIES,
        counted=bool(hidden and intermediate)
        and "vision_config" not in config
        and not any(text.get(key) for key in UNCOUNTED_KEYS),
    )


def _shared_intermediate(text: dict[str, Any]) -> int:
    """Qwen2-MoE's shared_expert_intermediate_size, or DeepSeek's n_shared_experts x moe_intermediate_size."""
    if text.get("shared_expert_intermediate_size"):
        return int(text["shared_expert_intermediate_size"])
    return int(text.get("n_shared_experts") or 0) * int(text.get("moe_intermediate_size") or 0)


def _dense_layers(text: dict[str, Any]) -> int:
    """The layers of an MoE model with a dense MLP: DeepSeek's first_k_dense_replace, Qwen-MoE's mlp_only_layers."""
    return int(text.get("first_k_dense_replace") or 0) + len(text.get("mlp_only_layers") or [])


def check_shapes(master: dict[str, Any], ref: str | None) -> list[str]:
    """Refuses parallel sizes the policy's shape cannot take (NemoRlConfigError with the sizes that can); notes."""
    shape, why = read_shape(ref)
    if shape is None:
        return [f"not checked here: the policy's heads, layers and experts against its parallel sizes ({why})"]
    policy = master["policy"]
    if policy["megatron_cfg"].get("enabled"):
        _megatron(policy["megatron_cfg"], shape)
    else:
        _dtensor(policy["dtensor_cfg"]["tensor_parallel_size"], shape)
    _vllm(int(policy["generation"]["vllm_cfg"].get("tensor_parallel_size") or 1), shape)
    return []


def _largest(asked: int, fits) -> int:
    return max(size for size in range(1, asked + 1) if fits(size))


def _dtensor(tp: int, shape: Shape) -> None:
    def fits(size: int) -> bool:
        return shape.kv_heads % size == 0 and shape.heads % size == 0

    if tp > 1 and not fits(tp):
        raise NemoRlConfigError(
            f"policy.dtensor_cfg.tensor_parallel_size {tp} against the policy's {shape.heads} attention heads and "
            f"{shape.kv_heads} key-value heads ({shape.source}): NeMo-RL's DTensor worker asserts both divisible by "
            "the TP size",
            changes={"policy.dtensor_cfg.tensor_parallel_size": _largest(tp, fits)},
        )


def _megatron(megatron: dict[str, Any], shape: Shape) -> None:
    tp, pp = megatron["tensor_model_parallel_size"], megatron["pipeline_model_parallel_size"]
    ep = int(megatron.get("expert_model_parallel_size") or 1)

    def tp_fits(size: int) -> bool:
        groups = shape.kv_heads % size == 0 or size % shape.kv_heads == 0
        return shape.heads % size == 0 and groups

    checks = (
        ("tensor_model_parallel_size", tp, tp_fits,
         f"{shape.heads} attention heads and {shape.kv_heads} query groups (Megatron-Core's TransformerConfig: heads "
         "a multiple of it, query groups a multiple or a divisor)"),
        ("pipeline_model_parallel_size", pp, lambda size: shape.layers % size == 0,
         f"{shape.layers} layer(s) (Megatron-Core: 'num_layers should be divisible by pipeline_model_parallel_size')"),
        ("expert_model_parallel_size", ep, lambda size: size == 1 or (shape.experts and shape.experts % size == 0),
         f"{shape.experts} expert(s) (Megatron-Core's MoE layer: the experts divisible by it)"),
    )  # fmt: skip
    for key, asked, fits, what in checks:
        if not fits(asked):
            raise NemoRlConfigError(
                f"policy.megatron_cfg.{key} {asked} against the policy's {what}; {shape.source}",
                changes={f"policy.megatron_cfg.{key}": _largest(asked, fits)},
            )


def _vllm(tp: int, shape: Shape) -> None:
    if shape.heads % tp:
        raise NemoRlConfigError(
            f"{VLLM_TP} {tp} against the policy's {shape.heads} attention heads ({shape.source}): vLLM refuses "
            "'Total number of attention heads must be divisible by tensor parallel size'",
            changes={VLLM_TP: _largest(tp, lambda size: shape.heads % size == 0)},
        )
