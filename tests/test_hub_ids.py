"""A Hugging Face Hub id for any model input (the policy, the reward model, the judge, a checkpoint to convert)
resolves through the Hugging Face cache: the dry run finds it there without the network and checks its snapshot as a
folder (a reward model given as the policy is the wrong type), offline and not cached it is refused naming the id,
HF_HUB_OFFLINE and how to fetch it, and the run reads the cached snapshot. Nothing is downloaded: each test fills a
temporary cache (the hub layout: models--org--name/snapshots/<revision>/, refs/main) with the tiny world's models."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cli_helpers import dry_run_in_fresh_python
from rlsteps.artifacts.inputs import Reach, check_input, inputs_in_job
from rlsteps.catalog import load_catalog
from rlsteps.contract.input_check import InputProblem, check_inputs_in_job
from rlsteps.tiny.layout import load_tiny_world
from run_helpers import FAST, rlsteps

REVISION = "0123456789abcdef0123456789abcdef01234567"
POLICY_ID, REWARD_MODEL_ID = "tiny-org/policy", "tiny-org/reward-model"


def fill_hub_cache(home: Path, repo_id: str, source: Path, repo_type: str = "model") -> Path:
    """source's files as the main revision of repo_id in the hub cache under HF_HOME=home; its snapshot folder."""
    repo = home / "hub" / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    if source.is_dir():
        shutil.copytree(source, snapshot)
    else:
        snapshot.mkdir(parents=True)
        shutil.copy(source, snapshot / source.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture(scope="module")
def hub_home(tmp_path_factory, request) -> Path:
    """An HF_HOME whose cache holds the tiny world's policy and reward model as Hub models."""
    world = load_tiny_world(0) or request.getfixturevalue("tiny_world")
    home = tmp_path_factory.mktemp("hf_home")
    fill_hub_cache(home, POLICY_ID, world.policy)
    fill_hub_cache(home, REWARD_MODEL_ID, world.reward_model)
    return home


@pytest.fixture
def offline_cache(hub_home, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(hub_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_home


def test_a_cached_hub_id_is_checked_as_its_snapshot_folder(offline_cache):
    catalog = load_catalog()
    policy = check_input(catalog, "policy", "inputs.policy", POLICY_ID, "checkpoint", hub_id=True)
    assert policy.status == "ok" and "checkpoint_hf" in policy.detected
    assert policy.ref == POLICY_ID and policy.path.endswith(f"models--tiny-org--policy/snapshots/{REVISION}")
    wrong = check_input(catalog, "policy", "inputs.policy", REWARD_MODEL_ID, "checkpoint", hub_id=True)
    assert wrong.status == "wrong_type" and "reward_model_hf" in wrong.detected
    plain = check_input(catalog, "policy", "inputs.policy", POLICY_ID, "checkpoint")  # an input without hub_id
    assert plain.status == "missing"


def test_offline_and_not_cached_is_refused_naming_the_id_the_switch_and_how_to_fetch_it(offline_cache):
    item = check_input(load_catalog(), "policy", "inputs.policy", "tiny-org/absent", "checkpoint", hub_id=True)
    assert item.status == "missing"
    assert (
        "tiny-org/absent" in item.problem and "HF_HUB_OFFLINE=1" in item.problem and str(offline_cache) in item.problem
    )
    assert "hf download tiny-org/absent" in item.fix and "HF_HOME" in item.fix and "inputs.policy=PATH" in item.fix


def test_online_and_not_cached_or_out_of_reach_the_job_resolves_it_where_it_runs(offline_cache, monkeypatch):
    catalog = load_catalog()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    online = check_input(catalog, "policy", "inputs.policy", "tiny-org/absent", "checkpoint", hub_id=True)
    assert online.status == "hub"
    remote = Reach("slurm", sees_local_files=False)
    cluster = check_input(catalog, "policy", "inputs.policy", POLICY_ID, "checkpoint", remote, hub_id=True)
    assert cluster.status == "hub" and cluster.path is None  # this machine's cache is not the job's
    [record] = [r.as_dict() for r in inputs_in_job(catalog, [online])]
    assert record["ref"] == "tiny-org/absent" and record["required_type"] == "checkpoint"


def test_the_job_resolves_and_checks_a_hub_id_in_its_own_cache(offline_cache):
    catalog = load_catalog()
    remote = Reach("slurm", sees_local_files=False)
    items = [
        check_input(catalog, name, f"inputs.{name}", ref, kind, remote, hub_id=True)
        for name, ref, kind in (
            ("policy", POLICY_ID, "checkpoint"),
            ("reward_model", REWARD_MODEL_ID, "reward_model_hf"),
        )
    ]
    records = [r.as_dict() for r in inputs_in_job(catalog, items)]
    assert [item.name for item in check_inputs_in_job(records)] == ["policy", "reward_model"]
    swapped = [{**records[0], "ref": REWARD_MODEL_ID}]
    with pytest.raises(InputProblem, match="tiny-org/reward-model is reward_model_hf.*but a checkpoint"):
        check_inputs_in_job(swapped)
    with pytest.raises(InputProblem, match="tiny-org/gone is not a path here nor a Hugging Face Hub model"):
        check_inputs_in_job([{**records[0], "ref": "tiny-org/gone"}])


def test_the_worker_reads_each_hub_id_as_its_cached_snapshot(offline_cache):
    from rlsteps.contract.config import STEP_SCHEMAS
    from rlsteps.contract.hub import with_hub_snapshots
    from rlsteps.plan.compile import compile_job

    given = ["inputs.prompts=/p.jsonl", f"inputs.policy={POLICY_ID}", f"inputs.reward_model={REWARD_MODEL_ID}"]
    job = compile_job(load_catalog().find("rl/reinforce"), "default", overrides=given)
    cfg = STEP_SCHEMAS[job.algorithm].model_validate(job.config)
    said: list[str] = []
    resolved = with_hub_snapshots(cfg, said.append)
    snapshot = offline_cache / "hub" / "models--tiny-org--policy" / "snapshots" / REVISION
    assert resolved.inputs.policy == str(snapshot) and resolved.inputs.prompts == "/p.jsonl"
    assert resolved.inputs.model_extra["reward_model"].endswith(f"models--tiny-org--reward-model/snapshots/{REVISION}")
    assert said[0] == f"input 'policy': {POLICY_ID} is {snapshot} in the Hugging Face cache"


def dry_run(home: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The dry run in a fresh Python with the network off and the Hugging Face cache at `home`."""
    return dry_run_in_fresh_python(*overrides, env={"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"})


def test_the_dry_run_resolves_hub_ids_in_the_cache_offline_without_torch(hub_home):
    done = dry_run(hub_home, f"inputs.policy={POLICY_ID}", f"inputs.reward_model={REWARD_MODEL_ID}")
    assert done.stdout.split("\n")[-2] == "0 []", done.stdout + done.stderr
    wrong = dry_run(hub_home, f"inputs.policy={REWARD_MODEL_ID}")
    assert wrong.stdout.split("\n")[-2] == "3 []", wrong.stdout + wrong.stderr
    assert "input 'policy': tiny-org/reward-model is reward_model_hf" in wrong.stderr
    absent = dry_run(hub_home, "inputs.policy=tiny-org/absent")
    assert absent.stdout.split("\n")[-2] == "3 []"
    assert "tiny-org/absent is not a path here nor a Hugging Face Hub model" in absent.stderr


@pytest.mark.slow
def test_a_run_trains_from_a_hub_id_in_the_cache_with_the_network_off(offline_cache, tmp_path):
    out = tmp_path / "run"
    short = ["train.max_steps=1", "validation.interval=0", "rollout.prompts_per_step=4", "train.global_batch_size=32"]
    given = [f"inputs.policy={POLICY_ID}", f"inputs.reward_model={REWARD_MODEL_ID}", "output.type=checkpoint_hf"]
    done = rlsteps("run", "rl/reinforce", "-c", "tiny", *given, *short, f"output.dir={out}", *FAST, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    snapshot = offline_cache / "hub" / "models--tiny-org--policy" / "snapshots" / REVISION
    assert f"input 'policy': {POLICY_ID} is {snapshot} in the Hugging Face cache" in done.stderr
    assert (out / "policy" / "config.json").is_file()
    [job_yaml] = (tmp_path / ".rlsteps" / "jobs").glob("*/job.yaml")
    job = yaml.safe_load(job_yaml.read_text())
    assert job["config"]["inputs"]["policy"] == POLICY_ID  # the job names the id; the run reads the snapshot

    refused = rlsteps("run", "rl/reinforce", "-c", "tiny", "inputs.policy=tiny-org/absent", *FAST, cwd=tmp_path)
    assert refused.returncode == 3 and "tiny-org/absent" in refused.stderr and "hf download" in refused.stderr
