"""What a worker's failed exit tells the user: the cause it left beside its exit code (its last error line, and the
fix it gave), or, for a worker that a signal ended before it could say anything, that signal named. SIGKILL is
most often the kernel's out-of-memory killer: the line says so, with the peak memory the run had logged.

Torch-free.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from rlsteps.contract.run_files import METRICS_FILE, read_metrics
from rlsteps.errors import InputRefusedInJob, RlstepsError, RunFailed, UsageError

PEAK_MEMORY_KEYS = ("perf/peak_memory_gb", "perf/peak_rss_gb")  # a GPU's allocator peak, else the process's RSS
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
_FIX_AT_END = re.compile(r"^(?P<cause>.*) \(fix: (?P<fix>.*)\)$")


def worker_failure(step_id: str, code: int, job_dir: Path, run_dir: Path | None) -> RlstepsError:
    """The error `rlsteps run` ends with when the worker exited with `code` (not 0, 130 or 143)."""
    cause, fix = _cause_left(job_dir)
    if cause is None and code > 128:
        cause, fix = _signal_cause(code - 128, run_dir) or (None, None)
    kind = InputRefusedInJob if code == InputRefusedInJob.exit_code else UsageError if code == 2 else RunFailed
    message = f"{step_id} failed with exit code {code}" + (f": {cause}" if cause else "")
    return kind(message, fix=fix or f"see the log above and {job_dir}")


def _cause_left(job_dir: Path) -> tuple[str | None, str | None]:
    """The failed worker's last error line (FAILURE_FILE) and the fix at its end, if it wrote one."""
    from rlsteps.contract.run_files import FAILURE_FILE  # torch-free

    try:
        line = (job_dir / FAILURE_FILE).read_text().strip()
    except OSError:
        return None, None
    told = _FIX_AT_END.match(line)
    return (told["cause"], told["fix"]) if told else (line or None, None)


def _signal_cause(number: int, run_dir: Path | None) -> tuple[str, str] | None:
    try:
        sig = signal.Signals(number)
    except ValueError:
        return None
    resume = "rerun the same command to resume from its last checkpoint"
    if sig == signal.SIGKILL:
        return (
            f"the worker was killed by SIGKILL, likely for lack of memory (the kernel's out-of-memory killer: see "
            f"dmesg); {peak_memory_logged(run_dir)}",
            f"give the run more memory or make its batches smaller (rollout.prompts_per_step, "
            f"train.micro_batch_size), then {resume}",
        )
    if sig in CRASH_SIGNALS:
        return f"the worker crashed with {sig.name} (a fault in native code)", f"see the log above; {resume}"
    return f"the worker was ended by {sig.name}", resume


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
