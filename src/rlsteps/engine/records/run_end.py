"""What a run says and draws at its end: its main figures first -> last, the failures and the signs of reward hacking
it met, and metrics.png (drawn by records/plot.py's process)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rlsteps.contract.run_files import EXIT_FILE_ENV, METRICS_FILE, read_metrics
from rlsteps.engine.records import metrics
from rlsteps.engine.records.plot import PlotProcess
from rlsteps.engine.records.reward_hacking import RECORD_FILE, recorded_signs

log = logging.getLogger("rlsteps")
PLOTTED = ["train/reward", "val/reward_mean", "train/loss", "train/response_length"]  # and val/<reward function>
# a run's health beside its rewards, where its recipe logs them: the KL to the initial or reference policy
# (rl/reinforce's penalty term, GRPO's k3 estimate), the sampled tokens' entropy, each reward term's mean
HEALTH = ["train/init_policy_kl", "train/kl_mean", "train/entropy", "reward/*"]
SUMMARISED = ["train/reward", "val/reward_mean"]  # first -> last at the end of a run, and val/<reward function>
# a judge whose verdicts go to the first-shown response this far from half the time, over the run, or whose scores
# and ranking disagree in this share of its verdicts, is no better than its position: the end summary says so. Shown
# both ways round, a judge that reads the responses wins exactly half from each position; 0.65 means the same
# position won both orders of a pair in (net) three pairs of ten.
POSITION_BIAS_LIMIT = 0.15
CONTRADICTION_LIMIT = 0.25


def summarise(run_dir: Path, extra_keys: list[str]) -> None:
    """The first and last value of the run's main figures, and what failed along the way, said in the log."""
    records = read_metrics(run_dir / METRICS_FILE)
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
    _warn_of_judge_bias(records)
    steps, idle = metrics.metric_series(records, "train/steps_without_update")
    if idle and idle[-1]:
        log.warning("%d of %d steps made no optimizer update (train/steps_without_update)", idle[-1], steps[-1])
    signs = recorded_signs(run_dir)
    if signs:
        log.warning("signs of reward hacking over the run (%s):", RECORD_FILE)
        for line in signs:
            log.warning("  %s", line)


def _warn_of_judge_bias(records: list[dict]) -> None:
    """A warning for each of the judge's bias figures that says its verdicts follow position, not the responses."""
    _, first = metrics.metric_series(records, "judge/first_position_rate")
    if first and abs(sum(first) / len(first) - 0.5) >= POSITION_BIAS_LIMIT:
        log.warning(
            "the judge gave %.0f%% of its verdicts over the run to the response shown first "
            "(judge/first_position_rate; a judge that reads the responses gives about 50%%): its verdicts follow "
            "position, not content, and its rewards say little of the responses. Keep judge.both_orders=true "
            "(position then cancels out) and use a stronger judge",
            100 * sum(first) / len(first),
        )
    _, contradicting = metrics.metric_series(records, "judge/contradiction_rate")
    if contradicting and sum(contradicting) / len(contradicting) >= CONTRADICTION_LIMIT:
        log.warning(
            "the judge's scores and ranking preferred different responses in %.0f%% of its verdicts over the run "
            "(judge/contradiction_rate): the rewards follow its scores, which its own ranking contradicts that "
            "often. Use a stronger judge",
            100 * sum(contradicting) / len(contradicting),
        )


def run_plot(run_dir: Path, extra_keys: list[str]) -> PlotProcess:
    """The process that draws metrics.png (the run's main figures, `extra_keys` and its health), not yet started."""
    keys = PLOTTED[:2] + extra_keys + HEALTH + PLOTTED[2:]
    return PlotProcess(run_dir / METRICS_FILE, run_dir / "metrics.png", keys, plot_title(run_dir))


def plot_title(run_dir: Path) -> str:
    """What tells one run's plot from another's: its step and config (from its job's record, when it runs as a
    job) and its run directory."""
    job = _job_record()
    what = f"{job['step']} -c {job['config']}" if job else run_dir.name
    return f"{what}: {run_dir}"


def _job_record() -> dict | None:
    """The job this process runs as (job.yaml beside its exit-code file): its step and config, or None."""
    import yaml

    exit_file = os.environ.get(EXIT_FILE_ENV)
    if not exit_file:
        return None
    try:
        job = yaml.safe_load((Path(exit_file).parent / "job.yaml").read_text()).get("job") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return job if job.get("step") and job.get("config") else None


def draw_plot(plot: PlotProcess) -> None:
    """Draw the plot now that the metrics are complete: the run ends with its file written, or a warning saying
    why not."""
    try:
        log.info("metrics plot: %s", plot.draw())
    except ValueError as error:
        log.warning("no metrics plot: %s", error)
