"""The reward model or judge server on nodes of its own: a Slurm heterogeneous job (the server in group 0, the run in
group 1), its script as the dry run shows it, the refusals, and real jobs on the two-node cluster that
`.ci/slurm.sh up` starts."""

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from rlsteps.catalog import load_catalog
from rlsteps.errors import UsageError
from rlsteps.launch import slurm, slurm_hetjob
from rlsteps.launch.base import JobState
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
    submitted_record,
    wait_until,
)

SERVER_PROFILE = """\
  {name}:
    extends: ci
    server:
      serves: {serves}
      cpus_per_task: 1
      mem: 2G
      port: {port}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_profile(folder: Path, name: str = "two", serves: str = "rm", port: int = 5555) -> None:
    add_profile(folder, SERVER_PROFILE.format(name=name, serves=serves, port=port))


def test_the_script_is_one_heterogeneous_job_server_first(project):  # noqa: F811
    server_profile(project)
    plan = compiled("two", overrides=("rm.token=rm-value-456",)).plan
    script = plan.files[slurm.SCRIPT_FILE]
    head, _, run_group = script.partition("\n#SBATCH hetjob\n")
    assert "#SBATCH --job-name=" in head and "#SBATCH --output=" in head and "#SBATCH --mem=2G" in head
    assert "#SBATCH --time=00:15:00" in head  # each group has its own time limit
    assert "#SBATCH --mem=3G" in run_group and "#SBATCH --time=00:15:00" in run_group
    assert "#SBATCH --job-name" not in run_group and "--signal=USR1" not in head  # the server would die of USR1
    server = next(line for line in script.splitlines() if line.startswith("srun --het-group=0 "))
    assert "-m rlsteps.engine.rewards.rm --model " in server and "--host 0.0.0.0 --port 5555" in server
    assert "--token-env RLSTEPS_SECRET_RM_TOKEN" in server and "rm-value-456" not in script
    assert any(
        line.startswith("srun --het-group=1 ") and line.endswith("config.yaml &") for line in script.splitlines()
    )
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0"' in script
    assert 'export RLSTEPS_RM_URL="http://$server_host:5555"' in script
    assert "waiting for the reward model server (rlsteps) to answer http://$server_host:5555/health" in script
    assert plan.worker_config["rm"]["url"] == "${oc.env:RLSTEPS_RM_URL}"
    assert plan.worker_config["rm"]["token"] == "${oc.env:RLSTEPS_SECRET_RM_TOKEN}"


def test_a_judge_server_fills_judge_url_with_the_openai_base(project):  # noqa: F811
    server_profile(project, serves="judge", port=8000)
    request = compile_request(load_catalog(), RunRequest(step="rl/rlhf", config="tiny", batch_profile="two"))
    script = request.plan.files[slurm.SCRIPT_FILE]
    assert 'export RLSTEPS_JUDGE_URL="http://$server_host:8000/v1"' in script
    assert "-m rlsteps.engine.rewards.judge --model " in script and "--model-name tiny-judge" in script
    assert request.plan.worker_config["judge"]["url"] == "${oc.env:RLSTEPS_JUDGE_URL}"


@pytest.mark.parametrize(
    ("overrides", "settings", "message"),
    [
        (("rm.url=http://rm-node:5555",), "", "rm.url=http://rm-node:5555 names a server"),
        (("rm.api=vllm", "rm.url=${oc.env:RLSTEPS_RM_URL}"), "", "rm.api=vllm does not speak to a server of kind"),
        ((), "      serves: judge\n", "no rewards entry of rl/rs uses it"),
        ((), "      kind: triton\n", "kind triton needs command"),
    ],
)
def test_a_server_the_run_cannot_use_is_refused_in_one_line(project, overrides, settings, message):  # noqa: F811
    add_profile(project, "  bad:\n    extends: ci\n    server:\n" + (settings or "      nodes: 1\n"))
    escaped = tuple(o.replace("${", "\\${") for o in overrides)
    with pytest.raises(UsageError, match=message.replace("(", r"\(")) as refused:
        compiled("bad", overrides=escaped)
    assert "\n" not in refused.value.message and refused.value.fix


def test_the_worker_config_reads_the_url_from_the_environment(tiny_world, project, monkeypatch):  # noqa: F811
    """What the job dir holds is what the worker reads: its rm.url resolves from the variable the script exports."""
    server_profile(project)
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "two", "--dry-run", cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH hetjob" in done.stdout and "reads rm.url from RLSTEPS_RM_URL" in done.stdout
    from rlsteps.contract.worker_args import load_config
    from rlsteps.plan.job_dir import write_job_files

    request = compiled("two")
    request.job_dir.mkdir(parents=True)
    write_job_files(request.job_dir, request.job, request.plan, [])
    monkeypatch.setenv("RLSTEPS_RM_URL", "http://10.1.2.3:5555")
    assert load_config(request.job_dir / "config.yaml").rm.url == "http://10.1.2.3:5555"
    assert yaml.safe_load((request.job_dir / "config.yaml").read_text())["rm"]["url"] == "${oc.env:RLSTEPS_RM_URL}"


# ----- the real cluster --------------------------------------------------------------------------------------------


def processes(*words: str) -> list[int]:
    """The pids whose command line holds every word, but the srun that started them."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if all(word in argv for word in words) and not argv[0].endswith("srun"):
                found.append(int(entry.name))
    return found


def component_nodes(job_id: str) -> list[str]:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
    return [line.split("=", 1)[1] for line in shown.split() if line.startswith("NodeList=")]


def log_of(record) -> str:
    return "\n".join(jobs.job_logs(record))


@needs_cluster
def test_the_run_scores_through_a_server_on_the_other_node(tiny_world, project):  # noqa: F811
    port = free_port()
    server_profile(project, port=port)
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "two", "train.max_steps=2", cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    record = submitted_record(project)
    wait_until(record, ended(record), timeout=300)
    log = log_of(record)
    assert jobs.job_status(record).state is JobState.SUCCEEDED, log
    assert sorted(component_nodes(record.job_id)) == ["node1", "node2"]  # the server's group, the run's group
    assert f"the reward model server (rlsteps) answers at http://127.0.0.1:{port}" in log
    assert f"INFO reward model at http://127.0.0.1:{port}:" in log  # the worker used it, and started no server
    assert "started rlsteps.engine.rewards.rm" not in log and "step 2/2" in log
    said = log.split("the reward model server (rlsteps) said: ")[1].splitlines()[0]
    assert '"requests":' in said and '"requests":0,' not in said, said  # the run's requests reached the server
    server_log = Path(record.job_dir) / f"server-{record.job_id}-0.log"
    assert f"serving on http://0.0.0.0:{port}" in server_log.read_text()
    assert not processes("--port", str(port))  # the server ended with the job


@needs_cluster
def test_a_server_that_dies_ends_the_run_and_a_cancel_leaves_nothing(tiny_world, project):  # noqa: F811
    port = free_port()
    server_profile(project, port=port)
    submit = ("run", "rs", *TINY_RUN, "-b", "two", "train.max_steps=400", "checkpoint.interval=0")
    assert rlsteps(*submit, cwd=project, timeout=120).returncode == 0
    record = submitted_record(project)
    wait_until(record, lambda: "step 1/400" in log_of(record), timeout=300)
    [server] = processes("rlsteps.engine.rewards.rm", "--port", str(port))
    os.kill(server, signal.SIGKILL)
    wait_until(record, ended(record), timeout=120)
    server_log = Path(record.job_dir) / f"server-{record.job_id}-0.log"
    [line] = [line for line in log_of(record).splitlines() if "while the run was going" in line]
    assert line.startswith("rlsteps: the reward model server (rlsteps) ended (exit ")
    assert line.endswith(f") while the run was going: see {server_log}")
    assert jobs.job_status(record).state is JobState.FAILED
    assert not processes(str(Path(record.job_dir) / "config.yaml"))  # the run stopped with it
    (project / ".rlsteps" / "jobs" / Path(record.job_dir).name / "submission.json").unlink()  # the next record alone

    assert rlsteps(*submit, cwd=project, timeout=120).returncode == 0
    record = submitted_record(project)
    wait_until(record, lambda: "step 1/400" in log_of(record), timeout=300)
    started = time.monotonic()
    assert "cancelled" in jobs_cli("cancel", record.job_id)
    assert jobs.job_status(record).state is JobState.CANCELLED
    assert not processes("rlsteps.engine.rewards.rm", "--port", str(port)), "the server outlived the cancel"
    assert not processes(str(Path(record.job_dir) / "config.yaml")), "the run outlived the cancel"
    assert time.monotonic() - started < 90
    assert slurm_hetjob.SERVER_LOG.format(attempt=f"{record.job_id}-0") in os.listdir(record.job_dir)


@needs_cluster
def test_a_requeue_restarts_the_server_and_the_run_resumes_from_its_checkpoint(tiny_world, project):  # noqa: F811
    """USR1 to the run's group (what `--signal` sends before the time limit): the run checkpoints and exits 75, the
    script requeues the job, and the requeued job starts the server again (a log of its own try) and resumes."""
    port = free_port()
    add_profile(project, SERVER_PROFILE.format(name="two", serves="rm", port=port) + "    requeue: true\n")
    submit = ("run", "rs", *TINY_RUN, "-b", "two", "train.max_steps=400", "checkpoint.interval=0")
    assert rlsteps(*submit, cwd=project, timeout=120).returncode == 0
    record = submitted_record(project)
    try:
        wait_until(record, lambda: "step 2/400" in log_of(record), timeout=300)
        subprocess.run(["scancel", "--signal=USR1", f"{record.job_id}+1"], check=True)  # the run's group only
        wait_until(record, lambda: "requeueing job" in log_of(record), timeout=120)
        wait_until(record, lambda: _pending(record.job_id), timeout=60)
        subprocess.run(["scontrol", "update", f"JobId={record.job_id}", "StartTime=now"], check=True)  # no 2 min hold
        second_server_log = Path(record.job_dir) / slurm_hetjob.SERVER_LOG.format(attempt=f"{record.job_id}-1")
        wait_until(record, second_server_log.exists, timeout=180)
        resumed = re.compile(r"resuming from \S*/checkpoints/step_(\d+) \(step \1,")
        wait_until(record, lambda: resumed.search(log_of(record).rpartition("requeueing job")[2]), timeout=300)
        after = log_of(record).rpartition("requeueing job")[2]
        assert f"the reward model server (rlsteps) answers at http://127.0.0.1:{port}" in after, after
        assert "step 1/400" not in after, after  # from its checkpoint, not from the start
        assert f"serving on http://0.0.0.0:{port}" in second_server_log.read_text()
    finally:
        jobs_cli("cancel", record.job_id)
    assert not processes("rlsteps.engine.rewards.rm", "--port", str(port)), "the server outlived the cancel"


def _pending(job_id: str) -> bool:
    shown = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return "PENDING" in shown.stdout
