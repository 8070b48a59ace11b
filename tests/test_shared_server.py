"""A reward model or judge server several runs share: `rlsteps serve rm|judge ... -b PROFILE` as a Slurm batch job of
its own, its script as the dry run shows it, `rm.url=job:ID` resolved at compile time (and refused in one line when it
cannot be), and real jobs on the two-node cluster that `.ci/slurm.sh up` starts."""

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from cli_helpers import invoke
from rlsteps.catalog import load_catalog
from rlsteps.errors import UsageError
from rlsteps.launch import shared_server
from rlsteps.launch.base import JobRecord, JobState
from rlsteps.launch.local import CANCELLED_FILE
from rlsteps.plan import submitted_jobs as jobs
from rlsteps.plan.runner import RunRequest, compile_request
from run_helpers import rlsteps
from test_launch_slurm import (
    TINY_RUN,
    add_profile,
    compiled,
    ended,
    jobs_cli,
    needs_cluster,
    project,  # noqa: F401 - a fixture
    wait_until,
)
from test_server_allocation import component_nodes, free_port, log_of, processes


@pytest.fixture
def reward_model(tmp_path) -> Path:
    """A folder the server's command takes for a reward model (its config.json is all it reads before it loads)."""
    folder = tmp_path / "rm"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForSequenceClassification"]}')
    return folder


def script_lines(stdout: str) -> list[str]:
    """The sbatch script the dry run printed verbatim."""
    return stdout.split("----- sbatch.sh (written into the job dir) -----\n")[1].splitlines()


# ----- the batch job's script ---------------------------------------------------------------------------------------


def test_the_dry_run_prints_the_servers_own_batch_job_and_writes_nothing(project, reward_model):  # noqa: F811
    done = invoke("serve", "rm", "--model", str(reward_model), "--port", "6123", "--threads", "1", "-b", "ci", "-d")
    assert done.exit_code == 0, done.output
    lines = script_lines(done.stdout)
    assert lines[0] == "#!/bin/bash" and "#SBATCH hetjob" not in lines
    for directive in ("--job-name=", "--time=00:15:00", "--nodes=1", "--cpus-per-task=1", "--mem=3G", "--output="):
        assert any(line.startswith(f"#SBATCH {directive}") for line in lines), directive
    assert not any("--signal" in line or "--requeue" in line for line in lines)  # a server has nothing to resume
    [srun] = [line for line in lines if line.startswith("srun ")]
    assert srun.startswith("srun --nodes=1 --ntasks-per-node=1 ") and srun.endswith(" &")
    server = f"-m rlsteps.engine.rewards.rm --model {reward_model} --host 0.0.0.0 --port 6123 --threads 1 &"
    assert srun.endswith(server) and "--het-group" not in srun
    assert 'export RLSTEPS_RM_URL="http://$server_host:6123"' in lines
    assert 'server_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    assert any("waiting for the reward model server (rlsteps) to answer" in line for line in lines)
    assert any(line.startswith("printf ") and line.endswith('> "$server_file.tmp"') for line in lines)
    assert 'wait "$server_pid"; code=$?' in lines
    assert "sbatch --parsable" in done.stdout and "not created: dry run" in done.stdout
    assert not (project / ".rlsteps").exists()  # nothing written, nothing sent


def test_a_judge_takes_its_own_port_and_a_profiles_server_its_resources(project, reward_model, monkeypatch):  # noqa: F811
    add_profile(project, "  gpu_server:\n    extends: ci\n    exclusive: true\n    server:\n      gpus_per_node: 2\n")
    monkeypatch.setenv("MY_JUDGE_KEY", "judge-secret-789")
    argv = ("serve", "judge", "--model", str(reward_model), "--token-env", "MY_JUDGE_KEY", "-b", "gpu_server", "-d")
    done = invoke(*argv)
    assert done.exit_code == 0, done.output
    lines = script_lines(done.stdout)
    assert 'export RLSTEPS_JUDGE_URL="http://$server_host:8000/v1"' in lines  # the command's own default port
    assert "#SBATCH --gpus-per-node=2" in lines and "#SBATCH --exclusive" in lines
    [srun] = [line for line in lines if line.startswith("srun ")]
    assert "-m rlsteps.engine.rewards.judge " in srun and srun.endswith("--token-env RLSTEPS_SECRET_JUDGE_API_KEY &")
    assert "judge-secret-789" not in done.stdout  # the token travels in sbatch's environment
    assert any(
        line.startswith("# Secrets are not in this file") and "RLSTEPS_SECRET_JUDGE_API_KEY" in line for line in lines
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("-b", "local"), "a shared server is a Slurm batch job"),
        (("-b", "ci", "--host", "127.0.0.1"), "--host is not for -b"),
        (("--dry-run",), "--dry-run and --force-squash are for a batch job"),
        (
            ("-b", "ci", "--token-env", "RLSTEPS_TEST_UNSET_TOKEN"),
            "RLSTEPS_TEST_UNSET_TOKEN: that environment variable",
        ),
        (("-b", "vllm_server"), "`rlsteps serve` runs kind rlsteps"),
    ],
)
def test_a_batch_server_it_cannot_run_is_refused_in_one_line(project, reward_model, argv, message):  # noqa: F811
    add_profile(project, "  vllm_server:\n    extends: ci\n    server:\n      kind: vllm\n")
    done = invoke("serve", "rm", "--model", str(reward_model), *argv)
    assert done.exit_code == 2 and message in done.stderr, done.output
    assert "\n" not in done.stderr.split("\nfix: ")[0] and not (project / ".rlsteps").exists()


# ----- rm.url=job:ID ------------------------------------------------------------------------------------------------


def recorded(project: Path, name: str, step: str, extra: dict) -> JobRecord:  # noqa: F811
    """A local job's record under the project's job dirs: the resolution reads any launcher's state the same way."""
    job_dir = project / ".rlsteps" / "jobs" / name
    job_dir.mkdir(parents=True)
    record = JobRecord("local", name, str(job_dir), step, "2026-11-29T10:00:00+00:00", {"pid": os.getpid(), **extra})
    record.save()
    return record


def server_job(project: Path, name: str = "20261129-100000-abcdef-serve-rm", serves: str = "rm") -> JobRecord:  # noqa: F811
    job_dir = project / ".rlsteps" / "jobs" / name
    extra = {"serves": serves, "server_file": str(job_dir / shared_server.SERVER_FILE)}
    return recorded(project, name, shared_server.step_of(serves), extra)


def answering(record: JobRecord, url: str) -> None:
    address = {
        "url": url,
        "address": url,
        "node": "node1",
        "serves": record.extra["serves"],
        "slurm_job_id": record.job_id,
    }
    Path(record.extra["server_file"]).write_text(json.dumps(address))


def test_rm_url_job_id_is_the_address_its_server_wrote_and_the_dry_run_says_so(project):  # noqa: F811
    record = server_job(project)
    answering(record, "http://10.0.0.7:5555")
    request = compiled("ci", overrides=(f"rm.url=job:{record.job_id}",))
    assert request.job.config["rm"]["url"] == "http://10.0.0.7:5555"
    assert request.plan.worker_config is None and "http://10.0.0.7:5555" in str(request.job.worker_config())
    assert any(note.startswith(f"rm.url=job:{record.job_id}: the reward model server") for note in request.job.notes)
    judge = server_job(project, "20261129-100001-abcdef-serve-judge", serves="judge")
    answering(judge, "http://10.0.0.8:8000/v1")
    rlhf = compile_request(load_catalog(), RunRequest("rl/rlhf", "tiny", overrides=("judge.url=job:20261129-100001",)))
    assert rlhf.job.config["judge"]["url"] == "http://10.0.0.8:8000/v1"  # a unique prefix of its name will do


@pytest.mark.parametrize(
    ("case", "message", "fix"),
    [
        ("unknown", "rm.url=job:4242: no job '4242' is recorded here", "rlsteps serve rm --model PATH -b PROFILE"),
        ("a run", "is a run of rl/rs, not a server", "name a server's job"),
        ("a judge", "serves a judge, not a reward model", "pass it as judge.url=job:"),
        ("cancelled", "is cancelled (cancelled with rlsteps jobs cancel)", "start another: rlsteps serve rm"),
        ("not answering", "is not answering yet", "wait until `rlsteps jobs status"),
    ],
)
def test_a_server_a_run_cannot_use_is_refused_in_one_line_with_the_fix(project, case, message, fix):  # noqa: F811
    ref = "4242"
    if case == "a run":
        ref = recorded(project, "20261129-100000-abcdef-rl_rs", "rl/rs", {}).job_id
    elif case == "a judge":
        ref = server_job(project, serves="judge").job_id
    elif case in ("cancelled", "not answering"):
        record = server_job(project)
        ref = record.job_id
        if case == "cancelled":
            answering(record, "http://10.0.0.7:5555")  # an address left behind counts for nothing
            (Path(record.job_dir) / CANCELLED_FILE).write_text("now\n")
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        compiled("ci", overrides=(f"rm.url=job:{ref}",))
    assert "\n" not in refused.value.message and fix in refused.value.fix


# ----- the real cluster ---------------------------------------------------------------------------------------------


def health(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
        return json.loads(answer.read())


def answers(record: JobRecord):
    return lambda: shared_server.served(record) is not None or jobs.job_status(record).state.ended


def run_on(project: Path, server_id: str, output: str) -> JobRecord:  # noqa: F811
    submit = (
        "run",
        "rs",
        *TINY_RUN,
        "-b",
        "ci",
        f"rm.url=job:{server_id}",
        "train.max_steps=2",
        f"output.dir={output}",
    )
    done = rlsteps(*submit, cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted job ")[1].split()[0]
    return jobs.find_job(job_id)


@needs_cluster
def test_runs_share_a_server_job_on_the_other_node_and_a_cancel_ends_it(tiny_world, project):  # noqa: F811
    started = time.monotonic()
    port = free_port()
    add_profile(
        project, "  ci_server:\n    extends: ci\n    exclusive: true\n"
    )  # its node to itself: runs go elsewhere
    serve = ("serve", "rm", "--model", str(tiny_world.reward_model), "--port", str(port), "--threads", "1")
    done = rlsteps(*serve, "-b", "ci_server", cwd=project, timeout=60)
    assert done.returncode == 0, done.stderr
    server = jobs.find_job(done.stdout.split("submitted job ")[1].split()[0])
    assert server.step == "serve/rm"
    wait_until(server, answers(server), timeout=90)
    url = f"http://127.0.0.1:{port}"
    assert shared_server.served(server)["url"] == url, log_of(server)
    listed = jobs_cli("list", "--step", "serve/*")
    assert f"serving at {url} on node1: rm.url=job:{server.job_id}" in " ".join(listed.split())
    assert health(url)["requests"] == 0

    first = run_on(project, server.job_id, ".rlsteps/runs/first")
    wait_until(first, ended(first), timeout=120)
    assert jobs.job_status(first).state is JobState.SUCCEEDED, log_of(first)
    after_first = health(url)["requests"]
    second = run_on(project, server.job_id, ".rlsteps/runs/second")
    wait_until(second, ended(second), timeout=120)
    assert jobs.job_status(second).state is JobState.SUCCEEDED, log_of(second)

    assert component_nodes(server.job_id) == ["node1"]
    for run in (first, second):
        assert component_nodes(run.job_id) == ["node2"]  # the server's node is its own
        log = log_of(run)
        assert f"INFO reward model at {url}:" in log and "started rlsteps.engine.rewards.rm" not in log
    assert after_first > 0 and health(url)["requests"] == 2 * after_first  # both runs scored through it

    assert "cancelled" in jobs_cli("cancel", server.job_id)
    assert jobs.job_status(server).state is JobState.CANCELLED
    assert not processes("rlsteps.engine.rewards.rm", "--port", str(port)), "the server outlived the cancel"
    assert shared_server.served(server) is None  # its address is gone with it
    refused = rlsteps("run", "rs", *TINY_RUN, "-b", "ci", f"rm.url=job:{server.job_id}", "--dry-run", cwd=project)
    assert refused.returncode == 2 and f"the reward model server's job {server.job_id} is cancelled" in refused.stderr
    assert time.monotonic() - started < 180
