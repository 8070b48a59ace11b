"""Faults a run meets once it has checkpoints, tried as a user would on the real CLI, worker and reward server: each
ends with its exit code and one line that names the cause (and the fix), no traceback, no process left and no
partial file.

- The newest checkpoint damaged (a shard cut short): named in one line, moved aside, and the run resumes from the
  newest intact one with its records cut back to it; with none intact, exit 1 and the override that starts over.
- The reward server the run started stops answering (SIGSTOP): a line at least every heartbeat with what the run
  waits for, the attempt and the time left; its patience stated where it starts; exit 1 after a checkpoint, with the
  fix for a server the run started (a rerun).

One two-step run is made once (a module fixture); each case runs on a copy of its directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from run_helpers import FAST, descendants, kill_group, rlsteps
from test_bad_inputs import files_under, leftover_processes, marked

pytestmark = pytest.mark.slow  # runs the tiny step end to end

CHECKPOINTED = ("train.max_steps=2", "checkpoint.interval=1", *FAST)


@pytest.fixture(scope="module")
def two_steps(tiny_world, tmp_path_factory) -> Path:
    """The run directory of a two-step run with checkpoints step_1 and step_2."""
    work = tmp_path_factory.mktemp("two_steps")
    done = rlsteps("run", "rl/rs", "-c", "tiny", *CHECKPOINTED, f"output.dir={work / 'run'}", cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (work / "run" / "checkpoints").iterdir()) == ["step_1", "step_2"]
    return work / "run"


@pytest.fixture
def copied(two_steps, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    return run


def steps_recorded(run: Path, name: str = "metrics.jsonl") -> list[int]:
    return [json.loads(line)["step"] for line in (run / name).read_text().splitlines()]


def assert_no_partial_file(run: Path) -> None:
    checkpoints = run / "checkpoints"
    assert not list(checkpoints.glob("tmp_*")) and not list(checkpoints.glob("trash_*"))
    for name in ("metrics.jsonl", "samples.jsonl"):
        text = (run / name).read_text()
        assert text.endswith("\n") and [json.loads(line) for line in text.splitlines()]


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_intact_one(copied, monkeypatch):
    shard = next((copied / "checkpoints" / "step_2" / "state").glob("*.distcp"))
    os.truncate(shard, 100_000)
    marker = marked(monkeypatch)
    done = rlsteps("run", "rl/rs", "-c", "tiny", *CHECKPOINTED, "train.max_steps=3", f"output.dir={copied}",
                   cwd=copied.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [said] = [line for line in done.stderr.splitlines() if "is damaged" in line]
    aside = copied / "checkpoints" / "damaged_step_2"
    cut_short = re.escape(f"{shard} is cut short: 100000 bytes where .metadata places tensors up to byte ")
    moved = re.escape(f"): moved aside to {aside}; resuming from step_1")
    assert re.fullmatch(rf"WARNING checkpoint step_2 is damaged \({cut_short}\d+{moved}", said), said
    assert f"resuming from {copied / 'checkpoints' / 'step_1'} (step 1," in done.stderr
    assert (aside / "COMPLETE").is_file() and shard.name in {p.name for p in (aside / "state").iterdir()}
    assert steps_recorded(copied) == [0, 1, 2, 3]  # step 2 made again, once
    assert sorted(p.name for p in (copied / "checkpoints").iterdir()) == ["damaged_step_2", "step_2", "step_3"]
    assert_no_partial_file(copied)
    assert leftover_processes(marker, str(copied), grace_s=2) == []


def test_a_shard_overwritten_in_place_is_found_by_its_content_and_the_output_stays_finite(copied):
    """Same length, same headers, other bytes (NaN where weights were): only the digests written with the checkpoint
    tell. The run resumes from step_1, never from the NaN, and its output holds finite weights only."""
    from rlsteps.engine.megatron.format import load_megatron_checkpoint

    shard = max((copied / "checkpoints" / "step_2" / "state").glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    nan = b"\x00\x00\xc0\x7f"  # float32 NaN
    data[len(data) // 4 : len(data) // 4 + 4096] = nan * 1024
    shard.write_bytes(bytes(data))
    done = rlsteps("run", "rl/rs", "-c", "tiny", *CHECKPOINTED, "train.max_steps=3", f"output.dir={copied}",
                   cwd=copied.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [said] = [line for line in done.stderr.splitlines() if "is damaged" in line]
    assert f"({shard} does not hold the bytes that were written (its SHA-256 differs))" in said, said
    assert said.endswith("resuming from step_1"), said
    assert steps_recorded(copied) == [0, 1, 2, 3]
    model, _ = load_megatron_checkpoint(copied / "policy")  # the output, a checkpoint_megatron
    assert all(bool(param.isfinite().all()) for param in model.parameters())


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_with_no_intact_checkpoint_the_run_stops_with_the_override_that_starts_over(copied, monkeypatch, dry_run):
    """Refused before the worker starts, and by the dry run alike (its job shown first), in the worker's words."""
    for step in (1, 2):
        os.truncate(copied / "checkpoints" / f"step_{step}" / "trainer_state.pt", 5_000)
    before = files_under(copied / "checkpoints")
    marker = marked(monkeypatch)
    done = rlsteps("run", "rl/rs", "-c", "tiny", *CHECKPOINTED, "train.max_steps=3", f"output.dir={copied}",
                   *(["--dry-run"] if dry_run else []), cwd=copied.parent)  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    newest = copied / "checkpoints" / "step_2"
    assert error.startswith(f"error: checkpoint {newest} is damaged ({newest}/"), error
    assert error.endswith("and no intact checkpoint is left to resume from"), error
    assert "\nfix: rerun with checkpoint.start_over_if_damaged=true to start over" in done.stderr
    assert files_under(copied / "checkpoints") == before  # nothing moved, nothing deleted
    assert steps_recorded(copied) == [0, 1, 2]  # the records stay as the stopped run left them
    assert leftover_processes(marker, str(copied), grace_s=2) == []


def test_the_worker_itself_refuses_to_start_over_on_damaged_checkpoints(copied):
    """The worker's own check (a run started by another launcher, or its checkpoints damaged after rlsteps looked)."""
    from rlsteps.contract.checkpoint_damage import no_intact_checkpoint
    from rlsteps.engine.checkpoints.integrity import set_aside_damaged
    from rlsteps.engine.checkpoints.resume import CheckpointError, CheckpointManager

    for step in (1, 2):
        os.truncate(copied / "checkpoints" / f"step_{step}" / "trainer_state.pt", 5_000)
    assert no_intact_checkpoint(copied / "checkpoints") is not None
    with pytest.raises(CheckpointError, match="no intact checkpoint is left to resume from"):
        set_aside_damaged(CheckpointManager(copied / "checkpoints"), start_over=False)


HEARTBEAT = re.compile(
    r"WARNING still waiting for the reward server at (http://127\.0\.0\.1:\d+): attempt (\d) of 2, \d+s so far, "
    r"gives up in \d+s at most"
)


def test_a_stalled_reward_server_is_waited_for_aloud_then_the_run_stops_with_a_rerun(copied, monkeypatch):
    monkeypatch.setenv("RLSTEPS_HEARTBEAT_S", "2")
    marker = marked(monkeypatch)
    quick = ("rm.timeout_s=3", "rm.max_retries=1", "train.max_steps=50")
    log = copied.parent / "terminal.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    argv = [sys.executable, "-m", "rlsteps.cli", "run", "rl/rs", "-c", "tiny", *CHECKPOINTED, *quick]
    with log.open("wb") as out:
        cli = subprocess.Popen([*argv, f"output.dir={copied}"], cwd=copied.parent, env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while 3 not in steps_recorded(copied):  # the server has answered a step of this run: then it stalls
            assert cli.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        [server] = [pid for pid, command in descendants(cli.pid).items() if "rlsteps.engine.rewards.rm" in command]
        os.kill(server, signal.SIGSTOP)
        stalled = time.monotonic()
        assert cli.wait(timeout=120) == 1
    finally:
        if cli.poll() is None:
            kill_group(cli)
    shown = log.read_text()
    assert "Traceback" not in shown
    told = re.search(
        r"each request waits up to 3s and is tried 2 times \(rm.timeout_s, rm.max_retries\): a server that "
        r"stops answering stops the run within (\d+)s",
        shown,
    )  # its patience, said at the start
    assert told and 12 <= int(told[1]) <= 15, shown[:3000]
    # the requests' heartbeats (a loaded machine may also show the start-up's, "... this run started to answer")
    beats = [HEARTBEAT.search(line) for line in shown.splitlines() if "still waiting for the reward server" in line]
    assert len(beats) >= 3 and all(beats), shown[-3000:]
    assert {b[2] for b in beats} == {"1", "2"}
    assert time.monotonic() - stalled < 60
    [error] = [line for line in shown.splitlines() if line.startswith("error:")]
    # at a step's scoring, or at the validation after a step when the stop lands after that step's scoring
    assert re.search(r"rewards unavailable at (step \d+|validation after step \d+): ", error), error
    assert f"the reward server this run started stopped answering (its log: {copied / 'rm_server.log'})" in error
    assert "a rerun starts it afresh" in error and "is intact and a rerun resumes from it" in error, error
    assert leftover_processes(marker, str(copied), grace_s=5) == []
    assert_no_partial_file(copied)
