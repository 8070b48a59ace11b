"""Run here: an attached subprocess that streams to this terminal, or (-b) a detached one with a pid file.

The subprocess is the worker, or with `nprocs_per_node: N` above 1 a torchrun (--standalone) that starts N
workers on this machine.

A detached job runs under a small shell wrapper that writes the worker's exit code to `exit_code`
when it ends; `status` reads that file, or the pid while the job runs. `cancel` writes `cancelled`,
then sends SIGTERM to the job's process group and SIGKILL to whatever is left after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rlsteps.errors import UsageError
from rlsteps.launch.base import (
    JobRecord,
    JobState,
    JobStatus,
    LaunchPlan,
    Submission,
    read_log,
    validated_profile,
    worker_command,
)
from rlsteps.launch.job import Job
from rlsteps.secrets import is_secret

LOG_FILE = "worker.log"
PID_FILE = "worker.pid"
EXIT_FILE = "exit_code"
CANCELLED_FILE = "cancelled"
CANCEL_GRACE_S = 10.0  # SIGTERM, then this long before SIGKILL
KILL_WAIT_S = 5.0
# $1 is the exit-code file, the rest is the worker's command; the file is renamed into place, never half written.
# The wrapper outlives a SIGTERM to the job's group (a trap, which its child does not inherit) to record the code.
EXIT_CODE_WRAPPER = (
    'trap : TERM; exit_file=$1; shift; "$@"; code=$?; '
    'echo "$code" > "$exit_file.tmp" && mv -f "$exit_file.tmp" "$exit_file"; exit "$code"'
)


class LocalProfile(BaseModel):
    """The launcher settings of a local profile; an unknown key is an error (a typo would be ignored otherwise)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executor: str = "local"
    nprocs_per_node: int = Field(1, ge=1)  # worker processes on this machine; above 1 they run under torchrun
    env_vars: dict[str, str | int | float | bool] = {}  # the job's environment; secret-looking names stay masked

    def public_env(self) -> dict[str, str]:
        """The env_vars that may be shown; the secret ones travel through Job.secret_env()."""
        return {k: str(v) for k, v in self.env_vars.items() if not is_secret(k, v)}


def load_profile(job: Job) -> LocalProfile:
    return validated_profile(LocalProfile, job, "local")


def process_command(profile: LocalProfile, job_dir: Path, passthrough: list[str]) -> list[str]:
    """The worker, or a torchrun of nprocs_per_node workers on this machine (a free rendezvous port of its own)."""
    worker = worker_command(sys.executable, job_dir, passthrough)
    if profile.nprocs_per_node == 1:
        return worker
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*torchrun, "--nproc-per-node", str(profile.nprocs_per_node), *worker[1:]]  # torchrun's -m: the worker


class LocalLauncher:
    name = "local"
    sees_local_files = True

    def check(self, job: Job) -> None:
        """Refuse a profile with an unknown key, and a job for NeMo-RL's container; anything else this machine
        compiles, it runs."""
        load_profile(job)
        if job.config.get("engine") == "nemo_rl":
            raise UsageError(
                "engine=nemo_rl runs inside NeMo-RL's container on GPU nodes, not on this machine",
                fix="submit it with -r or -b and a Slurm or Lepton profile whose container_image is NeMo-RL's; "
                "with --dry-run it prints the NeMo-RL config and scripts it compiles",
            )

    def processes(self, job: Job) -> tuple[int, int]:
        return 1, load_profile(job).nprocs_per_node

    def cluster_paths(self, job: Job) -> tuple[str, ...]:
        return ()

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan:
        self.check(job)
        profile = load_profile(job)
        command = process_command(profile, job_dir, job.passthrough)
        processes = "" if profile.nprocs_per_node == 1 else f", {profile.nprocs_per_node} processes under torchrun"
        if job.mode != "batch":
            return LaunchPlan(
                launcher=self.name,
                summary=f"run {job.step_id} on this machine{processes}, attached to this terminal",
                command=command,
                env=profile.public_env(),
            )
        return LaunchPlan(
            launcher=self.name,
            summary=f"run {job.step_id} on this machine{processes}, detached, logs to {job_dir / LOG_FILE}",
            command=["/bin/sh", "-c", EXIT_CODE_WRAPPER, "rlsteps-job", str(job_dir / EXIT_FILE), *command],
            env={"PYTHONUNBUFFERED": "1", **profile.public_env()},
        )

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission:
        env = {**os.environ, **plan.env, **job.secret_env()}
        if job.mode != "batch":
            return Submission(job_id=job.name, job_dir=job_dir, exit_code=_run_attached(plan.command, env))
        with open(job_dir / LOG_FILE, "ab") as log:
            process = subprocess.Popen(
                plan.command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (job_dir / PID_FILE).write_text(f"{process.pid}\n")
        return Submission(job_id=str(process.pid), job_dir=job_dir)

    def record(self, job: Job, submission: Submission) -> JobRecord:
        extra: dict = {"mode": job.mode, "profile": job.profile_name}
        if submission.exit_code is None:
            pid = int(submission.job_id)
            extra |= {"pid": pid, "pid_started": _process_start(pid), "log": str(submission.job_dir / LOG_FILE)}
        else:  # attached: the terminal had its output; the run's own log stays in its run directory
            extra |= {"exit_code": submission.exit_code, "run_log": str(_run_log(job))}
        return JobRecord.of(self.name, job, submission, extra)

    def status(self, record: JobRecord) -> JobStatus:
        job_dir = Path(record.job_dir)
        if "exit_code" in record.extra:
            return _from_exit_code(int(record.extra["exit_code"]), "ran attached")
        if (job_dir / CANCELLED_FILE).exists():
            return JobStatus(JobState.CANCELLED, "cancelled with rlsteps jobs cancel")
        if (job_dir / EXIT_FILE).exists():
            return _from_exit_code(int((job_dir / EXIT_FILE).read_text().strip()), f"pid {record.job_id}")
        if _alive(record):
            return JobStatus(JobState.RUNNING, f"pid {record.job_id}")
        return JobStatus(
            JobState.FAILED, f"pid {record.job_id} ended without writing {EXIT_FILE} (killed by a signal?)"
        )

    def logs(self, record: JobRecord, follow: bool = False) -> Iterator[str]:
        if "log" in record.extra:
            return read_log(Path(record.extra["log"]), follow, finished=lambda: self.status(record).state.ended)
        run_log = Path(record.extra.get("run_log", ""))
        if not run_log.is_file():
            raise UsageError(
                f"job {Path(record.job_dir).name} ran attached and its run's log is gone ({run_log})",
                fix="its output went to the terminal; the run directory holds what is left",
            )
        return read_log(run_log)  # an attached run has ended by the time its record is written

    def cancel(self, record: JobRecord) -> None:
        if "pid" not in record.extra:
            raise UsageError(
                f"job {Path(record.job_dir).name} ran attached and is not running", fix="nothing to cancel"
            )
        (Path(record.job_dir) / CANCELLED_FILE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))
        if not _alive(record):
            return
        group = int(record.extra["pid"])  # the job was started in its own session: its pid is its process group
        _signal_group(group, signal.SIGTERM)
        if not _wait_for_group_exit(group, CANCEL_GRACE_S):
            _signal_group(group, signal.SIGKILL)
            _wait_for_group_exit(group, KILL_WAIT_S)


def _run_log(job: Job) -> Path:
    """The worker's train.log in the run directory (output.dir, relative to where rlsteps ran)."""
    return (Path(str(job.config.get("output", {}).get("dir", "."))) / "train.log").absolute()


def _from_exit_code(code: int, where: str) -> JobStatus:
    if code == 0:
        return JobStatus(JobState.SUCCEEDED, f"{where}, exit code 0")
    return JobStatus(JobState.FAILED, f"{where}, exit code {code}")


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell it from a later process with the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19]  # field 22 of proc(5); fields[0] is field 3


def _process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(record: JobRecord) -> bool:
    pid = int(record.extra["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    started = record.extra.get("pid_started")
    if started is not None and _process_start(pid) not in (started, None):
        return False  # the pid was reused by another process
    return _process_state(pid) != "Z"  # a zombie has ended; its parent has not reaped it yet


def _group_exists(group: int) -> bool:
    """Some process of the group is still running (zombies, ended but not yet reaped, do not count)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        try:
            if entry.name.isdigit() and os.getpgid(int(entry.name)) == group and _process_state(int(entry.name)) != "Z":
                return True
        except OSError:
            continue
    return False


def _wait_for_group_exit(group: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _group_exists(group):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


LAUNCHER = LocalLauncher()


def _run_attached(command: list[str], env: dict[str, str], grace_s: float = 60.0) -> int:
    """Run in the foreground. Ctrl-C reaches the worker too (same process group): let it stop its servers and
    exit; a second Ctrl-C, or a worker still alive after the grace period, is killed."""
    process = subprocess.Popen(command, env=env)
    try:
        return process.wait()
    except KeyboardInterrupt:
        try:
            process.wait(grace_s)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        return 130
