"""How the worker answers signals: every way it ends leaves a log line, a clean exit code and no helper behind.

SIGTERM (`scancel`, `rlsteps jobs cancel`, `timeout`, a pod being stopped) raises Terminated in the main
thread, so every `with` block unwinds: the reward server and the judge are stopped, files are closed, and
the last checkpoint stays intact. SIGUSR1 (Slurm's `--signal=USR1@SECONDS` before the time limit) asks the
loop to write a checkpoint after the step in progress and stop with EXIT_CHECKPOINTED, which the batch
script answers by requeueing the job; the requeued job resumes from that checkpoint.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

EXIT_CHECKPOINTED = 75  # EX_TEMPFAIL: stopped on request after a checkpoint; run again to go on
EXIT_TERMINATED = 128 + signal.SIGTERM
CHECKPOINT_SIGNAL = signal.SIGUSR1

_checkpoint_requested = threading.Event()


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt: not an error the code should catch
    """SIGTERM arrived: unwind and exit, as Ctrl-C would."""


class CheckpointRequested(RuntimeError):
    """The run stopped at a step boundary after writing the checkpoint it was asked for."""


def install() -> None:
    """The worker's handlers; only the main thread may set them."""
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(CHECKPOINT_SIGNAL, _request_checkpoint)


def checkpoint_requested() -> bool:
    return _checkpoint_requested.is_set()


def _terminate(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated


def _request_checkpoint(signum: int, frame: FrameType | None) -> None:
    _checkpoint_requested.set()
