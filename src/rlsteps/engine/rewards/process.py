"""A server run as a local subprocess for the length of a `with` block.

    with LocalServer("rlsteps.engine.rewards.rm", ["--model", path], log_path=run_dir / "rm.log") as rm:
        client = RewardClient(rm.url)

Generic over the module: it must accept `--host` and `--port` and answer GET /health with 200
once it is ready (the reward server does; so does vLLM's OpenAI server for a judge).
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from rlsteps.engine.rewards.waiting import Waiting

LOG_TAIL_CHARS = 4000
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ServerStartError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now. Another process may take it before it is bound again: rare on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return text[-chars:].strip() or "(the log is empty)"


class LocalServer:
    def __init__(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        log_path: str | Path,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 300,
        stop_grace_s: float = 10,
        health_path: str = "/health",
        python: str | Path | None = None,
    ) -> None:
        self.module, self.args = module, list(args)
        self.python = str(python or sys.executable)  # another environment's interpreter may serve (vLLM's, say)
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.startup_timeout_s, self.stop_grace_s = startup_timeout_s, stop_grace_s
        self.health_path = health_path
        self.host = "127.0.0.1"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.ready = False  # it has answered its health check

    @property
    def url(self) -> str:
        if self.process is None:
            raise RuntimeError(f"the {self.module} server is not running: use LocalServer as a context manager")
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [self.python, "-m", self.module, *self.args, "--host", self.host, "--port", str(self.port)]

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()  # also on KeyboardInterrupt: the server never outlives the block

    def start(self, wait: bool = True) -> None:
        """Start the server; with wait, return once it answers (else call wait_until_ready before using it)."""
        self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # A session of its own: Ctrl-C reaches only the parent, which stops the server group in order.
            # If the parent dies without stopping it (kill -9, a crash), the kernel sends it SIGTERM.
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True, preexec_fn=server_preexec(),
            )  # fmt: skip
        atexit.register(self.stop)
        self.ready = False
        if wait:
            self.wait_until_ready()

    def wait_until_ready(self) -> None:
        """Return once the server answers its health check (at once after the first time); if it exits or does
        not answer in time, stop it and raise ServerStartError with the end of its log."""
        if self.ready:
            return
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        self.ready = True

    def _wait_until_healthy(self) -> None:
        import httpx  # here, not at the top: a run starts its server before paying for httpx's import (0.3 s)

        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        what = (
            f"the {self.module} server this run started to answer {self.url}{self.health_path} (log: {self.log_path})"
        )
        with httpx.Client(timeout=2.0) as http, Waiting(what, self.startup_timeout_s) as waiting:
            for poll in itertools.count(1):
                waiting.attempt(poll)
                code = self.process.poll()
                if code is not None:
                    raise ServerStartError(
                        f"the {self.module} server exited with code {code} before it was ready; "
                        f"its log {self.log_path} ends with:\n{log_tail(self.log_path)}"
                    )
                try:
                    if http.get(self.url + self.health_path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"the {self.module} server did not answer {self.url}{self.health_path} within "
                        f"{self.startup_timeout_s:.0f}s, the time a run gives a server it starts to load; "
                        f"its log {self.log_path} ends with:\n{log_tail(self.log_path)}"
                    )
                time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM (and SIGCONT) to the server's process group, SIGKILL after the grace period. Safe to call twice."""
        atexit.unregister(self.stop)
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        _signal_group(process, signal.SIGTERM)
        _signal_group(process, signal.SIGCONT)  # a stopped server (SIGSTOP) handles its SIGTERM only once continued
        try:
            process.wait(self.stop_grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def server_preexec() -> Callable[[], None]:
    """What the server's process does between fork and exec:
    - ignore SIGUSR1 (inherited through exec): Slurm signals every process of a job step before its time limit,
      and the default action would kill the server while the worker writes its checkpoint;
    - receive SIGTERM when the thread that started it ends (Linux prctl PR_SET_PDEATHSIG), so a killed worker
      leaves no server behind. prctl is looked up here, before the fork, so the child only calls it."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None  # not Linux
    parent = os.getpid()

    def prepare_server() -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent ended before the call: nobody will stop this child
                os._exit(1)

    return prepare_server


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the server and whatever it spawned (its own session, so its group id is its pid)."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
