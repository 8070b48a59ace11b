"""The keys rl/rlhf and rl/reinforce share with NeMo-RL's master config, one to one, in both directions.

engine=nemo_rl compiles an rl/rlhf or rl/reinforce config to NeMo-RL's keys with these pairs (master_config); the
embedded engine runs rl/nemo_rl/rlhf's NeMo-RL config through them the other way (embedded). A setting with no
pair here is mapped by hand in those modules, or named as one the other engine does not honour.
"""

from __future__ import annotations

from typing import Any

from rlsteps.contract.algorithms import UnsupportedAlgorithm, nemo_rl_form
from rlsteps.dotted import get

GENRM = "env.nemo_gym.genrm_compare_resources_server.resources_servers.genrm_compare"
JUDGE = "env.nemo_gym.genrm_model.responses_api_models.vllm_model"  # the seed step's judge block (embedded view)
LORA = "policy.dtensor_cfg.lora_cfg"  # NeMo-RL's LoRA on its DTensor (v2) policy worker

SHARED = (  # (rlsteps key, NeMo-RL key): the same meaning, value for value
    ("seed", "grpo.seed"),
    ("rollout.prompts_per_step", "grpo.num_prompts_per_step"),
    ("rollout.num_rollouts_per_prompt", "grpo.num_generations_per_prompt"),
    ("rollout.logprob_micro_batch_size", "policy.logprob_batch_size"),
    ("rollout.sampling.max_new_tokens", "policy.generation.max_new_tokens"),
    ("rollout.sampling.temperature", "policy.generation.temperature"),
    ("rollout.sampling.top_p", "policy.generation.top_p"),
    ("rollout.vllm.gpu_memory_utilization", "policy.generation.vllm_cfg.gpu_memory_utilization"),
    ("rollout.vllm.enforce_eager", "policy.generation.vllm_cfg.enforce_eager"),
    ("data.max_prompt_tokens", "data.max_input_seq_length"),
    ("data.chat_template_kwargs", "policy.tokenizer.chat_template_kwargs"),  # apply_chat_template's extra arguments
    ("run.dtype", "policy.precision"),
    ("train.max_steps", "grpo.max_num_steps"),
    ("train.global_batch_size", "policy.train_global_batch_size"),
    ("train.micro_batch_size", "policy.train_micro_batch_size"),
    ("train.max_grad_norm", "policy.max_grad_norm"),
    ("train.lr", "policy.optimizer.kwargs.lr"),
    ("train.weight_decay", "policy.optimizer.kwargs.weight_decay"),
    ("train.betas", "policy.optimizer.kwargs.betas"),
    ("train.activation_checkpointing", "policy.dtensor_cfg.activation_checkpointing"),
    ("train.sequence_packing", "policy.sequence_packing.enabled"),
    ("train.dynamic_batching", "policy.dynamic_batching.enabled"),
    ("train.truncated_importance_sampling", "loss_fn.use_importance_sampling_correction"),
    ("train.lora.enabled", f"{LORA}.enabled"),
    ("train.lora.dim", f"{LORA}.dim"),
    ("train.lora.alpha", f"{LORA}.alpha"),
    ("train.lora.dropout", f"{LORA}.dropout"),
    ("validation.show_samples", "logger.num_val_samples_to_print"),
    ("logging.tensorboard", "logger.tensorboard_enabled"),
)
GRPO_ONLY = (  # rl/rlhf's GRPO and judge settings
    ("grpo.normalize_std", "grpo.normalize_rewards"),
    ("grpo.leave_one_out", "grpo.use_leave_one_out_baseline"),
    ("grpo.kl_beta", "loss_fn.reference_policy_kl_penalty"),
    ("grpo.eps_low", "loss_fn.ratio_clip_min"),
    ("grpo.eps_high", "loss_fn.ratio_clip_max"),
    ("grpo.dynamic_sampling", "grpo.use_dynamic_sampling"),
    ("grpo.dynamic_sampling_max_gen_batches", "grpo.dynamic_sampling_max_gen_batches"),
    ("grpo.overlong_filtering", "grpo.overlong_filtering"),
    ("judge.temperature", f"{GENRM}.genrm_responses_create_params.temperature"),
    ("judge.top_p", f"{GENRM}.genrm_responses_create_params.top_p"),
    ("judge.max_tokens", f"{GENRM}.genrm_responses_create_params.max_output_tokens"),
    ("judge.length_penalty", f"{GENRM}.group_answer_length_penalty_coeff"),
    ("judge.max_retries", f"{GENRM}.genrm_parse_retries"),
)
INPUTS = (  # where rl/nemo_rl/rlhf keeps its inputs, at NeMo-RL's keys
    ("inputs.prompts", "data.train.data_path"),
    ("inputs.val_prompts", "data.validation.data_path"),
    ("inputs.policy", "policy.model_name"),
    ("inputs.judge_model", f"{JUDGE}.model"),
)
# rlsteps's own keys around rl/nemo_rl/rlhf's NeMo-RL config; `run` (device and dtype, from a profile's config.run)
# is the embedded engine's, never NeMo-RL's (policy.precision says its precision)
RLSTEPS_KEYS = frozenset(
    {"algorithm", "engine", "embedded_config", "nemo_rl_job", "output", "tiny_world", "inputs", "run"}
)
PAIRINGS = {"circular": "circular", "all": "all_pairs"}  # rlsteps judge.pairing -> genrm_compare comparison_strategy


def nemo_rl_inputs(cfg: dict[str, Any]) -> dict[str, Any]:
    """rl/nemo_rl/rlhf's inputs, read from NeMo-RL's keys, as the `inputs` section the job's stages read."""
    return {ours.removeprefix("inputs."): get(cfg, theirs) for ours, theirs in INPUTS}


RECIPE_PAIRS = {"grpo": GRPO_ONLY, "reinforce": ()}  # each algorithm NeMo-RL runs (contract.algorithms): its own keys


def pairs(algorithm: str) -> tuple[tuple[str, str], ...]:
    """The (rlsteps key, NeMo-RL key) pairs of an algorithm NeMo-RL runs; UnsupportedAlgorithm for one it does not."""
    nemo_rl_form(algorithm)
    if algorithm not in RECIPE_PAIRS:
        raise UnsupportedAlgorithm(
            f"algorithm '{algorithm}' runs on NeMo-RL but has no key pairs: add it to RECIPE_PAIRS"
        )
    return SHARED + RECIPE_PAIRS[algorithm]


def with_derived_keys(cfg: Any) -> Any:
    """An rl/nemo_rl/rlhf config with what the job's stages read derived from its NeMo-RL keys: `inputs` (the policy,
    prompts and judge NeMo-RL's keys name) and `nemo_rl_job.policy_backend` (megatron or dtensor)."""
    if not isinstance(cfg, dict) or not isinstance(cfg.get("policy"), dict):
        return cfg
    backend = "megatron" if get(cfg, "policy.megatron_cfg.enabled") else "dtensor"
    job = {**(cfg.get("nemo_rl_job") or {}), "policy_backend": backend}
    return {**cfg, "inputs": nemo_rl_inputs(cfg), "nemo_rl_job": job}
