"""Where a NeMo-RL job's GPUs go: the policy (training and its colocated vLLM), the judge, the reward model.

The job holds the profile's nodes x GPUs. NeMo-RL's cluster.* is what its policy takes: on one node, the GPUs the
judge does not (NeMo-Gym starts the judge's vLLM in placement groups of its own on the GPUs left); on several, whole
nodes, and the judge gets whole nodes of its own (env.nemo_gym.num_gpu_nodes, as NeMo-RL's nemotron-3-super
stage3_rlhf does). NeMo-RL's reward-model environment takes GPUs beside the policy on one node, and a whole node on
several (NeMo-RL subtracts its nodes from cluster.num_nodes): there it is given every GPU of that node, so none
idles. A profile that cannot hold them all is refused with the arithmetic, before anything is submitted.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from rlsteps.dotted import get, put
from rlsteps.nemo_rl.batches import repair, split_of
from rlsteps.nemo_rl.environments import SERVE_KWARGS_PARALLEL, NemoRlConfigError, judge_gpus
from rlsteps.nemo_rl.key_map import JUDGE

JUDGE_DP = JUDGE + ".vllm_serve_kwargs.data_parallel_size"  # the user's key (the seed step's judge block)
COMPILED_JUDGE = "env.nemo_gym.genrm_model.responses_api_models.genrm_model"  # as compile_judge writes it


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_memory_gib: float | None = None  # each GPU's, as the profile states it (the memory estimate's)


def place(master: dict[str, Any], cluster: Cluster) -> list[str]:
    """cluster.*, the judge's nodes and the reward model's resources set in `master` for the job's GPUs; notes."""
    if cluster.gpus_per_node < 1:
        master["cluster"].update(num_nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node)
        return []
    judge = judge_gpus(master)
    if judge:
        notes = _place_beside_judge(master, cluster, judge)
    elif get(master, "env.reward_model") is not None and "reward_model" in _env_names(master):
        notes = _place_reward_model(master, cluster)
    else:
        master["cluster"].update(num_nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node)
        notes = []
    check_policy_gpus(master)
    return notes


def _place_beside_judge(master: dict[str, Any], cluster: Cluster, judge: int) -> list[str]:
    """The judge placed, the policy's GPUs splitting into model-parallel groups; where either fails, the fix is the
    judge's data_parallel_size nearest the one asked for with which both hold (a refusal in words without one)."""
    try:
        notes = _place_judge(master, cluster, judge)
        _check_groups(master)
        return notes
    except NemoRlConfigError as err:
        replicas = _judge_replicas_that_fit(master, cluster)
        if replicas is None:
            raise
        raise NemoRlConfigError(
            f"{err} (the judge's GPUs: {_judge_shape(master)})", changes={JUDGE_DP: replicas}
        ) from None


def _judge_shape(master: dict[str, Any]) -> str:
    kwargs = _judge_kwargs(master)
    return " x ".join(f"{key} {kwargs.get(key) or 1}" for key in SERVE_KWARGS_PARALLEL)


def _judge_kwargs(master: dict[str, Any]) -> dict[str, Any]:
    return get(master, COMPILED_JUDGE + ".vllm_serve_kwargs") or {}


def _judge_replicas_that_fit(master: dict[str, Any], cluster: Cluster) -> int | None:
    """The judge's data_parallel_size nearest the one asked for (more before fewer) with which the profile holds the
    judge and the policy's GPUs split into its model-parallel groups, each tried by placing it; None if none does."""
    kwargs = _judge_kwargs(master)
    asked = int(kwargs.get("data_parallel_size") or 1)
    replica = judge_gpus(master) // asked
    fits = []
    for replicas in range(1, cluster.nodes * cluster.gpus_per_node // replica + 1):
        trial = copy.deepcopy(master)
        put(trial, COMPILED_JUDGE + ".vllm_serve_kwargs.data_parallel_size", replicas)
        try:
            _place_judge(trial, cluster, replica * replicas)
            _check_groups(trial)
        except NemoRlConfigError:
            continue
        fits.append(replicas)
    return min(fits, key=lambda n: (abs(n - asked), -n)) if fits else None


def policy_nodes(master: dict[str, Any]) -> tuple[int, int]:
    """(nodes, GPUs per node) NeMo-RL's grpo.setup leaves the policy and its generation: less the reward model's
    GPUs on one node, its whole nodes on several."""
    nodes, per_node = master["cluster"]["num_nodes"], master["cluster"]["gpus_per_node"]
    rm = get(master, "env.reward_model.resources") if "reward_model" in _env_names(master) else None
    if rm and nodes == 1:
        per_node -= rm["gpus_per_node"]
    elif rm:
        nodes -= rm["num_nodes"]
    return nodes, per_node


def policy_gpus(master: dict[str, Any]) -> int:
    """The GPUs NeMo-RL's policy trains on, as its setup counts them (less a one-node reward model's, and less
    generation's own GPUs where it is not colocated)."""
    nodes, per_node = policy_nodes(master)
    generation = master["policy"]["generation"]["colocated"]
    if not generation["enabled"]:
        resources = generation["resources"]
        if nodes == 1:
            per_node -= int(resources.get("gpus_per_node") or 0)
        else:
            nodes -= int(resources.get("num_nodes") or 0)
    return max(nodes, 0) * max(per_node, 0)


def _place_judge(master: dict[str, Any], cluster: Cluster, judge: int) -> list[str]:
    total = cluster.nodes * cluster.gpus_per_node
    if cluster.nodes == 1:
        if judge >= cluster.gpus_per_node:
            raise NemoRlConfigError(
                f"the job's node has {cluster.gpus_per_node} GPU(s) and the judge takes {judge} "
                f"(vllm_serve_kwargs: tensor x data x pipeline parallel): none is left for the policy; give the "
                "profile another node for the judge, or a smaller judge"
            )
        master["cluster"].update(num_nodes=1, gpus_per_node=cluster.gpus_per_node - judge)
        master["env"]["nemo_gym"]["num_gpu_nodes"] = 0
        return [f"GPUs: policy {cluster.gpus_per_node - judge} + judge {judge} on one node of {total}"]
    judge_nodes = math.ceil(judge / cluster.gpus_per_node)
    if judge_nodes >= cluster.nodes:
        raise NemoRlConfigError(
            f"the judge takes {judge} GPU(s) = {judge_nodes} node(s) of {cluster.gpus_per_node}, and the job has "
            f"{cluster.nodes}: no node is left for the policy; give the profile more nodes"
        )
    master["cluster"].update(num_nodes=cluster.nodes - judge_nodes, gpus_per_node=cluster.gpus_per_node)
    master["env"]["nemo_gym"]["num_gpu_nodes"] = judge_nodes
    notes = [
        f"GPUs: policy {cluster.nodes - judge_nodes} node(s) x {cluster.gpus_per_node} + judge {judge_nodes} "
        f"node(s) of its own, {cluster.nodes} in all"
    ]
    idle = judge_nodes * cluster.gpus_per_node - judge
    if idle:
        notes.append(f"the judge's node(s) leave {idle} GPU(s) idle: raise its data_parallel_size to use them")
    return notes


def _place_reward_model(master: dict[str, Any], cluster: Cluster) -> list[str]:
    resources = master["env"]["reward_model"]["resources"]
    master["cluster"].update(num_nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node)
    if cluster.nodes == 1:
        wanted = int(resources.get("gpus_per_node") or 1)
        if wanted >= cluster.gpus_per_node:
            raise NemoRlConfigError(
                f"the job's node has {cluster.gpus_per_node} GPU(s) and the reward model takes {wanted}: none is "
                "left for the policy; give the profile more GPUs or nodes"
            )
        resources.update(gpus_per_node=wanted, num_nodes=1)
        return [f"GPUs: policy {cluster.gpus_per_node - wanted} + reward model {wanted} on one node"]
    resources.update(gpus_per_node=cluster.gpus_per_node, num_nodes=1)
    return [
        f"GPUs: policy {cluster.nodes - 1} node(s) x {cluster.gpus_per_node} + the reward model on a node of its "
        f"own, all {cluster.gpus_per_node} GPUs (data parallel)"
    ]


def model_parallel(master: dict[str, Any]) -> int:
    """The policy's model-parallel group: tensor x pipeline x context parallel (NeMo-RL's Policy)."""
    policy = master["policy"]
    if policy["megatron_cfg"].get("enabled"):
        megatron = policy["megatron_cfg"]
        return (
            megatron["tensor_model_parallel_size"]
            * megatron["pipeline_model_parallel_size"]
            * megatron["context_parallel_size"]
        )
    return policy["dtensor_cfg"]["tensor_parallel_size"] * policy["dtensor_cfg"]["context_parallel_size"]


def check_policy_gpus(master: dict[str, Any]) -> None:
    """The policy's GPUs as placed (after generation or a server took some): its model-parallel groups and the
    first step's split of rows over its data-parallel ranks."""
    _check_groups(master)
    _check_policy_split(master, policy_gpus(master))


def _check_groups(master: dict[str, Any]) -> None:
    """NeMo-RL's Policy: the world size at least, and a multiple of, PP x CP x TP."""
    gpus, group = policy_gpus(master), model_parallel(master)
    if gpus < group or gpus % group:
        raise NemoRlConfigError(f"the policy's {gpus} GPU(s) do not split into model-parallel groups of {group}")


def _check_policy_split(master: dict[str, Any], gpus: int) -> None:
    """Each step's rows over the data-parallel ranks, as NeMo-RL's first step asserts (batches)."""
    group = model_parallel(master)
    split = split_of(master, gpus // group)
    problems = split.problems()
    if problems:
        changes = repair(split)
        raise NemoRlConfigError(
            f"NeMo-RL would stop at its first step: {problems[0]}; a step makes {split.prompts} prompts x "
            f"{split.generations} generations = {split.rows} rows over {split.data_parallel} data-parallel rank(s) "
            f"({gpus} GPU(s) / model parallel {group})",
            changes=changes,  # the fix says them
        )


def _env_names(master: dict[str, Any]) -> set[str]:
    """The environments the data names (NeMo-RL starts only those)."""
    data = master.get("data") or {}
    names = {get(data, "default.env_name")}
    for section in ("train", "validation"):
        names.add(get(data, f"{section}.env_name"))
    return {name for name in names if name}
