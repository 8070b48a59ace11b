"""The logical nodes of the in-process Ray (tests/standin_ray.py): their GPUs and CPUs, placement groups reserved on
them by Ray's strategies (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD), and each actor's GPUs taken from its bundle. A
request no node or bundle can hold is refused at once with the arithmetic (Unschedulable), where Ray would wait."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

CLUSTER: dict[str, Any] = {"nodes": [], "groups": [], "removed": []}  # groups: those that hold their bundles


class Unschedulable(RuntimeError):
    """What real Ray would wait on forever: the cluster cannot hold the request."""


@dataclass
class Node:
    node_id: str
    gpus: float
    cpus: float
    free_gpus: float = 0.0
    free_cpus: float = 0.0

    def __post_init__(self) -> None:
        self.free_gpus, self.free_cpus = self.gpus, self.cpus


@dataclass
class Bundle:
    node: Node
    gpus: float
    cpus: float
    gpus_used: float = 0.0
    gpu_ids: list[int] = field(default_factory=list)


def reset(node_count: int, gpus_per_node: int, cpus_per_node: int) -> None:
    """A fresh cluster of `node_count` nodes, each with its GPUs and CPUs free (Ray's node ids are 56 hex digits)."""
    CLUSTER.update(
        nodes=[Node(f"node{i:02d}" + "0" * 52, gpus_per_node, cpus_per_node) for i in range(node_count)],
        groups=[],
        removed=[],
    )


class PlacementGroup:
    _ids = itertools.count()

    def __init__(self, bundles: list[Bundle], specs: list[dict], strategy: str, name: str) -> None:
        self.bundles, self.bundle_specs, self.strategy, self.name = bundles, specs, strategy, name
        self.id = f"pg-{next(self._ids)}"
        self.state = "CREATED"

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def ready(self):
        from standin_ray import ObjectRef

        return ObjectRef(self)


@dataclass
class PlacementGroupSchedulingStrategy:
    placement_group: PlacementGroup
    placement_group_bundle_index: int = -1
    placement_group_capture_child_tasks: bool | None = None


@dataclass
class NodeAffinitySchedulingStrategy:
    node_id: str
    soft: bool = False


def _place(specs: list[dict], strategy: str) -> list[Node]:
    """The node of each bundle, as Ray's strategies choose; Unschedulable when the cluster cannot hold them."""
    nodes: list[Node] = CLUSTER["nodes"]
    free = {n.node_id: [n.free_gpus, n.free_cpus] for n in nodes}

    def take(node: Node, spec: dict) -> bool:
        room = free[node.node_id]
        if room[0] >= spec.get("GPU", 0) and room[1] >= spec.get("CPU", 0):
            room[0] -= spec.get("GPU", 0)
            room[1] -= spec.get("CPU", 0)
            return True
        return False

    chosen: list[Node] = []
    if strategy in ("STRICT_PACK", "PACK"):
        for node in nodes:  # STRICT_PACK: one node holds all; PACK: as few nodes as it can
            trial = dict((k, list(v)) for k, v in free.items())
            if all(take(node, spec) for spec in specs):
                return [node] * len(specs)
            free.clear()
            free.update(trial)
        if strategy == "STRICT_PACK":
            raise Unschedulable(f"no node can hold all {len(specs)} bundles {specs} (STRICT_PACK)")
    spread = strategy in ("SPREAD", "STRICT_SPREAD")
    for spec in specs:
        # SPREAD: the node holding the fewest of this group's bundles first; else in order
        candidates = sorted(nodes, key=lambda n: sum(c is n for c in chosen)) if spread else nodes
        strict = strategy == "STRICT_SPREAD"
        node = next((n for n in candidates if not (strict and n in chosen) and take(n, spec)), None)
        if node is None:
            raise Unschedulable(
                f"the cluster ({len(nodes)} node(s) x {nodes[0].gpus:g} GPU(s)) cannot hold bundle {spec} after "
                f"{len(chosen)} of {len(specs)} bundles ({strategy})"
            )
        chosen.append(node)
    return chosen


def placement_group(bundles: list[dict], strategy: str = "PACK", name: str = "", **_) -> PlacementGroup:
    nodes = _place(bundles, strategy)
    placed = []
    for node, spec in zip(nodes, bundles):
        node.free_gpus -= spec.get("GPU", 0)
        node.free_cpus -= spec.get("CPU", 0)
        placed.append(Bundle(node, spec.get("GPU", 0), spec.get("CPU", 0)))
    for node in {b.node.node_id: b.node for b in placed}.values():  # the node's GPU ids, as Ray numbers them
        taken = {i for pg in CLUSTER["groups"] for b in pg.bundles if b.node is node for i in b.gpu_ids}
        ids = (i for i in range(int(node.gpus)) if i not in taken)
        for bundle in (b for b in placed if b.node is node):
            bundle.gpu_ids = [next(ids) for _ in range(int(bundle.gpus))]
    group = PlacementGroup(placed, [dict(b) for b in bundles], strategy, name)
    CLUSTER["groups"].append(group)
    return group


def remove_placement_group(group: PlacementGroup) -> None:
    """Its bundles freed; Ray's table keeps it, REMOVED, with the GPUs it held."""
    for bundle in group.bundles:
        bundle.node.free_gpus += bundle.gpus
        bundle.node.free_cpus += bundle.cpus
    group.state = "REMOVED"
    CLUSTER["groups"].remove(group)
    CLUSTER["removed"].append(group)


def placement_group_table(group: PlacementGroup | None = None) -> dict[str, Any]:
    """Ray's table entry of `group`; with no group, every group's by id (as ray.util.placement_group_table)."""
    if group is None:
        return {g.id: placement_group_table(g) for g in CLUSTER["removed"] + CLUSTER["groups"]}
    return {
        "placement_group_id": group.id,
        "name": group.name,
        "strategy": group.strategy,
        "state": group.state,
        "bundles": dict(enumerate(group.bundle_specs)),
        "bundles_to_node_id": {i: b.node.node_id for i, b in enumerate(group.bundles)},
    }


def gpu_ids(group: PlacementGroup) -> list[list[int]]:
    """The GPU ids of each bundle of `group` on its node (Ray's table does not say them)."""
    return [list(bundle.gpu_ids) for bundle in group.bundles]


def bundle_for(options: dict[str, Any]) -> Bundle | None:
    """The bundle an actor or task runs in; its GPU request taken from it (Unschedulable if it cannot)."""
    strategy = options.get("scheduling_strategy")
    if not isinstance(strategy, PlacementGroupSchedulingStrategy):
        return None
    group, index = strategy.placement_group, strategy.placement_group_bundle_index
    if group.state == "REMOVED":
        raise Unschedulable(f"placement group {group.name!r} was removed")
    bundle = group.bundles[max(index, 0)]
    wanted = float(options.get("num_gpus") or 0)
    if bundle.gpus_used + wanted > bundle.gpus + 1e-9:
        raise Unschedulable(
            f"bundle {index} of {group.name!r} has {bundle.gpus - bundle.gpus_used:g} of {bundle.gpus:g} GPU(s) "
            f"left; an actor asks for {wanted:g}"
        )
    bundle.gpus_used += wanted
    return bundle


def cluster_resources() -> dict[str, float]:
    nodes = CLUSTER["nodes"]
    return {"GPU": sum(n.gpus for n in nodes), "CPU": sum(n.cpus for n in nodes)}


def available_resources() -> dict[str, float]:
    nodes = CLUSTER["nodes"]
    return {"GPU": sum(n.free_gpus for n in nodes), "CPU": sum(n.free_cpus for n in nodes)}


def nodes() -> list[dict[str, Any]]:
    return [
        {
            "NodeID": n.node_id,
            "Alive": True,
            "NodeManagerAddress": "127.0.0.1",
            "NodeName": f"node{i}",
            "Resources": {"GPU": n.gpus, "CPU": n.cpus, f"node:127.0.0.{i + 1}": 1.0},
            "Labels": {},
        }
        for i, n in enumerate(CLUSTER["nodes"])
    ]
