"""Run here: an attached subprocess that streams to this terminal, or (-b) a detached one with a pid file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlsteps.job import Job
from rlsteps.launch.base import LaunchPlan, Submission, worker_command

LOG_FILE = "worker.log"
PID_FILE = "worker.pid"


class LocalLauncher:
    name = "local"

    def plan(self, job: Job, job_dir: Path) -> LaunchPlan:
        detached = job.mode == "batch"
        how = f"detached, logs to {job_dir / LOG_FILE}" if detached else "attached to this terminal"
        return LaunchPlan(
            launcher=self.name,
            summary=f"run {job.step_id} on this machine, {how}",
            command=worker_command(sys.executable, job_dir, job.passthrough),
            env={"PYTHONUNBUFFERED": "1"} if detached else {},
        )

    def submit(self, job: Job, plan: LaunchPlan, job_dir: Path) -> Submission:
        env = {**os.environ, **plan.env, **job.secret_env()}
        if job.mode != "batch":
            try:
                code = subprocess.call(plan.command, env=env)
            except KeyboardInterrupt:
                code = 130
            return Submission(job_id=job.name, job_dir=job_dir, exit_code=code)
        with open(job_dir / LOG_FILE, "ab") as log:
            process = subprocess.Popen(
                plan.command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        (job_dir / PID_FILE).write_text(f"{process.pid}\n")
        return Submission(job_id=str(process.pid), job_dir=job_dir)


LAUNCHER = LocalLauncher()
