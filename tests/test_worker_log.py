"""The worker's log lines on a terminal with a live progress bar."""

import io
import logging
import sys

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
