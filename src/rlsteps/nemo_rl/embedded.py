"""rl/nemo_rl/rlhf on the embedded engine: its NeMo-RL master config mapped onto rl/rlhf's GRPO recipe.

Where no NeMo-RL runs (this machine, the tiny world), the step runs the same recipe (GRPO with a pairwise generative
judge) on rlsteps's own loop: rl/rlhf's config named by `embedded_config` is the base, and every NeMo-RL key with an
rlsteps counterpart is set over it (key_map's pairs, the schedule, validation, the judge). A key the user set that
has none is named in the notes, never silently dropped.
"""

from __future__ import annotations

import copy
from typing import Any

from rlsteps.dotted import get, put
from rlsteps.nemo_rl.key_map import GENRM, INPUTS, JUDGE, LORA, PAIRINGS, RLSTEPS_KEYS, pairs
from rlsteps.nemo_rl.lora import embedded_targets
from rlsteps.nemo_rl.semantics import NO_END

EMBEDDED_STEP = "rl/rlhf"  # the step whose recipe and inputs the embedded engine runs
_ABSENT = object()
HANDLED = (  # NeMo-RL keys mapped by hand below (a key under one of them is handled too)
    "grpo.max_num_epochs",
    "grpo.val_period",
    "grpo.max_val_samples",
    "grpo.val_batch_size",
    "grpo.adv_estimator",
    "checkpointing.save_period",
    "checkpointing.checkpoint_dir",
    "logger.log_dir",
    "policy.scheduler",
    "policy.generation.top_k",
    "policy.tokenizer.name",
    "policy.max_total_sequence_length",
    f"{LORA}.target_modules",
    f"{LORA}.match_all_linear",
    f"{LORA}.exclude_modules",
    f"{GENRM}.comparison_strategy",
    f"{GENRM}.use_principle",
    f"{GENRM}.default_principle",
    f"{GENRM}.num_rollouts_per_prompt",
    JUDGE,
)


def to_embedded(cfg: dict[str, Any], base: dict[str, Any], set_keys: list[str]) -> tuple[dict[str, Any], list[str]]:
    """(rl/rlhf config, notes) for a validated rl/nemo_rl/rlhf config; `base` is the resolved rl/rlhf config it
    starts from, `set_keys` the keys the user set (config file, profile, overrides)."""
    recipe = copy.deepcopy(base)
    recipe.update(algorithm="grpo", engine="embedded")
    for ours, theirs in pairs("grpo") + INPUTS:
        value = get(cfg, theirs, _ABSENT)
        if value is not _ABSENT:
            put(recipe, ours, copy.deepcopy(value))
    recipe["rollout"]["sampling"]["top_k"] = get(cfg, "policy.generation.top_k") or 0
    recipe["output"] = copy.deepcopy(cfg["output"])
    recipe["run"] = {**recipe["run"], **copy.deepcopy(cfg.get("run") or {})}  # a profile's config.run, if any
    if cfg.get("tiny_world") is not None:
        recipe["tiny_world"] = copy.deepcopy(cfg["tiny_world"])
    _epochs_and_validation(cfg, recipe)
    lora = recipe["train"].setdefault("lora", {})
    lora["target_modules"], lora_notes = embedded_targets(cfg)
    lora["lr"] = None  # NeMo-RL's one optimizer rate (train.lr here) moves the adapters, not a base config's own rate
    notes = _judge(cfg, recipe) + _schedule(cfg, recipe) + lora_notes
    unhonoured = [key for key in set_keys if _is_nemo_rl_key(key) and not _handled(key)]
    if unhonoured:
        notes.append("NeMo-RL keys the embedded engine does not honour: " + ", ".join(sorted(unhonoured)))
    return recipe, notes


def embedded_key(key: str) -> str:
    """The rl/rlhf key a NeMo-RL key becomes on the embedded engine (itself where it has no counterpart)."""
    return next((ours for ours, theirs in pairs("grpo") + INPUTS if theirs == key), key)


def nemo_rl_key(key: str) -> str:
    """The NeMo-RL key the user sets for an rl/rlhf key of the embedded engine (itself where it has none)."""
    return next((theirs for ours, theirs in pairs("grpo") + INPUTS if ours == key), key)


def _epochs_and_validation(cfg: dict[str, Any], recipe: dict[str, Any]) -> None:
    grpo = cfg["grpo"]
    epochs = grpo["max_num_epochs"]
    recipe["train"]["max_epochs"] = None if epochs is None or epochs >= NO_END else epochs
    recipe["validation"]["interval"] = grpo["val_period"]
    recipe["validation"]["num_prompts"] = grpo.get("max_val_samples") or grpo.get("val_batch_size") or 1
    recipe["checkpoint"]["interval"] = cfg["checkpointing"]["save_period"]


def _judge(cfg: dict[str, Any], recipe: dict[str, Any]) -> list[str]:
    block, compare, judge = get(cfg, JUDGE) or {}, get(cfg, GENRM) or {}, recipe["judge"]
    strategies = {theirs: ours for ours, theirs in PAIRINGS.items()}
    judge["pairing"] = strategies.get(compare.get("comparison_strategy"), judge["pairing"])
    judge["principle"] = compare.get("default_principle") if compare.get("use_principle") else None
    if block.get("base_url"):
        judge.update(url=block["base_url"], model=block.get("model"), api_key=block.get("api_key"))
        recipe["inputs"]["judge_model"] = None
        return [f"judge: the running server at {block['base_url']}"]
    return [f"judge: rlsteps's judge server over {block.get('model')} (vllm_serve_kwargs do not apply here)"]


def _schedule(cfg: dict[str, Any], recipe: dict[str, Any]) -> list[str]:
    """policy.scheduler, in the forms NeMo-RL's configs use: [decay] or [warmup LinearLR, decay, milestones]."""
    train, lr = recipe["train"], recipe["train"]["lr"]
    schedulers = [s for s in cfg["policy"].get("scheduler") or [] if "name" in s]
    milestones = next((s["milestones"] for s in cfg["policy"].get("scheduler") or [] if "milestones" in s), [])
    train["warmup_steps"] = int(milestones[0]) if milestones and len(schedulers) > 1 else 0
    notes = []
    if train["warmup_steps"]:
        start = schedulers[0]["kwargs"].get("start_factor", 1.0 / 3)
        if abs(start - 1.0 / train["warmup_steps"]) > 1e-9:
            notes.append(
                f"warmup: rlsteps starts at lr/{train['warmup_steps']} (NeMo-RL's LinearLR here at {start} x lr)"
            )
    decay = schedulers[-1] if schedulers else {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {}}
    kind, kwargs = decay["name"].rsplit(".", 1)[-1], decay.get("kwargs") or {}
    if kind == "CosineAnnealingLR":
        train.update(schedule="cosine", min_lr_ratio=kwargs.get("eta_min", 0.0) / lr if lr else 0.0)
    elif kind == "LinearLR":
        train.update(schedule="linear", min_lr_ratio=kwargs.get("end_factor", 1.0))
    elif kind == "ConstantLR":
        train["schedule"] = "constant"
    else:
        notes.append(f"policy.scheduler: {decay['name']} has no embedded counterpart; a constant rate runs")
        train["schedule"] = "constant"
    return notes


def _is_nemo_rl_key(key: str) -> bool:
    return key.split(".", 1)[0] not in RLSTEPS_KEYS


def _handled(key: str) -> bool:
    mapped = [theirs for _, theirs in pairs("grpo") + INPUTS] + list(HANDLED)
    return any(key == known or key.startswith(known + ".") for known in mapped)
