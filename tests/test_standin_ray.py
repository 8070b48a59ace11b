"""The logical cluster under the in-process Ray that runs NeMo-RL's code (tests/standin_ray_cluster.py): placement
groups land as Ray's strategies place them, GPUs are never handed out twice, and what real Ray would wait on forever
is refused at once."""

import pytest

import standin_ray_cluster as cluster

GPU = {"GPU": 1, "CPU": 1}


@pytest.fixture(autouse=True)
def two_nodes():
    cluster.reset(node_count=2, gpus_per_node=8, cpus_per_node=16)


def nodes_of(group) -> list[str]:
    return [cluster.CLUSTER["nodes"].index(bundle.node) for bundle in group.bundles]


def test_pack_fills_a_node_before_the_next_and_gpu_ids_are_the_nodes_own():
    first = cluster.placement_group([GPU] * 8, "PACK", "a")
    second = cluster.placement_group([GPU] * 8, "PACK", "b")
    assert nodes_of(first) == [0] * 8 and nodes_of(second) == [1] * 8
    assert [b.gpu_ids for b in second.bundles] == [[i] for i in range(8)]
    assert cluster.available_resources() == {"GPU": 0, "CPU": 16}
    with pytest.raises(cluster.Unschedulable, match="cannot hold bundle"):
        cluster.placement_group([GPU], "PACK", "c")


def test_spread_alternates_and_strict_strategies_refuse_what_they_cannot_keep():
    assert nodes_of(cluster.placement_group([GPU] * 4, "SPREAD", "s")) == [0, 1, 0, 1]
    with pytest.raises(cluster.Unschedulable):
        cluster.placement_group([{"CPU": 1}] * 3, "STRICT_SPREAD", "three on two nodes")
    with pytest.raises(cluster.Unschedulable, match="STRICT_PACK"):
        cluster.placement_group([GPU] * 9, "STRICT_PACK", "nine on a node of eight")


def test_an_actor_takes_its_gpus_from_its_bundle_and_a_removed_group_frees_them():
    group = cluster.placement_group([GPU] * 8, "PACK", "policy")
    place = cluster.PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=3)
    for _ in range(2):  # two worker groups colocated on one GPU, half each
        assert cluster.bundle_for({"scheduling_strategy": place, "num_gpus": 0.5}).gpu_ids == [3]
    with pytest.raises(cluster.Unschedulable, match="has 0 of 1 GPU"):
        cluster.bundle_for({"scheduling_strategy": place, "num_gpus": 0.5})
    cluster.remove_placement_group(group)
    assert cluster.available_resources()["GPU"] == 16
    (entry,) = cluster.placement_group_table().values()  # Ray's table keeps it, with the GPUs it held
    assert entry["state"] == "REMOVED" and cluster.gpu_ids(group)[3] == [3]
    with pytest.raises(cluster.Unschedulable, match="was removed"):
        cluster.bundle_for({"scheduling_strategy": place, "num_gpus": 1})
