"""A resumed run's records cut back to the step of the checkpoint it resumes from.

What came after that checkpoint (the steps of a run that was stopped later) is made again by the resumed run:
its lines in metrics.jsonl, samples.jsonl and reward_hacking.jsonl (one {"step": N, ...} a line) and its per-step
lines in the run's logs go, so no step is on record twice. A line a kill cut short is repaired.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from rlsteps.contract.run_files import METRICS_FILE
from rlsteps.engine.records.metrics import keep_records_through, replace_atomically
from rlsteps.engine.records.reward_hacking import RECORD_FILE as REWARD_HACKING_FILE

logger = logging.getLogger(__name__)

RECORD_FILES = (METRICS_FILE, "samples.jsonl", REWARD_HACKING_FILE)  # JSONL, one {"step": N, ...} a line
STEP_LOGGER = "rlsteps.steps"  # the loop's one line per step in the run's log: "<time> INFO rlsteps.steps: step N/T"
_LOG_HEADER = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
_STEP_LINE = re.compile(_LOG_HEADER.pattern + re.escape(STEP_LOGGER.encode()) + rb": step (\d+)/\d+")


def rewind_records(run_dir: Path, step: int | None, records: bool = True) -> None:
    """Cut the run's records back to the checkpoint the run resumes from (`step`; None: a start without one,
    which keeps no record of an earlier start): metrics.jsonl and samples.jsonl (with `records`: the process
    that writes them) and the log files this process writes in `run_dir`."""
    for name in RECORD_FILES if records else ():
        keep_records_through(run_dir / name, step)
    for path in _own_logs(run_dir):
        keep_log_steps_through(path, step)


def keep_log_steps_through(path: Path, step: int | None) -> int:
    """Drop a run log's per-step lines of steps after `step` (all of them for None), and the torn end of a line
    that a kill cut short (the next start's first line is glued to it). The other lines stay: they tell what
    happened before the run stopped. Replaced whole, under the lock of this process's handlers that write the
    file, which then write to the new file. Returns the number of lines dropped or repaired."""
    if not path.is_file():
        return 0
    handlers = [h for h in logging.getLogger().handlers if _writes(h, path)]
    for handler in handlers:
        handler.acquire()
    try:
        for handler in handlers:
            handler.flush()
        lines = path.read_bytes().splitlines(keepends=True)
        kept, repaired = [], 0
        for line in lines:
            glued = _LOG_HEADER.search(line, 1)
            if glued:
                line, repaired = line[glued.start() :], repaired + 1
            at = _STEP_LINE.match(line)
            if at and (step is None or int(at.group(1)) > step):
                continue
            kept.append(line)
        changed = len(lines) - len(kept) + repaired
        if changed:
            replace_atomically(path, b"".join(kept))
            for handler in handlers:
                old = handler.setStream(open(handler.baseFilename, handler.mode, encoding=handler.encoding))
                if old is not None:
                    old.close()
    finally:
        for handler in handlers:
            handler.release()
    if changed:
        dropped = f"{len(lines) - len(kept)} step line(s) " + (f"after step {step}" if step is not None else "")
        logger.info("%s: dropped %s (resumed run), repaired %d torn line(s)", path, dropped.strip(), repaired)
    return changed


def _own_logs(run_dir: Path) -> list[Path]:
    """The files in `run_dir` that this process's logging writes (train.log; train.rank<N>.log elsewhere)."""
    root = Path(run_dir).absolute()
    files = {Path(h.baseFilename) for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)}
    return sorted(f for f in files if f.parent == root)


def _writes(handler: logging.Handler, path: Path) -> bool:
    return isinstance(handler, logging.FileHandler) and Path(handler.baseFilename) == Path(path).absolute()
