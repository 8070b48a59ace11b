"""One launcher interface, and a registry by name: `executor: NAME` loads rlsteps.launch.NAME.

Adding a launcher is one new module in this package that defines LAUNCHER.
"""

from __future__ import annotations

import importlib
import pkgutil
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

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


class Launcher(Protocol):
    name: str

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan: ...

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission: ...


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
