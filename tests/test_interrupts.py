"""An interrupt never loses finished work behind a promise.

A run whose step outlasts the stop grace (RLSTEPS_STOP_GRACE_S, made 1 s here; the step made 4 s by a slow reward
function, tests/slow_reward.py): SIGTERM past the grace stops it in the middle of the step and says truthfully that
no checkpoint exists yet; Ctrl-C (SIGINT) lets the step end however long it takes and checkpoints it; the rerun
resumes from that checkpoint.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from run_helpers import FAST, kill_group, run_dir, wait_for

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
ARGS = [
    "train.max_steps=3",
    "checkpoint.interval=10",  # no checkpoint but the last and the ones a stop writes
    "validation.interval=0",
    "rewards.slow.function=slow_reward:slow",
    "rewards.slow.batched=true",
    "rewards.slow.weight=0",
    *FAST,
]


def start(cwd: Path, log: Path, slow_calls: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "RLSTEPS_STOP_GRACE_S": "1",
        "SLOW_REWARD_DIR": str(cwd),
        "SLOW_REWARD_CALLS": slow_calls,
        "SLOW_REWARD_S": "4",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rlsteps.cli", "run", "rs", "-c", "tiny", *ARGS],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def interrupt_slow_step(cwd: Path, log: Path, slow_calls: str, sig: signal.Signals) -> tuple[int, str]:
    """Runs until a slow step starts, sends `sig` to rlsteps, and returns its exit code and what it said."""
    (cwd / "ready").unlink(missing_ok=True)
    cli = start(cwd, log, slow_calls)
    try:
        wait_for(cwd / "ready", 300, cli)
        cli.send_signal(sig)
        code = cli.wait(timeout=60)
    except (AssertionError, subprocess.TimeoutExpired) as error:
        raise AssertionError(f"{error}:\n{log.read_text()[-3000:]}") from None
    finally:
        kill_group(cli)
    return code, log.read_text()


def test_an_interrupted_step_longer_than_the_grace_is_checkpointed_by_ctrl_c_and_sigterm_says_what_is_kept(
    tiny_world, tmp_path
):
    run = run_dir(tmp_path, "rl_rs")
    # SIGTERM in step 2, which outlasts the grace: stopped in its middle, with no checkpoint to promise
    code, said = interrupt_slow_step(tmp_path, tmp_path / "term.log", "2,4", signal.SIGTERM)
    assert code == 143, said[-3000:]
    assert not list((run / "checkpoints").glob("step_*"))
    assert "no checkpoint yet: a rerun starts from step 0" in said, said[-3000:]
    assert "checkpoint is intact" not in said

    # Ctrl-C in step 2 of the rerun (the 4th step counted): the step ends past the grace and is checkpointed
    code, said = interrupt_slow_step(tmp_path, tmp_path / "int.log", "2,4", signal.SIGINT)
    assert code == 130, said[-3000:]
    assert re.search(r"stopped at step 2 after a checkpoint \(SIGINT\); .* resume from step 2", said), said[-3000:]
    assert (run / "checkpoints" / "step_2" / "COMPLETE").is_file()

    resumed = start(tmp_path, tmp_path / "resumed.log", "")
    try:
        assert resumed.wait(timeout=300) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    finally:
        kill_group(resumed)
    said = (tmp_path / "resumed.log").read_text()
    assert "resuming from" in said and "(step 2," in said, said[-3000:]
    assert (run / "checkpoints" / "step_3" / "COMPLETE").is_file()
