import io
import json
import logging
import math
import re
import sys
import time
import types

import pytest
import torch

from rlsteps.contract.run_files import read_metrics
from rlsteps.engine.records.metrics import MetricsWriter, Timers, metric_series, trend
from rlsteps.engine.records.plot import plot_metrics
from rlsteps.engine.records.progress import TrainingProgress
from rlsteps.engine.records.trackers import TensorBoardTracker, WandbTracker


def test_lines_are_appended_flushed_and_read_back(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    writer = MetricsWriter(path)
    writer.log(1, {"train/reward": 0.5, "train/loss": torch.tensor(1.25), "consumed_samples": 8})
    assert len(path.read_text().splitlines()) == 1  # on disk before close: a crash loses nothing logged
    writer.log(2, {"train/reward": 0.75})
    writer.close()

    with MetricsWriter(path) as resumed:  # reopening appends
        resumed.log(3, {"train/reward": 1.0})
    records = read_metrics(path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["train/loss"] == 1.25 and records[0]["consumed_samples"] == 8
    assert all(isinstance(r["time"], float) for r in records)
    assert metric_series(records, "train/loss") == ([1], [1.25])


def test_non_finite_values_become_null_with_one_warning_per_key(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    with caplog.at_level(logging.WARNING, logger="rlsteps.engine.records.metrics"), MetricsWriter(path) as writer:
        writer.log(1, {"loss": float("nan"), "grad_norm": float("inf"), "reward": 1.0})
        writer.log(2, {"loss": float("nan"), "reward": 2.0})
    assert caplog.text.count("'loss'") == 1 and "'grad_norm'" in caplog.text
    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} written as a bare constant"))
    records = read_metrics(path)
    assert records[0]["loss"] is None and records[0]["grad_norm"] is None and records[1]["reward"] == 2.0
    assert metric_series(records, "loss") == ([], [])


def test_log_rejects_reserved_names_and_non_numbers(tmp_path):
    with MetricsWriter(tmp_path / "m.jsonl") as writer:
        with pytest.raises(ValueError, match="reserved"):
            writer.log(1, {"step": 3.0})
        with pytest.raises(TypeError, match="not a number"):
            writer.log(1, {"note": "hello"})


def test_truncated_last_line_is_skipped_and_cut_before_appending(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as writer:
        writer.log(1, {"reward": 0.1})
        writer.log(2, {"reward": 0.2})
    with path.open("a") as f:
        f.write('{"step": 3, "time": 1.0, "rew')  # a crash mid-write
    assert [r["step"] for r in read_metrics(path)] == [1, 2]

    with MetricsWriter(path) as writer:  # the resumed run appends on a clean line
        writer.log(3, {"reward": 0.3})
    assert [r["reward"] for r in read_metrics(path)] == [0.1, 0.2, 0.3]
    assert len(path.read_text().splitlines()) == 3


def test_corrupt_middle_line_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "time": 0}\n{"step": 2, oops\n{"step": 3, "time": 0}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(path)


def test_a_resumed_run_supersedes_the_steps_it_repeats(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as writer:
        for step in (1, 2, 3, 4):
            writer.log(step, {"reward": float(step)})
        writer.log(4, {"val/reward": 9.0})  # a second record for the same step is kept
    with MetricsWriter(path) as writer:  # resumed from the step-2 checkpoint
        writer.log(3, {"reward": 30.0})
        writer.log(4, {"reward": 40.0})
    records = read_metrics(path)
    assert [(r["step"], r.get("reward")) for r in records] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_tensorboard_and_wandb_receive_the_finite_numbers(tmp_path, monkeypatch):
    calls = []

    class FakeSummaryWriter:
        def __init__(self, log_dir):
            calls.append(("tb_init", log_dir))

        def add_scalar(self, key, value, global_step):
            calls.append(("tb", key, value, global_step))

        def flush(self):
            pass

        def close(self):
            calls.append(("tb_close",))

    class FakeRun:
        offline, url = False, "https://wandb.ai/me/p/runs/abc"

        def log(self, values, step):
            calls.append(("wandb", values, step))

        def finish(self):
            calls.append(("wandb_finish",))

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeSummaryWriter))

    def wandb_init(**kwargs):
        calls.append(("wandb_init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=wandb_init))
    trackers = [TensorBoardTracker.open(tmp_path / "tb"), WandbTracker.open({"project": "p"})]
    with MetricsWriter(tmp_path / "m.jsonl", trackers=trackers) as writer:
        writer.log(5, {"reward": 1.5, "loss": float("nan")})
    assert calls == [
        ("tb_init", str(tmp_path / "tb")),
        ("wandb_init", {"project": "p"}),
        ("tb", "reward", 1.5, 5),
        ("wandb", {"reward": 1.5}, 5),
        ("tb_close",),
        ("wandb_finish",),
    ]


def test_missing_tensorboard_and_wandb_only_warn_naming_the_key_and_the_extra(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "wandb", None)
    with caplog.at_level(logging.WARNING, logger="rlsteps.engine.records"):
        trackers = [TensorBoardTracker.open(tmp_path / "tb"), WandbTracker.open({"project": "p"})]
        with MetricsWriter(tmp_path / "m.jsonl", trackers=[t for t in trackers if t is not None]) as writer:
            writer.log(1, {"reward": 1.0})
    assert (
        "logging.tensorboard is set but the tensorboard package is not installed: pip install 'rlsteps[tensorboard]'"
        in caplog.text
    )
    assert (
        "logging.wandb_project is set but the wandb package is not installed: pip install 'rlsteps[wandb]'"
        in caplog.text
    )
    assert read_metrics(tmp_path / "m.jsonl")[0]["reward"] == 1.0


def test_timers_accumulate_and_reset_on_pop():
    timers = Timers()
    with timers("rollout"):
        time.sleep(0.02)
    with timers("rollout"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError), timers("train"):
        raise RuntimeError("the phase failed")
    totals = timers.pop()
    assert set(totals) == {"timers/rollout", "timers/train"}
    assert 0.04 <= totals["timers/rollout"] < 1.0
    assert timers.pop() == {}


def test_progress_prints_one_plain_line_per_step_when_not_a_terminal():
    stream = io.StringIO()
    with TrainingProgress(total=5, initial=2, stream=stream) as progress:
        assert not progress.interactive
        progress.update(3, {"train/reward": 0.5, "train/loss": 1.25})
        progress.update(4, {"train/reward": float("nan"), "train/steps_without_update": 1})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("step 3/5") and "reward 0.5" in lines[0] and "loss 1.25" in lines[0]
    assert lines[0].endswith("s  eta -") and "without update" not in lines[0]  # the first step: the warm-up
    assert "eta 0:00:00" in lines[1]  # the last step
    assert lines[1].startswith("step 4/5") and "reward -" in lines[1] and "loss -" in lines[1]
    assert lines[1].endswith("steps without update 1")


def test_the_eta_leaves_out_the_runs_first_step(monkeypatch):
    """A resumed run (from step 10 of 100) whose first step warms up for 50 s, then takes 2 s a step: the time left
    is said at 2 s a step, not at the mean with the warm-up in it (after step 12: 26 s a step, 38 minutes)."""
    clock = iter([0.0, 0.0, 50.0, 52.0, 54.0])  # __init__, __enter__, the ends of steps 11, 12 and 13
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()
    with TrainingProgress(total=100, initial=10, stream=stream) as progress:
        for step in (11, 12, 13):
            progress.update(step, {})
    first, second, third = stream.getvalue().splitlines()
    assert first.endswith("step 50.00s  eta -")
    assert second.endswith("step 2.00s  eta 0:02:56")  # 88 steps left x 2 s
    assert third.endswith("step 2.00s  eta 0:02:54")


def test_progress_draws_a_rich_bar_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    with TrainingProgress(total=4, stream=stream, reward_key="r") as progress:
        assert progress.interactive
        progress.update(1, {"r": 0.75})
    assert "1/4" in stream.getvalue() and "reward 0.75" in stream.getvalue()


def test_plot_metrics_writes_a_png_and_skips_keys_never_logged(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as writer:
        for step in range(1, 11):
            writer.log(step, {"train/reward": math.sin(step), "train/loss": 1.0 / step})
    with caplog.at_level(logging.INFO, logger="rlsteps.engine.records.plot"):
        out = plot_metrics(path, tmp_path / "plots" / "curves.png", ["train/reward", "train/loss", "val/reward"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert "val/reward" in caplog.text
    with pytest.raises(ValueError, match="train/reward"):
        plot_metrics(path, tmp_path / "none.png", ["val/reward"])


def test_trend_compares_the_first_and_last_windows():
    assert trend([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], window=2) == (1.5, 5.5)
    assert trend([1.0, None, 3.0], window=5) == (2.0, 2.0)
    with pytest.raises(ValueError, match="window"):
        trend([1.0], window=0)
    with pytest.raises(ValueError, match="empty"):
        trend([None], window=1)


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_progress_bar_keeps_its_counter_whole_and_fits_the_terminal(width, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", str(width))
    stream = Terminal()
    with TrainingProgress(total=16, stream=stream) as progress:
        progress.update(3, {"train/reward": -1.77573, "train/loss": 1.16612, "train/steps_without_update": 2})
        progress._progress.refresh()
    shown = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line) for line in re.split(r"[\r\n]", stream.getvalue())]
    last = [line for line in shown if " 3/16 " in line]
    assert last and last[-1].startswith("step ") and "reward -1.776" in last[-1], shown
    assert max(len(line.rstrip()) for line in shown) <= width
