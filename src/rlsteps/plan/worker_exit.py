"""What a worker's failed exit tells the user: the cause it left beside its exit code (its last error line, and the
fix it gave), or, for a worker that a signal ended before it could say anything, that signal named. SIGKILL is
most often the kernel's out-of-memory killer: the line says so, with the peak memory the run had logged. A failure
that left no fix of its own ends in the next action all the same: the log to read, and the command that resumes the
run from its last checkpoint.

Torch-free.
"""

from __future__ import annotations

import signal
from pathlib import Path

from rlsteps.contract.run_files import (
    METRICS_FILE,
    correct_it,
    log_to_read,
    read_failure,
    read_metrics,
    then_rerun,
)
from rlsteps.errors import InputRefusedInJob, RlstepsError, RunFailed, UsageError

PEAK_MEMORY_KEYS = ("perf/peak_memory_gb", "perf/peak_rss_gb")  # a GPU's allocator peak, else the process's RSS
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


def worker_failure(
    step_id: str, code: int, job_dir: Path, run_dir: Path | None, argv: list[str] | None = None
) -> RlstepsError:
    """The error `rlsteps run` ends with when the worker exited with `code` (not 0, 130 or 143); argv: the command
    line that started it, for the rerun the fix names."""
    cause, fix = read_failure(job_dir)
    if cause is None and code > 128:
        cause, fix = _signal_cause(code - 128, job_dir, run_dir, argv) or (None, None)
    kind = InputRefusedInJob if code == InputRefusedInJob.exit_code else UsageError if code == 2 else RunFailed
    message = f"{step_id} failed with exit code {code}" + (f": {cause}" if cause else "")
    return kind(message, fix=fix or then_rerun(correct_it(run_dir, job_dir), run_dir, argv))


def _signal_cause(number: int, job_dir: Path, run_dir: Path | None, argv: list[str] | None) -> tuple[str, str] | None:
    try:
        sig = signal.Signals(number)
    except ValueError:
        return None
    if sig == signal.SIGKILL:
        return (
            f"the worker was killed by SIGKILL, likely for lack of memory (the kernel's out-of-memory killer: see "
            f"dmesg); {peak_memory_logged(run_dir)}",
            then_rerun(
                "give the run more memory or make its batches smaller (rollout.prompts_per_step, "
                "train.micro_batch_size)",
                run_dir,
                argv,
            ),
        )
    if sig in CRASH_SIGNALS:
        where = log_to_read(run_dir, job_dir) or job_dir
        return (
            f"the worker crashed with {sig.name} (a fault in native code)",
            then_rerun(f"read the last lines of {where} for what it was doing", run_dir, argv),
        )
    return f"the worker was ended by {sig.name}", then_rerun("find what sent it (a scheduler, a person)", run_dir, argv)


def peak_memory_logged(run_dir: Path | None) -> str:
    """The highest peak memory the run wrote to metrics.jsonl, in words."""
    try:
        records = read_metrics(run_dir / METRICS_FILE) if run_dir is not None else []
    except (OSError, ValueError):  # no metrics yet, or a file someone else broke
        records = []
    for key in PEAK_MEMORY_KEYS:
        logged = [(r[key], r["step"]) for r in records if isinstance(r.get(key), int | float) and "step" in r]
        if logged:
            peak, step = max(logged)
            what = "GPU memory" if key == PEAK_MEMORY_KEYS[0] else "resident memory (RSS)"
            return f"its peak {what} logged was {peak:.2f} GB, at step {step} ({key} in metrics.jsonl)"
    return "it had logged no peak memory yet (metrics.jsonl has it from the first step on)"
