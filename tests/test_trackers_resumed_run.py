"""A tiny run with all three trackers, stopped mid-run and run again: the rerun resumes from its checkpoint and its
trackers continue the runs the first attempt opened, W&B (offline) and MLflow (sqlite) under the same run id,
TensorBoard with the steps made again shown once."""

from __future__ import annotations

import json

import pytest

from rlsteps.engine.records.trackers import TRACKER_RUNS_FILE
from test_trackers import need, wandb_records

pytestmark = pytest.mark.slow  # a tiny run end to end, twice


class PowerCut(RuntimeError):
    pass


def test_a_run_stopped_and_run_again_continues_its_tracker_runs(tiny_world, tmp_path, monkeypatch):
    for module, extra in (("wandb", "wandb"), ("mlflow", "mlflow"), ("tensorboard", "tensorboard")):
        need(module, extra)
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import rlsteps
    from rlsteps.engine.run.step import StepRun

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = {
        "train.max_steps": 4,
        "checkpoint.interval": 2,
        "run.num_threads": 1,
        "logging.tensorboard": True,
        "logging.wandb_project": "rlsteps-test",
        "logging.mlflow_experiment": "tiny",
        "logging.mlflow_tracking_uri": uri,
    }
    step = StepRun.step

    def cut_in_step_4(self, prompts):
        if self.counters.step == 3:  # steps 1-3 logged, the checkpoint of step 2 written
            raise PowerCut("the power went")
        return step(self, prompts)

    monkeypatch.setattr(StepRun, "step", cut_in_step_4)
    with pytest.raises(Exception) as stopped:
        rlsteps.run("rl/rs", overrides=overrides, say=lambda line: None)
    assert "the power went" in str(stopped.value) or isinstance(stopped.value, PowerCut)
    monkeypatch.setattr(StepRun, "step", step)
    run = rlsteps.run("rl/rs", overrides=overrides, say=lambda line: None)

    runs = json.loads((run.run_dir / TRACKER_RUNS_FILE).read_text())
    steps = [r["step"] for r in map(json.loads, (run.run_dir / "metrics.jsonl").read_text().splitlines())]
    assert [s for s in steps if s > 0] == [1, 2, 3, 4]

    wandb_steps, wandb_ids = [], set()
    for half in sorted((run.run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in wandb_records(half):
            kind = record.WhichOneof("record_type")
            wandb_ids.update([record.run.run_id] if kind == "run" else [])
            wandb_steps += [record.history.step.num] if kind == "history" else []
    assert wandb_ids == {runs["wandb"]["id"]}
    assert [s for s in wandb_steps if s > 0] == [1, 2, 3, 3, 4]  # the first attempt's, then the rerun's

    client = MlflowClient(tracking_uri=uri)
    (found,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert found.info.run_id == runs["mlflow"]["run_id"] and found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "train/reward")
    assert sorted(m.step for m in history) == [1, 2, 3, 3, 4]

    events = EventAccumulator(str(run.run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/reward")] == [1, 2, 3, 4]
