"""Slurm: an sbatch script written here and submitted with sbatch; states from scontrol, else sacct.

plan() builds the whole script from the profile, deterministically, with every value quoted: the
dry run prints exactly the file that is submitted. Secrets are never in it: sbatch passes the
submitting process's environment to the job (--export=ALL), and that is where they are put.
With nodes * gpus_per_node > 1 the job runs one task per node, each a torchrun whose rendezvous
comes from the Slurm variables; otherwise the task is the worker itself.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlsteps.errors import RunFailed, UsageError
from rlsteps.launch import containers
from rlsteps.launch.base import (
    JobRecord,
    JobState,
    JobStatus,
    LaunchPlan,
    Submission,
    comment_safe,
    read_log,
    worker_command,
)
from rlsteps.launch.job import Job
from rlsteps.secrets import is_secret_key

SCRIPT_FILE = "sbatch.sh"
LOG_NAME = "slurm-{job_id}.log"
RDZV_PORT = 29500
POLL_S = 1.0
CANCEL_WAIT_S = 20.0

STATES = {
    JobState.PENDING: {
        "PENDING",
        "CONFIGURING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESV_DEL_HOLD",
        "SUSPENDED",
    },
    JobState.RUNNING: {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"},
    JobState.SUCCEEDED: {"COMPLETED"},
    JobState.CANCELLED: {"CANCELLED", "REVOKED"},
    JobState.FAILED: {
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
    },
}


class SlurmProfile(BaseModel):
    """The launcher settings of a Slurm profile (everything in it but `config:` and `extends:`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executor: str = "slurm"
    account: str | None = None
    partition: str | None = None
    run_partition: str | None = None  # for -r (attached)
    batch_partition: str | None = None  # for -b (detached)
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    ntasks_per_node: int = 1
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | int | None = None  # sbatch --mem: 0 is all of the node's memory
    time: str | int | None = None  # sbatch --time: minutes or [D-]HH:MM:SS
    exclusive: bool = False
    container_image: str | None = None  # an image reference (squashed once) or a .sqsh file
    container_mounts: list[str] = []
    env_vars: dict[str, str | int | float | bool] = {}
    setup_lines: list[str] = []  # shell lines run before srun, written as given (module load ...)
    job_dir: str | None = None  # job directories on the shared filesystem; default .rlsteps/jobs here
    squash_dir: str | None = None  # where squashed images are cached; default <job_dir>/../containers
    python: str | None = None  # the worker's python; default this one, or `python` inside a container

    @field_validator("ntasks_per_node")
    @classmethod
    def _one_task_per_node(cls, value: int) -> int:
        if value != 1:
            raise ValueError("must be 1: the job runs one task per node, and torchrun starts a process per GPU")
        return value

    @field_validator("env_vars")
    @classmethod
    def _variable_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    def partition_for(self, mode: str) -> str | None:
        return (self.run_partition if mode == "attached" else self.batch_partition) or self.partition

    @property
    def world_size(self) -> int:
        return self.nodes * max(self.gpus_per_node, 1)


def load_profile(job: Job) -> SlurmProfile:
    try:
        return SlurmProfile.model_validate(job.launcher_settings)
    except ValidationError as err:
        causes = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'profile'}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        )
        known = ", ".join(k for k in SlurmProfile.model_fields if k != "executor")
        raise UsageError(
            f"Slurm profile '{job.profile_name}' is invalid: {causes}", fix=f"the known keys are {known}"
        ) from None


@dataclass(frozen=True)
class Placement:
    """Where the job lives on the cluster and what runs it."""

    run_dir: Path  # the job directory the cluster sees (the profile's job_dir, else the local one)
    workdir: Path  # the job's working directory: relative output paths resolve here, as in a local run
    python: str
    container: containers.ContainerPlan | None


def place(job: Job, profile: SlurmProfile, job_dir: Path) -> Placement:
    jobs_root = Path(profile.job_dir).expanduser().absolute() if profile.job_dir else job_dir.parent
    container = None
    if profile.container_image:
        cache = (
            Path(profile.squash_dir).expanduser().absolute() if profile.squash_dir else jobs_root.parent / "containers"
        )
        container = containers.plan_container(profile.container_image, cache, job.force_squash)
    python = profile.python or ("python" if container else sys.executable)
    return Placement(run_dir=jobs_root / job_dir.name, workdir=Path.cwd(), python=python, container=container)


class Expansion(str):
    """A shell word this module writes itself that must expand at run time, so it is not quoted."""


def shell_join(words: list[str]) -> str:
    return " ".join(w if isinstance(w, Expansion) else shlex.quote(w) for w in words)


def task_command(job: Job, profile: SlurmProfile, where: Placement) -> list[str]:
    """What each Slurm task runs: the worker, or a torchrun of it that meets the other nodes at the head node."""
    worker = worker_command(where.python, where.run_dir, job.passthrough)
    if profile.world_size == 1:
        return worker
    return [
        where.python,
        "-m",
        "torch.distributed.run",
        Expansion('--nnodes="$SLURM_NNODES"'),
        f"--nproc-per-node={max(profile.gpus_per_node, 1)}",
        "--rdzv-backend=c10d",
        Expansion('--rdzv-id="$SLURM_JOB_ID"'),
        Expansion(f'--rdzv-endpoint="$head_node:{RDZV_PORT}"'),
        *worker[1:],
    ]  # torchrun's -m runs the worker module in each process


def srun_words(job: Job, profile: SlurmProfile, where: Placement) -> list[str]:
    container = (
        containers.pyxis_options(where.container, profile.container_mounts, where.workdir) if where.container else []
    )
    return ["srun", f"--nodes={profile.nodes}", "--ntasks-per-node=1", *container, *task_command(job, profile, where)]


def directives(job: Job, profile: SlurmProfile, where: Placement) -> list[tuple[str, Any]]:
    wanted = [
        ("job-name", job.name),
        ("account", profile.account),
        ("partition", profile.partition_for(job.mode)),
        ("nodes", profile.nodes),
        ("ntasks-per-node", 1),
        ("gpus-per-node", profile.gpus_per_node or None),
        ("cpus-per-task", profile.cpus_per_task),
        ("mem", profile.mem),
        ("time", profile.time),
        ("exclusive", profile.exclusive or None),
        ("output", where.run_dir / LOG_NAME.format(job_id="%j")),
        ("open-mode", "append"),
        ("chdir", where.workdir),
        ("export", "ALL"),
        ("dependency", "afterok:" + ":".join(job.depends_on) if job.depends_on else None),
    ]
    return [(flag, value) for flag, value in wanted if value is not None]


def sbatch_script(job: Job, profile: SlurmProfile, where: Placement) -> str:
    lines = [
        "#!/bin/bash",
        f"# rlsteps {comment_safe(job.step_id)} (config {comment_safe(job.config_name)}), "
        f"{job.mode} on profile {comment_safe(job.profile_name or '')}, job {job.name}",
    ]
    for flag, value in directives(job, profile, where):
        text = str(value)
        if re.search(r"[\x00-\x1f\x7f]", text):
            raise UsageError(
                f"Slurm option --{flag} has a control character in {text!r}", fix="remove it from the profile"
            )
        lines.append(f"#SBATCH --{flag}" if value is True else f"#SBATCH --{flag}={shlex.quote(text)}")
    secrets = sorted(job.secret_env())
    lines += ["", "set -eo pipefail"]
    if secrets:
        lines.append(
            "# Secrets are not in this file: they come from the submitting environment (--export=ALL): "
            + " ".join(secrets)
        )
    lines += [f"export {name}={shlex.quote(str(value))}" for name, value in _public_env(profile).items()]
    if profile.setup_lines:
        lines += ["", "# setup_lines from the profile", *profile.setup_lines]
    lines.append("")
    if profile.world_size > 1:
        lines.append('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
    lines += [shell_join(srun_words(job, profile, where)), ""]
    return "\n".join(lines)


class SlurmLauncher:
    name = "slurm"
    supports_dependencies = True  # a job may wait for others: #SBATCH --dependency=afterok:ID[:ID...]

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan:
        profile = load_profile(job)
        where = place(job, profile, job_dir)
        files = {SCRIPT_FILE: sbatch_script(job, profile, where)}
        notes = [
            f"{'attached (logs streamed here)' if job.mode == 'attached' else 'detached'}",
            f"partition {profile.partition_for(job.mode) or '(cluster default)'}",
            f"{profile.nodes} node(s) x {profile.gpus_per_node} GPU(s)",
            f"job dir {where.run_dir}",
        ]
        if where.container:
            notes.append(where.container.describe())
            if where.container.action == "import":
                options = [
                    f"--{f}={v}"
                    for f, v in (("partition", profile.partition_for(job.mode)), ("account", profile.account))
                    if v
                ]
                files[containers.SQUASH_SCRIPT] = containers.squash_script(where.container, options, job.name)
            if where.container.warning:
                notes.append(f"warning: {where.container.warning}")
            missing = containers.unmounted([where.run_dir, where.workdir], profile.container_mounts)
            if missing:
                notes.append(
                    f"warning: not mounted in the container: {', '.join(map(str, missing))}; "
                    "add them to container_mounts"
                )
        if profile.world_size > 1:
            notes.append(
                "note: the embedded engine is single-process for now, so submitting refuses a world size above 1"
            )
        return LaunchPlan(
            launcher=self.name,
            summary=f"submit {job.step_id} to Slurm with sbatch: " + "; ".join(notes),
            command=["sbatch", "--parsable", str(where.run_dir / SCRIPT_FILE)],
            files=files,
        )

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission:
        profile = load_profile(job)
        if profile.world_size > 1:
            raise UsageError(
                f"the profile asks for {profile.nodes} node(s) x {profile.gpus_per_node} GPU(s), but the embedded "
                "engine runs a single process",
                fix="set nodes: 1 and gpus_per_node: 1 (or 0 for CPU)",
            )
        where = place(job, profile, job_dir)
        if where.run_dir != job_dir:
            if where.run_dir.exists():
                raise UsageError(f"{where.run_dir} already exists", fix="submit again: the next job gets a new name")
            shutil.copytree(job_dir, where.run_dir)
        if (where.run_dir / containers.SQUASH_SCRIPT).exists():
            _require("srun")
            _run_checked(
                ["bash", str(where.run_dir / containers.SQUASH_SCRIPT)],
                "squashing the container image failed",
                fix=f"see the enroot output above; the script is {where.run_dir / containers.SQUASH_SCRIPT}",
            )
        job_id = _sbatch(plan.command, job)
        submission = Submission(job_id=job_id, job_dir=where.run_dir)
        if job.mode != "attached":
            return submission
        record = self.record(job, submission)
        record.save()  # visible to `rlsteps jobs` while it runs
        return Submission(job_id=job_id, job_dir=where.run_dir, exit_code=self._stream_until_done(record))

    def record(self, job: Job, submission: Submission) -> JobRecord:
        profile = load_profile(job)
        extra = {
            "log": str(submission.job_dir / LOG_NAME.format(job_id=submission.job_id)),
            "job_name": job.name,
            "mode": job.mode,
            "profile": job.profile_name,
            "partition": profile.partition_for(job.mode),
            "script": str(submission.job_dir / SCRIPT_FILE),
        }
        return JobRecord.of(self.name, job, submission, extra)

    def status(self, record: JobRecord) -> JobStatus:
        info = query(record.job_id)
        if info is None:
            return JobStatus(
                JobState.UNKNOWN,
                f"Slurm no longer knows job {record.job_id} and sacct has no record of it; "
                "enable accounting (slurmdbd) or raise MinJobAge to keep final states",
            )
        if not _is_ours(info, record):
            return JobStatus(
                JobState.UNKNOWN,
                f"Slurm job {record.job_id} is now another job ({info.name}): "
                "the cluster's job ids were reset since it was submitted",
            )
        return JobStatus(info.state, info.describe())

    def logs(self, record: JobRecord, follow: bool = False) -> Iterator[str]:
        return read_log(Path(record.extra["log"]), follow, finished=lambda: self._over(record), poll_s=POLL_S)

    def cancel(self, record: JobRecord) -> None:
        info = query(record.job_id)
        if info is None or not _is_ours(info, record):
            raise UsageError(
                f"Slurm job {record.job_id} is not the job recorded in {record.job_dir}", fix="nothing to cancel"
            )
        _require("scancel")
        _run_checked(["scancel", record.job_id], f"scancel could not cancel Slurm job {record.job_id}")
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not self._over(record) and time.monotonic() < deadline:
            time.sleep(0.5)

    def _over(self, record: JobRecord) -> bool:
        state = self.status(record).state
        return state.ended or state is JobState.UNKNOWN

    def _stream_until_done(self, record: JobRecord) -> int:
        print(f"Slurm job {record.job_id}: streaming {record.extra['log']} (Ctrl-C cancels the job)", file=sys.stderr)
        try:
            for line in self.logs(record, follow=True):
                print(line, flush=True)
        except KeyboardInterrupt:
            subprocess.run(["scancel", record.job_id], check=False)
            print(f"cancelled Slurm job {record.job_id}", file=sys.stderr)
            return 130
        info = query(record.job_id)
        if info is None or info.state is JobState.UNKNOWN:
            return 1
        return 0 if info.state is JobState.SUCCEEDED else (info.exit_code or 1)


@dataclass(frozen=True)
class SlurmJobInfo:
    job_id: str
    name: str | None
    slurm_state: str
    exit_code: int | None
    signal: int | None
    reason: str | None
    source: str  # scontrol (live and recent jobs) or sacct (accounting)

    @property
    def state(self) -> JobState:
        return next((ours for ours, theirs in STATES.items() if self.slurm_state in theirs), JobState.UNKNOWN)

    def describe(self) -> str:
        parts = [f"Slurm job {self.job_id} {self.slurm_state}"]
        if self.exit_code is not None and self.state.ended:
            parts.append(f"exit code {self.exit_code}" + (f" (signal {self.signal})" if self.signal else ""))
        if self.reason and self.reason != "None":
            parts.append(f"reason {self.reason}")
        return ", ".join(parts) + ("" if self.source == "scontrol" else f" (from {self.source})")


def query(job_id: str) -> SlurmJobInfo | None:
    """The job's state from scontrol while slurmctld remembers it, else from sacct; None if neither knows it."""
    shown = _slurm_command(["scontrol", "show", "job", "--oneliner", job_id])
    if shown.returncode == 0 and (state := re.search(r"\bJobState=(\S+)", shown.stdout)):
        exit_code = re.search(r"\bExitCode=(\d+):(\d+)", shown.stdout)
        reason = re.search(r"\bReason=(\S+)", shown.stdout)
        name = re.search(r"\bJobName=(\S+)", shown.stdout)
        return SlurmJobInfo(
            job_id,
            name.group(1) if name else None,
            state.group(1),
            *_ints(exit_code),
            reason.group(1) if reason else None,
            "scontrol",
        )
    if shutil.which("sacct") is None:
        return None
    accounted = _slurm_command(
        ["sacct", "--jobs", job_id, "--allocations", "--noheader", "--parsable2", "--format=JobName,State,ExitCode"]
    )
    rows = (
        [line.split("|") for line in accounted.stdout.splitlines() if "|" in line] if accounted.returncode == 0 else []
    )
    if not rows:
        return None
    name, state_text, exit_text = rows[0][:3]
    exit_code = re.fullmatch(r"(\d+):(\d+)", exit_text)
    return SlurmJobInfo(job_id, name, state_text.split()[0], *_ints(exit_code), None, "sacct")


def _is_ours(info: SlurmJobInfo, record: JobRecord) -> bool:
    expected = record.extra.get("job_name")
    return expected is None or info.name is None or info.name == expected


def _ints(match: re.Match | None) -> tuple[int | None, int | None]:
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def _require(tool: str) -> None:
    if shutil.which(tool) is None:
        raise UsageError(
            f"{tool} not found: this machine has no Slurm client",
            fix="run rlsteps on a Slurm login node, or install the Slurm client (Debian: slurm-client)",
        )


def _slurm_command(argv: list[str]) -> subprocess.CompletedProcess:
    _require(argv[0])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _sbatch(command: list[str], job: Job) -> str:
    """Submit; sbatch hands the job this environment, which is where the secrets travel."""
    _require(command[0])
    done = subprocess.run(command, env={**os.environ, **job.secret_env()}, capture_output=True, text=True, timeout=300)
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id.isdigit():
        raise RunFailed(
            f"sbatch refused the job: {(done.stderr or done.stdout).strip()}",
            fix=f"check the profile's partition, account and resources; the script is {command[-1]}",
        )
    return job_id


def _run_checked(argv: list[str], failure: str, fix: str | None = None) -> None:
    """Run with its output shown on stderr as it comes; a failure names what failed and its last output line."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = ""
    for line in process.stdout or ():
        print(line, end="", file=sys.stderr)
        last = line.strip() or last
    if process.wait() != 0:
        raise RunFailed(f"{failure}: {last or f'exit code {process.returncode}'}", fix=fix)


def _public_env(profile: SlurmProfile) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1"}
    env |= {k: str(v) for k, v in profile.env_vars.items() if not is_secret_key(k)}
    return env


LAUNCHER = SlurmLauncher()
