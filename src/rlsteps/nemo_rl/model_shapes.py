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


def _shape_of(config: dict[str, Any], source: str) -> Shape:
    text = config.get("text_config") or config  # a multimodal model's language part
    heads = int(text["num_attention_heads"])
    experts = text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts") or 0
    return Shape(
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        layers=int(text["num_hidden_layers"]),
        experts=int(experts),
        source=source,
    )


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
