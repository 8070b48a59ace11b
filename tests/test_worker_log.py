"""The worker's log lines on a terminal with a live progress bar."""

import io
import logging
import sys
from pathlib import Path

from rlsteps.engine.run.worker_log import log_to


def test_log_lines_follow_sys_stderr_so_a_live_progress_bar_can_print_them_above_itself(tmp_path, monkeypatch):
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        log_to(tmp_path / "train.log")
        proxy = io.StringIO()  # what rich's Live puts in sys.stderr while the bar is drawn
        monkeypatch.setattr(sys, "stderr", proxy)
        logging.getLogger("rlsteps").info("saved checkpoint step_2")
        assert proxy.getvalue() == "INFO saved checkpoint step_2\n"
        assert "saved checkpoint step_2" in (tmp_path / "train.log").read_text()
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def test_a_train_log_on_a_full_disk_says_so_once_and_the_terminal_keeps_every_line(monkeypatch, capsys):
    """/dev/full is a real device whose every write fails with ENOSPC, as a filled disk's would."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        log_to(Path("/dev/full"))
        monkeypatch.setattr(sys, "stderr", proxy := io.StringIO())
        log = logging.getLogger("rlsteps")
        log.info("step 2 done")
        log.error("no space left on /runs/a")
        lines = proxy.getvalue().splitlines()
        assert "Traceback" not in proxy.getvalue() and "Logging error" not in proxy.getvalue()
        assert lines == [
            "INFO step 2 done",
            "WARNING /dev/full: No space left on device; the rest of the log is on the terminal only",
            "ERROR no space left on /runs/a",
        ]
        logging.shutdown()  # the interpreter's exit flushes the file again: quietly
        assert proxy.getvalue().splitlines() == lines
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
