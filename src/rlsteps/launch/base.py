"""One launcher interface, and a registry by name: `executor: NAME` loads rlsteps.launch.NAME.

Adding a launcher is one new module in this package that defines LAUNCHER, and its name in LAUNCHERS;
the package's other modules are the launchers' shared and private helpers.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from rlsteps.contract.entry_points import WORKER_MODULE
from rlsteps.errors import UsageError
from rlsteps.launch.job import Job

if TYPE_CHECKING:
    from pydantic import BaseModel

ProfileModel = TypeVar("ProfileModel", bound="BaseModel")
LAUNCHERS = ("lepton", "local", "slurm")  # the modules of this package that define LAUNCHER


@dataclass(frozen=True)
class LaunchPlan:
    """Exactly what a launcher would do: printed by --dry-run, carried out by submit."""

    launcher: str
    summary: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)  # non-secret variables; secrets travel separately
    files: dict[str, str] = field(default_factory=dict)  # job-dir file name -> content (scripts, specs)
    code: str | None = None  # the file name of the wheel of rlsteps the job runs (launch.code), built into its dir
    # the config.yaml the worker reads where the launcher fills a key at run time (a server's URL); None: the job's own
    worker_config: dict[str, Any] | None = None

    def shell(self) -> str:
        return shlex.join(self.command)


@dataclass
class Submission:
    """What submit returns: an id to find the job again, and the exit code when it ran attached."""

    job_id: str
    job_dir: Path
    exit_code: int | None = None  # None: detached, still running


RECORD_FILE = "submission.json"


class JobState(str, Enum):  # noqa: UP042 - StrEnum would change how a state prints
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def ended(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    detail: str = ""  # the backend's own words: Slurm state and exit code, Lepton phase, pid exit


@dataclass(frozen=True)
class JobRecord:
    """What `rlsteps jobs` needs to find a submitted job again; written to <job dir>/submission.json."""

    launcher: str
    job_id: str
    job_dir: str
    step: str
    submitted: str
    extra: dict[str, Any] = field(default_factory=dict)  # backend details: log paths, workspace, node list...

    def save(self, directory: Path | None = None) -> Path:
        """Write the record into its job dir, or into another directory that should find the job too."""
        path = Path(directory or self.job_dir) / RECORD_FILE
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, job_dir: Path) -> JobRecord:
        return cls(**json.loads((job_dir / RECORD_FILE).read_text()))

    @classmethod
    def of(
        cls, launcher: str, job: Job, submission: Submission, extra: dict[str, Any], submitted: str = ""
    ) -> JobRecord:
        """The record of a submission; `submitted` defaults to when the job was compiled."""
        return cls(
            launcher=launcher,
            job_id=submission.job_id,
            job_dir=str(submission.job_dir),
            step=job.step_id,
            submitted=submitted or job.created,
            extra=extra,
        )


class Launcher(Protocol):
    """One backend. plan() is pure (--dry-run prints it); submit() carries it out."""

    name: str
    sees_local_files: bool  # the job reads this machine's files (here, or a filesystem shared with the cluster)

    def check(self, job: Job) -> None:
        """Refuse a job this launcher cannot run (UsageError), before anything is written or sent."""

    def processes(self, job: Job) -> tuple[int, int]:
        """(nodes, processes per node) the job runs: the engine splits the step over their product."""
        ...

    def cluster_paths(self, job: Job) -> tuple[str, ...]:
        """Folders only the job's machines see (the profile's mounts): inputs there are checked in the job."""

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan: ...

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission: ...

    def record(self, job: Job, submission: Submission) -> JobRecord: ...

    def status(self, record: JobRecord) -> JobStatus: ...

    def logs(self, record: JobRecord, follow: bool = False) -> Iterator[str]: ...

    def cancel(self, record: JobRecord) -> None: ...


def read_log(
    path: Path, follow: bool = False, finished: Callable[[], bool] = lambda: True, poll_s: float = 0.5
) -> Iterator[str]:
    """The lines of a log file; with follow, new lines as they are written, until finished() and all is read."""
    while follow and not path.exists() and not finished():
        time.sleep(poll_s)
    if not path.exists():
        return
    pending = ""
    with path.open(errors="replace") as log:
        while True:
            done = not follow or finished()  # asked before reading, so the last read sees everything
            pending += log.read()
            *lines, pending = pending.split("\n")
            yield from lines
            if done:
                if pending:
                    yield pending
                return
            time.sleep(poll_s)


def comment_safe(text: str) -> str:
    """Text for a comment line in a generated script: a newline in it would start a new command."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)


def worker_command(python: str, job_dir: Path, passthrough: list[str]) -> list[str]:
    return [python, "-m", WORKER_MODULE, str(job_dir / "config.yaml"), *passthrough]


def available_launchers() -> list[str]:
    return list(LAUNCHERS)


def get_launcher(name: str) -> Launcher:
    if name not in available_launchers():
        raise UsageError(f"unknown executor '{name}'", fix=f"use one of: {', '.join(available_launchers())}")
    module = importlib.import_module(f"rlsteps.launch.{name}")
    return module.LAUNCHER


def validated_profile(schema: type[ProfileModel], job: Job, label: str) -> ProfileModel:
    """The job's launcher settings read through a launcher's profile schema; every problem at once otherwise,
    with the keys the schema knows."""
    from pydantic import ValidationError

    try:
        return schema.model_validate(job.launcher_settings)
    except ValidationError as err:
        causes = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'profile'}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        )
        known = ", ".join(k for k in schema.model_fields if k != "executor")
        problem = f"{label} profile '{job.profile_name}' is invalid: {causes}"
        raise UsageError(problem, fix=f"the known keys are {known}") from None
