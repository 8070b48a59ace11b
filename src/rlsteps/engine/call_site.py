"""Where an exception was raised, as a user reads it: the innermost frame's file and line (their own code, where a
reward function or a module they named ended the process)."""

from __future__ import annotations

import traceback


def raised_at(error: BaseException) -> str:
    """ " at FILE:LINE" of the innermost frame of `error`'s traceback; "" without one."""
    frames = traceback.extract_tb(error.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
