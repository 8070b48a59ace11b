"""What a run leaves in its run directory (output.dir) and beside its exit code, by name, and how the submitting side
reads it: the step checkpoints, the metrics, the failure's cause, what a detached worker wrote to its terminal, and the
environment the local launcher hands the worker. Standard library only."""

from __future__ import annotations

import json
import logging
import re
import shlex
from collections.abc import Mapping
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from rlsteps.contract import disk

logger = logging.getLogger(__name__)

# in the run directory
CHECKPOINTS_DIR = "checkpoints"  # <run dir>/checkpoints/step_<N>
COMPLETE = "COMPLETE"  # written last into a checkpoint: a step_<N> without it is not one
METRICS_FILE = "metrics.jsonl"
# beside the worker's exit-code file (the job directory of a local run)
FAILURE_FILE = "failure"  # the cause of a failed run, one line, and on the next one the fix ("fix: ...")
TERMINAL_LOG = "worker.log"  # what the worker writes to a terminal no one reads
FIX_PREFIX = "fix: "
TRAIN_LOG = "train.log"  # in the run directory: the main process's whole log, tracebacks included
MASKED = "******"  # a masked secret in a command line shown (rlsteps.secrets.MASK; contract imports no secrets)
# the environment the local launcher sets for its worker
STOP_WITH_PARENT = "RLSTEPS_STOP_WITH_PARENT"  # the worker ends with its starter
EXIT_FILE_ENV = "RLSTEPS_EXIT_FILE"  # where the worker writes its exit code


def run_directory(config: Mapping[str, Any], workdir: str | PurePath) -> PurePosixPath | None:
    """output.dir, the run directory, as the job sees it: a relative one lies under the job's working directory,
    where the worker starts (the directory rlsteps ran in, here and on Slurm; the profile's workdir on Lepton). None
    while output.dir is unset. The one place output.dir is resolved."""
    out = (config.get("output") or {}).get("dir")
    if not out or "???" in str(out):
        return None
    path = PurePosixPath(str(out))
    return path if path.is_absolute() else PurePosixPath(str(workdir)) / path


_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_step(path: Path) -> int | None:
    """N of a step_<N> folder; None for any other name."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete step_<N> checkpoints under `root` (a run's checkpoints folder), oldest step first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if checkpoint_step(p) is not None and (p / COMPLETE).is_file()]
    return sorted(found, key=checkpoint_step)


def next_checkpoint_bytes(root: Path, size_hint: int | None = None) -> int:
    """What the next checkpoint under `root` takes on disk: the latest one's size, else the size hint (0 without
    one)."""
    checkpoints = complete_checkpoints(root)
    return disk.tree_bytes(checkpoints[-1]) if checkpoints else (size_hint or 0)


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics file, in order.

    A truncated last line (a crash mid-write) is skipped. When the step goes backwards, the run
    was resumed from a checkpoint: the earlier records of the steps it repeats are dropped.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[dict] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                logger.warning("%s: skipped a truncated last line", path)
                break
            raise ValueError(
                f"{path}, line {number}: not valid JSON ({error}); the file is corrupt: fix or remove that line"
            ) from error
        if records and record["step"] < records[-1]["step"]:
            records = [r for r in records if r["step"] < record["step"]]
        records.append(record)
    return records


def rerun_starts(run_dir: Path | None) -> str:
    """From which step a rerun of the run in `run_dir` starts, in words: its last complete checkpoint's, or 0."""
    found = complete_checkpoints(Path(run_dir) / CHECKPOINTS_DIR) if run_dir is not None else []
    if not found:
        return "no checkpoint yet: a rerun starts from step 0"
    return f"a rerun resumes from step {checkpoint_step(found[-1])}, the last checkpoint"


def failure_text(cause: str, fix: str | None) -> str:
    """What FAILURE_FILE holds: the cause on one line, then its fix on the next."""
    one_line = " ".join(cause.split())
    return f"{one_line}\n{FIX_PREFIX}{' '.join(fix.split())}\n" if fix else f"{one_line}\n"


_FIX_AT_END = re.compile(r"^(?P<cause>.*) \(fix: (?P<fix>.*)\)$")


def read_failure(job_dir: Path) -> tuple[str | None, str | None]:
    """(cause, fix) a failed worker left in FAILURE_FILE; a cause written as "... (fix: ...)" on one line is split
    the same way. (None, None) without the file."""
    try:
        lines = [line.strip() for line in (Path(job_dir) / FAILURE_FILE).read_text().splitlines() if line.strip()]
    except OSError:
        return None, None
    if not lines:
        return None, None
    fixes = [line.removeprefix(FIX_PREFIX) for line in lines[1:] if line.startswith(FIX_PREFIX)]
    if fixes:
        return lines[0], fixes[0]
    return split_fix(lines[0])


def split_fix(line: str) -> tuple[str, str | None]:
    """("cause", "fix") of a line that ends with " (fix: ...)"; (line, None) of any other."""
    told = _FIX_AT_END.match(line)
    return (told["cause"], told["fix"]) if told else (line, None)


def rerun_command(argv: list[str] | tuple[str, ...] | None) -> str:
    """How the user starts the run again: the command line it was started with (quoted for a shell), or in words
    where that is not known or a secret in it is masked."""
    words = [str(word) for word in argv or ()]
    if words and words[0] == "rlsteps.run":
        return "call the same rlsteps.run(...) again"
    if not words or any(MASKED in word for word in words):
        return "rerun the same command"
    return f"rerun `{shlex.join(words)}`"


def then_rerun(action: str, run_dir: Path | None, argv: list[str] | tuple[str, ...] | None) -> str:
    """A fix that ends in the rerun: "<action>, then rerun `rlsteps run ...`: a rerun resumes from step N, the last
    checkpoint" (from step 0 without one)."""
    return f"{action}, then {rerun_command(argv)}: {rerun_starts(run_dir)}"


def log_to_read(run_dir: Path | None, job_dir: Path | None = None) -> Path | None:
    """Where the whole of a failed run's output is: its train.log, else the worker's terminal log; None without
    either."""
    candidates = [Path(run_dir) / TRAIN_LOG] if run_dir is not None else []
    candidates += [Path(job_dir) / TERMINAL_LOG] if job_dir is not None else []
    return next((path for path in candidates if path.is_file()), None)


def read_the_log(run_dir: Path | None, job_dir: Path | None = None) -> str:
    """The action of reading a failed run's whole error, in words, naming the file."""
    path = log_to_read(run_dir, job_dir)
    if path is not None:
        return f"read the full error in {path}"
    return f"read the worker's output in {job_dir}" if job_dir is not None else "read the run's log"


def correct_it(run_dir: Path | None, job_dir: Path | None = None) -> str:
    """The action for a failure without a fix of its own: the log that holds the whole error, read and acted on."""
    return f"{read_the_log(run_dir, job_dir)} and correct what it names"
