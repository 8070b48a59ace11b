"""A reward model or judge server as a Slurm batch job of its own, which several runs share: `rlsteps serve rm|judge
... -b PROFILE`. The sbatch script is the server half of a heterogeneous job (slurm_hetjob) standing alone: the same
directives as its group 0, the same start and readiness wait (slurm_server), then, once the server answers, its
address written into SERVER_FILE in the job dir, where `rlsteps jobs` and a run's `rm.url=job:ID` (`judge.url=job:ID`)
read it. The job lives as long as the server: until `rlsteps jobs cancel`, its time limit, or the server's end.

The job's config (Job.config) holds what `rlsteps serve` was given: `server:` {serves, model, port, default_port,
args} and the bearer token, where there is one, as the served section's secret (rm.token, judge.api_key), which
reaches the job through sbatch's environment as a run's secrets do, never through the script.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlsteps.contract.entry_points import SERVER_MODULES
from rlsteps.errors import UsageError
from rlsteps.launch import containers, slurm, slurm_hetjob, slurm_server
from rlsteps.launch.base import JobRecord, LaunchPlan, Submission, comment_safe
from rlsteps.launch.job import Job
from rlsteps.launch.server_alloc import SECRET_KEYS, URL_KEYS, ServerAllocation, secret_env
from rlsteps.launch.slurm_script import (
    SCRIPT_FILE,
    Expansion,
    Placement,
    SlurmProfile,
    directive_lines,
    environment_lines,
    load_profile,
    place,
    shell_join,
)

SERVER_FILE = "server.json"  # in the job dir, once the server answers: {url, address, node, serves, slurm_job_id}
STEP_PREFIX = "serve/"  # a server job's step in its record: serve/rm, serve/judge


def step_of(serves: str) -> str:
    return STEP_PREFIX + serves


def allocation(job: Job, profile: SlurmProfile) -> ServerAllocation:
    """The server's allocation: the profile's `server:` mapping where it has one (its resources, image, python, port
    and ready_timeout_s), else the profile's own resources; serving what the command serves, on one node."""
    wanted = job.config["server"]
    base = profile.server or ServerAllocation(
        gpus_per_node=profile.gpus_per_node, cpus_per_task=profile.cpus_per_task, mem=profile.mem
    )
    if base.kind != "rlsteps":
        raise UsageError(
            f"profile '{job.profile_name}' gives a server of kind {base.kind}; `rlsteps serve` runs kind rlsteps",
            fix="use a profile whose server.kind is rlsteps (or that has no server:)",
        )
    if base.nodes != 1:
        raise UsageError(
            f"profile '{job.profile_name}' gives its server {base.nodes} nodes; `rlsteps serve` runs on one",
            fix="set the profile's server.nodes to 1",
        )
    port = wanted["port"] or base.port or wanted["default_port"]
    return base.model_copy(update={"serves": wanted["serves"], "port": port})


def server_profile(job: Job) -> SlurmProfile:
    """The job's profile with its server's allocation in `server:`, as slurm_hetjob reads it; no requeue (a server
    has nothing to resume)."""
    profile = load_profile(job)
    return profile.model_copy(update={"server": allocation(job, profile), "requeue": False})


def command(job: Job, server: ServerAllocation, python: str) -> list[str]:
    """`python -m rlsteps.engine.rewards.rm|judge` with the options `rlsteps serve` was given, listening on every
    interface of its node; the token, where there is one, read from its secret's variable."""
    wanted = job.config["server"]
    words = [python, "-m", SERVER_MODULES[server.serves], "--model", wanted["model"], "--host", "0.0.0.0"]
    words += ["--port", str(server.listen_port), *wanted["args"], *server.args]
    return words + (["--token-env", secret_env(server)] if _token(job, server) else [])


def _token(job: Job, server: ServerAllocation) -> Any:
    section, key = SECRET_KEYS[server.serves].split(".")
    return (job.config.get(section) or {}).get(key)


def plan(job: Job, job_dir: Path) -> LaunchPlan:
    """What `rlsteps serve ... -b PROFILE` submits: the sbatch script (and the image's squash script where it is to
    be imported), and the summary its dry run shows."""
    profile = server_profile(job)
    server = profile.server
    assert server is not None
    where = place(job, profile, job_dir)
    container = slurm_hetjob.server_container(profile, where, job.force_squash)
    files = {SCRIPT_FILE: script(job, profile, where, container)}
    if container and container.action == "import":
        files[containers.SQUASH_SCRIPT] = containers.squash_script(
            container, slurm.squash_options(job, profile), job.name
        )
    notes = [
        f"{server.describe()} as a batch job of its own: 1 node x {server.gpus_per_node} GPU(s), port "
        f"{server.listen_port} on every interface",
        f"partition {profile.partition_for(job.mode) or '(cluster default)'}",
        f"time limit {profile.time or '(the partition default)'}",
        f"job dir {where.job_dir}; its address in {SERVER_FILE} there once it answers",
        container.describe() if container else "no container",
        f"code: the job's own wheel of rlsteps ({where.wheel.name})" if where.wheel else "code: rlsteps as installed",
    ]
    needed = [Path(job.config["server"]["model"]), where.job_dir]
    missing = containers.unmounted(needed, profile.container_mounts) if container else []
    if missing:
        notes.append(
            f"warning: not mounted in the container: {', '.join(map(str, missing))}; add them to container_mounts"
        )
    return LaunchPlan(
        launcher="slurm",
        summary=f"submit {server.describe()} to Slurm with sbatch: " + "; ".join(notes),
        command=["sbatch", "--parsable", str(where.job_dir / SCRIPT_FILE)],
        files=files,
        code=where.wheel.name if where.wheel else None,
    )


def script(job: Job, profile: SlurmProfile, where: Placement, container: Any) -> str:
    server = profile.server
    assert server is not None
    server_file = shlex.quote(str(where.job_dir / SERVER_FILE))
    words = command(job, server, server.python or where.python)
    srun = slurm_hetjob.server_srun(server, words, profile, where, container, [])
    key = URL_KEYS[server.serves]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# rlsteps serve {server.serves} on profile {comment_safe(job.profile_name or '')}, job {job.name}: "
            f"{server.describe()} that runs until `rlsteps jobs cancel` or its time limit",
            *directive_lines(directives(job, profile, where)),
            *environment_lines(job, profile),
            f"server_file={server_file}  # its address once it answers: for rlsteps jobs and {key}=job:ID",
            'rm -f "$server_file"',
            *slurm_server.start_lines(server, srun, "SLURM_JOB_NODELIST", None, on_exit='; rm -f "$server_file"'),
            *slurm_server.wait_lines(server),
            *_address_lines(server),
            *_serve_lines(server),
        ]
    )


def directives(job: Job, profile: SlurmProfile, where: Placement) -> list[tuple[str, Any]]:
    """A heterogeneous job's server group alone (its job-wide options and the server's resources), and the node to
    itself where the profile says `exclusive: true`."""
    return slurm_hetjob.server_directives(job, profile, where) + ([("exclusive", True)] if profile.exclusive else [])


def _address_lines(server: ServerAllocation) -> list[str]:
    """SERVER_FILE, written whole (a reader never sees half of it), and what runs write to use the server."""
    fields = '{"url": "%s", "address": "http://%s:%s", "node": "%s", "serves": "%s", "slurm_job_id": "%s"}\\n'
    values = [f'"${server.url_env}"', '"$server_host"', str(server.listen_port), '"$server_node"']
    printf = shell_join(["printf", fields, *map(Expansion, values), server.serves, Expansion('"$SLURM_JOB_ID"')])
    key = URL_KEYS[server.serves]
    return [
        f'{printf} > "$server_file.tmp"',
        'mv "$server_file.tmp" "$server_file"',
        f'echo "rlsteps: runs take it with {key}=job:$SLURM_JOB_ID; rlsteps jobs cancel $SLURM_JOB_ID stops it"',
        "",
    ]


def _serve_lines(server: ServerAllocation) -> list[str]:
    """The job lives as long as the server; a server that ends by itself ends the job with its exit code."""
    return [
        "set +e",
        'wait "$server_pid"; code=$?',
        f'echo "rlsteps: {server.describe()} ended (exit $code)"',
        'exit "$code"',
        "",
    ]


def record(job: Job, submission: Submission) -> JobRecord:
    """The Slurm job's record, saying what it serves and where its address is written."""
    base = slurm.LAUNCHER.record(job, submission)
    extra = {key: value for key, value in base.extra.items() if key != "server_log"}  # its output is the job's log
    extra |= {"serves": job.config["server"]["serves"], "server_file": str(submission.job_dir / SERVER_FILE)}
    return replace(base, extra=extra)


def serves(record: JobRecord) -> str | None:
    """What a recorded job serves (rm, judge); None for a run."""
    return record.extra.get("serves")


def served(record: JobRecord) -> dict[str, Any] | None:
    """The server's address file, once it answered: {url, address, node, serves, slurm_job_id}; None before (or for
    a job that serves nothing)."""
    if serves(record) is None:
        return None
    try:
        found = json.loads(Path(record.extra["server_file"]).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("slurm_job_id") == record.job_id else None
