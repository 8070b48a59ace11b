"""However the worker ends, its reward server ends with it, and the log says how it ended.

The real worker on the tiny world, detached with the local launcher: it starts the real reward
server (a uvicorn process in a session of its own), then is killed with SIGKILL, or cancelled with
`rlsteps jobs cancel` (SIGTERM to the job's process group, which does not hold the server).
"""

import os
import signal
import time
from pathlib import Path

import pytest

from rlsteps.contract.run_files import CHECKPOINTS_DIR
from rlsteps.engine.run.signals import EXIT_CHECKPOINTED, EXIT_TERMINATED
from rlsteps.launch.base import JobState
from run_helpers import descendants, processes
from test_local_launcher import LAUNCHER, start, wait_until_ended

SERVER_MODULE = "rlsteps.engine.rewards.rm"


@pytest.fixture
def here(tmp_path, monkeypatch, tiny_world):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text("profiles:\n  here: {executor: local}\n")
    return tmp_path


def wait_for_server(job_pid: int, timeout: float = 120) -> tuple[int, int]:
    """(worker pid, reward server pid) once the worker has started its server."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tree = descendants(job_pid)
        server = next((pid for pid, cmd in tree.items() if SERVER_MODULE in cmd), None)
        worker = next((pid for pid, cmd in tree.items() if "rlsteps.engine.run.worker" in cmd), None)
        if server and worker:
            return worker, server
        time.sleep(0.2)
    raise AssertionError(f"no reward server under job {job_pid} after {timeout}s")


def wait_gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid not in processes():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_a_worker_killed_with_sigkill_takes_its_reward_server_with_it(here):
    record = start()
    worker, server = wait_for_server(int(record.extra["pid"]))
    os.kill(worker, signal.SIGKILL)
    assert wait_gone(server), "the reward server outlived its killed worker"
    assert wait_until_ended(record) is JobState.FAILED


@pytest.mark.slow
def test_cancelling_a_detached_job_stops_its_reward_server_and_says_so_in_the_log(here):
    record = start()
    _, server = wait_for_server(int(record.extra["pid"]))
    LAUNCHER.cancel(record)
    assert wait_gone(server, timeout=5), "the reward server outlived the cancelled job"
    log = "\n".join(LAUNCHER.logs(record))
    assert "terminated (SIGTERM)" in log
    assert LAUNCHER.status(record).state is JobState.CANCELLED
    assert (Path(record.job_dir) / "exit_code").read_text().strip() == str(EXIT_TERMINATED)


@pytest.mark.slow
def test_sigusr1_writes_a_checkpoint_after_the_step_in_progress_and_exits_for_a_requeue(here):
    """What Slurm's --signal=USR1@SECONDS does before the time limit: checkpoint, stop, exit 75."""
    record = start()
    worker, server = wait_for_server(int(record.extra["pid"]))
    train_log = here / ".rlsteps" / "runs" / "rl_rs-tiny" / "train.log"
    deadline = time.monotonic() + 120
    while "step 1/16" not in (train_log.read_text() if train_log.exists() else ""):
        assert time.monotonic() < deadline, "the first step did not finish"
        time.sleep(0.2)
    os.kill(worker, signal.SIGUSR1)
    assert wait_until_ended(record) is JobState.FAILED
    assert (Path(record.job_dir) / "exit_code").read_text().strip() == str(EXIT_CHECKPOINTED)
    assert wait_gone(server, timeout=5)
    log = "\n".join(LAUNCHER.logs(record))
    assert "as asked (SIGUSR1" in log
    checkpoints = sorted((train_log.parent / CHECKPOINTS_DIR).glob("*/"))
    assert checkpoints, "no checkpoint written"
    assert not (train_log.parent / "policy").exists()  # stopped before the end: no output artifact yet
