"""The Slurm launcher: the sbatch script it writes, quoting, secrets, states; then real jobs on a real cluster.

The cluster tests need Slurm on this machine (CI: `bash .ci/slurm.sh up`) and are skipped without it.
"""

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_helpers import invoke
from rlsteps.catalog import load_catalog
from rlsteps.cli.jobs import jobs_app
from rlsteps.errors import UsageError
from rlsteps.launch import code, containers, slurm, slurm_script
from rlsteps.launch.base import JobRecord, JobState
from rlsteps.plan import submitted_jobs as jobs
from rlsteps.plan.runner import RunRequest, compile_request
from run_helpers import FAST, artifact_metadata, rlsteps, run_dir

STEPS = Path(__file__).resolve().parents[1] / "steps"
TINY_RUN = ["-c", "tiny", "validation.interval=0", *FAST]


def _cluster_problem() -> str | None:
    """None where a node answers: idle, in use, or planned for a job that waits (the state between two jobs)."""
    if shutil.which("sinfo") is None:
        return "sinfo is not on PATH"
    try:
        shown = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"sinfo failed: {error}"
    if shown.returncode != 0 or not {"idle", "mixed", "allocated", "planned", "completing"} & set(shown.stdout.split()):
        return f"no node is up ({(shown.stderr or shown.stdout).strip() or 'no answer'})"
    return None


CLUSTER_PROBLEM = _cluster_problem()
# The conftest fixture `slurm_cluster` skips these tests without a cluster, or fails them with the reason where
# RLSTEPS_REQUIRE_SLURM=1 (CI); it also puts them in one group, one after another on one worker.
needs_cluster = pytest.mark.usefixtures("slurm_cluster")

PROFILES = """\
profiles:
  ci:
    executor: slurm
    cpus_per_task: 1
    mem: 3G
    time: "00:15:00"
  ci_shared:
    extends: ci
    job_dir: {shared}
  big:
    executor: slurm
    account: proj
    partition: batch
    run_partition: interactive
    batch_partition: long
    nodes: 2
    gpus_per_node: 4
    mem: 0
    time: "04:00:00"
    exclusive: true
    env_vars: {{HF_HOME: /lustre/hf, WANDB_API_KEY: wandb-value-123}}
    setup_lines: [module load cuda]
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text(PROFILES.format(shared=tmp_path / "shared" / "jobs"))
    return tmp_path


def add_profile(project: Path, text: str) -> None:
    with (project / "rlsteps.yaml").open("a") as profiles:
        profiles.write(text)


SPLITS = ("train.micro_batch_size=1",)  # tiny's 16 rows per optimizer step split over up to 16 processes


def compiled(
    profile: str, attached: bool = False, overrides: tuple[str, ...] = (), config: str = "tiny", split: bool = True
):
    request = RunRequest(
        step="rs",
        config=config,
        overrides=(*SPLITS, *overrides) if split else overrides,
        **({"run_profile": profile} if attached else {"batch_profile": profile}),
    )
    return compile_request(load_catalog(), request)


def script_of(profile: str, **kwargs) -> str:
    return compiled(profile, **kwargs).plan.files[slurm.SCRIPT_FILE]


def test_the_script_takes_resources_from_the_profile_and_the_partition_from_the_mode(project):
    big = compiled("big")  # once: a second compile may fall in the next second and name another job dir
    batch, job_dir = big.plan, big.job_dir
    script = batch.files[slurm.SCRIPT_FILE]
    for line in (
        "#SBATCH --account=proj",
        "#SBATCH --partition=long",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --mem=0",
        "#SBATCH --time=04:00:00",
        "#SBATCH --exclusive",
        f"#SBATCH --chdir={project}",
        "#SBATCH --export=ALL",
        "#SBATCH --open-mode=append",
        "export HF_HOME=/lustre/hf",
        "module load cuda",
    ):
        assert f"\n{line}\n" in script, line
    assert f"#SBATCH --output={job_dir.parent}/" in script and "/slurm-%j.log\n" in script
    assert batch.command == ["sbatch", "--parsable", str(job_dir.parent / job_dir.name / slurm.SCRIPT_FILE)]
    assert "#SBATCH --partition=interactive" in script_of("big", attached=True)
    assert "#SBATCH --partition" not in script_of("ci")  # the cluster's default partition


def srun_words(script: str) -> list[str]:
    """The words of the script's srun line, as the batch shell splits them ("$VAR" left unexpanded)."""
    [line] = [line for line in script.splitlines() if line.startswith("srun ")]
    return shlex.split(line)


def test_one_process_runs_the_worker_and_many_run_one_torchrun_per_node(project):
    ci = compiled("ci")  # once: a second compile may fall in the next second and name another job dir
    script, job_dir = ci.plan.files[slurm.SCRIPT_FILE], ci.job_dir
    single = srun_words(script)
    assert single[:5] == ["srun", "--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--wait=60"]
    assert single[-3:] == ["-m", "rlsteps.engine.run.worker", str(job_dir / "config.yaml")]
    assert "torch.distributed.run" not in single and "head_node" not in script and "checkpointed" not in script
    big = compiled("big", overrides=("train.micro_batch_size=2",))
    script, job_dir = big.plan.files[slurm.SCRIPT_FILE], big.job_dir
    assert '\nhead_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n' in script
    multi = srun_words(script)
    assert multi[:5] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--wait=60"]
    torchrun = multi[multi.index("torch.distributed.run") + 1 :]
    assert torchrun == [
        "--nnodes=$SLURM_NNODES",
        "--rdzv-backend=c10d",
        "--rdzv-id=$SLURM_JOB_ID",
        "--rdzv-endpoint=$head_node:29500",
        "--nproc-per-node=4",
        "--no-python",
        "/bin/sh",
        "-c",
        slurm_script.RANK_WRAPPER,
        str(job_dir / slurm_script.CHECKPOINTED_FILE),
        *multi[-4:],
    ]
    assert multi[-4:] == [sys.executable, "-m", "rlsteps.engine.run.worker", str(job_dir / "config.yaml")]
    assert "2 node(s) x 4 GPU(s), 4 process(es) per node" in big.plan.summary


@pytest.mark.parametrize(
    ("settings", "rendezvous", "nproc"),
    [
        ("nprocs_per_node: 2", ["--standalone"], 2),  # a CPU node: processes without GPUs
        ("gpus_per_node: 8", ["--standalone"], 8),  # one process per GPU by default
        ("{gpus_per_node: 8, nprocs_per_node: 1}", None, None),  # one process that sees 8 GPUs
        ("{nodes: 2, gpus_per_node: 8, nprocs_per_node: 4}", ["--nnodes=$SLURM_NNODES"], 4),
    ],
)
def test_nprocs_per_node_sets_the_processes_torchrun_starts_on_each_node(project, settings, rendezvous, nproc):
    body = settings if settings.startswith("{") else "{" + settings + "}"
    add_profile(project, f"  procs: {{executor: slurm, code: installed, {body[1:-1]}}}\n")
    words = srun_words(script_of("procs"))
    if nproc is None:
        assert "torch.distributed.run" not in words
        return
    torchrun = words[words.index("torch.distributed.run") + 1 :]
    assert torchrun[: len(rendezvous)] == rendezvous and f"--nproc-per-node={nproc}" in torchrun


def test_torchrun_starts_with_usr1_ignored_and_each_worker_under_the_rank_wrapper(project):
    """USR1 goes to every process of the step: torchrun must not die of it before its workers checkpoint."""
    add_profile(project, "  procs:\n    extends: ci\n    nprocs_per_node: 2\n")
    job = compiled("procs", overrides=("train.micro_batch_size=8",))
    words = srun_words(job.plan.files[slurm.SCRIPT_FILE])
    task = words[words.index("--wait=60") + 1 :]
    assert task[:4] == ["/bin/sh", "-c", 'trap "" USR1; exec "$@"', "rlsteps-task"]
    assert task[4:8] == ["/bin/sh", "-c", code.ON_PATH, str(job.job_dir / code.wheel_name())]  # the job's wheel
    assert task[9:11] == ["-m", "torch.distributed.run"]


def test_a_config_its_processes_cannot_split_is_refused_at_compile_and_writes_nothing(tiny_world, project, monkeypatch):
    with pytest.raises(UsageError) as err:
        compiled("big", split=False)  # tiny: 16 rows, micro batches of 16, on 8 processes
    assert "(profile big: 2 node(s) x 4 process(es)): train.global_batch_size=16" in err.value.message
    assert slurm.LAUNCHER.processes(compiled("big", overrides=("train.micro_batch_size=2",)).job) == (2, 4)
    result = invoke("run", "rs", "-c", "tiny", "-b", "big")
    assert result.exit_code == 2 and "train.global_batch_size=16 is not a multiple" in result.output
    assert not (project / ".rlsteps").exists()


def test_secrets_are_named_in_the_script_but_their_values_are_nowhere_in_the_plan(project):
    plan = compiled("big", overrides=("rm.token=rm-value-456",)).plan
    script = plan.files[slurm.SCRIPT_FILE]
    assert "RLSTEPS_SECRET_RM_TOKEN WANDB_API_KEY" in script
    for value in ("rm-value-456", "wandb-value-123"):
        assert all(value not in text for text in (*plan.files.values(), plan.summary, plan.shell()))


def test_a_bad_profile_is_a_usage_error_that_names_the_fix(project):
    add_profile(
        project,
        "  typo: {executor: slurm, gpus_per_nod: 8}\n"
        "  tasks: {executor: slurm, ntasks_per_node: 8}\n"
        '  newline: {executor: slurm, partition: "a\\nrm -rf /"}\n',
    )
    with pytest.raises(UsageError, match="gpus_per_nod") as typo:
        compiled("typo")
    assert "gpus_per_node" in typo.value.fix
    with pytest.raises(UsageError, match="ntasks_per_node: must be 1"):
        compiled("tasks")
    with pytest.raises(UsageError, match="--partition has a control character"):
        compiled("newline")


HOSTILE = '\'; touch {pwned}; echo "$(touch {pwned})" `touch {pwned}` #'


def test_hostile_names_and_values_stay_single_words(project, tmp_path_factory):
    """Profile name, config file name, env var value and mount: running the script creates no file, and every
    value stays intact."""
    pwned = tmp_path_factory.mktemp("target") / "pwned"
    hostile = HOSTILE.format(pwned=pwned)
    mount = f"/a:/a{hostile}"
    config = project / f"evil{hostile.replace('/', '_')}.yaml"
    config.write_text(f"defaults: {STEPS / 'rl' / 'rs' / 'tiny.yaml'}\n")
    add_profile(
        project,
        f"  {json_quote('my prof ' + hostile)}:\n    executor: slurm\n"
        f"    container_image: {project}/image.sqsh\n"
        f"    container_mounts: [{json_quote(mount)}]\n"
        f"    env_vars: {{HOSTILE: {json_quote(hostile)}}}\n",
    )
    result = compiled("my prof " + hostile, config=str(config))
    script = project / "sbatch.sh"
    script.write_text(result.plan.files[slurm.SCRIPT_FILE])
    stand_ins = project / "bin"
    stand_ins.mkdir()
    (stand_ins / "srun").write_text(
        '#!/bin/bash\nprintf "%s\\0" "$@" > "$SRUN_ARGS"\nprintf "%s" "$HOSTILE" > "$SRUN_ENV"\n'
    )
    (stand_ins / "srun").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{stand_ins}:{os.environ['PATH']}",
        "SRUN_ARGS": str(project / "args"),
        "SRUN_ENV": str(project / "env"),
    }
    ran = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert not pwned.exists()
    args = (project / "args").read_text().split("\0")[:-1]
    assert f"--container-mounts={mount}" in args
    assert args[-1] == str(result.job_dir / "config.yaml")
    assert (project / "env").read_text() == hostile


def json_quote(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML string


SCONTROL_FAILED = (
    "JobId=7 JobName=x UserId=root(0) GroupId=root(0) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 ExitCode=3:0 RunTime=00:00:01 Command=/tmp/a b/s.sh WorkDir=/tmp/a b"
)


def test_states_come_from_scontrol_then_sacct_then_unknown(monkeypatch):
    answers = {}
    monkeypatch.setattr(
        slurm,
        "_slurm_command",
        lambda argv: subprocess.CompletedProcess(argv, *answers.get(argv[0], (1, "", "Invalid job id"))),
    )
    monkeypatch.setattr(slurm.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    record = JobRecord(
        launcher="slurm", job_id="7", job_dir="/tmp/x", step="rl/rs", submitted="", extra={"job_name": "x"}
    )
    answers["scontrol"] = (0, SCONTROL_FAILED, "")
    status = slurm.LAUNCHER.status(record)
    assert (
        status.state is JobState.FAILED and status.detail == "Slurm job 7 FAILED, exit code 3, reason NonZeroExitCode"
    )
    answers.pop("scontrol")
    answers["sacct"] = (0, "x|CANCELLED by 0|0:15\n", "")
    status = slurm.LAUNCHER.status(record)
    assert status.state is JobState.CANCELLED and status.detail.endswith("(from sacct)")
    answers["sacct"] = (0, "someone-else|RUNNING|0:0\n", "")  # the cluster's ids were reset: never report or cancel it
    assert "is now another job (someone-else)" in slurm.LAUNCHER.status(record).detail
    with pytest.raises(UsageError, match="is not the job recorded"):
        slurm.LAUNCHER.cancel(record)
    answers["sacct"] = (1, "", "Slurm accounting storage is disabled")
    status = slurm.LAUNCHER.status(record)
    assert status.state is JobState.UNKNOWN and "MinJobAge" in status.detail


# ----- a real cluster ---------------------------------------------------------------------------------------------


def jobs_cli(*argv: str):
    result = CliRunner().invoke(jobs_app, list(argv), env={"COLUMNS": "200"})
    assert result.exception is None, result.output
    return result.output


def submitted_record(cwd: Path) -> JobRecord:
    [record] = [r for r in jobs.find_records([cwd / ".rlsteps" / "jobs"]) if r.launcher == "slurm"]
    return record


def wait_until(record: JobRecord, done, timeout: float = 600, poll_s: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"Slurm job {record.job_id}: {jobs.job_status(record)} after {timeout}s"
        time.sleep(poll_s)


def ended(record: JobRecord):
    return lambda: jobs.job_status(record).state.ended


@needs_cluster
def test_secrets_reach_the_job_through_the_environment_only(tiny_world, project):
    """Also: sbatch reads the quoted #SBATCH paths of a directory whose name has a space and a quote."""
    cwd = project / "it's a dir"
    cwd.mkdir()
    shutil.copy(project / "rlsteps.yaml", cwd)
    add_profile(
        cwd,
        "  check:\n    extends: ci\n    setup_lines:\n"  # prints a digest: the value is in no file
        '      - \'echo "secret digest $(printf %s "$RLSTEPS_SECRET_RM_TOKEN" | sha256sum | cut -c1-16)"\'\n',
    )
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "check", "rm.token=rm-value-456", "--", "--help", cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    record = submitted_record(cwd)
    assert f"submitted job {record.job_id} " in done.stdout
    wait_until(record, ended(record), timeout=120)
    assert jobs.job_status(record).state is JobState.SUCCEEDED
    log = "\n".join(jobs.job_logs(record))
    assert f"secret digest {hashlib.sha256(b'rm-value-456').hexdigest()[:16]}" in log
    assert "usage: python -m rlsteps.engine.run.worker" in log
    for path in project.rglob("*"):
        if path.is_file():
            assert b"rm-value-456" not in path.read_bytes(), path


@needs_cluster
def test_squash_runs_enroot_on_a_compute_node_once_and_force_rebuilds(project):
    add_profile(
        project,
        f"  gpu:\n    extends: ci\n    container_image: nvcr.io/nvidia/pytorch:25.10-py3\n"
        f"    squash_dir: {project}/squash\n",
    )
    stand_ins = project / "bin"
    stand_ins.mkdir()
    (stand_ins / "enroot").write_text(
        '#!/bin/bash\necho "$*" >> "$ENROOT_CALLS"\n'
        'while [ $# -gt 0 ]; do [ "$1" = --output ] && echo squashed > "$2"; shift; done\n'
    )
    (stand_ins / "enroot").chmod(0o755)
    env = {**os.environ, "PATH": f"{stand_ins}:{os.environ['PATH']}", "ENROOT_CALLS": str(project / "calls")}
    sqsh = project / "squash" / "nvcr_io_nvidia_pytorch_25_10_py3.sqsh"

    def squash(force: bool = False) -> None:
        plan = compile_request(
            load_catalog(), RunRequest(step="rs", config="tiny", batch_profile="gpu", force_squash=force)
        ).plan
        if containers.SQUASH_SCRIPT in plan.files:
            (project / "squash.sh").write_text(plan.files[containers.SQUASH_SCRIPT])
            ran = subprocess.run(
                ["bash", str(project / "squash.sh")], env=env, capture_output=True, text=True, timeout=120
            )
            assert ran.returncode == 0, ran.stderr

    squash()
    squash()
    assert sqsh.read_text() == "squashed\n"
    calls = (project / "calls").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("import --output ")
    assert calls[0].endswith(".partial docker://nvcr.io#nvidia/pytorch:25.10-py3")
    squash(force=True)
    assert len((project / "calls").read_text().splitlines()) == 2
    assert sorted(p.name for p in sqsh.parent.iterdir()) == [sqsh.name]  # no partial file left


@needs_cluster
@pytest.mark.slow
def test_a_batch_job_trains_on_slurm_and_jobs_reports_it(tiny_world, project, monkeypatch):
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "ci_shared", "train.max_steps=2", cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    shared = project / "shared" / "jobs"
    [record] = jobs.find_records([shared])
    assert f"submitted job {record.job_id} ({shared / Path(record.job_dir).name})" in done.stdout
    assert submitted_record(project) == record  # recorded in the local job dir too
    wait_until(record, ended(record))
    assert "succeeded" in jobs_cli("status", record.job_id)
    assert artifact_metadata(run_dir(project, "rl_rs"))["counters"]["step"] == 2
    assert "output artifact (checkpoint_megatron)" in jobs_cli("logs", Path(record.job_dir).name)
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("RLSTEPS_PROFILES", str(project / "rlsteps.yaml"))
    assert jobs.find_job(record.job_id) == record  # found through the profile's job_dir


@needs_cluster
def test_cancel_waits_for_the_clusters_kill_wait():
    # scancel sends SIGTERM and SIGKILL only KillWait later: a cancel that waited less reported a job still COMPLETING
    assert slurm.kill_wait_s() == 30  # read from the cluster (None if scontrol's line were not found): its default


@needs_cluster
@pytest.mark.slow
def test_a_cancelled_job_is_cancelled_and_keeps_its_log(tiny_world, project):
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "ci", "train.max_steps=200", cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    record = submitted_record(project)
    wait_until(record, lambda: "run directory" in "\n".join(jobs.job_logs(record)), timeout=300)
    assert "cancelled" in jobs_cli("cancel", record.job_id)
    status = jobs.job_status(record)
    assert status.state is JobState.CANCELLED and "CANCELLED" in status.detail
    assert "run directory" in jobs_cli("logs", record.job_id)
    assert "already ended: cancelled" in jobs_cli("cancel", record.job_id)


@needs_cluster
@pytest.mark.slow
def test_an_attached_job_that_fails_its_input_check_streams_its_log_and_exits_3(tiny_world, project):
    long = project / "long.jsonl"  # well formed, so it is submitted; only the job's tokenizer finds it too long
    long.write_text(json.dumps({"prompt": "Describe the cat. " * 40}) + "\n")
    done = rlsteps("run", "rs", *TINY_RUN, "-r", "ci", f"inputs.prompts={long}", cwd=project, timeout=600)
    assert done.returncode == 3, done.stderr  # the job's own input check: before any server or policy load
    assert f"{long}:1: the prompt has" in done.stdout and "max_prompt_tokens=64" in done.stdout  # the log, streamed
    assert "rl/rs failed with exit code 3" in done.stderr
    record = submitted_record(project)
    status = jobs.job_status(record)
    assert status.state is JobState.FAILED and "exit code 3" in status.detail
    assert "max_prompt_tokens=64" in jobs_cli("logs", record.job_id)
