"""Shared test setup: nothing is ever downloaded, and the offline tiny world is built once per machine."""

import os

# Set before anything imports transformers or huggingface_hub, so a missing file fails instead of downloading.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# An xdist worker starts with COLUMNS=80 in its environment, which rich's consoles would keep for good when the CLI
# is imported; without it they follow the width each test gives its runner, as in one process.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

from pathlib import Path

import pytest

# Tests that share a machine-wide resource run one after another on one xdist worker: the two-node Slurm cluster
# (a second job would queue behind the first and miss its deadlines) and vLLM (each engine takes gigabytes and
# every core it finds). Every other file runs whole on one worker, so its module fixtures are built once.
SHARED_RESOURCES = {
    "slurm": ("needs_cluster", "CLUSTER_PROBLEM"),
    "vllm": ("vllm_python(", "vllm_judge(", ".venv-vllm"),  # a vLLM started, not only its model folder read
}


def resource_group(path: Path) -> str:
    text = path.read_text()
    for group, signs in SHARED_RESOURCES.items():
        if any(sign in text for sign in signs):
            return group
    return path.stem


# The groups that take longest start first, so that short files fill the end instead of one long group holding
# the run up (the learning test alone takes about 7 minutes beside the other worker).
LONGEST_FIRST = ("test_verifiable_learning", "vllm", "slurm", "test_records_on_resume", "test_runs", "test_tiny")


def pytest_configure(config):
    if config.getoption("dist", "no") == "loadgroup":
        config.option.loadscopereorder = False  # xdist would order the groups by their number of tests instead


def pytest_collection_modifyitems(config, items):
    """With `-n N --dist loadgroup` (README's test command), group the tests as SHARED_RESOURCES says, the groups
    of LONGEST_FIRST first."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    groups: dict[Path, str] = {}
    for item in items:
        path = Path(str(item.path))
        if path not in groups:
            groups[path] = resource_group(path)
        item.add_marker(pytest.mark.xdist_group(groups[path]))

    def rank(item) -> int:
        group = groups[Path(str(item.path))]
        return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each group keeps its tests' order


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
