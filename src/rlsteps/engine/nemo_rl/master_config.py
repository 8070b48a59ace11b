"""The step's config compiled to NeMo-RL's GRPO master config, key by key; pure (the dry run prints the result).

Names and structure follow NeMo-RL's examples/configs/grpo_math_1B.yaml and its config types at the pinned version
(rlsteps.engine.nemo_rl.NEMO_RL_VERSION); the NeMo-Gym judge keys of rl/rlhf follow Nemotron's rl/nemo_rl/rlhf step.
The compiled config is complete on its own (NeMo-RL's driver reads it with no `defaults:`), and the step's
`nemo_rl:` section is merged over it last, so any NeMo-RL key rlsteps does not model can still be set.

Where the two engines mean different things by the same setting, `notes` says so; the dry run prints them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from rlsteps.engine.nemo_rl.environments import (
    NemoRlConfigError,
    environment,
    reward_model_dtensor,
    sequence_length,
)
from rlsteps.engine.nemo_rl.layout import NemoRlPaths
from rlsteps.engine.nemo_rl.semantics import NO_END, differences


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int


@dataclass
class MasterConfig:
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # where NeMo-RL's semantics differ from the embedded recipe's


def compile_master_config(cfg: dict[str, Any], cluster: Cluster, run_dir: PurePosixPath) -> MasterConfig:
    """NeMo-RL's master config for a validated rl/rlhf (grpo) or rl/reinforce config, run in `run_dir` (absolute)."""
    if cfg["algorithm"] not in ("grpo", "reinforce"):
        raise NemoRlConfigError(f"engine=nemo_rl runs rl/rlhf and rl/reinforce, not algorithm '{cfg['algorithm']}'")
    if not run_dir.is_absolute():
        raise NemoRlConfigError(f"the run directory must be absolute for NeMo-RL, got {run_dir}")
    paths = NemoRlPaths(run_dir)
    notes = differences(cfg)
    config = {
        "grpo": _grpo(cfg),
        "loss_fn": _loss_fn(cfg),
        "checkpointing": _checkpointing(cfg, paths),
        "policy": _policy(cfg, paths),
        "data": _data(cfg, paths),
        "env": environment(cfg),
        "logger": _logger(cfg, paths),
        "cluster": {"gpus_per_node": cluster.gpus_per_node, "num_nodes": cluster.nodes},
    }
    passed = cfg.get("nemo_rl") or {}
    if passed:
        notes.append("set as given over the compiled keys (nemo_rl.*): " + ", ".join(sorted(_leaf_keys(passed))))
    return MasterConfig(config=deep_merge(config, passed), notes=notes)


def optimizer_steps(cfg: dict[str, Any]) -> int:
    """Optimizer steps of the whole run: NeMo-RL steps once per train_global_batch_size rows of a GRPO step."""
    rollout, train = cfg["rollout"], cfg["train"]
    rows = rollout["prompts_per_step"] * rollout["num_rollouts_per_prompt"]
    return train["max_steps"] * max(1, rows // train["global_batch_size"])


def _grpo(cfg: dict[str, Any]) -> dict[str, Any]:
    rollout, train, validation = cfg["rollout"], cfg["train"], cfg["validation"]
    rlhf = cfg["algorithm"] == "grpo"
    normalize = cfg["grpo"]["normalize_std"] if rlhf else False  # REINFORCE/RLOO: no std normalisation
    leave_one_out = cfg["grpo"]["leave_one_out"] if rlhf else True  # RLOO's baseline
    return {
        "num_prompts_per_step": rollout["prompts_per_step"],
        "num_generations_per_prompt": rollout["num_rollouts_per_prompt"],
        "max_rollout_turns": 1,
        "max_num_epochs": train["max_epochs"] or NO_END,
        "max_num_steps": train["max_steps"],
        "normalize_rewards": normalize,
        "use_leave_one_out_baseline": leave_one_out,
        "adv_estimator": {
            "name": "grpo",
            "normalize_rewards": normalize,
            "use_leave_one_out_baseline": leave_one_out,
            "minus_baseline": True,
        },
        "val_period": validation["interval"] if cfg["inputs"].get("val_prompts") else 0,
        "val_at_start": False,
        "val_at_end": bool(cfg["inputs"].get("val_prompts")),
        "max_val_samples": validation["num_prompts"],
        "val_batch_size": validation["num_prompts"],
        "val_num_generations_per_prompt": 1,
        "overlong_filtering": cfg["grpo"]["overlong_filtering"] if rlhf else False,
        "use_dynamic_sampling": cfg["grpo"]["dynamic_sampling"] if rlhf else False,
        "seed": cfg["seed"],
        "async_grpo": {"enabled": False},
    }


def _loss_fn(cfg: dict[str, Any]) -> dict[str, Any]:
    rlhf = cfg["algorithm"] == "grpo"
    train = cfg["train"]
    beta = cfg["grpo"]["kl_beta"] if rlhf else cfg["reinforce"]["initial_policy_kl_penalty"]
    return {
        "reference_policy_kl_penalty": beta,
        "reference_policy_kl_type": "k3",
        "kl_input_clamp_value": 20.0,
        "kl_output_clamp_value": 10.0,
        "ratio_clip_min": cfg["grpo"]["eps_low"] if rlhf else 0.2,
        "ratio_clip_max": cfg["grpo"]["eps_high"] if rlhf else 0.2,
        "ratio_clip_c": None,
        "use_on_policy_kl_approximation": False,
        "use_importance_sampling_correction": train["truncated_importance_sampling"],
        "truncated_importance_sampling_type": "tis" if train["truncated_importance_sampling"] else None,
        "truncated_importance_sampling_ratio": (
            train["importance_sampling_cap"] if train["truncated_importance_sampling"] else None
        ),
        "token_level_loss": True,
        "use_kl_in_reward": False,
        "disable_ppo_ratio": not rlhf,  # REINFORCE's surrogate -A * logp, no ratio and no clip
    }


def _checkpointing(cfg: dict[str, Any], paths: NemoRlPaths) -> dict[str, Any]:
    checkpoint = cfg["checkpoint"]
    by_metric = bool(checkpoint["metric"]) and bool(cfg["inputs"].get("val_prompts")) and checkpoint["keep_top_k"]
    return {
        "enabled": True,
        "checkpoint_dir": str(paths.checkpoints),
        "metric_name": "val:accuracy" if by_metric else None,  # NeMo-RL's mean validation reward
        "higher_is_better": True,
        "keep_top_k": max(checkpoint["keep_top_k"], checkpoint["keep_last"]),
        "save_period": checkpoint["interval"] or cfg["train"]["max_steps"],  # a final one is always written
        "model_save_format": "safetensors",
        "save_consolidated": False,
        "save_optimizer": True,
    }


def _policy(cfg: dict[str, Any], paths: NemoRlPaths) -> dict[str, Any]:
    rollout, train = cfg["rollout"], cfg["train"]
    megatron = cfg["nemo_rl_job"]["policy_backend"] == "megatron"
    policy = {
        "model_name": str(paths.policy),
        "tokenizer": {"name": str(paths.policy), "chat_template_kwargs": None},
        "train_global_batch_size": train["global_batch_size"],
        "train_micro_batch_size": train["micro_batch_size"],
        "generation_batch_size": rollout["generation_batch_size"] or 32,
        "logprob_batch_size": rollout["logprob_micro_batch_size"],
        "max_total_sequence_length": sequence_length(cfg),
        "precision": cfg["run"]["dtype"],
        "max_grad_norm": train["max_grad_norm"],
        "dtensor_cfg": _dtensor(cfg, enabled=not megatron),
        "megatron_cfg": _megatron(cfg, enabled=megatron),
        "dynamic_batching": {"enabled": False},
        "sequence_packing": {"enabled": False},
        "make_sequence_length_divisible_by": 1,
        "generation": _generation(cfg),
    }
    if not megatron:
        policy["optimizer"] = {
            "name": "torch.optim.AdamW",
            "kwargs": {"lr": train["lr"], "weight_decay": train["weight_decay"], "betas": list(train["betas"])},
        }
        policy["scheduler"] = torch_schedulers(cfg)
    return policy


def _dtensor(cfg: dict[str, Any], enabled: bool) -> dict[str, Any]:
    return {
        **reward_model_dtensor(),
        "enabled": enabled,
        "activation_checkpointing": cfg["train"]["activation_checkpointing"],
    }


def _megatron(cfg: dict[str, Any], enabled: bool) -> dict[str, Any]:
    if not enabled:
        return {"enabled": False}
    train = cfg["train"]
    warmup = min(train["warmup_steps"], optimizer_steps(cfg))
    return {
        "enabled": True,
        "activation_checkpointing": train["activation_checkpointing"],
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
        "pipeline_dtype": cfg["run"]["dtype"],
        "optimizer": {
            "optimizer": "adam",
            "lr": train["lr"],
            "min_lr": train["lr"] * (train["min_lr_ratio"] if train["schedule"] != "constant" else 1.0),
            "weight_decay": train["weight_decay"],
            "bf16": cfg["run"]["dtype"] == "bfloat16",
            "fp16": False,
            "params_dtype": "float32",
            "adam_beta1": train["betas"][0],
            "adam_beta2": train["betas"][1],
            "adam_eps": 1e-8,
            "clip_grad": train["max_grad_norm"],
            "use_distributed_optimizer": True,
        },
        "scheduler": {
            "lr_decay_style": train["schedule"],
            "lr_decay_iters": optimizer_steps(cfg),
            "lr_warmup_iters": warmup,
            "lr_warmup_init": train["lr"] / warmup if warmup else train["lr"],
            "weight_decay_incr_style": "constant",
            "start_weight_decay": train["weight_decay"],
            "end_weight_decay": train["weight_decay"],
        },
    }


def torch_schedulers(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """rlsteps's schedule as NeMo-RL's list of torch schedulers (a SequentialLR): warmup to the peak on optimizer
    step warmup_steps (the first step at 1/warmup_steps), then the decay to min_lr_ratio at the run's last step."""
    train = cfg["train"]
    total = optimizer_steps(cfg)
    warmup = min(train["warmup_steps"], total)
    decay_steps = max(1, total - warmup)
    if train["schedule"] == "cosine":
        decay = {"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": decay_steps}}
        decay["kwargs"]["eta_min"] = train["lr"] * train["min_lr_ratio"]
    elif train["schedule"] == "linear":
        decay = {
            "name": "torch.optim.lr_scheduler.LinearLR",
            "kwargs": {"start_factor": 1.0, "end_factor": train["min_lr_ratio"], "total_iters": decay_steps},
        }
    else:
        decay = {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0, "total_iters": NO_END}}
    if warmup <= 1:
        return [decay]
    ramp = {
        "name": "torch.optim.lr_scheduler.LinearLR",
        "kwargs": {"start_factor": 1.0 / warmup, "end_factor": 1.0, "total_iters": warmup - 1},
    }
    return [ramp, decay, {"milestones": [warmup]}]


def _generation(cfg: dict[str, Any]) -> dict[str, Any]:
    sampling, vllm = cfg["rollout"]["sampling"], cfg["rollout"]["vllm"]
    return {
        "backend": "vllm",
        "max_new_tokens": sampling["max_new_tokens"],
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "top_k": sampling["top_k"] or None,
        "stop_token_ids": None,
        "stop_strings": None,
        "vllm_cfg": {
            "async_engine": cfg["algorithm"] == "grpo",  # NeMo-Gym's HTTP server needs vLLM's async engine
            "precision": cfg["run"]["dtype"],
            "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1,
            "gpu_memory_utilization": vllm["gpu_memory_utilization"],
            "max_model_len": sequence_length(cfg),
            "enforce_eager": vllm["enforce_eager"],
            "expose_http_server": cfg["algorithm"] == "grpo",
        },
        "colocated": {"enabled": True, "resources": {"gpus_per_node": None, "num_nodes": None}},
    }


def _data(cfg: dict[str, Any], paths: NemoRlPaths) -> dict[str, Any]:
    rlhf = cfg["algorithm"] == "grpo"
    default = (
        {"dataset_name": "NemoGymDataset", "env_name": "nemo_gym", "processor": "nemo_gym_data_processor"}
        if rlhf
        else {
            "dataset_name": "ResponseDataset",
            "input_key": "input",
            "output_key": "output",
            "env_name": "reward_model",
            "processor": "math_hf_data_processor",
        }
    )
    return {
        "max_input_seq_length": cfg["data"]["max_prompt_tokens"],
        "shuffle": True,
        "num_workers": 1,
        "train": {"data_path": str(paths.train_data)},
        "validation": {"data_path": str(paths.val_data)} if cfg["inputs"].get("val_prompts") else None,
        "default": {**default, "prompt_file": None, "system_prompt_file": None},
    }


def _logger(cfg: dict[str, Any], paths: NemoRlPaths) -> dict[str, Any]:
    logging = cfg["logging"]
    return {
        "log_dir": str(paths.logs),
        "num_val_samples_to_print": cfg["validation"]["show_samples"],
        "wandb_enabled": logging["wandb_project"] is not None,
        "tensorboard_enabled": logging["tensorboard"],
        "mlflow_enabled": False,
        "swanlab_enabled": False,
        "monitor_gpus": True,
        "wandb": {"project": logging["wandb_project"] or "rlsteps", "name": PurePosixPath(cfg["output"]["dir"]).name},
        "tensorboard": {},
        "gpu_monitoring": {"collection_interval": 10, "flush_interval": 10},
    }


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """base with over's keys set over it, mappings merged key by key; neither argument changes."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _leaf_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        keys.extend(_leaf_keys(value, path + ".") if isinstance(value, dict) and value else [path])
    return keys
