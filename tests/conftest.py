"""Shared test setup: nothing is ever downloaded, and the offline tiny world is built once per machine."""

import os

# Set before anything imports transformers or huggingface_hub, so a missing file fails instead of downloading.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# An xdist worker starts with COLUMNS=80 in its environment, which rich's consoles would keep for good when the CLI
# is imported; without it they follow the width each test gives its runner, as in one process.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)


import pytest

from resource_groups import group_of, grouped_by_resource, make_scheduler, rank


def pytest_xdist_make_scheduler(config, log):
    """README's test command shares the tests out by the resource they use (resource_groups.py)."""
    return make_scheduler(config, log) if grouped_by_resource(config) else None


def pytest_collection_modifyitems(config, items):
    """Under README's test command, the groups of LONGEST_FIRST first, each group's tests in their order."""
    if not grouped_by_resource(config):
        return
    groups = {item.nodeid: group_of(item.nodeid, config.rootpath) for item in items}
    for item in items:  # the id-based group must agree with the fixtures pytest resolved
        if ("slurm_cluster" in item.fixturenames) != (groups[item.nodeid] == "slurm"):
            raise pytest.UsageError(f"{item.nodeid}: resource_groups.py places it wrongly (slurm_cluster fixture)")
    items.sort(key=lambda item: rank(groups[item.nodeid]))


# A world whose reward model trains this many steps instead of the recipe's (tests/lowest_versions.sh: the API tests
# build a world with every library the build calls, and leave the reward model's learning to the tests at the pinned
# versions, which are marked learned_reward_model)
REWARD_MODEL_STEPS = "RLSTEPS_TEST_REWARD_MODEL_STEPS"


@pytest.fixture(scope="session")
def tiny_world():
    """The seed-0 tiny world under $RLSTEPS_HOME (CI sets it) or the per-user ~/.cache/rlsteps.

    Subprocesses (`rlsteps run ... -c tiny`) resolve the same folder from the same environment.
    """
    from rlsteps.tiny.build import ensure_tiny_world
    from rlsteps.tiny.layout import rlsteps_home

    reward_model_steps = os.environ.get(REWARD_MODEL_STEPS)
    if reward_model_steps:
        if not os.environ.get("RLSTEPS_HOME"):  # the world's folder does not say how its reward model was trained
            raise pytest.UsageError(
                f"{REWARD_MODEL_STEPS} needs an RLSTEPS_HOME of its own: in the per-user one, its world would be "
                "every later tiny run's"
            )
        from rlsteps.tiny import hyperparameters

        hyperparameters.RM["steps"] = int(reward_model_steps)
    return ensure_tiny_world(seed=0, home=rlsteps_home())


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread: on a 2-core machine two threads fight (measured 25x slower)."""
    try:
        import torch
    except ImportError:  # the core installs without torch
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def slurm_cluster():
    """The Slurm cluster the test submits to. Without one the test skips, with the reason, unless
    RLSTEPS_REQUIRE_SLURM=1 (CI sets it) makes that a failure."""
    from test_launch_slurm import CLUSTER_PROBLEM

    if CLUSTER_PROBLEM is None:
        return
    if os.environ.get("RLSTEPS_REQUIRE_SLURM") == "1":
        pytest.fail(f"no Slurm cluster here: {CLUSTER_PROBLEM} (RLSTEPS_REQUIRE_SLURM=1; CI runs .ci/slurm.sh up)")
    pytest.skip(f"no Slurm cluster here: {CLUSTER_PROBLEM}; CI starts one with `bash .ci/slurm.sh up`")
