"""How the worker answers signals: every way it ends leaves a log line, a clean exit code and no helper behind.

SIGTERM (`scancel`, `rlsteps jobs cancel`, `timeout`, a pod being stopped) and SIGINT (Ctrl-C) stop the run. Inside
the training loop's steps the first one asks for a stop at the end of the step in progress: the loop writes a
checkpoint there and raises StoppedBySignal (exit 143, or 130 for SIGINT), so a rerun loses nothing. After Ctrl-C
the step ends however long it takes (a second Ctrl-C stops at once); after SIGTERM or SIGHUP, whose sender kills
soon after, a step that does not end within STOP_GRACE_S (RLSTEPS_STOP_GRACE_S) unwinds at once, as a second
signal does. Elsewhere (starting up, writing the output) the signal raises Terminated (or KeyboardInterrupt) in the
main thread at once. Either way every `with` block unwinds: the reward server and the judge are stopped, files are
closed, and what a rerun starts from is said (`rerun_from`): the last checkpoint written, or step 0.
SIGUSR1 (Slurm's `--signal=USR1@SECONDS` before the time limit) asks the loop to write a checkpoint after the step
in progress and stop with EXIT_CHECKPOINTED, which the batch script answers by requeueing the job; the requeued job
resumes from that checkpoint. SIGHUP (the terminal or session that ran it went away) is answered as SIGTERM.

A worker started by `rlsteps run` (STOP_WITH_PARENT in its environment) also stops as on SIGTERM when the process
that started it is gone: the CLI killed outright (kill -9) has the kernel send it SIGTERM (PR_SET_PDEATHSIG, set by
the launcher), and a watcher thread covers what that does not (torchrun killed under its workers). Its terminal is
then no longer the run's: from that moment what the worker writes there goes to worker.log in its job directory
instead (train.log has its log lines either way).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType

from rlsteps.contract.entry_points import EXIT_CHECKPOINTED  # noqa: F401 (signals.EXIT_CHECKPOINTED)
from rlsteps.contract.run_files import EXIT_FILE_ENV, STOP_WITH_PARENT, TERMINAL_LOG

EXIT_TERMINATED = 128 + signal.SIGTERM
CHECKPOINT_SIGNAL = signal.SIGUSR1
PARENT_POLL_S = 0.5

STOP_GRACE_S = float(os.environ.get("RLSTEPS_STOP_GRACE_S", "30"))  # the step in progress may end this long after

_checkpoint_requested = threading.Event()
_stopping = threading.Event()  # SIGTERM, SIGHUP or SIGINT arrived: the worker is unwinding
_at_step_boundary = threading.Event()  # the loop is in its steps: a stop waits for the step's end
_stop_signal: list[int] = []  # the signal that asked for a stop at the step's end
_unwound_by: list[int] = []  # the signal that has the worker unwinding at once
_parent: int | None = None  # the parent the watcher watches
_left_terminal: list[bool] = []  # stdout and stderr went to worker.log
_checkpointed: list[int] = []  # the step of the run's last checkpoint, once it has one


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt: not an error the code should catch
    """SIGTERM arrived: unwind and exit, as Ctrl-C would."""


class CheckpointRequested(RuntimeError):
    """The run stopped at a step boundary after writing the checkpoint it was asked for."""


class StoppedBySignal(BaseException):  # noqa: N818 - like Terminated: how the run ends, not an error to catch
    """SIGTERM, SIGHUP or SIGINT stopped the run at the end of a step, after a checkpoint."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def stops_at_step_end():
    """While the loop runs its steps: a stop signal is answered at the end of the step in progress."""
    _at_step_boundary.set()
    try:
        yield
    finally:
        _at_step_boundary.clear()


def stop_requested() -> int | None:
    """The signal that asked the loop to stop at the end of this step, or None."""
    return _stop_signal[0] if _stop_signal else None


def stopped(step: int, signum: int) -> StoppedBySignal:
    name = signal.Signals(signum).name
    code = 130 if signum == signal.SIGINT else EXIT_TERMINATED
    return StoppedBySignal(
        f"stopped at step {step} after a checkpoint ({name}); rerun the same command to resume from step {step}", code
    )


def checkpointed(step: int | None) -> None:
    """The run has a checkpoint of `step` (written, or resumed from): what a rerun would start from; None: none
    yet."""
    _checkpointed[:] = [] if step is None else [step]


def rerun_from() -> str:
    """From which step a rerun starts, in words."""
    if not _checkpointed:
        return "no checkpoint yet: a rerun starts from step 0"
    return f"a rerun resumes from step {_checkpointed[0]}, the last checkpoint"


def unwound(signum: int, cause: str | None = None) -> StoppedBySignal:
    """`signum` stopped the run in the middle of its work (no checkpoint of the step in progress): how it ends,
    saying what a rerun starts from; cause: what the unwinding raised, when it did."""
    name = signal.Signals(signum).name
    code = 130 if signum == signal.SIGINT else EXIT_TERMINATED
    during = f" ({cause})" if cause else ""
    how = "interrupted" if signum == signal.SIGINT else "terminated"
    return StoppedBySignal(f"{how} ({name}) in the middle of its work{during}; {rerun_from()}", code)


def unwinding_signal() -> int | None:
    """The signal that has the worker unwinding at once, or None."""
    return _unwound_by[0] if _unwound_by else None


def install() -> None:
    """The worker's handlers; only the main thread may set them."""
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(CHECKPOINT_SIGNAL, _request_checkpoint)
    if os.environ.get(STOP_WITH_PARENT) == "1":
        watch_parent()


def watch_parent(poll_s: float = PARENT_POLL_S) -> None:
    """SIGTERM to this process once its parent is gone (it was reparented), from a daemon thread; not when it is
    already stopping or a stop at the step's end is pending (a second SIGTERM would cut its checkpoint or cleanup
    short)."""
    global _parent
    _parent = os.getppid()

    def watch() -> None:
        while not parent_gone():
            _stopping.wait(poll_s)
        leave_the_terminal()
        if not (_stopping.is_set() or _stop_signal):  # the kernel's SIGTERM may have asked already
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rlsteps-parent-watch", daemon=True).start()


def parent_gone() -> bool:
    """The process that started this worker ended before it (only known where the watcher was started)."""
    return _parent is not None and os.getppid() != _parent


def unwinding_exit_code() -> int | None:
    """130 or 143 while a signal has the worker unwinding (an error raised meanwhile is its consequence), else
    None."""
    if not _unwound_by:
        return None
    return 130 if _unwound_by[0] == signal.SIGINT else EXIT_TERMINATED


def checkpoint_requested() -> bool:
    return _checkpoint_requested.is_set()


def leave_the_terminal() -> None:
    """Once the process that started this worker is gone: stdout and stderr to worker.log in the job directory (the
    terminal belongs to whatever the user does next). Once; in a signal handler too (no flush: a write the signal
    interrupted may hold the buffer's lock, and what is in it goes to the new file)."""
    if _left_terminal or not parent_gone():
        return
    _left_terminal.append(True)
    exit_file = os.environ.get(EXIT_FILE_ENV)
    try:
        fd = os.open(
            os.path.join(os.path.dirname(exit_file), TERMINAL_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
    except (OSError, TypeError):  # no job directory (a worker started by hand), or it is gone
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _terminate(signum: int, frame: FrameType | None) -> None:
    leave_the_terminal()  # the kernel's SIGTERM when the CLI was killed: before a line is written about it
    if _stop_at_step_end(signum):
        return
    _unwind(signum)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal is gone: let the cleanup finish
    raise Terminated


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if _stop_at_step_end(signum):
        return
    _unwind(signum)
    raise KeyboardInterrupt


def _unwind(signum: int) -> None:
    """`signum` has the worker unwinding at once: the watcher stands down, and the exit code will be the signal's."""
    _unwound_by.append(signum)
    _stopping.set()


def _stop_at_step_end(signum: int) -> bool:
    """The first stop signal inside the loop's steps: noted for the step's end, with a deadline; True when so."""
    if not _at_step_boundary.is_set() or _stop_signal:
        return False
    _stop_signal.append(signum)
    _at_step_boundary.clear()  # a second signal unwinds at once
    name = signal.Signals(signum).name
    if signum == signal.SIGINT:  # a person, who may press Ctrl-C again: the step ends however long it takes
        _say(f"{name}: the step in progress ends, then a checkpoint and a stop (Ctrl-C again to stop at once: "
             f"{rerun_from()})")  # fmt: skip
        return True
    _say(f"{name}: the step in progress ends within {STOP_GRACE_S:g} s (RLSTEPS_STOP_GRACE_S), then a checkpoint "
         f"and a stop; after that it stops at once: {rerun_from()}")  # fmt: skip
    timer = threading.Timer(STOP_GRACE_S, lambda: None if _stopping.is_set() else os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    return True


def _say(line: str) -> None:
    """A line on stderr from a signal handler: one write, no lock (the handler may have interrupted a write)."""
    try:
        os.write(2, f"rlsteps: {line}\n".encode())
    except OSError:  # no stderr left
        pass


def _request_checkpoint(signum: int, frame: FrameType | None) -> None:
    _checkpoint_requested.set()
