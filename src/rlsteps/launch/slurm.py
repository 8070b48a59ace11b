"""Slurm: the sbatch script (slurm_script) written here and submitted with sbatch; states from scontrol,
else sacct; an attached run streams the job's log until it ends."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rlsteps.errors import RunFailed, UsageError
from rlsteps.launch import containers, ray_job, slurm_hetjob
from rlsteps.launch.base import JobRecord, JobState, JobStatus, LaunchPlan, Submission, read_log
from rlsteps.launch.job import Job
from rlsteps.launch.slurm_script import (
    LOG_NAME,
    SCRIPT_FILE,
    Placement,
    SlurmProfile,
    load_profile,
    place,
    ray_job_of,
    sbatch_script,
)

POLL_S = 1.0
KILL_WAIT_DEFAULT_S = 30  # Slurm's default KillWait: SIGTERM, then SIGKILL this long after
CANCEL_MARGIN_S = 30.0  # beyond KillWait: the epilog and the node's clean-up (COMPLETING) on a busy node

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


class SlurmLauncher:
    name = "slurm"
    supports_dependencies = True  # a job may wait for others: #SBATCH --dependency=afterok:ID[:ID...]
    sees_local_files = True  # the submitting machine shares the cluster's filesystem (the job dir lives there)

    def check(self, job: Job) -> None:
        """What refuses the job before anything is written: no sbatch here."""
        _require("sbatch")

    def processes(self, job: Job) -> tuple[int, int]:
        profile = load_profile(job)
        return profile.nodes, profile.nprocs

    def cluster_paths(self, job: Job) -> tuple[str, ...]:
        return tuple(load_profile(job).cluster_paths)

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan:
        profile = load_profile(job)
        where = place(job, profile, job_dir)
        files = {SCRIPT_FILE: sbatch_script(job, profile, where)}
        nemo_rl = ray_job.uses_nemo_rl(job)
        server_notes, worker_config = [], None
        if profile.server:
            server_files, server_notes, worker_config = slurm_hetjob.plan_parts(
                job, profile, where, squash_options(job, profile)
            )
            files = {SCRIPT_FILE: server_files.pop(SCRIPT_FILE), **server_files}
        if nemo_rl:
            ray = ray_job_of(job, profile, where)
            ray_job.require_shared(ray, shared_places(profile, where), fix=SHARED_FIX)
            files |= ray_job.job_files(job, ray)
        per_node = "NeMo-RL on Ray, one task" if nemo_rl else f"{profile.nprocs} process(es)"
        notes = [
            f"{'attached (logs streamed here)' if job.mode == 'attached' else 'detached'}",
            f"partition {profile.partition_for(job.mode) or '(cluster default)'}",
            f"{profile.nodes} node(s) x {profile.gpus_per_node} GPU(s), {per_node} per node",
            f"job dir {where.job_dir}",
            *server_notes,
        ]
        if where.container:
            notes.append(where.container.describe())
            if where.container.action == "import":
                files[containers.SQUASH_SCRIPT] = containers.squash_script(
                    where.container, squash_options(job, profile), job.name
                )
            if where.container.warning:
                notes.append(f"warning: {where.container.warning}")
            missing = containers.unmounted([where.job_dir, where.workdir], profile.container_mounts)
            if missing:
                notes.append(
                    f"warning: not mounted in the container: {', '.join(map(str, missing))}; "
                    "add them to container_mounts"
                )
        notes.append(
            f"code: the job's own wheel of rlsteps, first on PYTHONPATH ({where.wheel.name})"
            if where.wheel
            else f"code: rlsteps as installed for {where.python} (code: installed)"
        )
        if profile.time and profile.checkpoint_before_limit_s and not nemo_rl:
            notes.append(
                f"checkpoint {profile.checkpoint_before_limit_s}s before the time limit"
                + (", then requeue" if profile.requeue else "")
            )
        return LaunchPlan(
            launcher=self.name,
            summary=f"submit {job.step_id} to Slurm with sbatch: " + "; ".join(notes),
            command=["sbatch", "--parsable", str(where.job_dir / SCRIPT_FILE)],
            files=files,
            code=where.wheel.name if where.wheel else None,
            worker_config=worker_config,
        )

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission:
        self.check(job)
        where = place(job, load_profile(job), job_dir)
        if where.job_dir != job_dir:
            if where.job_dir.exists():
                raise UsageError(f"{where.job_dir} already exists", fix="submit again: the next job gets a new name")
            shutil.copytree(job_dir, where.job_dir)
        for squash in (containers.SQUASH_SCRIPT, slurm_hetjob.SQUASH_SERVER_SCRIPT):
            if (where.job_dir / squash).exists():
                _require("srun")
                _run_checked(
                    ["bash", str(where.job_dir / squash)],
                    "squashing the container image failed",
                    fix=f"see the enroot output above; the script is {where.job_dir / squash}",
                )
        job_id = _sbatch(plan.command, job)
        submission = Submission(job_id=job_id, job_dir=where.job_dir)
        if job.mode != "attached":
            return submission
        record = self.record(job, submission)
        record.save()  # visible to `rlsteps jobs` while it runs
        return Submission(job_id=job_id, job_dir=where.job_dir, exit_code=self._stream_until_done(record))

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
        if profile.server:
            extra["server_log"] = str(
                submission.job_dir / slurm_hetjob.SERVER_LOG.format(attempt=f"{submission.job_id}-0")
            )
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
        deadline = time.monotonic() + (kill_wait_s() or KILL_WAIT_DEFAULT_S) + CANCEL_MARGIN_S
        while (not self._over(record) or _completing(record.job_id)) and time.monotonic() < deadline:
            time.sleep(0.5)

    def _over(self, record: JobRecord) -> bool:
        state = self.status(record).state
        return state.ended or state is JobState.UNKNOWN

    def _stream_until_done(self, record: JobRecord) -> int:
        """Stream the job's log until it ends. Ctrl-C, SIGTERM or SIGHUP to rlsteps cancels the job (scancel: its
        worker stops with a log line and exit 143) and exits 130 or 143, rather than leave it running unwatched."""
        print(
            f"Slurm job {record.job_id}: streaming {record.extra['log']} (Ctrl-C or SIGTERM cancels the job)",
            file=sys.stderr,
        )
        previous = {sig: signal.signal(sig, _stop_streaming) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            for line in self.logs(record, follow=True):
                print(line, flush=True)
        except (KeyboardInterrupt, _Stopped) as stopped:
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)  # scancel is not cut short by a second signal
            subprocess.run(["scancel", record.job_id], check=False)
            _print_quietly(f"cancelled Slurm job {record.job_id}")
            return 128 + (signal.SIGTERM if isinstance(stopped, _Stopped) else signal.SIGINT)  # SIGHUP too: 143
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        info = query(record.job_id)
        if info is None or info.state is JobState.UNKNOWN:
            return 1
        return 0 if info.state is JobState.SUCCEEDED else (info.exit_code or 1)


class _Stopped(BaseException):  # noqa: N818 - like KeyboardInterrupt
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop_streaming(signum: int, frame: object) -> None:
    raise _Stopped(signum)


def _print_quietly(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass  # the terminal is gone (SIGHUP)


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


def _completing(job_id: str) -> bool:
    """Whether some part of the job is still COMPLETING: its state already says CANCELLED while Slurm signals its
    steps and waits for their processes to end (a heterogeneous job's components each)."""
    if shutil.which("squeue") is None:
        return False
    shown = _slurm_command(["squeue", "--noheader", "--jobs", job_id, "--states", "COMPLETING", "--format=%i"])
    return shown.returncode == 0 and bool(shown.stdout.strip())


def _is_ours(info: SlurmJobInfo, record: JobRecord) -> bool:
    expected = record.extra.get("job_name")
    return expected is None or info.name is None or info.name == expected


def _ints(match: re.Match | None) -> tuple[int | None, int | None]:
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


SHARED_FIX = (
    "set output.dir under the job directory's or the working directory's filesystem, or add its shared "
    "filesystem to the profile's cluster_paths"
)


def shared_places(profile: SlurmProfile, where: Placement) -> tuple[PurePosixPath, ...]:
    """The folders a Slurm job's nodes share: the job directories' and the working directory's (both must be on a
    filesystem the nodes share), the profile's cluster_paths, and, unless they are a machine's own folders
    (/tmp, say), the filesystems the first two are on (their mount points here, never the root) and the host sides
    of the profile's container_mounts."""
    declared = [where.job_dir.parent, where.workdir]
    seen_here = [*map(_filesystem, declared), *(containers.host_side(m) for m in profile.container_mounts)]
    return ray_job.shared_folders(
        [*declared, *profile.cluster_paths, *(f for f in seen_here if not ray_job.machine_own(f))]
    )


def _filesystem(path: Path) -> Path:
    """The mount point of the filesystem `path` is on (that of its nearest existing folder), as this machine sees
    it: the submitting machine shares the cluster's filesystem."""
    folder = path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def squash_options(job: Job, profile: SlurmProfile) -> list[str]:
    """The squash srun asks for what the job's partition requires: a time limit, and GPUs where it has them."""
    wanted = (
        ("partition", profile.partition_for(job.mode)),
        ("account", profile.account),
        ("time", profile.squash_time),
        ("gpus-per-node", profile.gpus_per_node or None),
    )
    return [f"--{flag}={value}" for flag, value in wanted if value]


def _require(tool: str) -> None:
    if shutil.which(tool) is None:
        raise UsageError(
            f"{tool} not found: this machine has no Slurm client",
            fix="run rlsteps on a Slurm login node, or install the Slurm client (Debian: slurm-client)",
        )


def kill_wait_s() -> int | None:
    """The cluster's KillWait: how long after scancel's SIGTERM a job's processes are killed; None where scontrol
    does not say."""
    shown = _slurm_command(["scontrol", "show", "config"])
    found = re.search(r"^KillWait\s*=\s*(\d+)", shown.stdout, re.MULTILINE) if shown.returncode == 0 else None
    return int(found.group(1)) if found else None


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


LAUNCHER = SlurmLauncher()
