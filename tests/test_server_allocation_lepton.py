"""On Lepton, a profile's server: is a job of its own beside the run's: both built from the leptonai SDK's own types,
the server's created first, its address in the run's script, and both gone when the run ends or is cancelled (a
loopback stand-in for the workspace API, tests/lepton_stub_server.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import required

required.importorskip(
    "leptonai",
    switch="LEPTON",
    reason="the Lepton launcher tests need the leptonai SDK (pip install 'rlsteps[lepton]')",
)

from leptonai.api.v2.types.job import LeptonJob  # noqa: E402

from rlsteps.launch import lepton, lepton_server  # noqa: E402
from rlsteps.launch.lepton_spec import lepton_job_name  # noqa: E402
from rlsteps.plan.compile import compile_job  # noqa: E402
from rlsteps.plan.job_dir import write_job_files  # noqa: E402
from rlsteps.plan.profiles import resolve_profile  # noqa: E402
from test_launch_lepton import PROFILES, RM_TOKEN, rs, stub  # noqa: E402, F401 - fixtures

SERVER = """
  lep_server:
    extends: lep
    server:
      serves: rm
      resource_shape: gpu.8xh100-80gb
      port: 5555
"""
INPUTS = ["inputs.prompts=/data/prompts.jsonl", "inputs.policy=/data/sft", "inputs.reward_model=/data/rm"]


def server_job(rs, tmp_path: Path, mode: str = "batch"):  # noqa: F811
    tmp_path.mkdir(parents=True, exist_ok=True)
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES + SERVER)
    overrides = [*INPUTS, f"rm.token={RM_TOKEN}"]
    return compile_job(rs, "default", mode=mode, profile=resolve_profile("lep_server", [profiles]), overrides=overrides)


def test_the_server_is_a_job_of_its_own_and_the_run_waits_for_its_address(rs, tmp_path):  # noqa: F811
    job = server_job(rs, tmp_path)
    plan = lepton.LAUNCHER.plan(job, tmp_path / job.name)
    run = LeptonJob.model_validate(json.loads(plan.files[lepton.SPEC_FILE]))
    server = LeptonJob.model_validate(json.loads(plan.files[lepton_server.SERVER_SPEC_FILE]))
    name = lepton_server.server_job_name(run.metadata.id_)
    assert server.metadata.id_ == name and len(name) <= 36 and name != run.metadata.id_
    assert server.spec.resource_shape == "gpu.8xh100-80gb" and server.spec.intra_job_communication
    assert server.spec.completions == 1 and server.spec.container.image == run.spec.container.image
    command = server.spec.container.command[-1]
    assert "-m rlsteps.engine.rewards.rm --model /data/rm --host 0.0.0.0 --port 5555" in command
    assert "--token-env RLSTEPS_SECRET_RM_TOKEN" in command and RM_TOKEN not in json.dumps(plan.files)
    references = {e.name: e.value_from.secret_name_ref for e in server.spec.envs if e.value_from}
    assert references["RLSTEPS_SECRET_RM_TOKEN"] == f"rlsteps_{run.metadata.id_}_RLSTEPS_SECRET_RM_TOKEN"
    script = run.spec.container.command[-1]
    url = f"http://{name}-0.{name}-job-svc:5555"
    assert f"export RLSTEPS_RM_URL={url}\n" in script
    assert script.index("export RLSTEPS_RM_URL") < script.index("exec python -m rlsteps.engine.run.worker")
    assert f"as job {name}" in plan.summary


def test_the_run_waits_aloud_and_stops_when_the_server_never_answers(rs, tmp_path):  # noqa: F811
    job = server_job(rs, tmp_path)
    script = json.loads(lepton.LAUNCHER.plan(job, tmp_path / job.name).files[lepton.SPEC_FILE])["spec"]["container"]
    lines = script["command"][-1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("export RLSTEPS_RM_URL"))
    wait = (
        "\n".join(lines[start:-1]).replace("ready_timeout_s", "").replace("+ 1800", "+ 2").replace("sleep 5", "sleep 1")
    )
    ran = subprocess.run(["bash", "-c", "set -euo pipefail\n" + wait], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1
    said = ran.stdout.splitlines()
    assert said[0].startswith("rlsteps: waiting for the reward model server (rlsteps) (Lepton job ")
    assert said[0].endswith("s left)") and "/health" in said[0]
    server = lepton_server.server_job_name(lepton_job_name(job.name))
    assert said[-1].endswith(f"within 1800s: see the log of Lepton job {server}")


def test_both_jobs_are_created_and_both_go_when_the_run_ends_or_is_cancelled(rs, tmp_path, stub):  # noqa: F811
    for ending in ("ends", "cancel"):
        job = server_job(rs, tmp_path / ending)
        job_dir = tmp_path / ending / job.name
        job_dir.mkdir(parents=True)
        plan = lepton.LAUNCHER.plan(job, job_dir)
        write_job_files(job_dir, job, plan, inputs=[])
        submission = lepton.LAUNCHER.submit(job, plan, job_dir)
        server = lepton_server.server_job_name(submission.job_id)
        creates = [path for method, path in stub.calls if method == "POST" and path == "/jobs"]
        assert list(stub.jobs)[-2:] == [server, submission.job_id] and len(creates) >= 2  # the server's first
        assert stub.jobs[server]["spec"]["affinity"]["allowed_dedicated_node_groups"] == ["ng-0a1b2c"]
        record = lepton.LAUNCHER.record(job, submission)
        record.save()
        assert record.extra["server_job"] == server
        if ending == "ends":
            while not lepton.LAUNCHER.status(record).state.ended:
                assert ("DELETE", f"/jobs/{server}") not in stub.calls  # kept while the run goes on
        else:
            lepton.LAUNCHER.cancel(record)
            assert ("DELETE", f"/jobs/{submission.job_id}") in stub.calls
        assert ("DELETE", f"/jobs/{server}") in stub.calls
        assert stub.scripts[server] == ("Deleting",)
        assert json.loads((job_dir / "submission.json").read_text())["extra"]["server_deleted"] is True


def test_a_run_that_cannot_be_created_leaves_no_server_job(rs, tmp_path, stub):  # noqa: F811
    job = server_job(rs, tmp_path)
    job_dir = tmp_path / job.name
    job_dir.mkdir()
    plan = lepton.LAUNCHER.plan(job, job_dir)
    write_job_files(job_dir, job, plan, inputs=[])
    run_id = json.loads(plan.files[lepton.SPEC_FILE])["metadata"]["id"]
    stub.jobs[run_id] = {}  # the run's id is taken: its create answers 409
    stub.scripts[run_id] = ("Running",)
    with pytest.raises(lepton.RunFailed):
        lepton.LAUNCHER.submit(job, plan, job_dir)
    assert stub.scripts[lepton_server.server_job_name(run_id)] == ("Deleting",)
