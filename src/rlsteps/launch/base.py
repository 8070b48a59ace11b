"""One launcher interface, and a registry by name: `executor: NAME` loads rlsteps.launch.NAME.

Adding a launcher is one new module in this package that defines LAUNCHER.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import shlex
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Protocol

from rlsteps.errors import UsageError
from rlsteps.job import Job

WORKER_MODULE = "rlsteps.engine.worker"


@dataclass(frozen=True)
class LaunchPlan:
    """Exactly what a launcher would do: printed by --dry-run, carried out by submit."""

    launcher: str
    summary: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)  # non-secret variables; secrets travel separately
    files: dict[str, str] = field(default_factory=dict)  # job-dir file name -> content (scripts, specs)

    def shell(self) -> str:
        return shlex.join(self.command)


@dataclass
class Submission:
    """What submit returns: an id to find the job again, and the exit code when it ran attached."""

    job_id: str
    job_dir: Path
    exit_code: int | None = None  # None: detached, still running


RECORD_FILE = "submission.json"


class JobState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


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

    def save(self) -> Path:
        path = Path(self.job_dir) / RECORD_FILE
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, job_dir: Path) -> JobRecord:
        return cls(**json.loads((job_dir / RECORD_FILE).read_text()))


class Launcher(Protocol):
    """One backend. plan() is pure (--dry-run prints it); submit() carries it out."""

    name: str

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan: ...

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission: ...

    def record(self, job: Job, submission: Submission) -> JobRecord: ...

    def status(self, record: JobRecord) -> JobStatus: ...

    def logs(self, record: JobRecord, follow: bool = False) -> Iterator[str]: ...

    def cancel(self, record: JobRecord) -> None: ...


def worker_command(python: str, job_dir: Path, passthrough: list[str]) -> list[str]:
    return [python, "-m", WORKER_MODULE, str(job_dir / "config.yaml"), *passthrough]


def available_launchers() -> list[str]:
    import rlsteps.launch as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name != "base")


def get_launcher(name: str) -> Launcher:
    if name not in available_launchers():
        raise UsageError(f"unknown executor '{name}'", fix=f"use one of: {', '.join(available_launchers())}")
    module = importlib.import_module(f"rlsteps.launch.{name}")
    return module.LAUNCHER
