"""One run per run directory: the worker holds an OS lock on <output.dir>/run.lock for its whole life.

The lock is `fcntl.flock` (exclusive) on an open file: the kernel releases it when the process ends however it ends
(kill -9, a crash, power loss), so a lock left behind never blocks a rerun; the file stays, and only a held lock
counts. The holder writes one JSON line into the file for the message a refused run prints:

    {"job": "20260101-120000-rl_rs-3f9a1c", "job_dir": "/work/.rlsteps/jobs/...", "pid": 4242, "host": "node1",
     "started": "2026-01-01T12:00:00+0000"}

`rlsteps run` asks first (`holder`), before it starts anything, so the refusal comes in seconds; the worker's own
claim (`RunLock.acquire`) is the one that counts (two runs started at once, a job submitted elsewhere). Standard
library only: the CLI imports it without torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCK_FILE = "run.lock"
EXIT_IN_USE = 2  # as a usage error: the command was refused, nothing ran
CLAIM_TRIES_S = 1.0  # another process may be asking (holder) at the very moment the worker claims


@dataclass(frozen=True)
class Holder:
    """Who holds a run directory's lock, as the holder wrote it (empty fields while it is being written)."""

    path: Path
    info: dict[str, Any]

    @property
    def job(self) -> str | None:
        return self.info.get("job")

    def describe(self) -> str:
        job = self.info.get("job")
        where = ", ".join(
            part
            for part in (
                f"pid {self.info['pid']}" if self.info.get("pid") else "",
                f"on {self.info['host']}" if self.info.get("host") else "",
                f"since {self.info['started']}" if self.info.get("started") else "",
            )
            if part
        )
        return f"job {job}" + (f" ({where})" if where else "") if job else f"another run ({where or 'starting'})"

    def fix(self) -> str:
        stop = f"stop it with `rlsteps jobs cancel {self.job}`" if self.job else "stop that run"
        return f"{stop} (or wait for it to end), or pass output.dir=NEW_DIR for a separate run"


class RunDirectoryLocked(RuntimeError):
    """Another live process holds the run directory's lock."""

    def __init__(self, run_dir: Path, holder: Holder):
        self.holder = holder
        super().__init__(f"{run_dir} is in use by {holder.describe()}: one run per output.dir")


def holder(run_dir: Path) -> Holder | None:
    """The live holder of the run directory's lock, or None when no process holds it (or there is no lock file)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return Holder(path, _read(fd))
        except OSError:
            return None  # a filesystem without locks: the worker's own claim says so
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class RunLock:
    """The worker's claim on its run directory, held until release() or the process ends."""

    def __init__(self, run_dir: Path, job: str, job_dir: str | None = None):
        self.path = Path(run_dir) / LOCK_FILE
        self.info = {
            "job": job,
            "job_dir": job_dir,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise RunDirectoryLocked naming its holder. The descriptor is not inherited by the
        processes the worker starts (its servers), so the lock ends with the worker."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + CLAIM_TRIES_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                found = Holder(self.path, _read(fd))
                os.close(fd)
                raise RunDirectoryLocked(self.path.parent, found) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(self.info, sort_keys=True) + "\n").encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the lock; the file stays, unlocked


def _read(fd: int) -> dict[str, Any]:
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        info = json.loads(text) if text else {}
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}
