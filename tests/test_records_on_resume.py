"""A run killed in any phase of a step and resumed leaves its records as if it had never stopped.

The worker runs with a pause at one phase of one step (rollout, score, prepare, optimise, validate, checkpoint,
and in the middle of writing the checkpoint); the test kills it there with SIGKILL, leaves each record file with a
torn last line as a kill mid-write does, and the next run resumes. After a kill at every phase in turn,
metrics.jsonl, samples.jsonl and train.log hold what a run that never stopped writes: every step once, in order,
and no torn line.
"""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from run_helpers import FAST, kill_group, rlsteps, run_dir, wait_for

pytestmark = pytest.mark.slow

# five steps, a checkpoint every second one, a validation after each: a kill at step 4 finds the records of
# step 3 (not checkpointed) and of step 4 so far, and the run resumes from step 2
ARGS = ["train.max_steps=5", "checkpoint.interval=2", "validation.interval=1", *FAST]
KILLED_AT = 4
# kills inside a step before its records (at scoring: a rollout, prepare or optimise kill leaves the same records),
# at validation, between the records and the checkpoint, and during the checkpoint's write
PHASES = ["score", "validate", "checkpoint", "checkpoint_write"]
STEP_LINE = re.compile(r"rlsteps\.steps: step (\d+)/")
TORN = {
    "metrics.jsonl": b'{"step": 4, "time": 17',
    "samples.jsonl": b'{"step": 4, "split": "tr',
    "train.log": b"2026-01-01 00:00:00,000 INFO rlsteps.steps: step 4/",
}


def run_worker_paused(config: str, phase: str, step: int, ready: str) -> None:
    """Runs in a subprocess: the worker, which stops at `phase` of `step` until killed."""
    from rlsteps.engine.algorithms import RECIPES
    from rlsteps.engine.checkpoints import resume
    from rlsteps.engine.generation.rollouts import Sampler
    from rlsteps.engine.run.step import StepRun
    from rlsteps.engine.run.update import PolicyUpdate
    from rlsteps.engine.run.worker import main

    at = {"step": 0}

    def wait_here(name: str) -> None:
        if name == phase and at["step"] == step:
            Path(ready).write_text(name)
            time.sleep(600)

    def pause_before(owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        def paused(*args, **kwargs):
            wait_here(name)
            return original(*args, **kwargs)

        setattr(owner, attribute, paused)

    original_step = StepRun.step

    def counted(self, prompts):
        at["step"] = self.counters.step + 1  # the step being made; its validation and checkpoint follow it
        return original_step(self, prompts)

    StepRun.step = counted
    pause_before(Sampler, "rollouts", "rollout")
    pause_before(StepRun, "_score_on_main", "score")
    pause_before(RECIPES["rs"], "prepare", "prepare")
    pause_before(PolicyUpdate, "__call__", "optimise")
    pause_before(StepRun, "validate", "validate")
    pause_before(StepRun, "save", "checkpoint")  # the step's metrics and samples are written by now
    pause_before(resume, "_fsync_tree", "checkpoint_write")  # tmp_step_<N>/ written, not yet renamed
    main([config])


PAUSED_WORKER = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    "from test_records_on_resume import run_worker_paused; "
    "run_worker_paused(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])"
)


def kill_at(cwd: Path, config: Path, phase: str, log: Path) -> None:
    ready = cwd / "ready"
    ready.unlink(missing_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", PAUSED_WORKER, str(config), phase, str(KILLED_AT), str(ready)],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the reward server the worker starts dies with it
        )
    try:
        wait_for(ready, 300, process)
    except AssertionError as error:
        raise AssertionError(f"{error}:\n{log.read_text()[-3000:]}") from None
    finally:
        kill_group(process)


def records(run: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def step_lines(run: Path) -> list[int]:
    return [int(m.group(1)) for m in STEP_LINE.finditer((run / "train.log").read_text())]


def metric_rows(run: Path) -> list[tuple]:
    """Each metrics record's step and what a resumed run repeats: its train/ and val/ values (not times, speeds)."""
    rows = []
    for record in records(run, "metrics.jsonl"):
        kept = {k: v for k, v in record.items() if k.startswith(("train/", "val/"))}
        rows.append((record["step"], {k: v if v is None else round(v, 4) for k, v in kept.items()}))
    return rows


def sample_rows(run: Path) -> list[tuple]:
    return [(r["step"], r["split"], r["prompt_id"], r["response"]) for r in records(run, "samples.jsonl")]


def assert_whole(run: Path) -> None:
    """Every record file ends with a whole line, and train.log has no line with a torn one glued to it."""
    for name in TORN:
        assert (run / name).read_bytes().endswith(b"\n"), name
    for line in (run / "train.log").read_text().splitlines():
        assert len(re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ", line)) <= 1, line


def test_a_run_killed_mid_step_at_validation_and_around_its_checkpoint_resumes_with_records_as_if_it_never_stopped(
    tiny_world, tmp_path
):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    straight.mkdir(), stopped.mkdir()
    done = rlsteps("run", "rs", "-c", "tiny", *ARGS, cwd=straight)
    assert done.returncode == 0, done.stderr[-3000:]
    [config] = (straight / ".rlsteps" / "jobs").glob("*/config.yaml")  # the same config, run by the worker itself
    reference, run = run_dir(straight, "rl_rs"), run_dir(stopped, "rl_rs")

    for phase in PHASES:
        kill_at(stopped, config, phase, tmp_path / f"{phase}.log")
        assert (run / "checkpoints" / "step_2" / "COMPLETE").is_file(), phase
        assert not (run / "checkpoints" / "step_4").exists(), phase
        if phase == "checkpoint":  # killed between the step's records and its checkpoint: both steps logged
            assert [r["step"] for r in records(run, "metrics.jsonl")][-2:] == [3, 4]
        if phase == "checkpoint_write":
            assert (run / "checkpoints" / "tmp_step_4").is_dir()
        assert_whole(run)  # as the run left them (the earlier kill's torn lines are gone)
        steps = [r["step"] for r in records(run, "metrics.jsonl")]
        assert steps == sorted(set(steps)) and step_lines(run) == sorted(set(step_lines(run))), phase
        for name, torn in TORN.items():  # as a kill in the middle of a write leaves them
            with (run / name).open("ab") as f:
                f.write(torn)

    resumed = rlsteps("run", "rs", "-c", "tiny", *ARGS, cwd=stopped)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "(step 2," in resumed.stderr

    assert_whole(run)
    assert [r[0] for r in metric_rows(run)] == [0, 1, 2, 3, 4, 5]
    assert metric_rows(run) == metric_rows(reference)
    assert sample_rows(run) == sample_rows(reference)
    assert step_lines(run) == step_lines(reference) == [1, 2, 3, 4, 5]
    assert not list((run / "checkpoints").glob("tmp_*"))
