"""Composed rewards in whole tiny runs: rejection sampling with the judge and a function beside it, a function that
fails stopping the run with its name and the sample, a hack term beside the reward model named by the reward-hacking
watch as it takes over, and inputs asked for only by the terms that use them."""

from __future__ import annotations

import json
import time

import pytest

from rlsteps.contract.run_files import read_metrics
from rlsteps.engine.records.metrics import metric_series
from rlsteps.engine.records.reward_hacking import repeated_word
from rlsteps.tiny.task import MAX_COUNTED_POSITIVES, adjective_count
from run_helpers import FAST, rlsteps, run_dir, series

TRUE_REWARD = "rlsteps.tiny.task:true_reward"
SHORT = [*FAST, "train.max_steps=2", "validation.interval=2", "checkpoint.interval=2", "validation.num_prompts=8"]


@pytest.mark.slow
def test_rejection_sampling_with_the_judge_and_a_function_logs_each_term(tmp_path):
    """rl/rs takes the judge (pairwise within a prompt's rollouts) and the tiny world's true reward at weight 0.5;
    each is logged as reward/<name>, greedy validation too, and a sample record shows both."""
    done = rlsteps(
        "run", "rl/rs", "-c", "tiny", *SHORT, "rewards.reward_model=null",
        "inputs.judge_model=${tiny:reward_model}", "judge.model=tiny-judge",
        "rewards.judge.source=judge", f"rewards.true.function={TRUE_REWARD}", "rewards.true.weight=0.5",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(tmp_path, "rl_rs")
    assert len(series(run, "reward/judge")) == 2 and len(series(run, "reward/true")) == 2
    # greedy validation's judge meets the initial policy's answers: no figure at step 0, where every answer is one
    assert metric_series(read_metrics(run / "metrics.jsonl"), "val/reward/judge")[0] == [2]
    assert len(series(run, "val/reward/true")) == 2
    assert series(run, "val/reward/true") == series(run, "val/true_reward")  # the same function, trained and shown
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    judged = [r for r in records if r["split"] == "val" and r["valid"]]
    assert judged and all(r["step"] == 2 and set(r["rewards"]) == {"judge", "true"} and r["judge"] for r in judged)
    for record in judged:  # the judge's answers beside the terms, and the reward their weighted sum
        assert record["reward"] == pytest.approx(record["rewards"]["judge"] + 0.5 * record["rewards"]["true"], abs=1e-5)
    assert (run / "validation_references.json").is_file()  # what greedy validation meets: the first responses
    assert (run / "policy").is_dir()


@pytest.mark.slow
def test_a_run_trained_against_its_validation_function_says_it_sees_reward_hacking(tmp_path):
    """rl/reinforce trained on minus the tiny world's true reward, validated (sampled) on the true reward: the trained
    reward rises as the function falls, their rank correlation is -1, and the run says so in one line with two samples
    and the remedies, then again at its end."""
    done = rlsteps(
        "run", "rl/reinforce", "-c", "tiny", *FAST, "train.max_steps=6", "validation.interval=3",
        "checkpoint.interval=0", "validation.samples_per_prompt=2", "rewards.reward_model=null",
        f"rewards.true.function={TRUE_REWARD}", "rewards.true.weight=-1", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(tmp_path, "rl_reinforce")
    assert series(run, "val/rank_correlation/true_reward") == [-1.0] * 3  # the trained reward is minus the function
    assert all(0 < h < 5 for h in series(run, "train/entropy")) and len(series(run, "train/distinct_responses")) == 6
    said = [line for line in done.stderr.splitlines() if "reward hacking? step" in line]
    assert said and "the trained reward rising while val/true_reward falls" in done.stderr, done.stderr[-3000:]
    assert "the reward has one term (true): raise the KL penalty (reinforce.initial_policy_kl_penalty)" in done.stderr
    records = [json.loads(line) for line in (run / "reward_hacking.jsonl").read_text().splitlines()]
    assert "diverging val/true_reward" in {r["sign"] for r in records}
    summary = done.stderr.split("signs of reward hacking over the run (reward_hacking.jsonl):")[1]
    assert all(r["line"] in summary for r in records)


def runs_long(sample: dict) -> bool:
    return not sample["ended"] or adjective_count(sample["response"]) > MAX_COUNTED_POSITIVES


def says_a_word_again(sample: dict) -> bool:
    return repeated_word(sample["response"]) is not None


@pytest.mark.slow
@pytest.mark.parametrize(
    "hack, weight, signs, carries",
    [
        ("per_word", 100, {"longer answers", "unended answers"}, runs_long),
        ("per_repeat", 300, {"repeated words"}, says_a_word_again),
    ],
    ids=["length", "repeat"],
)
def test_a_hack_term_is_named_from_the_rollouts_as_it_takes_over(tmp_path, hack, weight, signs, carries):
    """rl/reinforce with a term of rlsteps.tiny.hacks beside the reward model, at a rate that moves the policy off its
    sentence (train.lr 3e-3: at the config's 1.5e-3 a per-word term only fills the sentence's four adjectives in 12
    steps; at 4e-3 on the tiny world v20 it took over by step 5 so wholly that no rollout ended, and the run stopped
    after three steps without an update, as it should), at weight 100 for length and 300 for repeats (at 100 the
    policy of world v21, whose SFT pushes down a word said again in lists of any order, never took over): the rollouts
    (all of them in samples.jsonl) mostly carry the hack from some step on, and within two validations of it the watch
    names it from the rollouts themselves, quoting rollouts that carry it, and advises the clip that caps the hack
    term."""
    done = rlsteps(
        "run", "rl/reinforce", "-c", "tiny", *FAST, "train.max_steps=10", "validation.interval=2",
        "checkpoint.interval=0", "logging.samples_per_step=128", f"rewards.hack.function=rlsteps.tiny.hacks:{hack}",
        f"rewards.hack.weight={weight}", "train.lr=3e-3", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_dir(tmp_path, "rl_reinforce")
    rollouts = [
        r for line in (run / "samples.jsonl").read_text().splitlines() if (r := json.loads(line))["split"] == "train"
    ]
    carrying = [step for step in range(1, 11) if sum(carries(r) for r in rollouts if r["step"] == step) > 64]
    assert carrying, "the hack never took over"
    named = [
        r
        for line in (run / "reward_hacking.jsonl").read_text().splitlines()
        if (r := json.loads(line))["sign"] in signs
    ]
    assert named and named[0]["step"] <= carrying[0] + 2 * 2, (carrying, named)
    quoted = named[0]["line"].split("; e.g. ")[1].split("; ")[0]
    assert any(
        json.dumps(" ".join(r["response"].split()))[:40] in quoted
        for r in rollouts
        if r["step"] == named[0]["step"] and carries(r)
    ), quoted
    assert "the term hack grew to outweigh the others" in named[0]["line"], named[0]["line"]
    assert "rewards.hack.clip=[" in named[0]["line"]  # with numbers: the others pay between answers
    assert len(series(run, "train/repeated_word_share")) == 10 and len(series(run, "train/fraction_ended")) == 10


FAILING = """
def reward(messages, response):
    if len(response) > 0:
        raise ZeroDivisionError("no score for " + messages[-1]["content"])
    return 0.0
"""


@pytest.mark.slow
def test_a_function_that_raises_stops_the_run_naming_it_and_the_sample(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(FAILING)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    done = rlsteps(
        "run", "rl/reinforce", "-c", "tiny", *SHORT, "rewards.reward_model=null",
        "rewards.mine.function=my_rewards:reward", "validation.interval=0", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "rewards unavailable at step 1: reward function mine (my_rewards:reward) on sample 0" in done.stderr
    assert "raised ZeroDivisionError: no score for" in done.stderr and "Traceback" not in done.stderr
    assert not (run_dir(tmp_path, "rl_reinforce") / "policy").exists()


EXITING = """
import pathlib, sys

calls = pathlib.Path(__file__).with_name("calls")


def reward(messages, response):
    calls.write_text(str(int(calls.read_text() if calls.exists() else "0") + 1))
    if int(calls.read_text()) > {after}:  # the rows of the first {after} calls: step 1's
        sys.exit(0)
    return 1.0
"""


@pytest.mark.slow
def test_a_function_that_calls_sys_exit_0_fails_the_run_after_a_checkpoint_and_jobs_agrees(tmp_path, monkeypatch):
    """sys.exit(0) in a reward function is a failure, not a run that ended well: exit 1, one line naming the function,
    the sample and the call, step 1's checkpoint kept, and `rlsteps jobs list` saying the same exit code."""
    (tmp_path / "my_rewards.py").write_text(EXITING.format(after=8))  # step 1: 2 prompts x 4 rollouts, one call each
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    done = rlsteps(
        "run", "rl/reinforce", "-c", "tiny", *SHORT, "rewards.reward_model=null", "rollout.prompts_per_step=2",
        "rollout.num_rollouts_per_prompt=4", "checkpoint.interval=1", "rewards.mine.function=my_rewards:reward",
        "validation.interval=0", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "reward function mine (my_rewards:reward) on sample 0" in error, error
    assert f"called sys.exit(0) at {tmp_path / 'my_rewards.py'}:10" in error, error
    assert "Traceback" not in done.stderr
    run = run_dir(tmp_path, "rl_reinforce")
    assert (run / "checkpoints" / "step_1" / "COMPLETE").is_file() and not (run / "policy").exists()
    [job] = json.loads(rlsteps("jobs", "list", "--json", cwd=tmp_path).stdout)
    assert job["state"] == "failed" and "exit code 1" in job["detail"], job


VANISHING = """
import os


def reward(messages, response):
    os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("detached", [False, True], ids=["attached", "detached"])
def test_a_worker_that_ends_with_os_exit_0_is_a_failed_run(tmp_path, monkeypatch, detached):
    """os._exit(0) leaves no exception to catch: the launcher sees exit code 0 without the worker's exit record, and
    says the run failed (exit 1, its cause), attached on the terminal and detached in `rlsteps jobs`."""
    (tmp_path / "my_rewards.py").write_text(VANISHING)
    (tmp_path / "rlsteps.yaml").write_text("profiles:\n  here: {executor: local}\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    done = rlsteps(
        "run", "rl/reinforce", "-c", "tiny", *SHORT, "rewards.reward_model=null", *(["-b", "here"] if detached else []),
        "rewards.mine.function=my_rewards:reward", "validation.interval=0", cwd=tmp_path,
    )  # fmt: skip
    if not detached:
        assert done.returncode == 1, done.stderr[-3000:]
        [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert "failed with exit code 1: the worker ended with exit code 0 before it finished" in error, error
    else:
        assert done.returncode == 0, done.stderr[-3000:]
        deadline = time.monotonic() + 120
        while (job := json.loads(rlsteps("jobs", "list", "--json", cwd=tmp_path).stdout)[0])["state"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert job["state"] == "failed" and "exit code 1" in job["detail"], job
    assert not (run_dir(tmp_path, "rl_reinforce") / "policy").exists()


def test_a_function_module_that_exits_on_import_is_refused_naming_it(tmp_path, monkeypatch):
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from rlsteps.engine.rewards.functions import RewardFunctionError, load_reward_function

    with pytest.raises(
        RewardFunctionError, match=r"importing exits_on_import called sys.exit\(0\) at .*exits_on_import.py:2"
    ):
        load_reward_function("exits_on_import:reward")


def test_a_reward_model_is_asked_for_only_when_a_term_uses_it(tmp_path):
    common = ["run", "rl/reinforce", "-c", "tiny", "inputs.reward_model=null", "--dry-run"]
    asked = rlsteps(*common, cwd=tmp_path)
    assert asked.returncode == 0 and "inputs.reward_model=PATH   a reward_model_hf" in asked.stdout, asked.stderr
    functions_only = rlsteps(*common, "rewards.reward_model=null", f"rewards.true.function={TRUE_REWARD}", cwd=tmp_path)
    assert functions_only.returncode == 0 and "the run will need" not in functions_only.stdout, functions_only.stderr
    judged = rlsteps(*common, "rewards.reward_model.source=judge", cwd=tmp_path)
    assert "inputs.judge_model=PATH" in judged.stdout and "inputs.reward_model=PATH" not in judged.stdout
