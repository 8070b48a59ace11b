"""One optimizer step over two processes: the policy's log-probs from the update, decided alike on both, give the
two-pass step's statistics and weights, and one process's (torchrun with gloo on the CPU, FSDP2)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from distributed_one_pass import OPTIONS, one_run  # noqa: E402
from rlsteps.engine.distributed import SINGLE  # noqa: E402
from test_distributed import assert_same_weights, torchrun  # noqa: E402

# Slow (torchrun with gloo, two processes a case): the fast tier, -m 'not slow', leaves it out
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "distributed_one_pass.py"


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict:
    return torchrun(SCRIPT, tmp_path_factory.mktemp("one_pass") / "two.pt")


@pytest.mark.parametrize("algorithm", list(OPTIONS))
def test_two_processes_take_the_log_probs_from_the_update_like_the_two_pass_step_and_one_process(
    two_processes, algorithm
):
    two_pass_stats, two_pass_weights = two_processes[(algorithm, True)]
    stats, weights = two_processes[(algorithm, False)]
    assert stats["optimizer_steps"] == two_pass_stats["optimizer_steps"] == 1
    assert stats.keys() == two_pass_stats.keys()
    assert stats == pytest.approx(two_pass_stats, rel=1e-5, abs=1e-7)
    # Adam's first step moves each weight by lr * g / (|g| + eps), lr 1e-3: where |g| is near eps a rounding apart in g
    # moves the weight by up to a few 1e-6 (CPUs with other vector units round the sums differently); 1% of a step
    assert_same_weights(weights, two_pass_weights, tolerance=1e-5)

    alone_stats, alone_weights = one_run(algorithm, False, SINGLE, torch.device("cpu"))
    del stats["train/reward_std"], alone_stats["train/reward_std"]  # the loop's is the whole step's, from the scores
    assert stats == pytest.approx(alone_stats, rel=1e-5, abs=1e-7)
    assert_same_weights(weights, alone_weights, tolerance=1e-5)
