"""Validation says its progress (rlsteps.engine.records.progress): rows answered, scoring, the time so far, at a
terminal as a row under the steps' bar and in a log as plain lines, each readable at 60 columns; the built-in sampler
counts the rows as they end; a tiny run's validation prints its lines."""

from __future__ import annotations

import io
import re
import threading

import pytest

from rlsteps.engine.generation.backend import SamplingParams
from rlsteps.engine.generation.builtin import DecodeOptions, generate
from rlsteps.engine.generation.rollouts import row_seed, tokenize_prompts
from rlsteps.engine.records.progress import TrainingProgress, ValidationProgress
from test_generation import _common_tokens, tiny_prompts, tiny_qwen2, tiny_tokenizer  # noqa: F401 (fixtures)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def shown_lines(stream: io.StringIO) -> list[str]:
    return [ANSI.sub("", line).rstrip() for line in re.split(r"[\r\n]", stream.getvalue()) if line.strip()]


def test_a_log_gets_a_line_as_validation_starts_one_while_it_runs_and_one_with_its_reward_at_the_end():
    stream, clock, ticked = io.StringIO(), Clock(), threading.Event()
    progress = ValidationProgress(64, stream, every=0.01, clock=clock)
    write = progress._write
    progress._write = lambda line: (write(line), ticked.set())  # the ticker's lines, waited for below
    with progress:
        ticked.clear()
        clock.now = 90.0
        progress.answered(37)
        assert ticked.wait(5)
        clock.now = 391.0
        progress.scoring()
        progress.done({"val/reward_mean": 0.40625})
    lines = stream.getvalue().splitlines()
    assert lines[0] == "validation 0/64  generating  0:00:00"
    assert any(re.fullmatch(r"validation (0|37)/64  generating  0:0[01]:[0-9]{2}", line) for line in lines[1:-1])
    assert lines[-1] == "validation 64/64  done  0:06:31  reward 0.4062"
    assert max(len(line) for line in lines) <= 60


def test_a_validation_that_stops_says_no_end_line():
    stream = io.StringIO()
    with pytest.raises(RuntimeError), ValidationProgress(8, stream, every=60):
        raise RuntimeError("rewards unavailable")
    assert stream.getvalue().splitlines() == ["validation 0/8  generating  0:00:00"]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_at_a_terminal_validation_is_a_row_under_the_steps_bar_then_one_line_that_stays(width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    stream, clock = Terminal(), Clock()
    with TrainingProgress(total=16, stream=stream) as steps:
        steps.update(3, {"train/reward": -1.77573, "train/loss": 1.16612})
        validation = steps.validation(64)
        validation.clock = clock
        with validation:
            clock.now = 75.0
            validation.answered(12)
            steps._progress.refresh()
            during = shown_lines(stream)
            validation.scoring()
            validation.done({"val/reward_mean": 0.5})
        assert [task.description for task in steps._progress.tasks] == ["step"]  # the row is gone
        steps._progress.refresh()
    row = [line for line in during if line.startswith("val ")]
    assert row and " 12/64 " in row[-1] and row[-1].endswith("generating  0:01:15"), during
    assert any(line.startswith("step ") and " 3/16 " in line for line in during)
    after = shown_lines(stream)
    assert "validation 64/64  done  0:01:15  reward 0.5" in after
    assert max(len(line) for line in after) <= width


def test_the_builtin_sampler_counts_the_rows_answered_as_they_end(tiny_tokenizer, tiny_qwen2):  # noqa: F811
    params = SamplingParams(16, top_k=20, top_p=0.9)
    eos = _common_tokens(tiny_tokenizer, tiny_qwen2, 3, params)  # rows end at different steps
    ids = tokenize_prompts(tiny_prompts(tiny_tokenizer, 5), tiny_tokenizer)
    seeds = [row_seed(3, i) for i in range(len(ids))]

    def sample(on_answered=None):
        return generate(
            tiny_qwen2,
            ids,
            params,
            eos_token_id=eos,
            pad_token_id=tiny_tokenizer.pad_token_id,
            seeds=seeds,
            batch_size=3,
            decode=DecodeOptions(end_check_interval=1),
            on_answered=on_answered,
        )

    counts: list[int] = []
    counted, uncounted = sample(counts.append), sample()
    assert counted == uncounted  # counting changes nothing
    assert counts == sorted(counts) and counts[-1] == 5 and 3 in counts  # both batches, in order, every row
    assert len(set(counts)) > 2  # rows counted as they end, not only as batches do


@pytest.mark.slow  # a tiny run end to end
def test_a_tiny_runs_validation_says_its_progress(tiny_world, tmp_path, monkeypatch, capsys):
    import rlsteps

    monkeypatch.chdir(tmp_path)
    overrides = {"train.max_steps": 1, "run.num_threads": 1, "validation.interval": 1}
    rlsteps.run("rl/rs", overrides=overrides, say=lambda line: None)
    lines = capsys.readouterr().out.splitlines()
    starts = [line for line in lines if re.fullmatch(r"validation 0/\d+  generating  0:00:0\d", line)]
    ends = [line for line in lines if re.fullmatch(r"validation (\d+)/\1  done  \d:\d\d:\d\d  reward \S+", line)]
    assert len(starts) == len(ends) == 2, lines  # before the first step and after it
    assert max(len(line) for line in starts + ends) <= 60
