"""Shared test setup: nothing is ever downloaded, and the offline tiny world is built once per machine."""

import os

# Set before anything imports transformers or huggingface_hub, so a missing file fails instead of downloading.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest


@pytest.fixture(scope="session")
def tiny_world():
    """The seed-0 tiny world under $RLSTEPS_HOME (CI sets it) or the per-user ~/.cache/rlsteps.

    Subprocesses (`rlsteps run ... -c tiny`) resolve the same folder from the same environment.
    """
    from rlsteps.tiny.build import ensure_tiny_world
    from rlsteps.tiny.layout import rlsteps_home

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
    """A Slurm cluster that must be up (RLSTEPS_REQUIRE_SLURM=1): its absence fails the test, with the reason."""
    from test_launch_slurm import CLUSTER_PROBLEM

    if CLUSTER_PROBLEM is not None:
        pytest.fail(f"no Slurm cluster here: {CLUSTER_PROBLEM} (RLSTEPS_REQUIRE_SLURM=1; CI runs .ci/slurm.sh up)")
