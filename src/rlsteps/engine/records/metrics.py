"""Training metrics: an append-only JSONL log mirrored to the trackers (trackers.py), timers; curves in plot.py, the
progress line in progress.py.

The JSONL file is the record of a run: one line {"step", "time", **metrics} per `log` call,
written at once and whole: a write the disk cannot take is cut back, so the file never ends in a torn line
(a kill mid-write may leave one, which the next start drops). A resumed run first cuts the file back to the
steps of its checkpoint (`keep_records_through`), then appends: the file reads as if the run never stopped.
`read_metrics` still drops records that a later step superseded (in files written before resumes cut them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

logger = logging.getLogger(__name__)

RESERVED_KEYS = ("step", "time")


def to_json_number(value: Any) -> int | float | None:
    """A metric value as a JSON number: tensors and numpy scalars unwrapped, NaN and inf as None."""
    if hasattr(value, "item"):  # torch.Tensor with one element, numpy scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"metric value {value!r} is not a number; log numbers only (use float(...))")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON line per `log` call; mirrors the finite numbers to each tracker (trackers.py).

    trackers: opened trackers (trackers.open_trackers), each closed with the writer.
    """

    def __init__(self, path: Path, trackers: list | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        drop_partial_last_line(self.path)
        self._file: BinaryIO = open_records(self.path)
        self._warned_non_finite: set[str] = set()
        self._trackers = list(trackers or [])  # rlsteps.engine.records.trackers: each step forwarded to them

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clash = [k for k in RESERVED_KEYS if k in metrics]
        if clash:
            raise ValueError(f"metric names {clash} are reserved for the record itself; rename them")
        values = {key: self._finite_or_none(step, key, value) for key, value in metrics.items()}
        record = {"step": int(step), "time": round(time.time(), 3), **values}
        append_whole(self._file, json.dumps(record, allow_nan=False) + "\n")
        numbers = {key: value for key, value in values.items() if value is not None}
        for tracker in self._trackers:
            tracker.log(int(step), numbers)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _finite_or_none(self, step: int, key: str, value: Any) -> int | float | None:
        number = to_json_number(value)
        if number is None and key not in self._warned_non_finite:
            self._warned_non_finite.add(key)
            logger.warning(
                "metric %r is %s at step %d; written as null (later non-finite values of it are not reported)",
                key,
                value,
                step,
            )
        return number


def open_records(path: Path) -> BinaryIO:
    """A record file opened for `append_whole`: unbuffered, so nothing waits in memory to be written later."""
    return Path(path).open("ab", buffering=0)


def append_whole(file: BinaryIO, text: str) -> None:
    """Append `text` (whole lines) to a file from `open_records`, or nothing: a write that fails part-way (a full
    disk) is cut back to where it began, and its error raised."""
    data = text.encode("utf-8")
    start = file.seek(0, os.SEEK_END)
    try:
        written = 0
        while written < len(data):
            written += file.write(data[written:])
    except OSError:
        with contextlib.suppress(OSError):  # cutting frees space; it does not need any
            os.ftruncate(file.fileno(), start)
        raise


def keep_records_through(path: Path, step: int | None) -> int:
    """Cut a JSONL record file (lines {"step": N, ...}) back to the records of steps <= `step` (None: to no
    record), dropping a torn last line: what a run resumed from the checkpoint of `step` does before it appends.

    Only when something goes, and atomically: the records kept are the file's first lines (steps only grow in a
    file this module writes), so the file is truncated in place (one call, no space needed); otherwise it is
    replaced whole. Returns the number of lines dropped."""
    path = Path(path)
    if not path.is_file():
        return 0
    lines = path.read_bytes().splitlines(keepends=True)
    kept: list[bytes] = []
    for line in lines:
        if not line.endswith(b"\n"):
            break  # torn by a kill mid-write
        try:
            at = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # not a record
        if step is not None and at <= step:
            kept.append(line)
    dropped = len(lines) - len(kept)
    if not dropped:
        return 0
    if lines[: len(kept)] == kept:
        with path.open("rb+") as f:
            f.truncate(sum(len(line) for line in kept))
            os.fsync(f.fileno())
    else:
        replace_atomically(path, b"".join(kept))
    after = f"after step {step}, the checkpoint this run resumes from" if step is not None else "(no checkpoint)"
    logger.info("%s: dropped %d line(s) %s", path, dropped, after)
    return dropped


def replace_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a sibling file, sync it, and rename it over `path`; a failure leaves `path` as it was."""
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with staging.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def drop_partial_last_line(path: Path) -> None:
    """Cut a line left half-written by a crash, so appended records start on a line of their own."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        end = size
        while end > 0:  # scan back in chunks for the last newline
            start = max(0, end - 65536)
            f.seek(start)
            newline = f.read(end - start).rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        f.truncate(end)
    logger.warning("%s ended with a partly written line (an interrupted run); removed it", path)


def metric_series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of one metric, skipping records without it and null (non-finite) values."""
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [step for step, _ in points], [value for _, value in points]


def trend(values: list[float | None], window: int) -> tuple[float, float]:
    """Mean of the first `window` values and mean of the last `window` values (None skipped)."""
    if window < 1:
        raise ValueError(f"trend window must be >= 1, got {window}")
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        raise ValueError("trend of an empty series: no finite values were logged")
    window = min(window, len(finite))
    return sum(finite[:window]) / window, sum(finite[-window:]) / window


class Timers:
    """Wall-clock time per phase: `with timers("rollout"): ...`; `pop()` returns and resets the totals."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] += time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        totals = {f"timers/{name}": seconds for name, seconds in self._seconds.items()}
        self._seconds.clear()
        return totals
