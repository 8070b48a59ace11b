"""The worker's logs and what it leaves beside its exit code: train.log (train.rank<N>.log for the other processes)
and the terminal, the exit code in a file, and a failed run's cause in one line for the CLI's error.

Imported once the preflight has passed (the worker's top imports only what parses on older Pythons).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from rlsteps.contract.run_files import EXIT_FILE_ENV, FAILURE_FILE, failure_text, split_fix
from rlsteps.engine.checkpoints.rewind import STEP_LOGGER  # the loop's one line per step: train.log only
from rlsteps.engine.run import signals
from rlsteps.secrets import MaskingFilter


class CurrentStderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is at each record: while the progress bar is live, rich's proxy, which prints
    the line above the bar (a handler holding the original stream would glue it to the bar's line)."""

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class TrainLogHandler(logging.FileHandler):
    """train.log, which a full disk (or a lost mount) must not turn into a logging traceback on the terminal: the
    first write that fails says so in one line there, and the file is left as it is from then on."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def flush(self) -> None:
        if self.failed:
            return
        try:
            super().flush()
        except OSError as error:
            self._give_up(error)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            self._give_up(error)
        else:
            super().handleError(record)

    def _give_up(self, error: OSError) -> None:
        self.failed = True
        line = f"WARNING {self.baseFilename}: {error.strerror or error}; the rest of the log is on the terminal only"
        with contextlib.suppress(OSError):
            print(line, file=sys.stderr)


def log_to(path: Path | None, level: str = "info", rank: int = 0) -> None:
    """train.log and the terminal; a process other than the main one writes its own file and tells the terminal
    its warnings and errors only, marked with its rank. path None: the terminal alone (the run directory is not
    known to be usable yet)."""
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    stream = CurrentStderrHandler()
    stream.setFormatter(logging.Formatter(f"{f'[rank {rank}] ' if rank else ''}%(levelname)s %(message)s"))
    if rank:
        stream.setLevel(logging.WARNING)
    handlers: list[logging.Handler] = [stream, last_error]
    if path is not None:
        file = TrainLogHandler(path)
        file.setFormatter(fmt)
        handlers.insert(1, file)
    for handler in handlers:
        handler.filters = [MaskingFilter()]  # a URL's password (rm.url=http://user:pw@host) never reaches a log
    stream.addFilter(lambda record: record.name != STEP_LOGGER)  # the terminal has the progress bar instead
    root = logging.getLogger()
    root.setLevel(level.upper())
    root.handlers[:] = handlers
    for noisy in ("httpx", "httpcore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class LastError(logging.Handler):
    """The last error the run logged, and its fix: the cause `rlsteps run` names when the worker fails, and the
    next action on its fix line. The fix is the record's `fix` (log_failure gives it), else the " (fix: ...)" that
    ends the line."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.message: str | None = None
        self.fix: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        first = text.splitlines()[0] if text else None
        cause, fix = split_fix(first) if first else (None, None)
        given = getattr(record, "fix", None)
        self.message, self.fix = cause, given or fix

    def clear(self) -> None:
        self.message = self.fix = None


last_error = LastError()


def log_failure(logger: logging.Logger, cause: str, fix: str, traceback: bool = False) -> None:
    """The error that ends the run, with its fix, on one line of the log (the traceback below it, when asked: in
    train.log, where the fix line sends the user)."""
    logger.error("%s (fix: %s)", cause, fix, extra={"fix": fix}, exc_info=traceback)


def record_failure(code: int) -> None:
    """A failed run's cause (its last error line) and its fix beside its exit-code file, for the CLI's error."""
    path = os.environ.get(EXIT_FILE_ENV)
    if code in (0, signals.EXIT_CHECKPOINTED) or not path or not last_error.message:
        return
    if os.environ.get("RANK", "0") != "0":
        return
    with contextlib.suppress(OSError):  # the job directory is gone: nobody is left to read it
        Path(path).with_name(FAILURE_FILE).write_text(failure_text(last_error.message, last_error.fix))


def record_exit_code(code: int) -> None:
    """Where the launcher asks for it (EXIT_FILE_ENV), the exit code in a file, renamed into place: the run's state
    once it has ended, whether or not the rlsteps that started it is still there to see it end."""
    path = os.environ.get(EXIT_FILE_ENV)
    if not path or os.environ.get("RANK", "0") != "0":
        return
    note = "the rlsteps run that started it had ended\n" if signals.parent_gone() else ""
    try:
        staging = f"{path}.{os.getpid()}.tmp"
        Path(staging).write_text(f"{code}\n{note}")
        os.replace(staging, path)
    except OSError:
        pass  # the job directory is gone: nobody is left to read it
