"""The DGX Cloud Lepton launcher: job specs from profiles, dry runs, and a full job life against a loopback API."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip(
    "leptonai", reason="the Lepton launcher tests need the leptonai SDK (pip install 'rlsteps[lepton]')"
)

from leptonai.api.v2.types.job import LeptonJob, LeptonJobState  # noqa: E402

from cli_helpers import invoke  # noqa: E402
from lepton_stub_server import LeptonStub  # noqa: E402
from rlsteps.catalog import load_catalog  # noqa: E402
from rlsteps.errors import RunFailed, UsageError  # noqa: E402
from rlsteps.launch import lepton  # noqa: E402
from rlsteps.launch.base import JobState  # noqa: E402
from rlsteps.plan.compile import compile_job  # noqa: E402
from rlsteps.plan.job_dir import write_job_files  # noqa: E402
from rlsteps.plan.profiles import resolve_profile  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The `dict` method is deprecated")  # raised inside the SDK

TOKEN = "lepton-token-Zq81xK"
RM_TOKEN = "rm-token-Pw22vB"
WANDB_KEY = "wandb-key-Yt55cN"
CREDENTIALS = (TOKEN, RM_TOKEN, WANDB_KEY)
INPUTS = ["inputs.prompts=/data/prompts.jsonl", "inputs.policy=/data/sft", "rm.url=http://rm-node:5555"]

PROFILES = f"""
profiles:
  lep:
    executor: lepton
    workspace: test-ws
    node_group: my-node-group
    resource_shape: gpu.8xh100-80gb
    container_image: nvcr.io/nvidia/pytorch:25.10-py3
    image_pull_secrets: [ngc-secret]
    shared_memory_size: 65536
    mounts:
      - {{path: /shared/rl, mount_path: /data, from: "node-nfs:lepton-shared-fs"}}
    env_vars:
      HF_HOME: /data/hf
      NCCL_DEBUG: WARN
      OMP_NUM_THREADS: 4
      WANDB_API_KEY: {WANDB_KEY}
      HF_TOKEN: {{secret: team-hf-token}}
    pre_launch_commands: ["pip install -q /data/wheels/rlsteps.whl"]
  lep2:
    extends: lep
    nodes: 2
    gpus_per_node: 8
    node_reservation: res-42
"""


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(PROFILES)
    return path


@pytest.fixture(scope="module")
def rs():
    return load_catalog().find("rl/rs")


def make_job(rs, profiles: Path, name: str = "lep", mode: str = "batch", passthrough=()):
    return compile_job(
        rs,
        "default",
        mode=mode,
        profile=resolve_profile(name, [profiles]),
        overrides=[*INPUTS, f"rm.token={RM_TOKEN}"],
        passthrough=list(passthrough),
    )


def spec_of(plan) -> LeptonJob:
    return LeptonJob.model_validate(json.loads(plan.files[lepton.SPEC_FILE]))  # the SDK's own schema


def test_single_node_spec_carries_every_profile_key(rs, profiles, tmp_path):
    job = make_job(rs, profiles)
    plan = lepton.LAUNCHER.plan(job, tmp_path / job.name)
    spec = spec_of(plan)
    assert spec.metadata.id_ == lepton.lepton_job_name(job.name) and re.fullmatch(
        r"[a-z][a-z0-9-]{0,35}", spec.metadata.id_
    )
    s = spec.spec
    assert (s.container.image, s.resource_shape) == ("nvcr.io/nvidia/pytorch:25.10-py3", "gpu.8xh100-80gb")
    assert s.affinity.allowed_dedicated_node_groups == ["my-node-group"]
    assert (s.completions, s.parallelism, s.intra_job_communication) == (1, 1, None)
    assert [(m.path, m.mount_path, m.from_) for m in s.mounts] == [("/shared/rl", "/data", "node-nfs:lepton-shared-fs")]
    assert s.image_pull_secrets == ["ngc-secret"] and s.shared_memory_size == 65536 and s.reservation_config is None
    plain = {e.name: e.value for e in s.envs if e.value_from is None}
    assert (
        plain
        == {"PYTHONUNBUFFERED": "1", "HF_HOME": "/data/hf", "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "4"}
        == plan.env
    )
    refs = {e.name: e.value_from.secret_name_ref for e in s.envs if e.value_from is not None}
    assert refs == {
        "HF_TOKEN": "team-hf-token",
        "WANDB_API_KEY": "RLSTEPS_ENV_WANDB_API_KEY",
        "RLSTEPS_SECRET_RM_TOKEN": "RLSTEPS_SECRET_RM_TOKEN",
    }
    assert s.container.command[:2] == ["/bin/bash", "-c"] and plan.command == s.container.command
    script = s.container.command[2]
    config_path = f"{lepton.CONTAINER_JOBS_DIR}/{job.name}/config.yaml"
    assert script.splitlines()[-1] == f"exec python -m rlsteps.engine.worker {config_path}"
    assert "pip install -q /data/wheels/rlsteps.whl\nmkdir -p /data && cd /data\n" in script


def test_the_config_in_the_command_is_the_worker_config_without_secret_values(rs, profiles, tmp_path):
    job = make_job(rs, profiles)
    script = lepton.LAUNCHER.plan(job, tmp_path / job.name).command[2]
    encoded = re.search(r"echo (\S+) \| base64 -d > \S+/config.yaml", script).group(1)
    config = OmegaConf.to_container(OmegaConf.create(base64.b64decode(encoded).decode()))
    assert config == job.worker_config()
    assert config["rm"]["token"] == "${oc.env:RLSTEPS_SECRET_RM_TOKEN}"


def test_multi_node_spec_sets_replicas_and_a_torchrun_rendezvous(rs, profiles, tmp_path):
    job = make_job(rs, profiles, name="lep2")
    spec = spec_of(lepton.LAUNCHER.plan(job, tmp_path / job.name)).spec
    assert (spec.completions, spec.parallelism, spec.intra_job_communication) == (2, 2, True)
    assert spec.reservation_config.reservation_id == "res-42"
    last = spec.container.command[2].splitlines()[-1]
    assert last.startswith(
        "exec torchrun --nnodes=2 --nproc-per-node=8 --master-port=29400 "
        '--node-rank="$LEPTON_JOB_WORKER_INDEX" --master-addr="$MASTER_ADDR" -m rlsteps.engine.worker '
    )


def run_script(script: str, tmp_path: Path, env: dict[str, str]) -> dict:
    """Run a container script here, with `python` and `torchrun` replaced by a recorder of their argv and cwd."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = (
        f"#!{sys.executable}\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv, 'cwd': os.getcwd()}, open(os.environ['RECORD'], 'w'))\n"
    )
    for name in ("python", "torchrun"):
        (bin_dir / name).write_text(recorder)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "record.json"
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record), **env}
    subprocess.run(["/bin/bash", "-c", script], env=full_env, check=True, timeout=30)
    return json.loads(record.read_text())


@pytest.mark.parametrize("profile_name", ["lep", "lep2"])
def test_the_script_runs_the_worker_with_exact_words(rs, profiles, tmp_path, monkeypatch, profile_name):
    monkeypatch.setattr(lepton, "CONTAINER_JOBS_DIR", str(tmp_path / "jobs"))
    data = tmp_path / "data"
    job = make_job(rs, profiles, name=profile_name, passthrough=["--note", "it's $HOME; a b", '"q"'])
    settings = {
        **job.launcher_settings,
        "mounts": [{"path": "/p", "mount_path": str(data), "from": "node-nfs:fs"}],
        "pre_launch_commands": [],
    }
    job = job.model_copy(update={"launcher_settings": settings})
    script = lepton.LAUNCHER.plan(job, tmp_path / job.name).command[2]
    lepton_env = {"LEPTON_JOB_NAME": "j-1", "LEPTON_JOB_WORKER_INDEX": "1", "LEPTON_WORKSPACE_ID": "test-ws"}
    seen = run_script(script, tmp_path, lepton_env)
    config = tmp_path / "jobs" / job.name / "config.yaml"
    assert seen["cwd"] == str(data)
    assert OmegaConf.to_container(OmegaConf.load(config)) == job.worker_config()
    assert OmegaConf.load(config.parent / "job.yaml").job.step == "rl/rs"
    worker = ["-m", "rlsteps.engine.worker", str(config), "--note", "it's $HOME; a b", '"q"']
    if profile_name == "lep":
        assert seen["argv"][1:] == worker
    else:
        assert seen["argv"][1:] == [
            "--nnodes=2",
            "--nproc-per-node=8",
            "--master-port=29400",
            "--node-rank=1",
            "--master-addr=j-1-0.j-1-job-svc.ws-test-ws.svc.cluster.local",
            *worker,
        ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"node_groups": "x"}, "unknown key 'node_groups' (did you mean node_group?)"),
        ({"resource_shape": None}, "resource_shape"),
        ({"nodes": 0}, "nodes: Input should be greater than or equal to 1"),
        ({"workspace": f"test-ws:{TOKEN}"}, "`workspace` holds a credential"),
        ({"mounts": [{"path": "/x", "mount_path": "/usr", "from": "node-nfs:fs"}]}, "reserved"),
        ({"mounts": [{"path": "/x", "from": "node-nfs:fs"}]}, "mount_path"),
    ],
)
def test_profile_mistakes_are_usage_errors_that_name_the_key(rs, profiles, tmp_path, change, message):
    job = make_job(rs, profiles)
    settings = {k: v for k, v in {**job.launcher_settings, **change}.items() if v is not None}
    with pytest.raises(UsageError) as err:
        lepton.LAUNCHER.plan(job.model_copy(update={"launcher_settings": settings}), tmp_path / job.name)
    assert message in str(err.value) and TOKEN not in str(err.value)


def test_job_names_meet_leptons_rules():
    assert lepton.lepton_job_name("20250101-120000-rl_reinforce-12") == "j-20250101-120000-rl-reinforce-12"
    assert lepton.lepton_job_name("My_Job") == "my-job"
    assert len(lepton.lepton_job_name("20250101-120000-" + "x" * 40)) == lepton.MAX_JOB_NAME


def test_every_lepton_state_has_a_meaning():
    unmapped = {s.value for s in LeptonJobState} - lepton.STATES.keys()
    assert unmapped == {"Archived", "UNK"}  # decided by the job's counters / unknown on purpose


def test_dry_run_prints_the_spec_as_json_and_no_secret(rs, profiles, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    result = invoke("run", "rl/rs", "-c", "default", "-b", "lep", "--dry-run", *INPUTS, f"rm.token={RM_TOKEN}")
    out = result.output + "".join(capfd.readouterr())
    assert result.exit_code == 0, out
    assert lepton.SPEC_FILE in out and '"resource_shape": "gpu.8xh100-80gb"' in out
    assert (
        '"secret_name_ref": "RLSTEPS_SECRET_RM_TOKEN"' in out
        and '"secret_name_ref": "RLSTEPS_ENV_WANDB_API_KEY"' in out
    )
    assert not any(secret in out for secret in CREDENTIALS)
    assert not (tmp_path / ".rlsteps").exists()


@pytest.fixture
def stub(monkeypatch):
    with LeptonStub(token=TOKEN) as server:
        monkeypatch.setenv("LEPTON_WORKSPACE_ID", server.workspace)
        monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", TOKEN)
        monkeypatch.setenv("LEPTON_WORKSPACE_URL", server.url)
        yield server


def test_submit_status_logs_and_cancel_through_the_sdk(rs, profiles, tmp_path, stub, capfd):
    stub.secrets["RLSTEPS_SECRET_RM_TOKEN"] = "an older value"  # replaced, not refused
    job = make_job(rs, profiles)
    job_dir = tmp_path / job.name
    job_dir.mkdir()
    plan = lepton.LAUNCHER.plan(job, job_dir)
    write_job_files(job_dir, job, plan, inputs=[])
    submission = lepton.LAUNCHER.submit(job, plan, job_dir)
    assert submission.job_id == lepton.lepton_job_name(job.name) and submission.exit_code is None
    posted = LeptonJob.model_validate(stub.jobs[submission.job_id])
    assert posted.spec.affinity.allowed_dedicated_node_groups == ["ng-0a1b2c"]  # the name became the group's id
    expected = json.loads(plan.files[lepton.SPEC_FILE])
    expected["spec"]["affinity"]["allowed_dedicated_node_groups"] = ["ng-0a1b2c"]
    assert stub.jobs[submission.job_id] == expected  # exactly what the dry run showed, but for the id
    assert stub.secrets == {"RLSTEPS_SECRET_RM_TOKEN": RM_TOKEN, "RLSTEPS_ENV_WANDB_API_KEY": WANDB_KEY}
    assert not any(secret in json.dumps(stub.jobs) for secret in CREDENTIALS)

    record = lepton.LAUNCHER.record(job, submission)
    assert record.extra["workspace"] == "test-ws" and record.job_id == submission.job_id
    record.save()
    assert [lepton.LAUNCHER.status(record).state for _ in range(3)] == [
        JobState.PENDING,
        JobState.RUNNING,
        JobState.SUCCEEDED,
    ]
    assert "Completed" in lepton.LAUNCHER.status(record).detail
    assert list(lepton.LAUNCHER.logs(record)) == list(stub.log)
    assert list(lepton.LAUNCHER.logs(record, follow=True)) == list(stub.log)
    lepton.LAUNCHER.cancel(record)
    assert ("DELETE", f"/jobs/{submission.job_id}") in stub.calls
    assert lepton.LAUNCHER.status(record).state is JobState.CANCELLED

    printed = "".join(capfd.readouterr())
    written = "".join(p.read_text() for p in job_dir.iterdir())
    assert not any(secret in printed + written for secret in CREDENTIALS)


@pytest.mark.parametrize(("final", "code"), [("Completed", 0), ("Failed", 1)])
def test_attached_run_streams_rank_zeros_log_and_returns_the_outcome(rs, profiles, tmp_path, stub, capfd, final, code):
    stub.states = ("Starting", "Running", "Running", final)
    launcher = lepton.LeptonLauncher()
    launcher.poll_seconds = 0.01
    job = make_job(rs, profiles, name="lep2", mode="attached")
    submission = launcher.submit(job, launcher.plan(job, tmp_path), tmp_path)
    assert submission.exit_code == code
    out, err = capfd.readouterr()
    assert out.splitlines() == list(stub.log) and final in err
    assert not any(secret in out + err for secret in CREDENTIALS)


def test_unknown_node_group_names_the_ones_there(rs, profiles, tmp_path, stub):
    job = make_job(rs, profiles)
    job = job.model_copy(update={"launcher_settings": {**job.launcher_settings, "node_group": "nope"}})
    with pytest.raises(UsageError, match="node group 'nope'.*my-node-group, other-group"):
        lepton.LAUNCHER.submit(job, lepton.LAUNCHER.plan(job, tmp_path), tmp_path)
    assert not stub.jobs and not stub.secrets


def test_a_rejected_token_is_a_one_line_error_without_the_token(rs, profiles, tmp_path, stub, monkeypatch):
    monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", "wrong-" + TOKEN)
    job = make_job(rs, profiles)
    with pytest.raises(RunFailed) as err:
        lepton.LAUNCHER.submit(job, lepton.LAUNCHER.plan(job, tmp_path), tmp_path)
    assert "401" in str(err.value) and "lep login" in err.value.fix and TOKEN not in str(err.value) and not stub.jobs


def test_no_credentials_names_the_login(rs, profiles, tmp_path, monkeypatch):
    from leptonai.api.v2 import client as sdk_client

    for name in ("LEPTON_WORKSPACE_ID", "LEPTON_WORKSPACE_TOKEN", "LEPTON_WORKSPACE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sdk_client.WorkspaceRecord, "current", classmethod(lambda cls: None))
    job = make_job(rs, profiles)
    job = job.model_copy(update={"launcher_settings": {**job.launcher_settings, "workspace": None}})
    with pytest.raises(UsageError, match="lep login"):
        lepton.LAUNCHER.submit(job, lepton.LAUNCHER.plan(job, tmp_path), tmp_path)


def test_without_the_sdk_the_error_names_the_extra(rs, profiles, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "leptonai.api.v2.types.job", None)  # as if absent or older than 0.47
    with pytest.raises(UsageError) as err:
        lepton.LAUNCHER.plan(make_job(rs, profiles), tmp_path)
    assert shlex.quote("rlsteps[lepton]") in err.value.fix


def test_rlsteps_run_submits_a_batch_job_and_writes_no_secret(tiny_world, profiles, tmp_path, stub, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    result = invoke("run", "rl/rs", "-c", "tiny", "-b", "lep", f"rm.token={RM_TOKEN}")
    out = result.output + "".join(capfd.readouterr())
    assert result.exit_code == 0, out
    ((job_id, body),) = stub.jobs.items()
    assert job_id in out and body["spec"]["affinity"]["allowed_dedicated_node_groups"] == ["ng-0a1b2c"]
    (job_dir,) = (tmp_path / ".rlsteps" / "jobs").iterdir()
    assert {"config.yaml", "job.yaml", lepton.SPEC_FILE} <= {p.name for p in job_dir.iterdir()}
    written = "".join(p.read_text() for p in job_dir.iterdir())
    assert not any(secret in out + written for secret in CREDENTIALS)
