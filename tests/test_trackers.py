"""The experiment trackers a run mirrors its metrics to (rlsteps.engine.records.trackers), each through its own real
package: TensorBoard's event files read back, a W&B run in offline mode (nothing leaves the machine), an MLflow run in
a sqlite store in the test's folder. A tracker's package that is not installed skips its test (the `test` extra
installs all three); RLSTEPS_REQUIRE_TRACKERS=1 makes that a failure."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys

import pytest

from rlsteps.contract.config import LoggingConfig
from rlsteps.contract.run_files import read_metrics
from rlsteps.engine.records.metrics import MetricsWriter, keep_records_through
from rlsteps.engine.records.trackers import TRACKER_RUNS_FILE, open_trackers

LOGGER = "rlsteps.engine.records"


def need(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        if os.environ.get("RLSTEPS_REQUIRE_TRACKERS") == "1":
            pytest.fail(f"{module} is not installed (pip install -e '.[{extra}]'; RLSTEPS_REQUIRE_TRACKERS=1)")
        pytest.skip(f"{module} is not installed (pip install -e '.[{extra}]')")


def write_three_steps(logging_config: LoggingConfig, run_dir) -> None:
    with MetricsWriter(run_dir / "metrics.jsonl", trackers=open_trackers(logging_config, run_dir)) as writer:
        for step in (1, 2, 3):
            writer.log(step, {"train/reward": step / 2, "train/loss": float("nan") if step == 2 else 0.1})


def test_no_tracker_is_opened_or_imported_by_default(tmp_path):
    before = {"torch.utils.tensorboard", "wandb", "mlflow"} & set(sys.modules)
    assert open_trackers(LoggingConfig(), tmp_path) == []
    assert {"torch.utils.tensorboard", "wandb", "mlflow"} & set(sys.modules) == before


def test_tensorboard_events_hold_the_finite_numbers_and_the_run_says_where(tmp_path, caplog):
    need("tensorboard", "tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with caplog.at_level(logging.INFO, logger=LOGGER):
        write_three_steps(LoggingConfig(tensorboard=True), tmp_path)
    log_dir = tmp_path / "tensorboard"
    assert f"tensorboard: events in {log_dir} (tensorboard --logdir {log_dir})" in caplog.text
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/reward")] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert [e.step for e in events.Scalars("train/loss")] == [1, 3]  # NaN is null in metrics.jsonl, absent here


def test_a_wandb_run_in_offline_mode_is_written_under_the_run_folder(tmp_path, caplog, monkeypatch):
    need("wandb", "wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        write_three_steps(LoggingConfig(wandb_project="rlsteps-test"), tmp_path)
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    assert f"wandb: offline run in {offline} (wandb sync it later)" in caplog.text
    (records,) = offline.glob("run-*.wandb")
    data = wandb_file_bytes(records)
    assert b"train/reward" in data and b"rlsteps-test" in data and tmp_path.name.encode() in data


@pytest.mark.slow  # MLflow makes its sqlite store's tables: about 13 s
def test_an_mlflow_run_in_a_sqlite_store_holds_the_metrics_per_step(tmp_path, caplog):
    need("mlflow", "mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with caplog.at_level(logging.INFO, logger=LOGGER):
        write_three_steps(LoggingConfig(mlflow_experiment="tiny", mlflow_tracking_uri=uri), tmp_path / "rl_rs-tiny")
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.run_name == "rl_rs-tiny" and run.info.status == "FINISHED"
    assert f"mlflow: run {run.info.run_id} in experiment tiny at {uri}" in caplog.text
    history = client.get_metric_history(run.info.run_id, "train/reward")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == [1, 3]


MISSING = {  # module, the key that asks for it, the extra that installs it
    "tensorboard": ("torch.utils.tensorboard", {"tensorboard": True}, "logging.tensorboard", "tensorboard"),
    "wandb": ("wandb", {"wandb_project": "p"}, "logging.wandb_project", "wandb"),
    "mlflow": ("mlflow.tracking", {"mlflow_experiment": "e"}, "logging.mlflow_experiment", "mlflow-skinny"),
}


@pytest.mark.parametrize("extra", list(MISSING))
def test_a_missing_package_is_one_warning_naming_the_key_and_the_extra(tmp_path, monkeypatch, caplog, extra):
    module, setting, key, package = MISSING[extra]
    monkeypatch.setitem(sys.modules, module, None)  # its import raises ImportError
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        write_three_steps(LoggingConfig(**setting), tmp_path)
    (warning,) = [
        r.getMessage() for r in caplog.records if r.name.endswith("trackers") and r.levelno >= logging.WARNING
    ]
    assert warning.startswith(
        f"{key} is set but the {package} package is not installed: pip install 'rlsteps[{extra}]'"
    )
    assert [r["train/reward"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0.5, 1.0, 1.5]


# A resumed run: the first attempt logged steps 1-3 and was interrupted after its checkpoint of step 2; the rerun cut
# metrics.jsonl back to step 2 (as checkpoints.rewind does) and makes steps 3-5. Each tracker holds one run with both.
FIRST, SECOND, CHECKPOINT = (1, 2, 3), (3, 4, 5), 2


def write_steps(logging_config: LoggingConfig, run_dir, steps, half: int) -> None:
    with MetricsWriter(run_dir / "metrics.jsonl", trackers=open_trackers(logging_config, run_dir)) as writer:
        for step in steps:
            writer.log(step, {"train/reward": step + half / 10})


def interrupted_and_resumed(logging_config: LoggingConfig, run_dir) -> None:
    write_steps(logging_config, run_dir, FIRST, 1)
    keep_records_through(run_dir / "metrics.jsonl", CHECKPOINT)
    write_steps(logging_config, run_dir, SECOND, 2)


def wandb_file_bytes(path) -> bytes:
    """A W&B run file once W&B's service process has written all of it: run.finish() returns before the service's
    writer has flushed (on a loaded machine the file can still be its header alone); teardown waits for it, as the
    exit of a process that used W&B does."""
    import wandb

    wandb.teardown()
    return path.read_bytes()


def wandb_records(path):
    """The records of a W&B run file (a LevelDB-style log of protobuf records after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data, block = wandb_file_bytes(path), 32768
    assert data[:4] == b":W&B"
    position, pending = 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_a_resumed_run_continues_its_wandb_run(tmp_path, caplog, monkeypatch):
    need("wandb", "wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # the run directory's own dir= wins
    with caplog.at_level(logging.INFO, logger=LOGGER):
        interrupted_and_resumed(LoggingConfig(wandb_project="rlsteps-test"), tmp_path)
    run_id = json.loads((tmp_path / TRACKER_RUNS_FILE).read_text())["wandb"]["id"]
    halves = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))  # one folder per start, synced as one
    assert [half.name for half in halves] == [f"run-{run_id}.wandb"] * 2
    steps, ids = [], set()
    for half in halves:
        for record in wandb_records(half):
            kind = record.WhichOneof("record_type")
            ids.update([record.run.run_id] if kind == "run" else [])
            steps += [record.history.step.num] if kind == "history" else []
    assert ids == {run_id} and steps == [*FIRST, *SECOND]
    assert f"continuing run {run_id}" in caplog.text


@pytest.mark.slow  # MLflow makes its sqlite store's tables
def test_a_resumed_run_continues_its_mlflow_run(tmp_path, caplog):
    need("mlflow", "mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = LoggingConfig(mlflow_experiment="tiny", mlflow_tracking_uri=uri)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        interrupted_and_resumed(config, tmp_path / "rl_rs-tiny")
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.status == "FINISHED" and f"mlflow: continuing run {run.info.run_id}" in caplog.text
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/reward"))
    assert history == [(1, 1.1), (2, 2.1), (3, 3.1), (3, 3.2), (4, 4.2), (5, 5.2)]  # step 3 made twice


@pytest.mark.slow  # MLflow makes its sqlite store's tables
def test_a_resumed_mlflow_run_gone_from_its_store_is_a_new_run_and_a_warning(tmp_path, caplog):
    need("mlflow", "mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = LoggingConfig(mlflow_experiment="tiny", mlflow_tracking_uri=uri)
    write_steps(config, tmp_path, FIRST, 1)
    first = json.loads((tmp_path / TRACKER_RUNS_FILE).read_text())["mlflow"]["run_id"]
    MlflowClient(tracking_uri=uri).delete_run(first)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        write_steps(config, tmp_path, SECOND, 2)
    second = json.loads((tmp_path / TRACKER_RUNS_FILE).read_text())["mlflow"]["run_id"]
    assert second != first and f"mlflow: run {first} cannot be continued" in caplog.text


def test_a_resumed_run_hides_the_tensorboard_events_it_makes_again(tmp_path):
    need("tensorboard", "tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    interrupted_and_resumed(LoggingConfig(tensorboard=True), tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("train/reward")] == [
        (1, 1.1), (2, 2.1), (3, 3.2), (4, 4.2), (5, 5.2),
    ]  # fmt: skip
