"""Where NeMo-RL's semantics differ from the embedded recipe's, for a given step config: one sentence each.

The dry run prints them on top of the compiled master config, so a user moving a step from one engine to the other
sees what will not mean the same.
"""

from __future__ import annotations

from typing import Any

from rlsteps.contract.algorithms import UnsupportedAlgorithm

NO_END = 1_000_000  # "no limit" for NeMo-RL's integer limits (its own default for grpo.max_num_steps)


def differences(cfg: dict[str, Any]) -> list[str]:
    """The differences of the recipe's own keys for this validated rl/rlhf (grpo) or rl/reinforce config (the schedule's
    and LoRA's are said by schedule.notes and lora.lora_notes)."""
    if cfg["algorithm"] not in RECIPE_NOTES:
        raise UnsupportedAlgorithm(f"no notes on how NeMo-RL runs algorithm '{cfg['algorithm']}': add them")
    return _common(cfg) + RECIPE_NOTES[cfg["algorithm"]](cfg)


def _where_generation(cfg: dict[str, Any]) -> str:
    return "beside training, on GPUs of its own" if cfg["rollout"].get("max_age_steps") else "colocated with training"


def _common(cfg: dict[str, Any]) -> list[str]:
    notes = [
        f"rollouts: NeMo-RL generates with vLLM {_where_generation(cfg)}; rollout.backend does not apply",
        "train.max_steps_without_update: NeMo-RL has no such guard; a run that never updates runs to its end",
    ]
    if cfg["train"]["max_epochs"] is None:
        notes.append(f"train.max_epochs null: grpo.max_num_epochs {NO_END} (NeMo-RL needs a number)")
    if cfg["validation"]["reward_functions"]:
        notes.append("validation.reward_functions: NeMo-RL does not run them; only its own validation reward")
    if cfg["checkpoint"]["keep_last"] > cfg["checkpoint"]["keep_top_k"]:
        notes.append("checkpoint.keep_last and keep_top_k: NeMo-RL keeps one set, the larger of the two")
    return notes


def _rlhf(cfg: dict[str, Any]) -> list[str]:
    notes = [
        f"grpo.std_floor: NeMo-RL divides by (std + 1e-6) whenever std > 0; rlsteps only when std > "
        f"{cfg['grpo']['std_floor']} (a near-constant group keeps r - mean, unscaled, there)",
        "judge failures: NeMo-Gym gives an unparsable comparison the default score 3.0 (ranking 3.5) after "
        "genrm_parse_retries; rlsteps masks the sample out of the loss (judge.on_failure) and stops above "
        "judge.max_parse_failure_rate",
        "judge.structured_output, extra_body, concurrency and timeout_s: NeMo-Gym's judge server sets its own",
    ]
    if cfg["judge"]["both_orders"]:
        notes.append(
            "judge.both_orders: NeMo-Gym's genrm_compare shows each pair in one order (num_judges_per_comparison "
            "repeats it), so a judge's position bias reaches the rewards; judge/first_position_rate and "
            "judge/contradiction_rate are rlsteps's alone"
        )
    if cfg["grpo"]["overlong_filtering"]:
        notes.append(
            "grpo.overlong_filtering: rlsteps leaves a truncated sample out of its group's baseline and std and out "
            "of the loss; NeMo-RL keeps it in the baseline and std and only zeroes its loss"
        )
    if cfg["grpo"]["dynamic_sampling"]:
        notes.append(
            "grpo.dynamic_sampling: both engines sample more prompts until the batch is full of groups whose rewards "
            "differ; rlsteps compares the rewards of a group's rows that count (scored, and ended under "
            "grpo.overlong_filtering), NeMo-RL those of all its rows"
        )
    if cfg["judge"]["length_penalty"]:
        notes.append("judge.length_penalty: NeMo-Gym's group_answer_length_penalty_coeff (zero-centred in the group)")
    return notes


def _reinforce(cfg: dict[str, Any]) -> list[str]:
    kl = "|logp - logp_init| (k1, absolute)" if cfg["reinforce"]["use_absolute_kl"] else "logp - logp_init (k1)"
    return [
        f"KL: rlsteps folds beta * mean_t {kl} into the sequence reward before the baseline; NeMo-RL adds beta * k3 "
        "KL to the loss (loss_fn.use_kl_in_reward belongs to its Reinforce++ estimator)",
        "baseline: rlsteps's leave-one-out mean counts only properly ended samples; NeMo-RL's counts every sample",
        "loss: loss_fn.disable_ppo_ratio gives REINFORCE's -A * logp, as rlsteps does; no std normalisation",
        "rm.*: NeMo-RL serves inputs.reward_model itself (env.reward_model, Bradley-Terry); rm.url, token and "
        "chat_template do not apply",
        "prompts: rl/reinforce on NeMo-RL takes single-turn prompts (NeMo-RL's math_hf_data_processor)",
    ]


RECIPE_NOTES = {"grpo": _rlhf, "reinforce": _reinforce}  # each algorithm NeMo-RL runs (contract.algorithms)
