"""A step scores its rollouts and computes the reference's log-probs at once (run/step.py `run_beside`): the reward
sources wait on servers in a thread of their own while this thread runs the reference's pass, which needs no reward.
By default only on an accelerator (`run.overlap_reference: auto`): on a CPU both share its cores.
"""

import threading

import pydantic
import pytest
import torch

from rlsteps.contract.config import GRPOConfig, ReinforceConfig, RSConfig, RunConfig
from rlsteps.engine.algorithms.grpo import GRPO
from rlsteps.engine.algorithms.reinforce import ReinforceRLOO
from rlsteps.engine.algorithms.rs import RejectionSampling
from rlsteps.engine.run.overlap import overlaps_reference, run_beside


def config(schema, algorithm: str, **section):
    cfg = {"algorithm": algorithm, "inputs": {"prompts": "-", "policy": "-"}, "output": {"dir": "-"}}
    cfg["rollout"] = {"top_n_rollouts": 1} if algorithm == "rs" else {}
    return schema.model_validate({**cfg, algorithm: section} if section else cfg)


def test_both_run_at_once_the_first_off_this_thread_and_both_results_come_back():
    first_started, second_started = threading.Event(), threading.Event()

    def first():
        first_started.set()
        assert second_started.wait(10), "the second never ran while the first waited: not at once"
        return threading.current_thread().name

    def second():
        second_started.set()
        assert first_started.wait(10), "the first never ran while the second waited: not at once"
        return threading.current_thread().name

    first_thread, second_thread = run_beside(first, second)
    assert first_thread == "rlsteps-scoring" and second_thread == threading.current_thread().name


def test_without_a_second_the_first_runs_here_alone():
    assert run_beside(lambda: threading.current_thread().name, None) == (threading.current_thread().name, None)


def test_an_error_of_either_is_raised_here_after_both_have_ended():
    finished = []

    def slow_first():
        threading.Event().wait(0.2)
        finished.append("first")
        return 1

    def failing_second():
        raise ValueError("the reference pass failed")

    with pytest.raises(ValueError, match="the reference pass failed"):
        run_beside(slow_first, failing_second)
    assert finished == ["first"]  # the scoring thread was waited for, not left behind

    def failing_first():
        raise ConnectionError("the judge is down")

    with pytest.raises(ConnectionError, match="the judge is down"):
        run_beside(failing_first, lambda: finished.append("second"))
    assert finished == ["first", "second"]


@pytest.mark.parametrize(
    "recipe, expected",
    [
        (lambda: GRPO(config(GRPOConfig, "grpo", kl_beta=0.01)), True),
        (lambda: GRPO(config(GRPOConfig, "grpo", kl_beta=0.0)), False),  # no reference at all
        # dynamic sampling drops flat groups before it asks for the reference: the pass waits for the rewards
        (lambda: GRPO(config(GRPOConfig, "grpo", kl_beta=0.01, dynamic_sampling=True)), False),
        (lambda: ReinforceRLOO(config(ReinforceConfig, "reinforce")), True),
        (lambda: RejectionSampling(config(RSConfig, "rs")), False),
    ],
    ids=["grpo", "grpo-no-kl", "grpo-dynamic-sampling", "reinforce", "rs"],
)
def test_the_reference_is_computed_beside_the_scoring_only_where_prepare_asks_for_every_rows(recipe, expected):
    assert recipe().reference_of_every_row() is expected


def test_the_reference_overlaps_the_scoring_on_an_accelerator_unless_the_config_says_otherwise():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert not overlaps_reference("auto", cpu) and overlaps_reference("auto", cuda)
    assert overlaps_reference(True, cpu) and not overlaps_reference(False, cuda)
    assert RunConfig().overlap_reference == "auto"
    assert RunConfig.model_validate({"overlap_reference": True}).overlap_reference is True
    with pytest.raises(pydantic.ValidationError, match="overlap_reference"):
        RunConfig.model_validate({"overlap_reference": "sometimes"})
