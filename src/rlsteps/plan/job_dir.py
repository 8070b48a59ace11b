"""The job directory: .rlsteps/jobs/<timestamp>-<step>/ with job.yaml (provenance) and the worker's config."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlsteps.artifacts.inputs import ResolvedInput
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
    _write_yaml(job_dir / "config.yaml", job.worker_config())
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
        "git": {"rlsteps": git_state(Path(__file__).resolve().parent), "cwd": git_state(Path.cwd())},
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


def git_state(directory: Path) -> dict[str, Any] | None:
    try:
        sha = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(directory), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return {"sha": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return None


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(data)))
