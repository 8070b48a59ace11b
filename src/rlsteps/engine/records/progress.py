"""The progress line of a run: its steps (TrainingProgress) and, while it validates, its validation
(ValidationProgress), each readable at 60 columns.

On a terminal both are rows of one rich progress display: the steps' bar, and under it, while validation runs, its
own. Otherwise (CI, a log file) each is plain lines: one per step, and for validation one as it starts, one every
PLAIN_EVERY seconds while it runs (a validation of many greedy answers takes minutes and is seen alive), one as it
ends.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

IDLE_STEPS_KEY = "train/steps_without_update"  # shown beside the progress once a step changed no weight
VALIDATION_REWARD_KEY = "val/reward_mean"
PLAIN_EVERY = 30.0  # seconds between plain validation lines
TICK = 1.0  # seconds between redraws of the validation row's clock on a terminal


BAR_COLUMNS = 16  # the progress bar's width: the counter and the stats have the rest


class TrainingProgress:
    """Step progress with the latest reward, loss, step time and ETA.

    On a terminal: a rich progress bar. Otherwise (CI, log files): one plain line per step.
    `initial` is the step a resumed run starts from. The ETA uses this run's mean step time without its first step,
    which carries the warm-up (compiling the sampler or the forward, CUDA graphs, the allocator's first blocks: 50 s
    against 2.2 s a step for the 0.37B GRPO step on an H200), so it is said from the run's second step on.
    """

    def __init__(
        self,
        total: int,
        initial: int = 0,
        reward_key: str = "train/reward",
        loss_key: str = "train/loss",
        stream: TextIO | None = None,
    ):
        self.total, self.initial = total, initial
        self.reward_key, self.loss_key = reward_key, loss_key
        self.stream = stream if stream is not None else sys.stdout
        self.interactive = self.stream.isatty()
        self._progress: Any = None
        self._task: Any = None
        self._last = time.perf_counter()
        self._first_done: float | None = None  # when this run's first step ended

    def __enter__(self) -> TrainingProgress:
        self._last = time.perf_counter()
        if self.interactive:
            self._progress = _rich_progress(self.stream, self.total)
            self._task = self._progress.add_task(
                "step", total=self.total, completed=self.initial, count=self._count(self.initial), stats=""
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def update(self, step: int, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        step_seconds, self._last = now - self._last, now
        eta = self._eta(step, now)
        if self._first_done is None:
            self._first_done = now
        stats = (
            f"reward {_fmt(metrics.get(self.reward_key))}  loss {_fmt(metrics.get(self.loss_key))}  "
            f"step {step_seconds:.2f}s  eta {eta}"
        )
        if metrics.get(IDLE_STEPS_KEY):
            stats += f"  steps without update {int(metrics[IDLE_STEPS_KEY])}"
        if self._progress is not None:
            stats = _cut(stats, self.stats_room())
            self._progress.update(self._task, completed=step, count=self._count(step), stats=stats)
        else:
            print(f"step {step}/{self.total}  {stats}", file=self.stream, flush=True)

    def validation(self, rows: int) -> ValidationProgress:
        """The progress of a validation whose sampler answers `rows` rows here, drawn beside the steps' bar."""
        return ValidationProgress(rows, self.stream, self._progress, room=self.stats_room)

    def stats_room(self) -> int:
        """The columns a row's stats have on the terminal: its width less the name, the bar, the counter, and a
        space between each column and at the end."""
        return self._progress.console.width - 4 - BAR_COLUMNS - (2 * len(str(self.total)) + 1) - 4

    def _count(self, step: int) -> str:
        return f"{step:>{len(str(self.total))}}/{self.total}"

    def _eta(self, step: int, now: float) -> str:
        """The time left at this run's mean step time after its first step; `-` at the first (unless the last)."""
        left = max(self.total - step, 0)
        if left == 0:
            return _duration(0)
        if self._first_done is None:
            return "-"
        after_first = step - self.initial - 1  # steps this run timed after its first
        return _duration((now - self._first_done) / max(after_first, 1) * left)


class ValidationProgress:
    """A validation's progress: the rows answered so far of `rows`, its phase (generating, scoring) and its time.

    `answered(count)` may be called as often as the sampler likes (a backend that cannot count calls it never: the
    clock still runs); `scoring()` when every row is answered; `done(figures)` with validation's figures. On a
    terminal a row under the steps' bar (`bar`, rich), removed at the end, when one line stays; otherwise plain
    lines (the module's docstring). Over several processes the main one's rows are counted: its share.
    """

    def __init__(
        self,
        rows: int,
        stream: TextIO | None = None,
        bar: Any = None,
        every: float = PLAIN_EVERY,
        clock: Callable[[], float] = time.monotonic,
        room: Callable[[], int] | None = None,
    ):
        self.rows, self.stream, self.every, self.clock = rows, stream or sys.stdout, every, clock
        self._bar, self._task, self._room = bar, None, room
        self._answered, self._phase, self._figures = 0, "generating", None
        self._started = clock()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> ValidationProgress:
        self._started = self.clock()
        if self._bar is not None:
            self._task = self._bar.add_task("val", total=self.rows, completed=0, count="", stats=self._row())
        else:
            self._write(self.line())
        self._ticker = threading.Thread(target=self._tick, name="rlsteps-validation-progress", daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._task is not None:
            self._bar.remove_task(self._task)
        if self._figures is not None:
            if self._bar is not None:
                self._bar.console.print(self.line(), highlight=False, soft_wrap=True)
            else:
                self._write(self.line())

    def answered(self, count: int) -> None:
        self._answered = max(0, min(count, self.rows))
        self._redraw()

    @property
    def on_answered(self) -> Callable[[int], None]:
        """What the sampler calls with the count of rows answered so far."""
        return self.answered

    def scoring(self) -> None:
        self._answered, self._phase = self.rows, "scoring"
        self._redraw()

    def done(self, figures: dict[str, float]) -> None:
        self._phase, self._figures = "done", figures

    def line(self) -> str:
        """The plain line: `validation 12/64  generating  0:01:30`; at the end, the reward after the time."""
        return f"validation {self._answered}/{self.rows}  {self._stats()}"

    def _stats(self) -> str:
        stats = f"{self._phase}  {_duration(self.clock() - self._started)}"
        if self._figures is not None:
            stats += f"  reward {_fmt(self._figures.get(VALIDATION_REWARD_KEY))}"
        return stats

    def _row(self) -> str:
        """The stats of the row under the steps' bar (its counter column is the steps'): `12/64  generating  0:01:15`,
        cut to the room it has."""
        row = f"{self._answered}/{self.rows}  {self._stats()}"
        return _cut(row, self._room()) if self._room is not None else row

    def _redraw(self) -> None:
        if self._task is not None:
            self._bar.update(self._task, completed=self._answered, stats=self._row())

    def _tick(self) -> None:
        """On a terminal the row's clock, each TICK seconds; otherwise a plain line each `every` seconds."""
        while not self._stop.wait(TICK if self._bar is not None else self.every):
            if self._bar is not None:
                self._redraw()
            else:
                self._write(self.line())

    def _write(self, line: str) -> None:
        with self._lock:  # one write per line: the ticker's lines never run into another's
            self.stream.write(line + "\n")
            self.stream.flush()


class QuietValidation:
    """Where no progress is drawn (a process other than the main one): the calls ValidationProgress takes, ignored."""

    on_answered = None  # the sampler counts nothing

    def __enter__(self) -> QuietValidation:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def scoring(self) -> None:
        pass

    def done(self, figures: dict[str, float]) -> None:
        pass


def _rich_progress(stream: TextIO, total: int) -> Any:
    """The bar: the counter never cut (at 60 columns the stats give way, ending in an ellipsis)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.table import Column

    counter = 2 * len(str(total)) + 1
    return Progress(
        TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True, min_width=4)),
        BarColumn(bar_width=BAR_COLUMNS, table_column=Column(no_wrap=True, min_width=BAR_COLUMNS)),
        TextColumn("{task.fields[count]}", markup=False, table_column=Column(no_wrap=True, min_width=counter)),
        TextColumn("{task.fields[stats]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
        console=Console(file=stream),
    )


def _cut(text: str, width: int) -> str:
    """`text` in `width` columns, ending in an ellipsis when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _fmt(value: Any) -> str:
    return "-" if value is None or not math.isfinite(float(value)) else f"{float(value):.4g}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
