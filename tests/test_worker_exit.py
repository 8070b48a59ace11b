"""What `rlsteps run` says of a worker that failed: the cause it left (its fix on the fix line), or the signal that
ended it, named (SIGKILL with the peak memory the run logged). A real worker killed with SIGKILL is in
test_run_lifecycle.py."""

from __future__ import annotations

import json

import pytest

from rlsteps.contract.run_files import FAILURE_FILE
from rlsteps.errors import InputRefusedInJob, RunFailed, UsageError
from rlsteps.plan.worker_exit import worker_failure


def metrics(run_dir, *records: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_cause_the_worker_left_is_the_line_and_its_fix_the_fix_line(tmp_path):
    (tmp_path / FAILURE_FILE).write_text("checkpoint step_8 is damaged (...) (fix: rerun with X=true)\n")
    error = worker_failure("rl/rs", 1, tmp_path, None)
    assert isinstance(error, RunFailed)
    assert error.message == "rl/rs failed with exit code 1: checkpoint step_8 is damaged (...)"
    assert error.fix == "rerun with X=true"


@pytest.mark.parametrize(("code", "kind"), [(2, UsageError), (3, InputRefusedInJob), (1, RunFailed)])
def test_the_exit_code_keeps_its_meaning(tmp_path, code, kind):
    (tmp_path / FAILURE_FILE).write_text("what went wrong\n")
    error = worker_failure("rl/rs", code, tmp_path, None)
    assert type(error) is kind and error.exit_code == code
    assert error.fix == (
        f"read the worker's output in {tmp_path} and correct what it names, then rerun the same command: no "
        "checkpoint yet: a rerun starts from step 0"
    )


def test_sigkill_is_named_as_likely_out_of_memory_with_the_highest_peak_logged(tmp_path):
    run = tmp_path / "run"
    metrics(run, {"step": 0, "val/reward_mean": 1.0}, {"step": 1, "perf/peak_memory_gb": 61.5},
            {"step": 2, "perf/peak_memory_gb": 79.25})  # fmt: skip
    error = worker_failure("rl/rs", 137, tmp_path, run)
    assert error.message.endswith(
        "the worker was killed by SIGKILL, likely for lack of memory (the kernel's out-of-memory killer: see dmesg); "
        "its peak GPU memory logged was 79.25 GB, at step 2 (perf/peak_memory_gb in metrics.jsonl)"
    )
    assert error.fix.startswith("give the run more memory or make its batches smaller")
    assert "it had logged no peak memory yet" in worker_failure("rl/rs", 137, tmp_path, tmp_path / "none").message


def test_a_crash_by_signal_is_named(tmp_path):
    assert worker_failure("rl/rs", 139, tmp_path, None).message.endswith(
        "the worker crashed with SIGSEGV (a fault in native code)"
    )
    assert worker_failure("rl/rs", 129 + 60, tmp_path, None).message == "rl/rs failed with exit code 189"
