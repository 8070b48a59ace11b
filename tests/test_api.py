"""rlsteps from Python (rlsteps.api): docs/python-api.md's example run as it is written, a reward that is a closure,
and a failing callable or a bad key raising what the command line would say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import REPO

pytestmark = pytest.mark.slow  # tiny runs end to end

FAST = {"train.max_steps": 2, "run.num_threads": 1, "validation.interval": 2}


def test_the_documented_example_runs_as_written(tiny_world, tmp_path):
    page = (REPO / "docs" / "python-api.md").read_text()
    [example] = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps_line = done.stdout.strip().splitlines()[-2]
    assert steps_line.startswith("[1, 2] [") and steps_line.endswith(
        str(tmp_path / ".rlsteps/runs/rl_reinforce-tiny/policy")
    )


def test_a_closure_is_a_reward_term_and_the_run_reads_back(tiny_world, tmp_path, monkeypatch):
    import rlsteps

    monkeypatch.chdir(tmp_path)
    calls = []

    def word_count(messages, response):  # a closure over this test's list: only this process can call it
        calls.append(response)
        return float(len(response.split()))

    run = rlsteps.run("rl/rs", overrides=FAST, rewards={"words": (word_count, 0.0)}, say=lambda line: None)
    assert run.output.is_dir() and (run.output / "latest_checkpointed_iteration.txt").is_file()
    steps, values = run.series("reward/words")
    assert steps == [1, 2] and all(v > 0 for v in values)
    trained = [s for s in run.samples() if s["split"] == "train"]
    assert trained and all(s["rewards"]["words"] == len(s["response"].split()) for s in trained)
    assert len(calls) >= len(trained)
    assert rlsteps.run("rl/rs", overrides=FAST, rewards={"words": (word_count, 0.0)}).run_dir == run.run_dir  # done


def test_a_failing_callable_and_an_unknown_key_raise_what_the_command_line_says(tiny_world, tmp_path, monkeypatch):
    import rlsteps
    from rlsteps.errors import RunFailed, UsageError

    monkeypatch.chdir(tmp_path)

    def broken(messages, response):
        raise KeyError("no score")

    with pytest.raises(RunFailed, match=r"reward function broken \(rlsteps.api_rewards:broken\) on sample 0"):
        rlsteps.run("rl/reinforce", overrides={**FAST, "rewards.reward_model": None}, rewards={"broken": broken})
    with pytest.raises(UsageError, match="unknown config key 'train.lrr'"):
        rlsteps.run("rl/reinforce", overrides={"train.lrr": 1e-5})
    assert not Path(tmp_path / ".rlsteps" / "runs" / "rl_reinforce-tiny" / "policy").exists()
