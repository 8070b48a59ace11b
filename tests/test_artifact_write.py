"""The typed output artifact is replaced whole; what a killed writer leaves is repaired by the next write."""

import json
import os

from rlsteps.contract.artifact import (
    METADATA_FILE,
    read_artifact_metadata,
    recover_interrupted_write,
    write_artifact,
)

DEAD_PID = "99999999"  # above any pid_max, so never a running process


def _artifact(folder, label):
    folder.mkdir(parents=True)
    (folder / "weights").write_text(label)
    (folder / METADATA_FILE).write_text(json.dumps({"type": "checkpoint_hf", "label": label}))
    return folder


def test_a_write_replaces_the_previous_artifact_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "policy"
    write_artifact(target, lambda d: (d / "weights").write_text("one"), {"type": "checkpoint_hf"})
    write_artifact(target, lambda d: (d / "weights").write_text("two"), {"type": "checkpoint_hf"})
    assert (target / "weights").read_text() == "two" and read_artifact_metadata(target)["type"] == "checkpoint_hf"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]


def test_a_kill_between_the_two_renames_is_undone_by_the_next_write(tmp_path):
    target = tmp_path / "policy"
    _artifact(tmp_path / f".old-policy-{DEAD_PID}", "previous")  # moved aside, then the writer died
    (tmp_path / f".tmp-policy-{DEAD_PID}").mkdir()  # its staging folder, without metadata
    (tmp_path / f".tmp-policy-{DEAD_PID}" / "weights").write_text("half")
    recover_interrupted_write(target)
    assert (target / "weights").read_text() == "previous" and read_artifact_metadata(target)["label"] == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]


def test_the_staging_folder_of_a_running_writer_is_left_alone(tmp_path):
    running = tmp_path / f".tmp-policy-{os.getppid()}"
    running.mkdir()
    dead = tmp_path / f".tmp-policy-{DEAD_PID}"
    dead.mkdir()
    write_artifact(tmp_path / "policy", lambda d: (d / "weights").write_text("new"), {"type": "checkpoint_hf"})
    assert running.is_dir() and not dead.exists() and (tmp_path / "policy" / "weights").read_text() == "new"
