"""`rlsteps serve rm|judge ... -b PROFILE`: the server as a batch job of its own (launch.shared_server), compiled into
a frozen Job from the profile as a run's is, shown by its dry run, or submitted and recorded where `rlsteps jobs`
finds it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rlsteps.errors import UsageError
from rlsteps.launch import shared_server, slurm
from rlsteps.launch.base import JobRecord, LaunchPlan
from rlsteps.launch.job import Job
from rlsteps.launch.server_alloc import SECRET_KEYS
from rlsteps.plan.job_dir import create_job_dir, planned_job_dir, write_job_files
from rlsteps.plan.profiles import resolve_profile


@dataclass(frozen=True)
class ServeRequest:
    """What `rlsteps serve rm|judge` was given, for a batch job."""

    serves: str  # rm or judge
    model: str  # the model folder
    profile: str
    port: int | None = None  # --port where given; else the profile's server.port, else default_port
    default_port: int = 5555  # the command's own default
    args: tuple[str, ...] = ()  # the server's other options given, as words
    token: str | None = None  # the bearer token's value (from --token-env's variable): a secret of the job
    force_squash: bool = False
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerJob:
    job: Job
    plan: LaunchPlan  # against the job directory it would get (job_dir); submit plans the real one
    job_dir: Path


def compile_server_job(request: ServeRequest) -> ServerJob:
    """The server's job and its launch plan; touches nothing (the dry run shows this)."""
    profile = resolve_profile(request.profile)
    if profile.executor != "slurm":
        raise UsageError(
            f"profile '{profile.name}' runs on {profile.executor}; a shared server is a Slurm batch job",
            fix="-b a Slurm profile, or run `rlsteps serve` without -b, in the foreground",
        )
    created = datetime.now().astimezone()
    section, key = SECRET_KEYS[request.serves].split(".")
    server = {
        "serves": request.serves,
        "model": str(Path(request.model).expanduser().absolute()),
        "port": request.port,
        "default_port": request.default_port,
        "args": list(request.args),
    }
    job = Job(
        name=f"{created:%Y%m%d-%H%M%S}-{os.urandom(3).hex()}-serve-{request.serves}",
        step_id=shared_server.step_of(request.serves),
        algorithm="serve",
        config_name=request.serves,
        config_source="rlsteps serve " + request.serves,
        mode="batch",
        executor=profile.executor,
        profile_name=profile.name,
        profile_source=profile.source,
        launcher_settings=profile.launcher_settings,
        config={"server": server, **({section: {key: request.token}} if request.token else {})},
        overrides=[],
        passthrough=[],
        force_squash=request.force_squash,
        argv=list(request.argv),
        created=created.isoformat(timespec="microseconds"),
    )
    job_dir = planned_job_dir(job)
    return ServerJob(job, shared_server.plan(job, job_dir), job_dir)


def submit_server_job(compiled: ServerJob) -> JobRecord:
    """Write the job directory, submit the job and record it (in the job dir here and in the profile's job_dir)."""
    job = compiled.job
    slurm.LAUNCHER.check(job)
    job_dir = create_job_dir(job)
    plan = shared_server.plan(job, job_dir)
    write_job_files(job_dir, job, plan, [])
    submission = slurm.LAUNCHER.submit(job, plan, job_dir)
    record = shared_server.record(job, submission)
    for directory in dict.fromkeys([job_dir, submission.job_dir]):
        record.save(directory)
    return record
