"""A step's config compiled to NeMo-RL's GRPO master config; pure (the dry run prints the result).

rl/nemo_rl/rlhf's config is NeMo-RL's master config already; rl/rlhf's and rl/reinforce's keys are set over the
shipped one (templates/master.yaml, complete for NeMo-RL v0.7.0) through key_map's pairs and the mappings
below. Then every job gets what only rlsteps knows: the paths its stages write under the run directory, the judge
block in the form the pinned NeMo-Gym starts, and the GPUs of the profile split between policy and judge or
reward model (placement). The result is what NeMo-RL's own MasterConfig and drivers accept (tests check it with
NeMo-RL's code). Where the two engines mean different things by one setting, `notes` says so; the dry run prints it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from omegaconf import OmegaConf

from rlsteps.contract.algorithms import UnsupportedAlgorithm, nemo_rl_form
from rlsteps.contract.nemo_rl_job import NemoRlPaths
from rlsteps.dotted import get, leaves, put
from rlsteps.nemo_rl.asynchronous import asynchronous_notes, compile_asynchronous, separate_generation
from rlsteps.nemo_rl.environments import (
    NemoRlConfigError,
    assignments,
    compile_judge,
    reward_model_env,
    uses_gym,
)
from rlsteps.nemo_rl.judge_context import check_judge_context
from rlsteps.nemo_rl.key_map import INPUTS, JUDGE, PAIRINGS, RLSTEPS_KEYS, pairs
from rlsteps.nemo_rl.lora import check_lora, compile_lora, lora_notes, with_adapter_rate
from rlsteps.nemo_rl.memory import check_memory
from rlsteps.nemo_rl.model_shapes import check_shapes
from rlsteps.nemo_rl.placement import Cluster, place
from rlsteps.nemo_rl.policy_checks import check_policy
from rlsteps.nemo_rl.schedule import megatron_scheduler, torch_schedulers
from rlsteps.nemo_rl.schedule import notes as schedule_notes
from rlsteps.nemo_rl.semantics import NO_END, differences
from rlsteps.nemo_rl.template import GENRM_ENV, REWARD_MODEL_ENV, master_template
from rlsteps.nemo_rl.vllm_args import check_vllm_keywords

__all__ = ["Cluster", "MasterConfig", "NemoRlConfigError", "compile_master_config", "deep_merge"]


@dataclass
class MasterConfig:
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # where NeMo-RL's semantics differ, and what rlsteps set


def compile_master_config(cfg: dict[str, Any], cluster: Cluster, run_dir: PurePosixPath) -> MasterConfig:
    """NeMo-RL's master config for a validated rl/nemo_rl/rlhf, rl/rlhf or rl/reinforce config, run in `run_dir`."""
    try:
        nemo_rl_form(cfg["algorithm"])
    except UnsupportedAlgorithm as unsupported:
        raise NemoRlConfigError(str(unsupported)) from None
    if not run_dir.is_absolute():
        raise NemoRlConfigError(f"the run directory must be absolute for NeMo-RL, got {run_dir}")
    if cfg["algorithm"] == "nemo_rl_grpo":
        master, notes = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in RLSTEPS_KEYS}, []
        if cfg.get("run"):
            notes.append("run.* (the embedded engine's device and dtype) does not apply: policy.precision is NeMo-RL's")
    else:
        cfg = with_adapter_rate(cfg)
        master = from_recipe(cfg)
        notes = differences(cfg) + schedule_notes(cfg) + lora_notes(cfg) + asynchronous_notes(cfg)
    passed = cfg.get("nemo_rl") or {}
    if passed:  # before the job's own keys, so the paths, the judge and the GPU split take them into account
        given = ", ".join(sorted(leaves(passed)))
        notes.append(f"set as given (nemo_rl.*; the paths, the judge block and cluster.* stay rlsteps's): {given}")
        master = deep_merge(master, passed)
    try:
        notes += _finalized(master, cfg, cluster, NemoRlPaths(run_dir))
    except NemoRlConfigError as err:
        if err.changes and cfg["algorithm"] != "nemo_rl_grpo":  # the fix in the recipe's own keys
            raise NemoRlConfigError(str(err), fix=_in_recipe_keys(err.changes, cfg["algorithm"])) from None
        raise
    return MasterConfig(config=master, notes=notes)


def _refuse_prompt_datasets(cfg: dict[str, Any]) -> None:
    """NeMo-RL's job writes its rows from JSONL prompt files: a Hugging Face dataset is refused here where its name
    says what it is (a Hub id, a parquet or arrow file); the dry run refuses one it can read (rlsteps.plan)."""
    from rlsteps.contract.hub import is_hub_id

    for key in ("inputs.prompts", "inputs.val_prompts"):
        ref = str(get(cfg, key) or "")
        if ref and (is_hub_id(ref) or ref.lower().endswith((".parquet", ".arrow"))):
            raise NemoRlConfigError(
                f"{key}={ref} is a Hugging Face dataset; NeMo-RL's job reads JSONL prompt files",
                fix="write the prompts as JSONL (Dataset.to_json(PATH, lines=True)) and pass that file, or run on "
                "the embedded engine",
            )


def _in_recipe_keys(changes: dict[str, Any], algorithm: str) -> str:
    ours = {theirs: mine for mine, theirs in pairs(algorithm)}
    return assignments(changes, lambda key: ours.get(key, "nemo_rl." + key))


def from_recipe(cfg: dict[str, Any]) -> dict[str, Any]:
    """An rl/rlhf or rl/reinforce config as NeMo-RL's keys, over the shipped master config."""
    _refuse_prompt_datasets(cfg)
    rlhf = nemo_rl_form(cfg["algorithm"]).judge
    overlay: dict[str, Any] = {}
    for ours, theirs in pairs(cfg["algorithm"]):
        put(overlay, theirs, copy.deepcopy(get(cfg, ours)))
    for ours, theirs in INPUTS:
        if ours != "inputs.judge_model":  # the judge block is _judge's
            put(overlay, theirs, get(cfg, ours))
    mappings = (
        _epochs_and_validation,
        _checkpointing,
        _policy,
        compile_lora,
        compile_asynchronous,
        _logger,
        _reward_scaling,
        _judge if rlhf else _reinforce,
    )
    for mapping in mappings:
        overlay = deep_merge(overlay, mapping(cfg))
    template = master_template(GENRM_ENV if rlhf else REWARD_MODEL_ENV)
    merged = OmegaConf.merge(template, OmegaConf.create(overlay))
    return OmegaConf.to_container(merged, resolve=True)


def _epochs_and_validation(cfg: dict[str, Any]) -> dict[str, Any]:
    validation, validating = cfg["validation"], bool(cfg["inputs"].get("val_prompts"))
    return {
        "grpo": {
            "max_num_epochs": cfg["train"]["max_epochs"] or NO_END,
            "val_period": validation["interval"] if validating else 0,
            "val_at_end": validating,
            "max_val_samples": validation["num_prompts"],
            "val_batch_size": validation["num_prompts"],
        }
    }


def _checkpointing(cfg: dict[str, Any]) -> dict[str, Any]:
    checkpoint = cfg["checkpoint"]
    by_metric = bool(checkpoint["metric"]) and bool(cfg["inputs"].get("val_prompts")) and checkpoint["keep_top_k"]
    return {
        "checkpointing": {
            "metric_name": "val:accuracy" if by_metric else None,  # NeMo-RL's mean validation reward
            "keep_top_k": max(checkpoint["keep_top_k"], checkpoint["keep_last"]),
            "save_period": checkpoint["interval"] or cfg["train"]["max_steps"],  # a final one is always written
        }
    }


def _policy(cfg: dict[str, Any]) -> dict[str, Any]:
    rollout, train = cfg["rollout"], cfg["train"]
    megatron = cfg["nemo_rl_job"]["policy_backend"] == "megatron"
    policy: dict[str, Any] = {
        "generation_batch_size": rollout["generation_batch_size"] or 32,
        "max_total_sequence_length": cfg["data"]["max_prompt_tokens"] + rollout["sampling"]["max_new_tokens"],
        "generation": {"top_k": rollout["sampling"]["top_k"] or None},
        "dtensor_cfg": {"enabled": not megatron},
        "megatron_cfg": {"enabled": megatron, "activation_checkpointing": train["activation_checkpointing"]},
    }
    if megatron:
        policy["megatron_cfg"]["optimizer"] = {
            "lr": train["lr"],
            "min_lr": train["lr"] * (train["min_lr_ratio"] if train["schedule"] != "constant" else 1.0),
            "weight_decay": train["weight_decay"],
            "bf16": cfg["run"]["dtype"] == "bfloat16",
            "adam_beta1": train["betas"][0],
            "adam_beta2": train["betas"][1],
        }
        policy["megatron_cfg"]["scheduler"] = megatron_scheduler(cfg)
        policy.update(optimizer=None, scheduler=None)
    else:
        policy["scheduler"] = torch_schedulers(cfg)
    importance = train["truncated_importance_sampling"]
    loss = {
        "truncated_importance_sampling_type": "tis" if importance else None,
        "truncated_importance_sampling_ratio": train["importance_sampling_cap"] if importance else None,
    }
    return {"policy": policy, "loss_fn": loss}


def _logger(cfg: dict[str, Any]) -> dict[str, Any]:
    """The run's trackers as NeMo-RL's logger config (its LoggerConfig: wandb, tensorboard, mlflow)."""
    logging, name = cfg["logging"], PurePosixPath(cfg["output"]["dir"]).name
    project, experiment = logging["wandb_project"], logging.get("mlflow_experiment")
    mlflow = {"experiment_name": experiment, "run_name": name, "tracking_uri": logging.get("mlflow_tracking_uri")}
    return {
        "logger": {
            "wandb_enabled": project is not None,
            "wandb": {"project": project or "rlsteps", "name": name},
            "tensorboard_enabled": bool(logging.get("tensorboard")),
            "mlflow_enabled": experiment is not None,
            **({"mlflow": mlflow} if experiment is not None else {}),
        }
    }


def _reward_scaling(cfg: dict[str, Any]) -> dict[str, Any]:
    """The reward term's clip and scale as NeMo-RL's grpo.reward_scaling: each reward clamped to [low, high] and
    mapped linearly onto [low * scale, high * scale], which is clip then scale (its scale_rewards). NeMo-RL scales
    only within a clamped interval, so a scale needs a clip."""
    ((name, term),) = [(name, term) for name, term in cfg["rewards"].items() if term is not None]
    if term.get("clip") is None:
        if term.get("scale", 1.0) != 1.0:
            raise NemoRlConfigError(
                f"rewards.{name}.scale without a clip: NeMo-RL scales rewards only within an interval "
                "(grpo.reward_scaling clamps each reward to [source_min, source_max] first)",
                fix=f"rewards.{name}.clip=[LOW,HIGH] (the rewards' range)",
            )
        return {}
    (low, high), scale = term["clip"], term.get("scale", 1.0)
    scaling = {"enabled": True, "source_min": low, "source_max": high, "target_min": low * scale}
    return {"grpo": {"reward_scaling": {**scaling, "target_max": high * scale}}}


def _judge(cfg: dict[str, Any]) -> dict[str, Any]:
    judge = cfg["judge"]
    if judge["url"]:  # compile_judge refuses it, with the reason
        block = {"base_url": judge["url"], "model": judge["model"], "api_key": judge["api_key"]}
    elif cfg["inputs"].get("judge_model"):
        block = {"model": cfg["inputs"]["judge_model"]}
    else:
        raise NemoRlConfigError("rl/rlhf on NeMo-RL needs inputs.judge_model (NeMo-Gym serves it) or judge.url")
    compare = {
        "comparison_strategy": PAIRINGS[judge["pairing"]],
        "use_principle": judge["principle"] is not None,
    }
    if judge["principle"] is not None:
        compare["default_principle"] = judge["principle"]
    tree: dict[str, Any] = {}
    put(tree, JUDGE, block)
    put(tree, "env.nemo_gym.genrm_compare_resources_server.resources_servers.genrm_compare", compare)
    return tree


def _reinforce(cfg: dict[str, Any]) -> dict[str, Any]:
    """REINFORCE with the RLOO baseline: GRPO's loop with a leave-one-out mean, no std, no ratio, no clip."""
    return {
        "grpo": {"normalize_rewards": False, "use_leave_one_out_baseline": True},
        "loss_fn": {
            "reference_policy_kl_penalty": cfg["reinforce"]["initial_policy_kl_penalty"],
            "disable_ppo_ratio": True,
        },
        **reward_model_env(cfg),
    }


FIX_ROUNDS = 6  # a fix's changes can meet another check (a new data-parallel size, say): that many passes at most


def _finalized(master: dict[str, Any], cfg: dict[str, Any], cluster: Cluster, paths: NemoRlPaths) -> list[str]:
    """_finalize on `master` in place. A refusal's fix is made whole first: its changes are applied to the config as
    it was and the checks run again, each further refusal's changes added, until the config passes; the refusal
    then names every change (so the fix, applied, compiles), or the first refusal stands as it was."""
    pristine = copy.deepcopy(master)
    try:
        return _finalize(master, cfg, cluster, paths)
    except NemoRlConfigError as first:
        if not first.changes:
            raise
        changes = dict(first.changes)
        for _ in range(FIX_ROUNDS):
            trial = copy.deepcopy(pristine)
            for key, value in changes.items():
                put(trial, key, value)
            try:
                _finalize(trial, cfg, cluster, paths)
            except NemoRlConfigError as again:
                if not again.changes or all(changes.get(k) == v for k, v in again.changes.items()):
                    raise first from None
                changes.update(again.changes)
                continue
            raise NemoRlConfigError(str(first), changes=changes) from None
        raise


def _finalize(master: dict[str, Any], cfg: dict[str, Any], cluster: Cluster, paths: NemoRlPaths) -> list[str]:
    """What only rlsteps knows, set in place: the job's paths, the judge as Gym starts it, the GPUs; the notes."""
    notes = _paths(master, cfg, paths)
    if uses_gym(master):
        notes += compile_judge(master)
        if master["grpo"].get("max_val_samples") is not None:
            master["grpo"]["max_val_samples"] = None  # NeMo-RL's NeMo-Gym driver refuses any other value
            notes.append("grpo.max_val_samples: null (NeMo-RL's NeMo-Gym driver validates on the whole file)")
    notes += place(master, cluster)
    notes += separate_generation(master, cfg)
    notes += check_vllm_keywords(master)
    notes += check_judge_context(master)
    check_policy(master)
    policy = get(cfg, "inputs.policy") or get(cfg, "policy.model_name")
    notes += check_shapes(master, policy)
    notes += _megatron_precision(master)
    notes += check_lora(master)
    _context_parallel(master)
    _sequence_divisor(master)
    notes += check_memory(master, policy, cluster.gpu_memory_gib)  # last: it reads the settings as they run
    return notes + [
        "known only on the cluster, so not checked here: the files at policy.model_name and data.*.data_path (the "
        "job's prepare stage writes them from the inputs, and checks inputs on cluster paths), and models named by "
        "Hub id (fetched there)"
    ]


def _paths(master: dict[str, Any], cfg: dict[str, Any], paths: NemoRlPaths) -> list[str]:
    policy, data = master["policy"], master["data"]
    policy["model_name"] = str(paths.policy)
    policy["tokenizer"]["name"] = str(paths.policy)
    data["train"]["data_path"] = str(paths.train_data)
    master["checkpointing"]["checkpoint_dir"] = str(paths.checkpoints)
    master["logger"]["log_dir"] = str(paths.logs)
    if cfg["inputs"].get("val_prompts"):
        data["validation"] = {**(data.get("validation") or {}), "data_path": str(paths.val_data)}
        return []
    data["validation"] = None
    grpo = master["grpo"]
    if grpo["val_period"] or grpo["val_at_start"] or grpo["val_at_end"]:
        grpo.update(val_period=0, val_at_start=False, val_at_end=False)
        return ["no validation prompts: grpo.val_period 0, val_at_start and val_at_end false"]
    return []


def _megatron_precision(master: dict[str, Any]) -> list[str]:
    """megatron_cfg.optimizer's bf16 and fp16 as policy.precision says (NeMo-RL's Megatron setup asserts they agree:
    _validate_dtype_config); a note where the config said otherwise."""
    policy = master["policy"]
    if not policy["megatron_cfg"].get("enabled"):
        return []
    optimizer = policy["megatron_cfg"]["optimizer"]
    wanted = {"bf16": policy["precision"] == "bfloat16", "fp16": policy["precision"] == "float16"}
    changed = {key: value for key, value in wanted.items() if optimizer.get(key) != value}
    optimizer.update(wanted)
    if not changed:
        return []
    given = ", ".join(f"megatron_cfg.optimizer.{key} {str(value).lower()}" for key, value in changed.items())
    return [f"policy.precision {policy['precision']}: {given} (NeMo-RL's Megatron setup needs them to agree)"]


def _context_parallel(master: dict[str, Any]) -> None:
    """Context parallelism asks opposite things of sequence packing on NeMo-RL's two policies: its Megatron setup
    asserts packing with it ('Sequence Packing must be enabled to use Context Parallelism with MCore'), its DTensor
    workers refuse packing with it ('Context parallel is not supported for sequence packing'), and DTensor's model
    setup refuses it beside tensor parallelism with sequence parallelism (NeMo-RL's issue 659)."""
    policy = master["policy"]
    packing = bool(policy["sequence_packing"].get("enabled"))
    if policy["megatron_cfg"].get("enabled"):
        size = policy["megatron_cfg"]["context_parallel_size"]
        if size > 1 and not packing:
            raise NemoRlConfigError(
                f"policy.megatron_cfg.context_parallel_size {size} needs sequence packing: NeMo-RL's Megatron setup "
                "asserts 'Sequence Packing must be enabled to use Context Parallelism with MCore'",
                changes={"policy.sequence_packing.enabled": True, "policy.dynamic_batching.enabled": False},
            )
        return
    dtensor = policy["dtensor_cfg"]
    size = dtensor["context_parallel_size"]
    if size > 1 and packing:
        raise NemoRlConfigError(
            f"policy.dtensor_cfg.context_parallel_size {size} and sequence packing: NeMo-RL's DTensor workers stop at "
            "their setup with 'Context parallel is not supported for sequence packing'",
            changes={"policy.sequence_packing.enabled": False},
        )
    if size > 1 and dtensor["tensor_parallel_size"] > 1 and dtensor["sequence_parallel"]:
        raise NemoRlConfigError(
            f"policy.dtensor_cfg.context_parallel_size {size} beside tensor_parallel_size "
            f"{dtensor['tensor_parallel_size']} and sequence_parallel: NeMo-RL's DTensor model setup stops with "
            "'context parallel can't be used together with sequence parallel in DTensor worker'",
            changes={"policy.dtensor_cfg.sequence_parallel": False},
        )


def _sequence_divisor(master: dict[str, Any]) -> None:
    """policy.make_sequence_length_divisible_by as the backend needs it: the tensor-parallel size (DTensor), or
    2 x tensor x context parallel with Megatron's sequence packing; a multiple of it is kept."""
    policy = master["policy"]
    if policy["megatron_cfg"].get("enabled"):
        megatron = policy["megatron_cfg"]
        needed = megatron["tensor_model_parallel_size"] * megatron["context_parallel_size"]
        if policy["sequence_packing"].get("enabled"):
            needed *= 2
    else:
        needed = policy["dtensor_cfg"]["tensor_parallel_size"]
    if (policy.get("make_sequence_length_divisible_by") or 1) % needed:
        policy["make_sequence_length_divisible_by"] = needed


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """base with over's keys set over it, mappings merged key by key; neither argument changes."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
