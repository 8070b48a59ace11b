"""What a run says and draws at its end: its main figures first -> last, the failures and the signs of reward hacking
it met, and metrics.png."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from rlsteps.engine.records import metrics
from rlsteps.engine.records.reward_hacking import RECORD_FILE, recorded_signs

log = logging.getLogger("rlsteps")
PLOTTED = ["train/reward", "val/reward_mean", "train/loss", "train/response_length"]  # and val/<reward function>
SUMMARISED = ["train/reward", "val/reward_mean"]  # first -> last at the end of a run, and val/<reward function>


def summarise(run_dir: Path, extra_keys: list[str]) -> None:
    """The first and last value of the run's main figures, and what failed along the way, said in the log."""
    records = metrics.read_metrics(run_dir / "metrics.jsonl")
    for key in SUMMARISED + extra_keys:
        steps, values = metrics.metric_series(records, key)
        if len(values) >= 2:
            log.info("%s: %.4f at step %d -> %.4f at step %d", key, values[0], steps[0], values[-1], steps[-1])
    _, failed = metrics.metric_series(records, "judge/transport_failures")
    if sum(failed):
        log.warning(
            "%d judge comparisons failed in transport over the run; their responses left the loss "
            "(judge/transport_failures)",
            sum(failed),
        )
    steps, idle = metrics.metric_series(records, "train/steps_without_update")
    if idle and idle[-1]:
        log.warning("%d of %d steps made no optimizer update (train/steps_without_update)", idle[-1], steps[-1])
    signs = recorded_signs(run_dir)
    if signs:
        log.warning("signs of reward hacking over the run (%s):", RECORD_FILE)
        for line in signs:
            log.warning("  %s", line)


def start_plot(run_dir: Path, extra_keys: list[str]) -> subprocess.Popen | None:
    """metrics.png drawn by a process of its own from the finished metrics.jsonl (the run's main figures and
    `extra_keys`); None where none can start."""
    keys = PLOTTED[:2] + extra_keys + PLOTTED[2:]
    try:
        return metrics.start_plot(run_dir / "metrics.jsonl", run_dir / "metrics.png", keys)
    except OSError as error:
        log.warning("no metrics plot: %s", error)
        return None


def finish_plot(run_dir: Path, process: subprocess.Popen | None) -> None:
    """Wait for the plot (the run ends with its file written, or a warning saying why not)."""
    if process is None:
        return
    try:
        log.info("metrics plot: %s", metrics.finish_plot(process, run_dir / "metrics.png"))
    except ValueError as error:
        log.warning("no metrics plot: %s", error)
