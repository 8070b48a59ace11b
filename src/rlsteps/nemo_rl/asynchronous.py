"""rollout.max_age_steps compiled to NeMo-RL's asynchronous GRPO (grpo.async_grpo), with what its loop asserts.

NeMo-RL v0.7.0's async_grpo_train generates beside training and trains on trajectories at most
max_trajectory_age_steps optimizer steps old. It asserts vLLM's async engine, the importance-sampling correction
and generation on GPUs of its own (grpo.py:3364-3421); a recipe that asks for rollouts beside training gets all
three set, and the notes say so. NeMo-RL's own config (rl/nemo_rl/rlhf) is taken as written: policy_checks refuses
what its loop would stop on, with the keys that pass.
"""

from __future__ import annotations

from typing import Any

from rlsteps.dotted import get, put
from rlsteps.nemo_rl.placement import check_policy_gpus, policy_gpus, policy_nodes

AGE = "rollout.max_age_steps"
COLOCATED = "policy.generation.colocated"


def compile_asynchronous(cfg: dict[str, Any]) -> dict[str, Any]:
    """The NeMo-RL keys a recipe's rollout.max_age_steps sets (none at 0: the synchronous loop)."""
    age = get(cfg, AGE) or 0
    if not age:
        return {}
    return {
        "grpo": {"async_grpo": {"enabled": True, "max_trajectory_age_steps": age}},
        "policy": {"generation": {"vllm_cfg": {"async_engine": True}}},
        "loss_fn": {"use_importance_sampling_correction": True},
    }


def asynchronous_notes(cfg: dict[str, Any]) -> list[str]:
    age = get(cfg, AGE) or 0
    if not age:
        return []
    notes = [
        f"{AGE}={age}: grpo.async_grpo.enabled=true, max_trajectory_age_steps={age} (NeMo-RL's asynchronous GRPO: "
        "vLLM's async engine generates beside training on GPUs of its own; the importance-sampling correction "
        "weighs each trajectory by how far the trained policy has moved from the one that drew it)",
        f"rollout ages: NeMo-RL trains on trajectories at most {age} step(s) old, as its replay buffer has them; the "
        f"embedded engine's are exactly {age} once the first {age} step(s) are past (a fixed lag: a resume draws the "
        "same rollouts again)",
    ]
    if not get(cfg, "train.truncated_importance_sampling"):
        notes.append(
            "loss_fn.use_importance_sampling_correction: true although train.truncated_importance_sampling is "
            "false (NeMo-RL's asynchronous loop asserts it)"
        )
    return notes


def own_generation_gpus(master: dict[str, Any]) -> dict[str, Any]:
    """vLLM on GPUs of its own, as NeMo-RL's grpo.setup takes them from the policy's share of the cluster (what a
    reward model leaves): half of one node's GPUs beside training, or half of several nodes (whole nodes, their
    gpus_per_node the cluster's)."""
    nodes, per_node = policy_nodes(master)
    vllm = master["policy"]["generation"]["vllm_cfg"]
    engine = int(vllm.get("tensor_parallel_size") or 1) * int(vllm.get("pipeline_parallel_size") or 1)
    if nodes == 1:
        gpus = max(engine, per_node // 2 // engine * engine)
        resources = {"gpus_per_node": gpus, "num_nodes": 1}
    else:
        resources = {"gpus_per_node": master["cluster"]["gpus_per_node"], "num_nodes": max(nodes // 2, 1)}
    return {
        f"{COLOCATED}.enabled": False,
        **{f"{COLOCATED}.resources.{key}": value for key, value in resources.items()},
    }


def separate_generation(master: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """A recipe's rollouts beside training: generation moved off the policy's GPUs (set in place, once the cluster is
    placed), the policy's GPUs checked again; the note says the split."""
    if not get(cfg, AGE) or not get(master, f"{COLOCATED}.enabled") or master["cluster"]["gpus_per_node"] < 1:
        return []
    for key, value in own_generation_gpus(master).items():
        put(master, key, value)
    check_policy_gpus(master)
    resources = get(master, f"{COLOCATED}.resources")
    nodes, _ = policy_nodes(master)
    where = f"{resources['gpus_per_node']} GPU(s) of the node" if nodes == 1 else f"{resources['num_nodes']} node(s)"
    return [
        f"{COLOCATED}.enabled: false, vLLM on {where} of its own, the policy training on {policy_gpus(master)} "
        "(asynchronous GRPO generates beside training)"
    ]
