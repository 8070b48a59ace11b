"""The job directory: .rlsteps/jobs/<timestamp>-<step>/ with job.yaml (provenance) and the worker's config."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlsteps.artifacts.inputs import ResolvedInput
from rlsteps.install import git_state, source, version
from rlsteps.launch.base import LaunchPlan
from rlsteps.launch.job import Job
from rlsteps.secrets import mask_argv

JOBS_DIR = Path(".rlsteps") / "jobs"
TRACKED_PACKAGES = (
    "rlsteps",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "omegaconf",
    "pydantic",
    "typer",
    "fsspec",
    "megatron-core",
    "vllm",
    "submitit",
    "leptonai",
)


def planned_job_dir(job: Job, base: Path | None = None) -> Path:
    return (base or Path.cwd()) / JOBS_DIR / job.name


def create_job_dir(job: Job, base: Path | None = None) -> Path:
    """A new directory for the job; a second job in the same second gets a numbered suffix."""
    target = planned_job_dir(job, base)
    target.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1000):
        candidate = target if attempt == 0 else target.with_name(f"{target.name}-{attempt}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a job directory next to {target}")


def write_job_files(job_dir: Path, job: Job, plan: LaunchPlan, inputs: list[ResolvedInput]) -> None:
    shipped = _ship_code(job_dir, plan)
    _write_yaml(job_dir / "config.yaml", plan.worker_config or job.worker_config())
    _write_yaml(job_dir / "job.yaml", provenance(job, plan, inputs, job_dir) | shipped)
    for name, content in plan.files.items():
        (job_dir / name).write_text(content)


def _ship_code(job_dir: Path, plan: LaunchPlan) -> dict[str, Any]:
    """The wheel of rlsteps the job runs, built into its directory when the launcher ships code."""
    if plan.code is None:
        return {}
    from rlsteps.launch.code import write_wheel

    wheel = write_wheel(job_dir)
    if wheel.name != plan.code:
        raise RuntimeError(f"the plan names the wheel {plan.code}, but {wheel.name} was built")
    return {"code": {"wheel": wheel.name, "sha256": wheel.sha256, "files": wheel.files}}


def provenance(job: Job, plan: LaunchPlan, inputs: list[ResolvedInput], job_dir: Path) -> dict[str, Any]:
    return {
        "job": {
            "name": job.name,
            "dir": str(job_dir),
            "created": job.created,
            "step": job.step_id,
            "config": job.config_name,
            "config_source": job.config_source,
            "mode": job.mode,
        },
        "argv": job.public_argv(),
        "overrides": mask_argv(job.overrides),
        "passthrough": mask_argv(job.passthrough),
        "profile": {"name": job.profile_name, "source": job.profile_source, "settings": job.public_launcher_settings()},
        "launch": {"launcher": plan.launcher, "summary": plan.summary, "command": mask_argv(plan.command)},
        "inputs": [i.as_dict() for i in inputs],
        "inputs_in_job": job.inputs_in_job,  # on cluster paths: the worker checks these before it starts
        "config": job.public_config(),
        "versions": package_versions(),
        "rlsteps": {"version": version(), "source": source()},  # the code that compiled the job (and runs it)
        "git": {"cwd": _cwd_git()},
        "host": {"hostname": socket.gethostname(), "python": sys.version.split()[0], "platform": platform.platform()},
    }


def package_versions() -> dict[str, str]:
    found = {}
    for name in TRACKED_PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _cwd_git() -> dict[str, Any] | None:
    """The commit of the project the job was compiled in, where it is a git checkout."""
    state = git_state(Path.cwd())
    return None if state is None else {"sha": state["sha"], "dirty": state["dirty"]}


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(data)))
