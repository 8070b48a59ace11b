"""train.lora on NeMo-RL: the adapters' targets in NeMo-RL's lora_cfg (Automodel's matcher), and back.

rlsteps names target modules as peft matches them (`q_proj`: any module whose dotted name ends with it; none: every
linear layer but the output layer). NeMo-RL's DTensor v2 worker hands lora_cfg to Automodel, which matches
target_modules against a module's whole dotted name with `*` wildcards (so `q_proj` becomes `*.q_proj`), and whose
match_all_linear takes the output layer too (so every linear layer but the output layer is exclude_modules
[`*lm_head`]). enabled, dim, alpha and dropout are key_map's pairs. NeMo-RL runs LoRA on that worker only
(policy.dtensor_cfg._v2; its lm_policy asserts it), not on its Megatron policy through these keys.
"""

from __future__ import annotations

from typing import Any

from rlsteps.dotted import get
from rlsteps.nemo_rl.environments import NemoRlConfigError
from rlsteps.nemo_rl.key_map import LORA

OUTPUT_LAYER = "*lm_head"  # the output layer of a Hugging Face causal LM, in Automodel's wildcards


def compile_lora(cfg: dict[str, Any]) -> dict[str, Any]:
    """NeMo-RL's lora_cfg keys key_map does not pair, for an rl/rlhf or rl/reinforce config with train.lora."""
    lora = cfg["train"]["lora"]
    if not lora["enabled"]:
        return {}
    if cfg["nemo_rl_job"]["policy_backend"] == "megatron":
        raise NemoRlConfigError(
            "train.lora runs on NeMo-RL's DTensor policy, not its Megatron one (whose peft keys name Megatron's "
            "modules)",
            fix="nemo_rl_job.policy_backend=dtensor",
        )
    names = lora["target_modules"]
    lora_cfg = {
        "target_modules": [f"*.{name}" for name in names],
        "exclude_modules": [] if names else [OUTPUT_LAYER],
        "match_all_linear": False,
        "dropout_position": "pre",  # peft's dropout acts on the adapters' input
    }
    return {"policy": {"dtensor_cfg": {"_v2": True, "lora_cfg": lora_cfg}}}


def with_adapter_rate(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config with train.lr the optimizer's rate: train.lora.lr where the adapters train and it is set. NeMo-RL
    has one optimizer rate, which with lora_cfg moves the adapters alone, as train.lora.lr does here."""
    lora = cfg["train"]["lora"]
    if not lora["enabled"] or lora.get("lr") is None:
        return cfg
    return {**cfg, "train": {**cfg["train"], "lr": lora["lr"]}}


def check_lora(master: dict[str, Any]) -> list[str]:
    """What NeMo-RL's LoRA needs of the finished master config, set or refused; the notes."""
    dtensor = master["policy"]["dtensor_cfg"]
    lora_cfg = dtensor.get("lora_cfg") or {}
    if not (dtensor.get("enabled") and lora_cfg.get("enabled")):
        return []
    if not dtensor.get("_v2"):
        raise NemoRlConfigError(
            "policy.dtensor_cfg.lora_cfg: NeMo-RL runs LoRA on its DTensor v2 worker only (its lm_policy asserts "
            "'LoRA is not supported for DTensorPolicyWorker V1')",
            changes={"policy.dtensor_cfg._v2": True},
        )
    if dtensor["tensor_parallel_size"] > 1 and lora_cfg.get("use_triton"):
        lora_cfg["use_triton"] = False
        return [
            "policy.dtensor_cfg.lora_cfg.use_triton false: NeMo-RL's Triton LoRA kernels need tensor_parallel_size 1"
        ]
    return []


def lora_notes(cfg: dict[str, Any]) -> list[str]:
    """Where NeMo-RL's LoRA differs from the embedded engine's, for a config with train.lora."""
    if not cfg["train"]["lora"]["enabled"]:
        return []
    return [
        "train.lora: NeMo-RL draws the adapters' A with lora_A_init (xavier), peft Kaiming-uniform; B starts at zero "
        "in both, so both start from the base policy",
        "train.lora: the output is NeMo-RL's last checkpoint as its DTensor converter exports it (nemo_rl_job.export); "
        "that a LoRA checkpoint exports as the merged policy is not checked off a GPU (Automodel writes it)",
    ]


def embedded_targets(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(train.lora.target_modules, notes) for rl/nemo_rl/rlhf's lora_cfg on the embedded engine."""
    lora_cfg = get(cfg, LORA) or {}
    patterns = list(lora_cfg.get("target_modules") or [])
    excluded = [pattern for pattern in lora_cfg.get("exclude_modules") or [] if pattern != OUTPUT_LAYER]
    names = [name for name in (pattern.rsplit(".", 1)[-1].lstrip("*") for pattern in patterns) if name]
    notes = []
    if any(pattern not in (name, f"*.{name}", f"*{name}") for pattern, name in zip(patterns, names)):
        notes.append(f"{LORA}.target_modules {patterns}: the embedded engine adapts the modules named {names}")
    if not patterns and lora_cfg.get("match_all_linear"):
        notes.append(f"{LORA}.match_all_linear: the embedded engine adapts every linear layer but the output layer")
    if excluded:
        notes.append(f"{LORA}.exclude_modules {excluded}: the embedded engine excludes only the output layer")
    return names, notes
