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

import required

required.importorskip(
    "leptonai",
    switch="LEPTON",
    reason="the Lepton launcher tests need the leptonai SDK (pip install 'rlsteps[lepton]')",
)

from leptonai.api.v2.types.job import LeptonJob, LeptonJobState  # noqa: E402

import run_helpers  # noqa: E402
from cli_helpers import invoke, run_cli  # noqa: E402
from lepton_stub_server import LeptonStub  # noqa: E402
from rlsteps.catalog import load_catalog  # noqa: E402
from rlsteps.errors import RunFailed, UsageError  # noqa: E402
from rlsteps.install import describe, source  # noqa: E402
from rlsteps.launch import code, lepton, lepton_api, lepton_spec  # noqa: E402
from rlsteps.launch.base import JobRecord, JobState  # noqa: E402
from rlsteps.launch.lepton_spec import secret_name  # noqa: E402
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


ON_MOUNT = [  # the tiny world's inputs, as if copied to the profile's mount: the job checks them, not this machine
    "inputs.prompts=/data/tiny/train.jsonl",
    "inputs.val_prompts=/data/tiny/val.jsonl",
    "inputs.policy=/data/tiny/policy",
    "inputs.reward_model=/data/tiny/reward_model",
]


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
    assert spec.metadata.id_ == lepton_spec.lepton_job_name(job.name) and re.fullmatch(
        r"[a-z][a-z0-9-]{0,35}", spec.metadata.id_
    )
    s = spec.spec
    assert (s.container.image, s.resource_shape) == ("nvcr.io/nvidia/pytorch:25.10-py3", "gpu.8xh100-80gb")
    assert s.affinity.allowed_dedicated_node_groups == ["my-node-group"]
    assert (s.completions, s.parallelism, s.intra_job_communication) == (1, 1, None)
    assert [(m.path, m.mount_path, m.from_) for m in s.mounts] == [("/shared/rl", "/data", "node-nfs:lepton-shared-fs")]
    assert s.image_pull_secrets == ["ngc-secret"] and s.shared_memory_size == 65536 and s.reservation_config is None
    plain = {e.name: e.value for e in s.envs if e.value_from is None}
    assert plain == plan.env
    assert {k: v for k, v in plain.items() if not k.startswith("RLSTEPS_CODE_")} == {
        "PYTHONUNBUFFERED": "1",
        "HF_HOME": "/data/hf",
        "NCCL_DEBUG": "WARN",
        "OMP_NUM_THREADS": "4",
    }
    refs = {e.name: e.value_from.secret_name_ref for e in s.envs if e.value_from is not None}
    job_id = spec.metadata.id_
    assert refs == {
        "HF_TOKEN": "team-hf-token",
        "WANDB_API_KEY": f"rlsteps_{job_id}_WANDB_API_KEY",
        "RLSTEPS_SECRET_RM_TOKEN": f"rlsteps_{job_id}_RLSTEPS_SECRET_RM_TOKEN",
    }
    assert s.container.command[:2] == ["/bin/bash", "-c"] and plan.command == s.container.command
    script = s.container.command[2]
    config_path = f"{lepton_spec.CONTAINER_JOBS_DIR}/{job.name}/config.yaml"
    assert script.splitlines()[-1] == f"exec python -m rlsteps.engine.run.worker {config_path}"
    assert "pip install -q /data/wheels/rlsteps.whl\nmkdir -p /data && cd /data\n" in script
    wheel = f"{lepton_spec.CONTAINER_JOBS_DIR}/{job.name}/{code.wheel_name()}"
    assert f'export PYTHONPATH={wheel}"${{PYTHONPATH:+:$PYTHONPATH}}"\n' in script  # before the profile's setup
    assert script.index("export PYTHONPATH=") < script.index("pip install")
    assert plan.code == code.wheel_name()
    assert "code: the job's own wheel of rlsteps, first on PYTHONPATH" in plan.summary


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
        '--node-rank="$LEPTON_JOB_WORKER_INDEX" --master-addr="$MASTER_ADDR" -m rlsteps.engine.run.worker '
    )


def run_script(script: str, tmp_path: Path, env: dict[str, str]) -> dict:
    """Run a container script here, with `python` and `torchrun` replaced by a recorder of their argv and cwd."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = (
        f"#!{sys.executable}\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv, 'cwd': os.getcwd(), 'path': os.environ.get('PYTHONPATH'),"
        " 'chunks': sorted(k for k in os.environ if k.startswith('RLSTEPS_CODE_'))}, open(os.environ['RECORD'], 'w'))\n"
    )
    for name in ("python", "torchrun"):
        (bin_dir / name).write_text(recorder)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "record.json"
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record), **env}
    subprocess.run(["/bin/bash", "-c", script], env=full_env, check=True, timeout=30)
    return json.loads(record.read_text())


LEPTON_REPLICA = {"LEPTON_JOB_NAME": "j-1", "LEPTON_JOB_WORKER_INDEX": "1", "LEPTON_WORKSPACE_ID": "test-ws"}


@pytest.mark.parametrize(
    ("profile_name", "change", "lepton_env", "launch"),
    [
        ("lep", {}, LEPTON_REPLICA, []),  # one process: the worker itself
        ("lep", {"nprocs_per_node": 2}, LEPTON_REPLICA, ["--standalone", "--nproc-per-node=2"]),
        (
            "lep2",
            {},
            LEPTON_REPLICA,  # without the service variables: the job name stands in, as the platform's examples do
            [
                "--nnodes=2",
                "--nproc-per-node=8",
                "--master-port=29400",
                "--node-rank=1",
                "--master-addr=j-1-0.j-1-job-svc",
            ],
        ),
        (
            "lep2",
            {},
            {**LEPTON_REPLICA, "LEPTON_JOB_SERVICE_PREFIX": "svc-j", "LEPTON_SUBDOMAIN": "sub-j"},
            ["--nnodes=2", "--nproc-per-node=8", "--master-port=29400", "--node-rank=1", "--master-addr=svc-j-0.sub-j"],
        ),
    ],
)
def test_the_script_runs_the_worker_with_exact_words(
    rs, profiles, tmp_path, monkeypatch, profile_name, change, lepton_env, launch
):
    monkeypatch.setattr(lepton_spec, "CONTAINER_JOBS_DIR", str(tmp_path / "jobs"))
    data = tmp_path / "data"
    job = make_job(rs, profiles, name=profile_name, passthrough=["--note", "it's $HOME; a b", '"q"'])
    settings = {
        **job.launcher_settings,
        **change,
        "mounts": [{"path": "/p", "mount_path": str(data), "from": "node-nfs:fs"}],
        "pre_launch_commands": [],
    }
    job = job.model_copy(update={"launcher_settings": settings})
    script = lepton.LAUNCHER.plan(job, tmp_path / job.name).command[2]
    shipped = code.env_chunks(code.build_wheel().content)
    seen = run_script(script, tmp_path, lepton_env | shipped)
    config = tmp_path / "jobs" / job.name / "config.yaml"
    assert seen["cwd"] == str(data)
    assert seen["path"] == str(config.parent / code.wheel_name())  # the job's wheel, for torchrun's children too
    assert seen["chunks"] == ["RLSTEPS_CODE_CHUNKS", "RLSTEPS_CODE_SHA256"]  # the chunks dropped once unpacked
    assert OmegaConf.to_container(OmegaConf.load(config)) == job.worker_config()
    assert OmegaConf.load(config.parent / "job.yaml").job.step == "rl/rs"
    worker = ["-m", "rlsteps.engine.run.worker", str(config), "--note", "it's $HOME; a b", '"q"']
    assert Path(seen["argv"][0]).name == ("torchrun" if launch else "python")
    assert seen["argv"][1:] == [*launch, *worker]


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
    assert lepton_spec.lepton_job_name("20250101-120000-rl_reinforce-12") == "j-20250101-120000-rl-reinforce-12"
    assert lepton_spec.lepton_job_name("My_Job") == "my-job"
    assert len(lepton_spec.lepton_job_name("20250101-120000-" + "x" * 40)) == lepton_spec.MAX_JOB_NAME


def test_every_lepton_state_has_a_meaning():
    unmapped = {s.value for s in LeptonJobState} - lepton_api.STATES.keys()
    assert unmapped == {"Archived", "UNK"}  # decided by the job's counters / unknown on purpose


def test_dry_run_prints_the_spec_as_json_and_no_secret(rs, profiles, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    result = invoke("run", "rl/rs", "-c", "default", "-b", "lep", "--dry-run", *INPUTS, f"rm.token={RM_TOKEN}")
    out = result.output + "".join(capfd.readouterr())
    assert result.exit_code == 0, out
    assert lepton.SPEC_FILE in out and '"resource_shape": "gpu.8xh100-80gb"' in out
    for variable in ("RLSTEPS_SECRET_RM_TOKEN", "WANDB_API_KEY"):  # a secret of this job's own, by name
        assert re.search(rf'"secret_name_ref": "rlsteps_j-[a-z0-9-]+_{variable}"', out), variable
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
    stub.secrets["RLSTEPS_SECRET_RM_TOKEN"] = "another job's value"  # a shared name of older releases: left alone
    job = make_job(rs, profiles)
    job_dir = tmp_path / job.name
    job_dir.mkdir()
    plan = lepton.LAUNCHER.plan(job, job_dir)
    write_job_files(job_dir, job, plan, inputs=[])
    submission = lepton.LAUNCHER.submit(job, plan, job_dir)
    job_id = submission.job_id
    assert job_id == lepton_spec.lepton_job_name(job.name) and submission.exit_code is None
    posted = LeptonJob.model_validate(stub.jobs[submission.job_id])
    assert posted.spec.affinity.allowed_dedicated_node_groups == ["ng-0a1b2c"]  # the name became the group's id
    expected = json.loads(plan.files[lepton.SPEC_FILE])
    expected["spec"]["affinity"]["allowed_dedicated_node_groups"] = ["ng-0a1b2c"]
    shipped = code.env_chunks((job_dir / plan.code).read_bytes())
    for env in expected["spec"]["envs"]:
        env.update({"value": shipped[env["name"]]} if env["name"] in shipped else {})
    assert stub.jobs[submission.job_id] == expected  # exactly what the dry run showed, but for the id and the code
    own = {secret_name(job_id, "RLSTEPS_SECRET_RM_TOKEN"): RM_TOKEN, secret_name(job_id, "WANDB_API_KEY"): WANDB_KEY}
    assert stub.secrets == {"RLSTEPS_SECRET_RM_TOKEN": "another job's value", **own}
    assert not any(secret in json.dumps(stub.jobs) for secret in CREDENTIALS)

    record = lepton.LAUNCHER.record(job, submission)
    assert record.extra["workspace"] == "test-ws" and record.job_id == submission.job_id
    assert record.extra["secrets"] == sorted(own) and record.extra["secrets_deleted"] is False
    record.save()
    assert [lepton.LAUNCHER.status(record).state for _ in range(2)] == [JobState.PENDING, JobState.RUNNING]
    assert stub.secrets.keys() == {"RLSTEPS_SECRET_RM_TOKEN", *own}  # kept while the job runs
    assert lepton.LAUNCHER.status(record).state is JobState.SUCCEEDED
    assert stub.secrets == {"RLSTEPS_SECRET_RM_TOKEN": "another job's value"}  # its own are gone once it ended
    assert JobRecord.load(job_dir).extra["secrets_deleted"] is True
    assert "Completed" in lepton.LAUNCHER.status(record).detail
    assert list(lepton.LAUNCHER.logs(record)) == list(stub.log)
    assert list(lepton.LAUNCHER.logs(record, follow=True)) == list(stub.log)
    lepton.LAUNCHER.cancel(record)
    assert ("DELETE", f"/jobs/{job_id}") in stub.calls
    assert lepton.LAUNCHER.status(record).state is JobState.CANCELLED
    assert [c for c in stub.calls if c[1].startswith("/usersecrets/")] == [("DELETE", f"/usersecrets/{n}") for n in own]

    printed = "".join(capfd.readouterr())
    written = "".join(p.read_bytes().decode(errors="replace") for p in job_dir.iterdir())
    assert not any(secret in printed + written for secret in CREDENTIALS)


@pytest.mark.parametrize(("final", "code"), [("Completed", 0), ("Failed", 1)])
def test_attached_run_streams_the_log_returns_the_outcome_and_drops_its_secrets(
    rs, profiles, tmp_path, stub, capfd, final, code
):
    stub.states = ("Starting", "Running", "Running", final)
    launcher = lepton.LeptonLauncher()
    launcher.poll_seconds = 0.01
    job = make_job(rs, profiles, mode="attached")
    submission = launcher.submit(job, launcher.plan(job, tmp_path), tmp_path)
    assert submission.exit_code == code
    out, err = capfd.readouterr()
    assert out.splitlines() == list(stub.log) and final in err
    assert not any(secret in out + err for secret in CREDENTIALS)
    assert not stub.secrets and len([c for c in stub.calls if c == ("POST", "/usersecrets")]) == 1
    assert launcher.record(job, submission).extra["secrets_deleted"] is True  # what the runner then saves


def test_the_log_is_rank_zeros_of_a_multi_replica_job(rs, profiles, tmp_path, stub):
    job = make_job(rs, profiles, name="lep2")  # submitting refuses it; a job that has two replicas all the same
    body = json.loads(lepton.LAUNCHER.plan(job, tmp_path).files[lepton.SPEC_FILE])
    body["spec"]["affinity"]["allowed_dedicated_node_groups"] = ["ng-0a1b2c"]
    job_id = body["metadata"]["id"]
    stub.jobs[job_id], stub.scripts[job_id] = body, ("Running",)
    record = JobRecord("lepton", job_id, str(tmp_path), "rl/rs", "2026-01-01T00:00:00+00:00", {"workspace": "test-ws"})
    assert list(lepton.LAUNCHER.logs(record, follow=True)) == list(stub.log)  # the stub streams rank 0 only


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


def test_without_the_sdk_the_plan_is_the_job_the_sdk_posts_and_only_a_submission_needs_it(
    rs, profiles, tmp_path, monkeypatch
):
    job = make_job(rs, profiles)
    with_sdk = json.loads(lepton.LAUNCHER.plan(job, tmp_path).files[lepton.SPEC_FILE])
    monkeypatch.setitem(sys.modules, "leptonai", None)  # as if not installed
    plan = lepton.LAUNCHER.plan(job, tmp_path)
    without = json.loads(plan.files[lepton.SPEC_FILE])
    # the SDK fills in its defaults (a finished job's time to live, ...): the job rlsteps builds is the one it posts
    assert LeptonJob.model_validate(without).model_dump(by_alias=True, exclude_none=True, mode="json") == with_sdk
    assert set(with_sdk["spec"]) - set(without["spec"]) == {"ttl_seconds_after_finished"}
    with pytest.raises(UsageError) as err:
        lepton.LAUNCHER.submit(job, plan, tmp_path)
    assert shlex.quote("rlsteps[lepton]") in err.value.fix


def test_a_dry_run_needs_no_sdk(profiles, tmp_path):
    hidden = "import sys; sys.modules['leptonai'] = None; from rlsteps.cli import entry; sys.exit(entry())"
    argv = ["run", "rl/rs", "-c", "default", "-b", "lep", "--dry-run", *INPUTS]
    env = {**os.environ, "RLSTEPS_PROFILES": str(profiles), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", hidden, *argv], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert lepton.SPEC_FILE in done.stdout and '"resource_shape": "gpu.8xh100-80gb"' in done.stdout


def test_rlsteps_run_submits_a_batch_job_and_writes_no_secret(tiny_world, profiles, tmp_path, stub, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    result = invoke("run", "rl/rs", "-c", "tiny", "-b", "lep", f"rm.token={RM_TOKEN}", *ON_MOUNT)
    out = result.output + "".join(capfd.readouterr())
    assert result.exit_code == 0, out
    ((job_id, body),) = stub.jobs.items()
    assert job_id in out and body["spec"]["affinity"]["allowed_dedicated_node_groups"] == ["ng-0a1b2c"]
    (job_dir,) = (tmp_path / ".rlsteps" / "jobs").iterdir()
    assert {"config.yaml", "job.yaml", lepton.SPEC_FILE} <= {p.name for p in job_dir.iterdir()}
    written = "".join(p.read_bytes().decode(errors="replace") for p in job_dir.iterdir())
    assert not any(secret in out + written for secret in CREDENTIALS)


@pytest.mark.parametrize(
    ("name", "change", "refused"),
    [
        ("lep2", {}, None),  # 512 prompts and 64 rows split in 16
        ("lep", {"gpus_per_node": 8}, None),
        ("lep", {"nprocs_per_node": 3}, "(profile lep: 1 node(s) x 3 process(es)): rollout.prompts_per_step=512"),
        ("lep2", {"nprocs_per_node": 64}, "(profile lep2: 2 node(s) x 64 process(es)): train.global_batch_size=64"),
    ],
)
def test_a_config_its_processes_cannot_split_is_refused(rs, profiles, name, change, refused):
    from rlsteps.plan.runner import check_processes

    job = make_job(rs, profiles, name=name)
    job = job.model_copy(update={"launcher_settings": {**job.launcher_settings, **change}})
    if refused is None:
        check_processes(lepton.LAUNCHER, job)
        return
    with pytest.raises(UsageError) as err:
        check_processes(lepton.LAUNCHER, job)
    assert refused in err.value.message


def test_an_unservable_run_is_refused_before_anything_is_written_or_sent(
    tiny_world, profiles, tmp_path, stub, monkeypatch, capfd
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    fits = "train.micro_batch_size=1"  # 16 rows split in 16
    dry = invoke("run", "rl/rs", "-c", "tiny", "-b", "lep2", "--dry-run", f"rm.token={RM_TOKEN}", fits)
    shown = " ".join((dry.output + "".join(capfd.readouterr())).split())
    assert dry.exit_code == 3, shown  # it compiles; the tiny world's files are on this machine, where Lepton is not
    assert "the run would refuse 4 inputs" in shown and "is on this machine" in shown
    assert "2 x gpu.8xh100-80gb, 8 process(es) per node" in shown and "single-process" not in shown
    dry = invoke("run", "rl/rs", "-c", "tiny", "-b", "lep2", "--dry-run", f"rm.token={RM_TOKEN}")  # the dry run says it
    assert dry.exit_code == 2 and "is not a multiple of world size 16" in dry.output + "".join(capfd.readouterr())
    result = invoke("run", "rl/rs", "-c", "tiny", "-b", "lep2", f"rm.token={RM_TOKEN}")  # 16 rows on 16 x 16
    out = result.output + "".join(capfd.readouterr())
    assert result.exit_code == 2, out
    assert "train.global_batch_size=16 is not a multiple of world size 16" in out
    assert stub.calls == [] and not (tmp_path / ".rlsteps").exists()


LEPTON_ENV = ("LEPTON_WORKSPACE_ID", "LEPTON_WORKSPACE_TOKEN", "LEPTON_WORKSPACE_URL", "LEPTON_CACHE_DIR")


@pytest.mark.parametrize(
    ("login_record", "message"),
    [
        (None, "no token for DGX Cloud Lepton workspace test-ws"),  # the profile names a workspace, nothing a token
        ("- not: a mapping\n", "the leptonai SDK cannot read its `lep login` record (TypeError)"),
    ],
)
def test_missing_or_unreadable_credentials_are_one_line_not_a_traceback(
    tiny_world, profiles, tmp_path, monkeypatch, login_record, message
):
    from rlsteps.tiny.layout import rlsteps_home

    for name in LEPTON_ENV:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    if login_record is not None:
        (home / ".cache" / "lepton").mkdir(parents=True)
        (home / ".cache" / "lepton" / "workspace_info.yaml").write_text(login_record)
    env = {"HOME": str(home), "RLSTEPS_HOME": str(rlsteps_home()), "RLSTEPS_PROFILES": str(profiles)}
    result = run_cli(
        "run", "rl/rs", "-c", "tiny", "-b", "lep", f"rm.token={RM_TOKEN}", *ON_MOUNT, cwd=tmp_path, env=env
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and message in " ".join(result.stderr.split())
    assert "lep login" in result.stderr


def test_every_way_the_sdk_fails_to_build_a_client_is_a_usage_error(monkeypatch):
    from leptonai.api.v2 import client as sdk_client
    from leptonai.api.v2.workspace_record import _LocalWorkspaceRecord

    for name in LEPTON_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sdk_client.WorkspaceRecord, "_singleton_record", _LocalWorkspaceRecord())  # no `lep login`
    with pytest.raises(UsageError, match="no DGX Cloud Lepton workspace to talk to"):
        lepton_api.client(None)
    with pytest.raises(UsageError, match="no token for DGX Cloud Lepton workspace test-ws"):
        lepton_api.client("test-ws")
    monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", TOKEN)
    monkeypatch.setenv("LEPTON_DEBUG_HEADERS", "not-a-pair")  # the SDK raises a RuntimeError on this one
    with pytest.raises(UsageError, match=r"cannot set up a client .* test-ws \(RuntimeError\)") as err:
        lepton_api.client("test-ws")
    assert TOKEN not in str(err.value)


def local_record(root: Path, name: str, exit_file: str = "0\n") -> JobRecord:
    """A detached local job that ended, as the local launcher leaves it."""
    from rlsteps.launch import local

    job_dir = root / name
    job_dir.mkdir(parents=True)
    (job_dir / local.LOG_FILE).write_text("done\n")
    (job_dir / local.EXIT_FILE).write_text(exit_file)
    extra = {"pid": 4242, "pid_started": None, "log": str(job_dir / local.LOG_FILE)}
    record = JobRecord("local", "4242", str(job_dir), "rl/rs", f"2026-01-01T00:00:{name[-2:]}+00:00", extra)
    record.save()
    return record


def lepton_record(root: Path, name: str) -> JobRecord:
    job_dir = root / name
    job_dir.mkdir(parents=True)
    job_id = lepton_spec.lepton_job_name(name)
    extra = {"workspace": "test-ws", "secrets": [secret_name(job_id, "WANDB_API_KEY")], "secrets_deleted": False}
    record = JobRecord("lepton", job_id, str(job_dir), "rl/rs", f"2026-01-01T00:00:{name[-2:]}+00:00", extra)
    record.save()
    return record


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("failure", ["unreachable", "no token", "token refused"])
def test_jobs_list_shows_every_job_when_lepton_cannot_answer(tmp_path, stub, monkeypatch, failure):
    from leptonai.api.v2 import client as sdk_client
    from leptonai.api.v2.workspace_record import _LocalWorkspaceRecord

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(tmp_path / "none.yaml"))
    if failure == "unreachable":
        monkeypatch.setenv("LEPTON_WORKSPACE_URL", f"http://127.0.0.1:{closed_port()}/api/v2/workspaces/test-ws")
    elif failure == "no token":
        monkeypatch.delenv("LEPTON_WORKSPACE_TOKEN")
        monkeypatch.setattr(sdk_client.WorkspaceRecord, "_singleton_record", _LocalWorkspaceRecord())
    else:
        monkeypatch.setenv("LEPTON_WORKSPACE_TOKEN", "wrong-" + TOKEN)
    jobs_dir = tmp_path / ".rlsteps" / "jobs"
    local_record(jobs_dir, "20260101-000000-rl_rs-01")
    for name in ("20260101-000001-rl_rs-02", "20260101-000002-rl_rs-03"):
        lepton_record(jobs_dir, name)
    local_record(jobs_dir, "20260101-000003-rl_rs-04", exit_file="garbled")  # fails alone: not its backend

    listed = invoke("jobs", "list", "--json")
    assert listed.exit_code == 0, listed.output
    views = json.loads(listed.stdout)
    assert [(v["launcher"], v["state"]) for v in views] == [
        ("local", "succeeded"),
        ("lepton", "unknown"),
        ("lepton", "unknown"),
        ("local", "unknown"),
    ]
    reason = {"unreachable": "cannot reach the Lepton API", "no token": "no token for", "token refused": "401"}
    assert all(reason[failure] in v["detail"] and "lep login" in v["detail"] for v in views[1:3])
    assert views[3]["detail"].startswith("local status unavailable: ValueError")
    assert len([c for c in stub.calls if c[1].startswith("/jobs/")]) == (failure == "token refused")  # asked once
    table = invoke("jobs", "list")
    assert table.exit_code == 0 and all(f"rl_rs-0{i}" in table.stdout for i in range(1, 5))
    assert not any(secret in table.output + listed.output for secret in CREDENTIALS)


def test_each_job_keeps_its_own_secrets_until_it_ends(tiny_world, profiles, tmp_path, stub, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    stub.secrets["RLSTEPS_SECRET_RM_TOKEN"] = "a shared value"  # a name older releases stored for every job
    tokens = ["rm-token-first-A1", "rm-token-second-B2"]
    for token in tokens:
        result = invoke("run", "rl/rs", "-c", "tiny", "-b", "lep", f"rm.token={token}", *ON_MOUNT)
        assert result.exit_code == 0, result.output + "".join(capfd.readouterr())
    first, second = stub.jobs  # in the order submitted
    assert first != second
    secrets = {
        job_id: {secret_name(job_id, "RLSTEPS_SECRET_RM_TOKEN"): token, secret_name(job_id, "WANDB_API_KEY"): WANDB_KEY}
        for job_id, token in zip((first, second), tokens)
    }
    assert stub.secrets == {"RLSTEPS_SECRET_RM_TOKEN": "a shared value", **secrets[first], **secrets[second]}
    assert not any(c[0] == "DELETE" for c in stub.calls)  # a submission deletes nothing

    stub.scripts[first], stub.scripts[second] = ("Completed",), ("Running",)
    listed = invoke("jobs", "list", "--json")
    assert [(v["job_id"], v["state"]) for v in json.loads(listed.stdout)] == [(first, "succeeded"), (second, "running")]
    assert stub.secrets == {"RLSTEPS_SECRET_RM_TOKEN": "a shared value", **secrets[second]}
    (first_dir,) = [p for p in (tmp_path / ".rlsteps" / "jobs").iterdir() if JobRecord.load(p).job_id == first]
    assert JobRecord.load(first_dir).extra["secrets_deleted"] is True
    deletes = len([c for c in stub.calls if c[0] == "DELETE"])
    assert invoke("jobs", "status", first).exit_code == 0
    assert len([c for c in stub.calls if c[0] == "DELETE"]) == deletes  # done once, not at each look

    cancelled = invoke("jobs", "cancel", second)
    assert cancelled.exit_code == 0, cancelled.output
    assert stub.secrets == {"RLSTEPS_SECRET_RM_TOKEN": "a shared value"}


def test_a_failed_secret_delete_is_a_warning_and_is_tried_again(rs, profiles, tmp_path, stub, capfd):
    launcher = lepton.LeptonLauncher()
    job = make_job(rs, profiles)
    submission = launcher.submit(job, launcher.plan(job, tmp_path), tmp_path)
    record = launcher.record(job, submission)
    record.save()
    stub.scripts[submission.job_id], stub.secret_deletes_fail = ("Failed",), True
    assert launcher.status(record).state is JobState.FAILED
    err = capfd.readouterr().err
    assert "warning: the secrets of Lepton job" in err and all(name in err for name in record.extra["secrets"])
    assert stub.secrets.keys() == set(record.extra["secrets"]) and not JobRecord.load(tmp_path).extra["secrets_deleted"]
    stub.secret_deletes_fail = False
    assert launcher.status(JobRecord.load(tmp_path)).state is JobState.FAILED
    assert not stub.secrets and JobRecord.load(tmp_path).extra["secrets_deleted"] is True


def test_a_refused_submission_leaves_no_secret_and_touches_no_other_jobs(rs, profiles, tmp_path, stub):
    job = make_job(rs, profiles)
    plan = lepton.LAUNCHER.plan(job, tmp_path / job.name)
    stub.job_creates_fail = True
    with pytest.raises(RunFailed, match="500"):
        lepton.LAUNCHER.submit(job, plan, tmp_path / job.name)
    assert not stub.jobs and not stub.secrets  # stored for the job, then dropped when it was not created

    stub.job_creates_fail = False
    lepton.LAUNCHER.submit(job, plan, tmp_path / job.name)
    kept = dict(stub.secrets)
    again = job.model_copy(update={"config": {**job.config, "rm": {**job.config["rm"], "token": "another"}}})
    with pytest.raises(RunFailed, match="409"):  # the same job id: its secret names are taken, not replaced
        lepton.LAUNCHER.submit(again, lepton.LAUNCHER.plan(again, tmp_path / job.name), tmp_path / job.name)
    assert stub.secrets == kept and len(stub.jobs) == 1


# The job carries its code: the wheel of rlsteps in the job's environment, rebuilt in the container.


def posted_env(body: dict) -> dict[str, str]:
    """The plain environment variables of a posted job body, as the container gets them."""
    return {e["name"]: e["value"] for e in body["spec"]["envs"] if "value" in e}


def wheel_in(env: dict[str, str]) -> bytes:
    count = int(env["RLSTEPS_CODE_CHUNKS"])
    return base64.b64decode("".join(env[f"RLSTEPS_CODE_{i}"] for i in range(count)), validate=True)


def submit_to_stub(job, tmp_path: Path, stub: LeptonStub) -> tuple[Path, dict]:
    """Plan, write the job dir and submit, as `rlsteps run -b` does; the job dir and the body the API got."""
    job_dir = tmp_path / job.name
    job_dir.mkdir()
    plan = lepton.LAUNCHER.plan(job, job_dir)
    write_job_files(job_dir, job, plan, inputs=[])
    return job_dir, stub.jobs[lepton.LAUNCHER.submit(job, plan, job_dir).job_id]


def in_container(job, tmp_path: Path, **settings):
    """The job with its container paths under tmp_path: the mount is the run dir, no setup lines."""
    mounts = [{"path": "/p", "mount_path": str(tmp_path / "data"), "from": "node-nfs:fs"}]
    return job.model_copy(
        update={"launcher_settings": {**job.launcher_settings, "mounts": mounts, "pre_launch_commands": [], **settings}}
    )


@pytest.fixture(scope="module")
def python_without_rlsteps(tmp_path_factory) -> Path:
    """The bin folder of a stock image's python: torch and the engine's dependencies, no rlsteps."""
    return run_helpers.python_without_rlsteps(tmp_path_factory.mktemp("image") / "env").parent


def run_in_image(script: str, env: dict[str, str], image_bin: Path, **kwargs) -> subprocess.CompletedProcess:
    """Run a container script here with `python` and `python3` the image's: no rlsteps of their own."""
    full = {"PATH": f"{image_bin}:/usr/bin:/bin", "HOME": str(image_bin.parent), **env}
    return subprocess.run(["/bin/bash", "-c", script], env=full, capture_output=True, text=True, **kwargs)


IMPORT_PROBE = 'python -c "import os, rlsteps; print(rlsteps.__file__, \\"RLSTEPS_CODE_0\\" in os.environ)"'


def up_to_the_worker(body: dict) -> str:
    """The posted entry script without its last line (exec the worker), and a probe of what python imports."""
    script = body["spec"]["container"]["command"][2]
    head, last = script.rstrip("\n").rsplit("\n", 1)
    assert last.startswith("exec python -m rlsteps.engine.run.worker ")
    return f"{head}\n{IMPORT_PROBE}\n"


def test_the_posted_spec_carries_the_jobs_wheel_in_chunks_that_linux_passes(rs, profiles, tmp_path, stub):
    job = make_job(rs, profiles)
    job_dir, body = submit_to_stub(job, tmp_path, stub)
    env = posted_env(body)
    built = code.build_wheel()
    assert wheel_in(env) == built.content == (job_dir / built.name).read_bytes()
    assert env["RLSTEPS_CODE_SHA256"] == built.sha256 and int(env["RLSTEPS_CODE_CHUNKS"]) >= 2
    chunks = [v for k, v in env.items() if code.is_chunk(k)]
    assert len(chunks) == int(env["RLSTEPS_CODE_CHUNKS"]) and max(map(len, chunks)) <= code.ENV_CHUNK
    assert all(len(f"{k}={v}".encode()) < code.ARG_STRLEN for k, v in env.items())
    assert len(body["spec"]["container"]["command"][2].encode()) < code.ARG_STRLEN
    recorded = OmegaConf.to_container(OmegaConf.load(job_dir / "job.yaml"))["code"]  # as for Slurm
    assert recorded == {"wheel": built.name, "sha256": built.sha256, "files": built.files}
    shown = (job_dir / lepton.SPEC_FILE).read_text()  # the job dir keeps the wheel once, not its base64 as well
    assert "of the job's wheel, elided" in shown and len(shown) < 32 * 1024


def test_the_entry_script_rebuilds_the_wheel_and_a_bare_python_imports_rlsteps_from_it(
    rs, profiles, tmp_path, stub, monkeypatch, python_without_rlsteps
):
    monkeypatch.setattr(lepton_spec, "CONTAINER_JOBS_DIR", str(tmp_path / "container"))
    job = in_container(make_job(rs, profiles), tmp_path)
    _, body = submit_to_stub(job, tmp_path, stub)
    done = run_in_image(up_to_the_worker(body), posted_env(body), python_without_rlsteps, timeout=60)
    assert done.returncode == 0, done.stderr
    wheel = tmp_path / "container" / job.name / code.wheel_name()
    assert done.stdout.split() == [f"{wheel}/rlsteps/__init__.py", "False"]  # from the wheel; chunks dropped
    assert wheel.read_bytes() == code.build_wheel().content


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("a changed character", "rlsteps: the code of this job arrived damaged: sha256 "),
        ("a missing chunk", "rlsteps: cannot rebuild the code of this job: 'RLSTEPS_CODE_1' is not set"),
        ("a stray character", "rlsteps: cannot rebuild the code of this job from RLSTEPS_CODE_*: Only base64 data"),
    ],
)
def test_damaged_code_stops_the_job_with_one_line_before_anything_runs(
    rs, profiles, tmp_path, stub, monkeypatch, python_without_rlsteps, damage, message
):
    monkeypatch.setattr(lepton_spec, "CONTAINER_JOBS_DIR", str(tmp_path / "container"))
    job = in_container(make_job(rs, profiles), tmp_path)
    _, body = submit_to_stub(job, tmp_path, stub)
    env = posted_env(body)
    chunk = env["RLSTEPS_CODE_1"]
    if damage == "a changed character":
        env["RLSTEPS_CODE_1"] = chunk[:100] + ("A" if chunk[100] != "A" else "B") + chunk[101:]
    elif damage == "a missing chunk":
        del env["RLSTEPS_CODE_1"]
    else:
        env["RLSTEPS_CODE_1"] = chunk[:100] + "!" + chunk[101:]
    done = run_in_image(up_to_the_worker(body), env, python_without_rlsteps, timeout=60)
    assert done.returncode == 1 and done.stdout == ""  # the probe, standing for the worker, never ran
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(message), done.stderr
    assert not list((tmp_path / "container" / job.name).glob("*.whl*"))


def test_code_installed_sends_no_wheel(rs, profiles, tmp_path, stub):
    job = make_job(rs, profiles)
    job = job.model_copy(update={"launcher_settings": {**job.launcher_settings, "code": "installed"}})
    plan = lepton.LAUNCHER.plan(job, tmp_path / job.name)
    assert plan.code is None and "code: rlsteps as installed in the image (code: installed)" in plan.summary
    job_dir, body = submit_to_stub(job, tmp_path, stub)
    assert not any(name.startswith("RLSTEPS_CODE") for name in posted_env(body))
    script = body["spec"]["container"]["command"][2]
    assert "PYTHONPATH" not in script and "python3" not in script
    assert not list(job_dir.glob("*.whl")) and "code" not in OmegaConf.load(job_dir / "job.yaml")


def test_the_dry_run_shows_the_code_chunks_elided(rs, profiles, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    result = invoke("run", "rl/rs", "-c", "default", "-b", "lep", "--dry-run", *INPUTS, f"rm.token={RM_TOKEN}")
    out = result.output + "".join(capfd.readouterr())
    assert result.exit_code == 0, out
    assert re.search(r'"name": "RLSTEPS_CODE_0",\s+"value": "<96 KiB of the job\'s wheel, elided>"', out)
    assert "RLSTEPS_CODE_0=<96 KiB of the job's wheel, elided>" in out  # the environment panel
    assert f'"value": "{code.build_wheel().sha256}"' in out and "carried in the job's environment as" in out
    # the config travels base64-encoded in the command (a few KiB); no 96 KiB chunk of the wheel is printed
    assert len(out) < 64 * 1024 and not re.search(r"[A-Za-z0-9+/]{10000}", out)


def test_a_wheel_that_is_not_the_one_planned_is_not_sent(rs, profiles, tmp_path, stub):
    job = make_job(rs, profiles)
    job_dir = tmp_path / job.name
    job_dir.mkdir()
    plan = lepton.LAUNCHER.plan(job, job_dir)
    write_job_files(job_dir, job, plan, inputs=[])
    (job_dir / plan.code).write_bytes(b"another build")
    with pytest.raises(RunFailed, match="is not the one planned"):
        lepton.LAUNCHER.submit(job, plan, job_dir)
    assert not stub.jobs and not stub.secrets


def test_a_command_and_environment_linux_would_refuse_are_refused_at_planning(rs, profiles, tmp_path, monkeypatch):
    monkeypatch.setattr(lepton_spec, "MAX_EXEC", 128 * 1024)  # as if the wheel had grown past what a job can carry
    job = make_job(rs, profiles)
    with pytest.raises(UsageError) as err:
        lepton.LAUNCHER.plan(job, tmp_path / job.name)
    assert "the job's command and environment take" in err.value.message and "code: installed" in err.value.fix


@pytest.mark.slow
def test_a_stock_image_runs_the_jobs_own_wheel_to_the_end_of_a_tiny_run(
    tiny_world, rs, profiles, tmp_path, stub, monkeypatch, python_without_rlsteps
):
    """The whole posted entry script, its worker included, in a python without rlsteps."""
    monkeypatch.setattr(lepton_spec, "CONTAINER_JOBS_DIR", str(tmp_path / "container"))
    job = compile_job(
        rs,
        "tiny",
        mode="batch",
        profile=resolve_profile("lep", [profiles]),
        overrides=["validation.interval=0", "run.num_threads=1", "train.max_steps=1", "checkpoint.interval=1"],
    )
    job = in_container(job, tmp_path, env_vars={})
    _, body = submit_to_stub(job, tmp_path, stub)
    env = posted_env(body) | job.secret_env()  # what Lepton sets from the job's secret references
    script = body["spec"]["container"]["command"][2]
    done = run_in_image(script, env, python_without_rlsteps, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheel = tmp_path / "container" / job.name / code.wheel_name()
    assert (
        f"code: {describe(source() | {'from': 'wheel'})} from {wheel}/rlsteps" in done.stdout + done.stderr
    )  # its commit too
    assert (tmp_path / "data" / ".rlsteps" / "runs" / "rl_rs-tiny" / "policy").is_dir()


def test_a_local_input_the_container_cannot_see_is_refused_at_submission_with_the_fix(
    tiny_world, profiles, tmp_path, stub, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    result = invoke("run", "rl/rs", "-c", "tiny", "-b", "lep", f"rm.token={RM_TOKEN}")
    assert result.exit_code == 3 and not stub.jobs and not (tmp_path / ".rlsteps" / "jobs").exists()
    message = " ".join(result.stderr.split())  # unwrapped
    assert f"input 'prompts': {tiny_world.train_prompts} is on this machine" in message
    assert "its cluster paths (/data)" in message and "copy it under a cluster path" in message
    assert "rlsteps artifacts publish" in message


def test_inputs_on_the_mount_are_left_to_the_job_which_carries_what_it_needs_to_check_them(
    tiny_world, profiles, tmp_path, stub, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(profiles))
    result = invoke("run", "rl/rs", "-c", "tiny", "-b", "lep", f"rm.token={RM_TOKEN}", *ON_MOUNT)
    assert result.exit_code == 0, result.output
    ((_, body),) = stub.jobs.items()
    script = body["spec"]["container"]["command"][-1]
    record = next(line for line in script.splitlines() if "/job.yaml" in line and "base64 -d" in line)
    job_yaml = base64.b64decode(record.split()[1]).decode()
    assert "inputs_in_job:" in job_yaml and "ref: /data/tiny/policy" in job_yaml and "hf_causal_lm" in job_yaml
