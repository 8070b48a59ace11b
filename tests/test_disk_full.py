"""A full disk under output.dir: exit 1 with one line naming the directory and what to free, found as early as it
can be (before the run starts, when the disk has no room for a first checkpoint), and nothing half-written left
behind (no partial checkpoint, no torn record).

The disks are real: a small tmpfs mounted for the test (root only; skipped elsewhere). One more test injects
ENOSPC at a checkpoint's write boundary, where a real disk would have to fill at one exact moment.
"""

import errno
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlsteps.contract.disk import free_bytes
from rlsteps.engine.checkpoints.resume import CheckpointManager
from rlsteps.engine.records.metrics import append_whole, open_records
from rlsteps.errors import DiskFull
from run_helpers import FAST, kill_group, rlsteps, wait_for
from tmpfs import tmpfs_mounts

STOPPABLE = ["train.max_steps=3", "checkpoint.interval=1", "validation.interval=1", *FAST]


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of the given size (MB) under tmp_path; unmounted after the test."""
    with tmpfs_mounts(tmp_path) as mount:
        yield lambda megabytes: mount(f"size={int(megabytes * 1024)}k")


def fill(disk: Path) -> Path:
    """Write a file until the disk is full."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    with filler.open("ab", buffering=0) as f:  # the last partial block
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def assert_nothing_half_written(run: Path) -> None:
    for name in ("metrics.jsonl", "samples.jsonl"):
        if (run / name).exists():
            text = (run / name).read_text()
            assert text == "" or text.endswith("\n"), name
            [json.loads(line) for line in text.splitlines()]
    checkpoints = run / "checkpoints"
    if checkpoints.exists():
        assert not list(checkpoints.glob("tmp_*")) and not list(checkpoints.glob("trash_*"))
        assert all((c / "COMPLETE").is_file() for c in checkpoints.glob("step_*"))
    assert not list(run.glob(".tmp-*")) and not list(run.glob(".run.json.*"))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ERROR")]


def test_a_disk_without_room_for_a_checkpoint_stops_the_run_before_it_starts(tiny_world, tmp_path, small_disk):
    """Asked by rlsteps before it starts anything: no job directory, no worker, no run directory."""
    disk = small_disk(2)  # a checkpoint of the tiny policy: 5.0 MB estimated from its files (weights and Adam)
    run = disk / "run"
    started = time.monotonic()
    done = rlsteps("run", "rs", "-c", "tiny", *STOPPABLE, f"output.dir={run}", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line, fix] = done.stderr.splitlines()
    assert line.startswith(f"error: no space left on {run}/checkpoints (") and "a checkpoint needs 5.0 MB" in line
    assert fix == "fix: free 4 MB or move output.dir to a disk with room"
    assert not run.exists() and not (tmp_path / ".rlsteps" / "jobs").exists()
    assert time.monotonic() - started < 60


def run_worker_until_step(config: str, step: int, ready: str, go: str) -> None:
    """Runs in a subprocess: the worker, which waits before `step` until the file `go` exists."""
    from rlsteps.engine.run.step import StepRun
    from rlsteps.engine.run.worker import main

    original = StepRun.step

    def waiting(self, prompts):
        if self.counters.step + 1 == step:
            Path(ready).write_text("waiting")
            while not Path(go).exists():
                time.sleep(0.1)
        return original(self, prompts)

    StepRun.step = waiting
    main([config])


WAITING_WORKER = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    "from test_disk_full import run_worker_until_step; "
    "run_worker_until_step(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])"
)


@pytest.mark.slow
def test_a_disk_that_fills_during_a_run_stops_it_in_one_line_and_the_rerun_resumes(tiny_world, tmp_path, small_disk):
    disk = small_disk(16)
    run = disk / "run"
    first = rlsteps("run", "rs", "-c", "tiny", *STOPPABLE, "train.max_steps=1", f"output.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]  # a run of one step: then more steps continue it
    [config] = (tmp_path / ".rlsteps" / "jobs").glob("*/config.yaml")
    config.write_text(config.read_text().replace("max_steps: 1\n", "max_steps: 3\n"))

    ready, go, log = tmp_path / "ready", tmp_path / "go", tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-c", WAITING_WORKER, str(config), "2", str(ready), str(go)],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(ready, 300, worker)
        filler = fill(disk)  # something else fills the disk while the run makes step 2
        go.write_text("go")
        code = worker.wait(timeout=300)
    finally:
        if worker.poll() is None:
            kill_group(worker)
    output = log.read_text()
    assert code == 1, output[-3000:]
    assert "Traceback" not in output and "Logging error" not in output, output[-3000:]
    [line] = error_lines(output)
    assert line.startswith(f"ERROR no space left on {run} (") and "the next checkpoint needs 4." in line, line
    assert line.endswith(" MB or move output.dir to a disk with room)"), line
    assert_nothing_half_written(run)
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [0, 1]

    filler.unlink()
    resumed = rlsteps("run", "rs", "-c", "tiny", *STOPPABLE, f"output.dir={run}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    assert_nothing_half_written(run)
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [0, 1, 2, 3]


def test_a_record_the_disk_cannot_take_is_not_written_at_all(tmp_path, small_disk):
    disk = small_disk(1)
    path = disk / "samples.jsonl"
    with open_records(path) as f:
        append_whole(f, '{"step": 1}\n')
        fill(disk)
        with pytest.raises(OSError) as error:
            append_whole(f, '{"step": 2, "response": "' + "x" * 100_000 + '"}\n')
    assert error.value.errno == errno.ENOSPC
    assert path.read_text() == '{"step": 1}\n'


def test_a_checkpoint_write_that_meets_a_full_disk_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path / "checkpoints", size_hint=1000)
    info = {"consumed_samples": 8, "epoch": 0, "optimizer_steps": 1}

    def write_policy(folder: Path) -> None:
        folder.mkdir()
        (folder / "weights.txt").write_text("weights")

    def write_until_full(folder: Path) -> None:
        write_policy(folder)
        (folder / "more.bin").write_bytes(b"\0" * 100)  # part of it reached the disk
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "more.bin"))

    manager.save(1, None, None, {}, info, write_policy=write_policy)
    with pytest.raises(DiskFull) as error:
        manager.save(2, None, None, {}, {**info, "optimizer_steps": 2}, write_policy=write_until_full)
    assert str(error.value).startswith(f"no space left on {tmp_path / 'checkpoints'} (")
    assert "writing checkpoint step_2" in str(error.value) or "checkpoint step_2 needs" in str(error.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]  # no tmp_step_2/

    # no room for another like step_1
    monkeypatch.setattr("rlsteps.contract.disk.free_bytes", lambda directory: 10)
    with pytest.raises(DiskFull, match=r"checkpoint needs .* MB\) \(fix: free 1 MB or move output.dir"):
        manager.save(2, None, None, {}, {**info, "optimizer_steps": 2}, write_policy=write_policy)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]
    assert free_bytes(tmp_path / "not" / "made") > 0  # the disk of the nearest folder that exists
