"""Experiment trackers a run mirrors its metrics to, beside metrics.jsonl: TensorBoard, W&B and MLflow.

Each is switched on by a key of the config's `logging:` section and needs its own package, an extra of rlsteps
(`pip install 'rlsteps[tensorboard]'`, `[wandb]`, `[mlflow]`), imported only when its key is set. A tracker whose
package is missing is a warning naming the key and the extra, and the run goes on with metrics.jsonl alone. Each
tracker says where its events go in one line when it opens: the TensorBoard folder, the W&B run's URL or offline
folder, the MLflow run id and its store.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, ClassVar, Protocol

logger = logging.getLogger(__name__)


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


class TensorBoardTracker:
    key: ClassVar[str] = "logging.tensorboard"

    def __init__(self, writer: Any, log_dir: Path):
        self._writer = writer
        logger.info("tensorboard: events in %s (tensorboard --logdir %s)", log_dir, log_dir)

    @classmethod
    def open(cls, log_dir: Path) -> TensorBoardTracker | None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            missing(cls.key, "tensorboard", "tensorboard")
            return None
        return cls(SummaryWriter(log_dir=str(log_dir)), log_dir)

    def log(self, step: int, numbers: dict[str, float]) -> None:
        for key, value in numbers.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    key: ClassVar[str] = "logging.wandb_project"

    def __init__(self, run: Any):
        self._run = run
        where = f"offline run in {run.settings.sync_dir} (wandb sync it later)" if run.offline else run.url
        logger.info("wandb: %s", where)

    @classmethod
    def open(cls, init_kwargs: dict[str, Any]) -> WandbTracker | None:
        try:
            import wandb
        except ImportError:
            missing(cls.key, "wandb", "wandb")
            return None
        return cls(wandb.init(**init_kwargs))

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
    def open(cls, experiment: str, run_name: str, tracking_uri: str | None = None) -> MlflowTracker | None:
        """A new MLflow run in `experiment` (made if absent) at `tracking_uri` (None: $MLFLOW_TRACKING_URI, else
        MLflow's default store)."""
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            missing(cls.key, "mlflow", "mlflow-skinny")
            return None
        client = MlflowClient(tracking_uri=tracking_uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
        run = client.create_run(experiment_id, run_name=run_name)
        return cls(client, run.info.run_id, experiment)

    def log(self, step: int, numbers: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in numbers.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def open_trackers(logging_config: Any, run_dir: Path) -> list[Tracker]:
    """The trackers a config's `logging:` section asks for, opened for the run in `run_dir`."""
    opened: list[Tracker | None] = []
    if logging_config.tensorboard:
        opened.append(TensorBoardTracker.open(run_dir / "tensorboard"))
    if logging_config.wandb_project:
        opened.append(
            WandbTracker.open({"project": logging_config.wandb_project, "name": run_dir.name, "dir": str(run_dir)})
        )
    if logging_config.mlflow_experiment:
        uri = logging_config.mlflow_tracking_uri
        opened.append(MlflowTracker.open(logging_config.mlflow_experiment, run_dir.name, uri))
    return [tracker for tracker in opened if tracker is not None]
