"""What an unknown config key is refused with: the key the user most likely meant.

Users arrive with the names of the tools they come from (TRL's trainers, NeMo-RL's configs, NeMo-Aligner's actors),
which spelling alone maps badly (train.learning_rate is nearer train.min_lr_ratio than train.lr), so those names
are looked up first; then the config's keys by spelling; then a key of the same last part under another section.
"""

from __future__ import annotations

import difflib
from typing import Any

from omegaconf import DictConfig

# Names users of TRL's trainers and NeMo-RL's configs bring, by their last part -> rlsteps' keys (the first of them
# the config has)
COUNTERPART_NAMES = {
    "learning_rate": ("train.lr",),
    "num_generations": ("rollout.num_rollouts_per_prompt",),
    "num_generations_per_prompt": ("rollout.num_rollouts_per_prompt",),
    "num_prompts_per_step": ("rollout.prompts_per_step",),
    "max_completion_length": ("rollout.sampling.max_new_tokens",),
    "max_new_tokens": ("rollout.sampling.max_new_tokens",),
    "max_num_steps": ("train.max_steps",),
    "num_train_epochs": ("train.max_epochs",),
    "max_num_epochs": ("train.max_epochs",),
    "per_device_train_batch_size": ("train.micro_batch_size",),
    "train_micro_batch_size": ("train.micro_batch_size",),
    "train_global_batch_size": ("train.global_batch_size",),
    "beta": ("grpo.kl_beta", "reinforce.initial_policy_kl_penalty"),
    "reference_policy_kl_penalty": ("grpo.kl_beta", "reinforce.initial_policy_kl_penalty"),
    "epsilon": ("grpo.eps_low",),
    "ratio_clip_min": ("grpo.eps_low",),
    "ratio_clip_max": ("grpo.eps_high",),
}

# NeMo-Aligner's override names (its RS and REINFORCE actors' configs, gpt_rs_actor.yaml and
# gpt_reinforce_actor.yaml, and the seeds' commands), whole -> rlsteps' keys. The reward server's host and port are
# one URL here.
NEMO_ALIGNER_NAMES = {
    "pretrained_checkpoint.restore_from_path": ("inputs.policy",),
    "model.rs.num_rollouts_per_prompt": ("rollout.num_rollouts_per_prompt",),
    "model.rs.top_n_rollouts": ("rollout.top_n_rollouts",),
    "model.rs.num_rollout_samples": ("rollout.prompts_per_step",),
    "model.reinforce.num_rollout_samples": ("rollout.prompts_per_step",),
    "model.optim.lr": ("train.lr",),
    "model.global_batch_size": ("train.global_batch_size",),
    "model.micro_batch_size": ("train.micro_batch_size",),
    "remote_rm.host": ("rm.url",),
    "remote_rm.ip": ("rm.url",),
    "remote_rm.port": ("rm.url",),
    "remote_rm.reward_model.ip": ("rm.url",),
    "remote_rm.reward_model.port": ("rm.url",),
    "remote_rm.reward_model.name": ("rm.model",),
}
# under trainer.rs. and trainer.reinforce.: the last part -> rlsteps' keys
NEMO_ALIGNER_TRAINER_SECTIONS = ("trainer.rs.", "trainer.reinforce.")
NEMO_ALIGNER_TRAINER_NAMES = {
    "max_epochs": ("train.max_epochs",),
    "max_steps": ("train.max_steps",),
    "val_check_interval": ("validation.interval",),
    "save_interval": ("checkpoint.interval",),
    "gradient_clip_val": ("train.max_grad_norm",),
    "model_gbs": ("train.global_batch_size",),
    "model_mbs": ("train.micro_batch_size",),
    "num_rollouts_per_prompt": ("rollout.num_rollouts_per_prompt",),
    "initial_policy_kl_penalty": ("reinforce.initial_policy_kl_penalty",),
    "use_absolute_kl": ("reinforce.use_absolute_kl",),
}
URL_HINT = {"rm.url": " (host and port are one URL here: rm.url=http://HOST:PORT)"}


def closest_key_hint(cfg: DictConfig, key: str) -> str:
    """The fix for an unknown key: "did you mean '<key>'?", or where to find the keys."""
    keys = flat_keys(cfg)
    named = [k for k in counterpart_names(key) if k in keys]
    close = named[:1] or difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    if not close:  # a right leaf under a wrong section: match on the last part
        leaf = key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:1]
    # a new key with + is only welcome where the schema takes any key (a step's own inputs)
    adding = f" (use +{key}=... to add a new input)" if key.startswith("inputs.") else ""
    if close:
        return f"did you mean '{close[0]}'?{URL_HINT.get(close[0], '')}{adding}"
    return f"use +{key}=... to add a new input" if adding else "see `rlsteps run STEP -c CONFIG --dry-run` for its keys"


def counterpart_names(key: str) -> tuple[str, ...]:
    """rlsteps' keys for a name another tool gives the same setting (empty when it is no such name)."""
    if key in NEMO_ALIGNER_NAMES:
        return NEMO_ALIGNER_NAMES[key]
    leaf = key.rsplit(".", 1)[-1]
    if key.startswith(NEMO_ALIGNER_TRAINER_SECTIONS) and leaf in NEMO_ALIGNER_TRAINER_NAMES:
        return NEMO_ALIGNER_TRAINER_NAMES[leaf]
    return COUNTERPART_NAMES.get(leaf, ())


def flat_keys(cfg: Any, prefix: str = "") -> list[str]:
    if not isinstance(cfg, DictConfig):
        return [prefix] if prefix else []
    keys: list[str] = []
    for k in cfg.keys():
        path = f"{prefix}.{k}" if prefix else str(k)
        child = cfg._get_node(k)
        keys.extend(flat_keys(child, path) if isinstance(child, DictConfig) else [path])
    return keys
