"""What NeMo-RL v0.7.0 asserts of the policy's and the loop's settings once its setup or first step reaches them,
checked when a job compiles, each refusal with the keys that pass it; pure.

- nemo_rl/models/policy/lm_policy.py (Policy.__init__): at tensor parallel 4 or more, policy.train_micro_batch_size
  must equal policy.logprob_batch_size (a known batch-variant accuracy issue); dynamic batching is exclusive of
  sequence packing, and needs a single pipeline stage.
- nemo_rl/algorithms/grpo.py (async_grpo_train) and the drivers' async branch: asynchronous GRPO needs vLLM's async
  engine, the importance-sampling correction, generation on GPUs of its own (not colocated), and none of dynamic
  sampling or reward scaling.
"""

from __future__ import annotations

from typing import Any

from rlsteps.nemo_rl.asynchronous import own_generation_gpus
from rlsteps.nemo_rl.environments import NemoRlConfigError

ASYNC_ENGINE = "policy.generation.vllm_cfg.async_engine"
IMPORTANCE = "loss_fn.use_importance_sampling_correction"


def check_policy(master: dict[str, Any]) -> None:
    """Refuses what NeMo-RL's Policy and its asynchronous loop would stop on (NemoRlConfigError with the fix)."""
    _batch_variance(master)
    _dynamic_batching(master)
    _asynchronous(master)


def tensor_parallel(policy: dict[str, Any]) -> int:
    """The tensor-parallel size NeMo-RL's Policy reads for the backend in use."""
    if policy["megatron_cfg"].get("enabled"):
        return int(policy["megatron_cfg"]["tensor_model_parallel_size"])
    return int(policy["dtensor_cfg"]["tensor_parallel_size"])


def pipeline_parallel(policy: dict[str, Any]) -> int:
    if policy["megatron_cfg"].get("enabled"):
        return int(policy["megatron_cfg"]["pipeline_model_parallel_size"])
    return 1


def _batch_variance(master: dict[str, Any]) -> None:
    """lm_policy.py:184: `assert config["train_micro_batch_size"] == config["logprob_batch_size"]` when tp_size >= 4
    (the job does not set NRL_IGNORE_TP_ACCURACY_CHECK). The fix takes the smaller size for both (memory only)."""
    policy = master["policy"]
    tp, micro, logprob = tensor_parallel(policy), policy["train_micro_batch_size"], policy.get("logprob_batch_size")
    if tp < 4 or "logprob_batch_size" not in policy or micro == logprob:
        return
    size = min(micro, logprob) if logprob else micro
    changes = {key: size for key, value in (("policy.train_micro_batch_size", micro),
                                            ("policy.logprob_batch_size", logprob)) if value != size}  # fmt: skip
    raise NemoRlConfigError(
        f"tensor parallel {tp} with policy.train_micro_batch_size {micro} and policy.logprob_batch_size {logprob}: "
        "NeMo-RL's Policy asserts they are equal at tensor parallel 4 or more ('There is a known batch-variant "
        "accuracy issue with TP>=4', lm_policy.py)",
        changes=changes,
    )


def _dynamic_batching(master: dict[str, Any]) -> None:
    """lm_policy.py:283 and 295: dynamic batching only with one pipeline stage, and never beside sequence packing."""
    policy = master["policy"]
    if not policy["dynamic_batching"].get("enabled"):
        return
    stages = pipeline_parallel(policy)
    if stages > 1:
        raise NemoRlConfigError(
            f"policy.dynamic_batching with pipeline_model_parallel_size {stages}: NeMo-RL's Policy asserts 'Dynamic "
            "batching is only supported for single pipeline parallel stage'; sequence packing batches by tokens there",
            changes={"policy.dynamic_batching.enabled": False, "policy.sequence_packing.enabled": True},
        )
    if policy["sequence_packing"].get("enabled"):
        raise NemoRlConfigError(
            "policy.dynamic_batching and policy.sequence_packing both on: NeMo-RL's Policy asserts 'Dynamic Batching "
            "is exclusive of Sequence Packing'",
            changes={"policy.sequence_packing.enabled": False},
        )


def _asynchronous(master: dict[str, Any]) -> None:
    """grpo.async_grpo.enabled: the drivers refuse dynamic sampling and reward scaling with it; async_grpo_train
    asserts vLLM's async engine (grpo.py:3364), the importance-sampling correction (grpo.py:3371) and generation
    that is not colocated (grpo.py:3421). One refusal names them all, the first NeMo-RL would stop on."""
    grpo, policy = master["grpo"], master["policy"]
    if not (grpo.get("async_grpo") or {}).get("enabled"):
        return
    found: list[tuple[str, dict[str, Any]]] = []
    if grpo.get("use_dynamic_sampling"):
        found.append(("use_dynamic_sampling is not supported with async GRPO", {"grpo.use_dynamic_sampling": False}))
    if (grpo.get("reward_scaling") or {}).get("enabled"):
        found.append(("reward_scaling is not supported with async GRPO", {"grpo.reward_scaling.enabled": False}))
    generation = policy["generation"]
    if generation["backend"] == "vllm" and not generation["vllm_cfg"].get("async_engine"):
        found.append(("Async GRPO requires an async vLLM or Megatron generation engine", {ASYNC_ENGINE: True}))
    if not master["loss_fn"].get("use_importance_sampling_correction"):
        found.append(("Importance sampling correction must be enabled for async GRPO", {IMPORTANCE: True}))
    if generation["colocated"]["enabled"]:
        found.append(("Colocated inference is not supported for async GRPO", own_generation_gpus(master)))
    if found:
        changes = {key: value for _, change in found for key, value in change.items()}
        said = "; ".join(f"'{words}'" for words, _ in found)
        raise NemoRlConfigError(
            f"grpo.async_grpo.enabled: NeMo-RL's asynchronous GRPO stops with {said}", changes=changes
        )
