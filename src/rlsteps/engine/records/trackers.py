"""Experiment trackers a run mirrors its metrics to, beside metrics.jsonl: TensorBoard, W&B and MLflow.

Each is switched on by a key of the config's `logging:` section and needs its own package, an extra of rlsteps
(`pip install 'rlsteps[tensorboard]'`, `[wandb]`, `[mlflow]`), imported only when its key is set. A tracker whose
package is missing is a warning naming the key and the extra, and the run goes on with metrics.jsonl alone. Each
tracker says where its events go in one line when it opens: the TensorBoard folder, the W&B run's URL or offline
folder, the MLflow run id and its store.

A rerun of the same run directory (a resume after an interrupt) continues the same tracker runs: the W&B run's id
and the MLflow run's id are kept in the run directory (TRACKER_RUNS_FILE) and opened again (W&B with
resume="allow"); TensorBoard's events of the steps after the checkpoint it resumes from are purged from view. The
steps a resumed run makes again (those after its checkpoint) are logged again: MLflow keeps both values of such a
step, W&B the first (the same samples, from the same seeds).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rlsteps.contract.run_files import METRICS_FILE
from rlsteps.engine.records.metrics import replace_atomically

logger = logging.getLogger(__name__)

TRACKER_RUNS_FILE = "trackers.json"  # in the run directory: the W&B and MLflow runs a rerun continues


class Tracker(Protocol):
    def log(self, step: int, numbers: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def missing(key: str, extra: str, package: str) -> None:
    """The warning for a tracker whose package is not installed."""
    logger.warning(
        "%s is set but the %s package is not installed: pip install 'rlsteps[%s]' (metrics go to metrics.jsonl only)",
        key,
        package,
        extra,
    )


class TrackerRuns:
    """The tracker runs of a run directory (TRACKER_RUNS_FILE): {"wandb": {"id"}, "mlflow": {"run_id", ...}}."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / TRACKER_RUNS_FILE
        self._runs = self._read()

    def _read(self) -> dict[str, dict[str, str]]:
        try:
            runs = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            logger.warning("%s cannot be read (%s): the trackers start new runs", self.path, error)
            return {}
        return runs if isinstance(runs, dict) else {}

    def get(self, tracker: str) -> dict[str, str]:
        found = self._runs.get(tracker)
        return found if isinstance(found, dict) else {}

    def remember(self, tracker: str, **ids: str) -> None:
        self._runs[tracker] = ids
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(self.path, (json.dumps(self._runs, indent=2) + "\n").encode())


class TensorBoardTracker:
    key: ClassVar[str] = "logging.tensorboard"

    def __init__(self, writer: Any, log_dir: Path):
        self._writer = writer
        logger.info("tensorboard: events in %s (tensorboard --logdir %s)", log_dir, log_dir)

    @classmethod
    def open(cls, log_dir: Path, resumed_after: int | None = None) -> TensorBoardTracker | None:
        """The writer of `log_dir`; in a folder an earlier attempt wrote, the events of the steps after
        `resumed_after` (the checkpoint's step; None: no checkpoint, every step) hidden: they are made again."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            missing(cls.key, "tensorboard", "tensorboard")
            return None
        again = {} if not Path(log_dir).is_dir() else {"purge_step": 0 if resumed_after is None else resumed_after + 1}
        return cls(SummaryWriter(log_dir=str(log_dir), **again), log_dir)

    def log(self, step: int, numbers: dict[str, float]) -> None:
        for key, value in numbers.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    key: ClassVar[str] = "logging.wandb_project"

    def __init__(self, run: Any, continued: bool = False):
        self._run = run
        where = f"offline run in {run.settings.sync_dir} (wandb sync it later)" if run.offline else run.url
        logger.info("wandb: %s%s", where, f", continuing run {run.id}" if continued else "")

    @classmethod
    def open(cls, init_kwargs: dict[str, Any], runs: TrackerRuns | None = None) -> WandbTracker | None:
        """A W&B run: the one `runs` names (resumed), else a new one, named in `runs` for a rerun."""
        try:
            import wandb
        except ImportError:
            missing(cls.key, "wandb", "wandb")
            return None
        if runs is None:
            return cls(wandb.init(**init_kwargs))
        previous = runs.get("wandb").get("id")
        run = wandb.init(**init_kwargs, **({"id": previous} if previous else {}), resume="allow")
        runs.remember("wandb", id=run.id, project=str(init_kwargs.get("project")))
        return cls(run, continued=previous == run.id)

    def log(self, step: int, numbers: dict[str, float]) -> None:
        self._run.log(numbers, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    key: ClassVar[str] = "logging.mlflow_experiment"

    def __init__(self, client: Any, run_id: str, experiment: str):
        self._client, self.run_id = client, run_id
        logger.info("mlflow: run %s in experiment %s at %s", run_id, experiment, client.tracking_uri)

    @classmethod
    def open(
        cls, experiment: str, run_name: str, tracking_uri: str | None = None, runs: TrackerRuns | None = None
    ) -> MlflowTracker | None:
        """An MLflow run in `experiment` (made if absent) at `tracking_uri` (None: $MLFLOW_TRACKING_URI, else
        MLflow's default store): the one `runs` names when it is in that experiment and store (running again),
        else a new one, named in `runs` for a rerun."""
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            missing(cls.key, "mlflow", "mlflow-skinny")
            return None
        client = MlflowClient(tracking_uri=tracking_uri)
        saved = runs.get("mlflow") if runs is not None else {}
        same_store = saved.get("tracking_uri") == client.tracking_uri and saved.get("experiment") == experiment
        run_id = _continued_mlflow_run(client, saved["run_id"]) if same_store and saved.get("run_id") else None
        if run_id is None:
            found = client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
            run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
        if runs is not None:
            runs.remember("mlflow", run_id=run_id, tracking_uri=client.tracking_uri, experiment=experiment)
        return cls(client, run_id, experiment)

    def log(self, step: int, numbers: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in numbers.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _continued_mlflow_run(client: Any, run_id: str) -> str | None:
    """`run_id` set running again; None (a warning) where its store no longer holds it."""
    from mlflow.exceptions import MlflowException

    try:
        client.update_run(run_id, status="RUNNING")
    except MlflowException as error:
        logger.warning("mlflow: run %s cannot be continued (%s); a new run starts", run_id, str(error).splitlines()[0])
        return None
    logger.info("mlflow: continuing run %s", run_id)
    return run_id


def open_trackers(logging_config: Any, run_dir: Path) -> list[Tracker]:
    """The trackers a config's `logging:` section asks for, opened for the run in `run_dir`: those of its earlier
    attempt where there was one (a resume), after metrics.jsonl was cut back to the checkpoint it resumes from."""
    opened: list[Tracker | None] = []
    runs = TrackerRuns(run_dir)
    if logging_config.tensorboard:
        opened.append(TensorBoardTracker.open(run_dir / "tensorboard", last_step(run_dir / METRICS_FILE)))
    if logging_config.wandb_project:
        init = {"project": logging_config.wandb_project, "name": run_dir.name, "dir": str(run_dir)}
        opened.append(WandbTracker.open(init, runs))
    if logging_config.mlflow_experiment:
        uri = logging_config.mlflow_tracking_uri
        opened.append(MlflowTracker.open(logging_config.mlflow_experiment, run_dir.name, uri, runs))
    return [tracker for tracker in opened if tracker is not None]


def last_step(metrics: Path) -> int | None:
    """The step of the last whole record of a metrics.jsonl; None when it holds none."""
    try:
        lines = Path(metrics).read_bytes().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a torn line, or not a record
    return None
