"""A wait on a server is never silent: while a call waits (a reward model, a judge, a server still loading), a line
at least every HEARTBEAT_S seconds says what it waits for, the attempt, and the time left before it gives up.

    with Waiting("the reward server at http://...", patience_s=390, attempts=6) as waiting:
        ... waiting.attempt(2) ...

A wait that ends before HEARTBEAT_S says nothing: a step's scoring that answers in seconds stays quiet.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)

HEARTBEAT_S = float(os.environ.get("RLSTEPS_HEARTBEAT_S", "30"))  # the longest silence while a server is waited on


class Waiting:
    """What a call waits for, said every `every_s` from a thread of its own until the block ends."""

    def __init__(
        self,
        what: str,
        patience_s: float,
        attempts: int | None = None,
        say: Callable[[str], None] = log.warning,
        every_s: float | None = None,
    ) -> None:
        self.what, self.patience_s, self.attempts, self.say = what, patience_s, attempts, say
        self.every_s = HEARTBEAT_S if every_s is None else every_s
        self.current = 1
        self.started = self.last_heard = time.monotonic()
        self._done = threading.Event()
        self._lock = threading.Lock()

    def attempt(self, number: int) -> None:
        """The attempt now under way (several threads may each be at their own: the furthest is said)."""
        with self._lock:
            self.current = max(self.current, number)

    def heard(self) -> None:
        """The server answered: its silence, which the patience bounds, starts again from now."""
        self.last_heard = time.monotonic()

    def left_s(self) -> float:
        """The patience left before the wait gives up: patience_s from the start or from the server's last answer."""
        return self.patience_s - (time.monotonic() - self.last_heard)

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        of = f" of {self.attempts}" if self.attempts else ""
        left = self.left_s()
        gives_up = f"gives up in {left:.0f}s at most" if left >= 0.5 else "giving up now"
        return f"still waiting for {self.what}: attempt {self.current}{of}, {elapsed:.0f}s so far, {gives_up}"

    def __enter__(self) -> Waiting:
        self.started = self.last_heard = time.monotonic()
        self._done.clear()
        threading.Thread(target=self._beat, name="rlsteps-waiting", daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()

    def _beat(self) -> None:
        while not self._done.wait(self.every_s):
            self.say(self.line())


def minutes(seconds: float) -> str:
    """A duration as a person reads it: 45s, 6.5 min."""
    return f"{seconds:.0f}s" if seconds < 90 else f"{seconds / 60:.1f} min"
