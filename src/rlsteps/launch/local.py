"""Run here: an attached subprocess that streams to this terminal, or (-b) a detached one.

The subprocess is the worker, or with `nprocs_per_node: N` above 1 a torchrun (--standalone) that starts N
workers on this machine.

Either way the job is a job from its first second: its directory holds its record (`submission.json`, written as
soon as the process has started), the pid file, and the exit-code file once it ends. `status` reads that file,
or the pid while the job runs; the job id is the job directory's name. A detached job runs under a small shell
wrapper that writes the exit code; an attached worker writes its own (and rlsteps writes it for a worker killed
outright), so a run whose rlsteps was killed is still seen to end. `cancel` writes `cancelled`, then sends SIGTERM
to the job's process group and SIGKILL to whatever is left after a grace period.

An attached worker runs in a process group of its own, and rlsteps passes on what ends it: SIGINT, SIGTERM or SIGHUP
is sent to the worker once (it stops its servers and exits 130 or 143, and rlsteps with it), a second one or the
grace period kills it. If rlsteps itself is killed outright, the kernel sends the worker SIGTERM (PR_SET_PDEATHSIG),
and the worker watches its parent as well (STOP_WITH_PARENT): no worker outlives the command that started it.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rlsteps.contract.run_files import (  # standard library only
    EXIT_FILE_ENV,
    FAILURE_FILE,
    STOP_WITH_PARENT,
    TERMINAL_LOG,
    run_directory,
)
from rlsteps.errors import UsageError
from rlsteps.launch.base import (
    RECORD_FILE,
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

LOG_FILE = TERMINAL_LOG  # a detached worker's output, or an attached one's once its rlsteps is gone
PID_FILE = "worker.pid"
EXIT_FILE = "exit_code"
CANCELLED_FILE = "cancelled"
CANCEL_GRACE_S = 10.0  # SIGTERM, then this long before SIGKILL
KILL_WAIT_S = 5.0
ATTACHED_GRACE_S = 60.0  # a signal passed on to an attached worker, then this long before SIGKILL
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what rlsteps passes on to an attached worker
PR_SET_PDEATHSIG = 1  # linux/prctl.h
SIGNAL_EXITS = {130: "interrupted: SIGINT", 143: "terminated: SIGTERM or SIGHUP", 137: "killed: SIGKILL"}
# $1 is the exit-code file, the rest is the worker's command; the file is renamed into place, never half written.
# The wrapper outlives a SIGTERM to the job's group (a trap, which its child does not inherit) to record the code.
# A worker that ends normally writes its exit code itself first (EXIT_FILE_ENV); one that exits 0 without it ended
# before its result (os._exit, in code the run called): that is a failure, exit 1, with the cause in FAILURE_FILE.
VANISHED = (
    "the worker ended with exit code 0 before it finished, without writing its exit record (os._exit in code the run "
    "called?); nothing was output (fix: rerun to resume from the last checkpoint once that code returns instead)"
)
EXIT_CODE_WRAPPER = (
    'trap : TERM; exit_file=$1; shift; "$@"; code=$?; '
    f'if [ "$code" = 0 ] && [ ! -f "$exit_file" ]; then code=1; echo {shlex.quote(VANISHED)} > '
    f'"$(dirname "$exit_file")/{FAILURE_FILE}"; fi; '
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
        env = {**os.environ, **plan.env, **job.secret_env(), STOP_WITH_PARENT: "1"}
        env[EXIT_FILE_ENV] = str(job_dir / EXIT_FILE)
        submission = Submission(job_id=job_dir.name, job_dir=job_dir)
        if job.mode != "batch":

            def started(pid: int) -> None:  # a job from its first second: `rlsteps jobs` sees it while it runs
                (job_dir / PID_FILE).write_text(f"{pid}\n")
                self.record(job, submission).save()

            code = _run_attached(plan.command, env, on_start=started)
            if not (job_dir / EXIT_FILE).exists():  # the worker was killed, or ended, before it could write it
                if code == 0:
                    code = 1
                    (job_dir / FAILURE_FILE).write_text(VANISHED + "\n")
                _write_exit_code(job_dir / EXIT_FILE, code)
            submission.exit_code = code
            return submission
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
        return submission

    def record(self, job: Job, submission: Submission) -> JobRecord:
        """The job's record: the one written when it started, if any, else a new one (with the pid and its start
        time, to tell it from a later process with the same pid)."""
        saved = Path(submission.job_dir) / RECORD_FILE
        if saved.is_file():
            record = JobRecord.load(saved.parent)
            if record.launcher == self.name and record.job_id == submission.job_id:
                return record
        extra: dict = {"mode": job.mode, "profile": job.profile_name}
        pid_file = Path(submission.job_dir) / PID_FILE
        if not pid_file.is_file():  # attached, and it never started
            ended = {"exit_code": submission.exit_code, "run_log": str(_run_log(job))}
            return JobRecord.of(self.name, job, submission, extra | ended)
        pid = int(pid_file.read_text().split()[0])
        extra |= {"pid": pid, "pid_started": _process_start(pid)}
        if job.mode == "batch":
            extra["log"] = str(submission.job_dir / LOG_FILE)
        else:  # attached: the terminal has its output; the run's own log is in its run directory
            rlsteps = os.getpid()
            extra |= {"run_log": str(_run_log(job)), "rlsteps_pid": rlsteps, "rlsteps_started": _process_start(rlsteps)}
        return JobRecord.of(self.name, job, submission, extra)

    def status(self, record: JobRecord) -> JobStatus:
        job_dir = Path(record.job_dir)
        if "pid" not in record.extra:  # an attached run recorded once it had ended (earlier versions of rlsteps)
            return _from_exit_code(int(record.extra["exit_code"]), "ran attached")
        who = f"pid {record.extra['pid']}"
        if (job_dir / CANCELLED_FILE).exists():
            return JobStatus(JobState.CANCELLED, "cancelled with rlsteps jobs cancel")
        ended = _read_exit_code(job_dir / EXIT_FILE)
        if ended is not None:
            code, note = ended
            return _from_exit_code(code, who, note)
        starter_gone = "rlsteps_pid" in record.extra and not _pid_alive(
            int(record.extra["rlsteps_pid"]), record.extra.get("rlsteps_started")
        )
        starter = f"the rlsteps run that started it (pid {record.extra.get('rlsteps_pid')}) has ended"
        if _alive(record):
            return JobStatus(JobState.RUNNING, f"{who}; {starter}: stopping" if starter_gone else who)
        detail = f"{who} ended without writing {EXIT_FILE} (killed by a signal?)"
        return JobStatus(JobState.FAILED, f"{detail}; {starter}" if starter_gone else detail)

    def logs(self, record: JobRecord, follow: bool = False) -> Iterator[str]:
        def finished() -> bool:
            return self.status(record).state.ended

        if "log" in record.extra:
            return read_log(Path(record.extra["log"]), follow, finished=finished)
        run_log = Path(record.extra.get("run_log", ""))  # attached: the worker's train.log
        if not run_log.is_file() and finished():
            raise UsageError(
                f"job {Path(record.job_dir).name} ran attached and its run's log is gone ({run_log})",
                fix="its output went to the terminal; the run directory holds what is left",
            )
        return read_log(run_log, follow, finished=finished)

    def cancel(self, record: JobRecord) -> None:
        if "pid" not in record.extra:
            raise UsageError(
                f"job {Path(record.job_dir).name} ran attached and is not running", fix="nothing to cancel"
            )
        (Path(record.job_dir) / CANCELLED_FILE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))
        if not _alive(record):
            return
        group = int(record.extra["pid"])  # started in a session (-b) or process group (attached) of its own
        _signal_group(group, signal.SIGTERM)
        if not _wait_for_group_exit(group, CANCEL_GRACE_S):
            _signal_group(group, signal.SIGKILL)
            _wait_for_group_exit(group, KILL_WAIT_S)


def _run_log(job: Job) -> Path:
    """The worker's train.log in the run directory (output.dir; a relative one under where rlsteps ran)."""
    return Path(run_directory(job.config, Path.cwd()) or Path.cwd()) / "train.log"


def _from_exit_code(code: int, where: str, note: str = "") -> JobStatus:
    how = f" ({SIGNAL_EXITS[code]})" if code in SIGNAL_EXITS else ""
    detail = f"{where}, exit code {code}{how}" + (f"; {note}" if note else "")
    return JobStatus(JobState.SUCCEEDED if code == 0 else JobState.FAILED, detail)


def _read_exit_code(path: Path) -> tuple[int, str] | None:
    """(exit code, the note after it) from an exit-code file; None before the job has ended. A file that holds no
    exit code raises ValueError: the job's state is unknown then, not running nor failed."""
    try:
        code, _, note = path.read_text().strip().partition("\n")
    except OSError:
        return None
    return int(code), note.strip()


def _write_exit_code(path: Path, code: int) -> None:
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    staging.write_text(f"{code}\n")
    staging.replace(path)


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
    return _pid_alive(int(record.extra["pid"]), record.extra.get("pid_started"))


def _pid_alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
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


def _run_attached(
    command: list[str],
    env: dict[str, str],
    grace_s: float = ATTACHED_GRACE_S,
    on_start: Callable[[int], None] | None = None,
) -> int:
    """Run in the foreground, in a process group of its own, and return its exit code (128+N for signal N).

    SIGINT, SIGTERM and SIGHUP to rlsteps (to it alone or to its group: the worker's group is its own, so it gets
    each signal once) are passed on to the worker, which stops its servers and exits; a second signal, or a worker
    still alive after the grace period, is killed with its group. If rlsteps is killed outright, the kernel sends
    the worker SIGTERM."""
    received: list[tuple[int, float]] = []
    running: list[subprocess.Popen] = []

    def pass_on(signum: int, frame: object) -> None:
        received.append((signum, time.monotonic()))
        if running:
            _pass_on(running[0], signum, again=len(received) > 1)

    previous = {sig: signal.signal(sig, pass_on) for sig in FORWARDED}
    try:
        process = subprocess.Popen(command, env=env, preexec_fn=_attached_preexec())
        running.append(process)
        if received:  # a signal came while it was starting
            _pass_on(process, received[0][0], again=False)
        if on_start is not None:
            on_start(process.pid)
        while True:
            try:
                code = process.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                # Ctrl-C lets the worker end its step and checkpoint it, however long (a second Ctrl-C stops it
                # now); SIGTERM and SIGHUP, whose senders kill soon after, get the grace period
                first = received[0] if received else None
                if first and first[0] != signal.SIGINT and time.monotonic() - first[1] > grace_s:
                    _signal_group(process.pid, signal.SIGKILL)
        if received and code < 0:  # killed with its group: it was asked to stop by this signal
            return 128 + received[0][0]
        return code if code >= 0 else 128 - code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _pass_on(process: subprocess.Popen, signum: int, again: bool) -> None:
    if again:  # asked twice: stop now
        _signal_group(process.pid, signal.SIGKILL)
        return
    try:
        process.send_signal(signum)  # the worker (or torchrun, which passes it on to its workers) only
    except ProcessLookupError:
        pass


def _attached_preexec() -> Callable[[], None]:
    """Between fork and exec: a process group of its own, and SIGTERM when the thread that started it (rlsteps'
    main thread) ends (Linux prctl PR_SET_PDEATHSIG). prctl is looked up before the fork."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None  # not Linux: the worker's own watch of its parent (STOP_WITH_PARENT) remains
    parent = os.getpid()

    def prepare() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # rlsteps ended before the call: nobody would stop this child
            os._exit(128 + signal.SIGTERM)

    return prepare
