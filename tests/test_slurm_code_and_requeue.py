"""Slurm jobs carry their code, survive their time limit, and do not wait forever on a failed stage.

The script tests read the sbatch script a dry run shows; the cluster tests submit it to the real
Slurm that `.ci/slurm.sh up` starts, with a worker environment that does not have rlsteps.
"""

import io
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from rlsteps.engine.run.signals import EXIT_CHECKPOINTED
from rlsteps.install import describe, source
from rlsteps.launch import code, containers, slurm_script
from rlsteps.launch.base import JobState
from rlsteps.plan import submitted_jobs as jobs
from run_helpers import artifact_metadata, python_without_rlsteps, rlsteps, run_dir
from test_launch_slurm import (
    TINY_RUN,
    add_profile,
    compiled,
    ended,
    needs_cluster,
    project,  # noqa: F401 - a fixture
    script_of,
    submitted_record,
    wait_until,
)

SRUN_END = " ".join(slurm_script.SRUN_END)


def test_the_wheel_holds_the_package_and_is_the_same_bytes_each_time(tmp_path):
    first, second = code.build_wheel(), code.build_wheel()
    assert first.content == second.content and first.name == code.wheel_name()
    names = zipfile.ZipFile(io.BytesIO(first.content)).namelist()
    assert "rlsteps/engine/run/worker.py" in names and not any("__pycache__" in n for n in names)
    assert any(n.endswith(".dist-info/RECORD") for n in names)
    wheel = tmp_path / first.name
    wheel.write_bytes(first.content)
    where = subprocess.run(  # imported from the wheel, ahead of the installed copy
        [sys.executable, "-c", "import rlsteps.engine.run.signals as s; print(s.__file__)"],
        env={"PYTHONPATH": str(wheel), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == f"{wheel}/rlsteps/engine/run/signals.py", where.stderr


def test_the_task_runs_with_the_jobs_wheel_first_on_the_path_unless_the_profile_says_installed(project):  # noqa: F811
    job = compiled("ci")
    wheel = job.job_dir / code.wheel_name()
    last = job.plan.files["sbatch.sh"].rstrip().splitlines()[-1]
    assert last.startswith(f"srun --nodes=1 --ntasks-per-node=1 {SRUN_END} /bin/sh -c '{code.ON_PATH}' {wheel} ")
    assert last.endswith("-m rlsteps.engine.run.worker " + str(job.job_dir / "config.yaml"))
    assert job.plan.code == code.wheel_name() and "code: the job's own wheel" in job.plan.summary
    add_profile(project, "  installed:\n    extends: ci\n    code: installed\n")
    assert "/bin/sh" not in script_of("installed") and compiled("installed").plan.code is None


def test_the_script_and_the_worker_agree_on_the_exit_code_of_a_checkpoint_on_request():
    assert slurm_script.EXIT_CHECKPOINTED == EXIT_CHECKPOINTED


def test_a_time_limit_brings_a_checkpoint_signal_and_requeue_is_the_profiles_choice(project):  # noqa: F811
    script = script_of("ci")  # time 00:15:00
    assert "#SBATCH --signal=USR1@300" in script and "--requeue" not in script
    add_profile(project, "  again:\n    extends: ci\n    requeue: true\n    checkpoint_before_limit_s: 120\n")
    script = script_of("again")
    assert "#SBATCH --signal=USR1@120" in script and "#SBATCH --requeue" in script
    assert f'if [ "$code" -eq {EXIT_CHECKPOINTED} ]; then' in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    add_profile(project, "  unlimited:\n    executor: slurm\n")
    assert "--signal" not in script_of("unlimited")


def test_under_torchrun_a_workers_marker_stands_for_its_exit_75(project):  # noqa: F811
    """torchrun exits 1 when its workers exit 75: the script clears the marker, then reads it after srun."""
    add_profile(project, "  again2:\n    extends: ci\n    requeue: true\n    nprocs_per_node: 2\n")
    job = compiled("again2", overrides=("train.micro_batch_size=8",))
    marker = job.job_dir / slurm_script.CHECKPOINTED_FILE
    script = job.plan.files["sbatch.sh"]
    assert (
        script.index(f"\nrm -f {marker}\n")
        < script.index("\nsrun ")
        < script.index(f'\nif [ "$code" -ne 0 ] && [ -e {marker} ]; then code={EXIT_CHECKPOINTED}; fi\n')
        < script.index(f'\nif [ "$code" -eq {EXIT_CHECKPOINTED} ]; then\n')
    )


def test_a_stage_that_waits_on_another_is_cancelled_when_that_one_fails(project):  # noqa: F811
    from rlsteps.catalog import load_catalog
    from rlsteps.plan.runner import RunRequest, compile_request

    request = RunRequest(step="rs", config="tiny", batch_profile="ci", after=("41", "42"))
    script = compile_request(load_catalog(), request).plan.files["sbatch.sh"]
    assert "#SBATCH --dependency=afterok:41:42" in script and "#SBATCH --kill-on-invalid-dep=yes" in script


def test_the_squash_srun_asks_for_a_time_limit_and_the_jobs_gpus(project):  # noqa: F811
    add_profile(
        project,
        "  gpu:\n    executor: slurm\n    partition: gpu\n    gpus_per_node: 8\n"
        "    container_image: nvcr.io/nvidia/pytorch:25.10-py3\n    squash_time: 45\n",
    )
    squash = compiled("gpu").plan.files[containers.SQUASH_SCRIPT]
    assert "--partition=gpu --time=45 --gpus-per-node=8 enroot import" in squash


# ----- the real cluster -------------------------------------------------------------------------------------------


@needs_cluster
@pytest.mark.slow
def test_a_job_runs_its_own_wheel_in_an_environment_without_rlsteps(tiny_world, project, tmp_path):  # noqa: F811
    python = python_without_rlsteps(tmp_path / "env")
    add_profile(project, f"  bare:\n    extends: ci\n    python: {python}\n    code: installed\n")
    add_profile(project, f"  shipped:\n    extends: ci\n    python: {python}\n")
    done = rlsteps("run", "rs", *TINY_RUN, "-r", "bare", "train.max_steps=1", cwd=project, timeout=300)
    assert done.returncode == 1 and "No module named 'rlsteps'" in done.stdout  # the environment lacks it
    for path in (project / ".rlsteps" / "jobs").glob("*/submission.json"):
        path.unlink()
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "shipped", "train.max_steps=2", cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    record = submitted_record(project)
    wait_until(record, ended(record), timeout=600)
    log = "\n".join(jobs.job_logs(record))
    assert jobs.job_status(record).state is JobState.SUCCEEDED, log
    wheel = Path(record.job_dir) / code.wheel_name()
    assert f"code: {describe(source() | {'from': 'wheel'})} from {wheel}/rlsteps" in log  # its commit too
    assert artifact_metadata(run_dir(project, "rl_rs"))["counters"]["step"] == 2


# ----- torchrun in the task: two ranks, USR1, the marker and the requeue, with a stand-in worker -----------------

FAKE_WORKER = """\
import os, signal, sys, time
from pathlib import Path

rank, world, here = os.environ["RANK"], int(os.environ["WORLD_SIZE"]), Path(__file__).parent
print(f"fake worker rank {rank} of {world} up", flush=True)


def on_usr1(*_):
    # said before the file appears: once every rank's file is there, the first rank to exit may have torchrun stop
    # the others
    print(f"fake worker rank {rank} handled USR1", flush=True)
    (here / f"usr1.{rank}").touch()


signal.signal(signal.SIGUSR1, on_usr1)
(here / f"ready.{rank}").touch()
deadline = time.monotonic() + 60
while not all((here / f"usr1.{r}").exists() for r in range(world)) and time.monotonic() < deadline:
    time.sleep(0.05)  # as the engine's ranks checkpoint together: once the signal has reached them all
if not (here / f"usr1.{rank}").exists():
    print(f"fake worker rank {rank} saw no USR1", flush=True)
    sys.exit(1)
sys.exit(75)
"""


@pytest.fixture
def fake_python(tmp_path) -> Path:
    """A `python` for the profile: torchrun is the real one, the worker module is FAKE_WORKER (ready.RANK files
    next to it say each rank handles USR1 by now)."""
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "worker.py").write_text(FAKE_WORKER)
    python = folder / "python"
    fake_worker = f'exec {sys.executable} {folder / "worker.py"} "$@"'
    python.write_text(
        f'#!/bin/bash\nif [ "$1 $2" = "-m rlsteps.engine.run.worker" ]; then shift 2; {fake_worker}; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return python


def add_torchrun_profile(cwd: Path, python: Path) -> None:
    add_profile(
        cwd,
        f"  torchrun2:\n    extends: ci\n    nprocs_per_node: 2\n    requeue: true\n"
        f"    code: installed\n    python: {python}\n",
    )


def wait_for_ranks(folder: Path, ranks: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all((folder / f"ready.{rank}").exists() for rank in range(ranks)):
        assert time.monotonic() < deadline, f"not every rank was up after {timeout}s"
        time.sleep(0.1)


def descendants(pid: int) -> list[int]:
    """Every process below pid: what Slurm's proctrack/linuxproc signals for a step."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def assert_torchrun_outlived_usr1(log: str) -> None:
    """Both ranks handled USR1, and torchrun lived on to report a rank's exit 75 (the first rank to exit; it may
    stop the other one before that one exits by itself)."""
    for rank in (0, 1):
        assert f"fake worker rank {rank} of 2 up" in log and f"fake worker rank {rank} handled USR1" in log, log
    assert re.search(r"exitcode\s*:\s*75\b", log), log


def test_the_task_runs_two_ranks_that_checkpoint_on_usr1_and_the_script_requeues(
    tiny_world,
    project,  # noqa: F811
    fake_python,
):
    """The generated script with srun and scontrol stood in for: srun runs the task here, USR1 goes to every
    process below the batch shell (not to the shell), as Slurm's --signal does."""
    add_torchrun_profile(project, fake_python)
    job = compiled("torchrun2", overrides=("train.micro_batch_size=8",))
    job.job_dir.mkdir(parents=True)
    script = job.job_dir / "sbatch.sh"
    script.write_text(job.plan.files["sbatch.sh"])
    stand_ins = project / "bin"
    stand_ins.mkdir()
    (stand_ins / "srun").write_text('#!/bin/bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (stand_ins / "scontrol").write_text('#!/bin/bash\necho "$*" >> "$SCONTROL_CALLS"\n')
    for tool in ("srun", "scontrol"):
        (stand_ins / tool).chmod(0o755)
    calls = project / "scontrol-calls"
    env = {**os.environ, "PATH": f"{stand_ins}:{os.environ['PATH']}", "SCONTROL_CALLS": str(calls)}
    env |= {"SLURM_JOB_ID": "4242"}
    batch = subprocess.Popen(
        ["bash", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_ranks(fake_python.parent, 2)
        for pid in descendants(batch.pid):
            os.kill(pid, signal.SIGUSR1)
        out, _ = batch.communicate(timeout=60)
    finally:
        if batch.poll() is None:
            os.killpg(batch.pid, signal.SIGKILL)
    assert batch.returncode == EXIT_CHECKPOINTED, out
    assert_torchrun_outlived_usr1(out)
    assert (job.job_dir / slurm_script.CHECKPOINTED_FILE).exists()
    assert "requeueing job 4242" in out and calls.read_text() == "requeue 4242\n"


@needs_cluster
@pytest.mark.slow
def test_torchrun_on_slurm_outlives_usr1_and_the_job_is_requeued(tiny_world, project, fake_python):  # noqa: F811
    """scancel --signal=USR1 reaches every process of the step, as --signal=USR1@SECONDS does. Slurm holds a
    requeued job for about two minutes before it may start again: the test ends at the requeue."""
    add_torchrun_profile(project, fake_python)
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "torchrun2", "train.micro_batch_size=8", cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    record = submitted_record(project)
    wait_for_ranks(fake_python.parent, 2)
    subprocess.run(["scancel", "--signal=USR1", record.job_id], check=True)

    def log() -> str:
        return "\n".join(jobs.job_logs(record))

    wait_until(record, lambda: f"requeueing job {record.job_id}" in log(), timeout=60, poll_s=0.2)
    wait_until(record, lambda: jobs.job_status(record).state is JobState.PENDING, timeout=30, poll_s=0.2)
    subprocess.run(["scancel", record.job_id], check=True)
    assert_torchrun_outlived_usr1(log())
    assert (Path(record.job_dir) / slurm_script.CHECKPOINTED_FILE).exists()


def test_the_dry_run_prints_the_script_verbatim_when_piped(project):  # noqa: F811
    shown = rlsteps("run", "rs", "-c", "tiny", "-b", "ci", "--dry-run", cwd=project, timeout=60)
    assert shown.returncode == 0, shown.stderr
    script = shown.stdout.split("----- sbatch.sh (written into the job dir) -----\n", 1)[1]
    expected = compiled("ci").plan.files["sbatch.sh"]
    name = expected.split("#SBATCH --job-name=", 1)[1].split("\n", 1)[0]
    printed_name = script.split("#SBATCH --job-name=", 1)[1].split("\n", 1)[0]  # compiled a moment apart
    assert script.replace(printed_name, name).rstrip() == expected.rstrip()  # not wrapped, not framed
