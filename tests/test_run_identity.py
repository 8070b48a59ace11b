"""A rerun into a run directory resumes only the run it continues: another config is refused with the fix."""

import json

import pytest

from rlsteps.contract.run_identity import RUN_FILE, RunDirectoryInUse, changed_keys, claim_run_directory

CONFIG = {
    "algorithm": "grpo",
    "train": {"lr": 1e-4, "max_steps": 16},
    "judge": {"url": "http://a/v1", "temperature": 0.6, "api_key": "sk-never-on-disk"},
    "inputs": {"prompts": "train.jsonl"},
}


def with_(**changes):
    config = json.loads(json.dumps(CONFIG))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        config[section][key] = value
    return config


def test_changed_keys_leave_out_what_a_continuation_may_change():
    assert changed_keys(CONFIG, with_(train__max_steps=32, judge__url="http://b/v1")) == []
    assert changed_keys(CONFIG, with_(train__lr=3e-4, judge__temperature=1.0)) == ["judge.temperature", "train.lr"]
    assert changed_keys(CONFIG, {**CONFIG, "seed": 1}) == ["seed"]


def test_a_new_run_is_recorded_and_a_continuation_resumes(tmp_path):
    claim_run_directory(tmp_path, CONFIG, has_checkpoints=False)
    assert json.loads((tmp_path / RUN_FILE).read_text())["identity"] == {
        "algorithm": "grpo", "train.lr": 1e-4, "judge.temperature": 0.6, "inputs.prompts": "train.jsonl",
    }  # fmt: skip
    assert "sk-never-on-disk" not in (tmp_path / RUN_FILE).read_text()  # a secret is never a run's identity
    claim_run_directory(tmp_path, with_(train__max_steps=32), has_checkpoints=True)  # more steps: the same run


def test_another_config_over_checkpoints_is_refused_and_nothing_is_touched(tmp_path):
    claim_run_directory(tmp_path, CONFIG, has_checkpoints=False)
    before = (tmp_path / RUN_FILE).read_text()
    with pytest.raises(RunDirectoryInUse) as refused:
        claim_run_directory(tmp_path, with_(train__lr=3e-4), has_checkpoints=True)
    message = str(refused.value)
    assert "train.lr (0.0001 -> 0.0003)" in message and "output.dir=NEW_DIR" in message
    assert refused.value.exit_code == 2  # a config error, as docs/troubleshooting.md's exit codes say
    assert (tmp_path / RUN_FILE).read_text() == before


def test_another_config_without_checkpoints_starts_afresh(tmp_path):
    claim_run_directory(tmp_path, CONFIG, has_checkpoints=False)
    claim_run_directory(tmp_path, with_(train__lr=3e-4), has_checkpoints=False)  # nothing to resume: a new run
    assert json.loads((tmp_path / RUN_FILE).read_text())["identity"]["train.lr"] == 3e-4
