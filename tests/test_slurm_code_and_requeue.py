"""Slurm jobs carry their code, survive their time limit, and do not wait forever on a failed stage.

The script tests read the sbatch script a dry run shows; the cluster tests submit it to the real
Slurm that `.ci/slurm.sh up` starts, with a worker environment that does not have rlsteps.
"""

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rlsteps.engine.signals import EXIT_CHECKPOINTED
from rlsteps.launch import code, containers
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


def test_the_wheel_holds_the_package_and_is_the_same_bytes_each_time(tmp_path):
    first, second = code.build_wheel(), code.build_wheel()
    assert first.content == second.content and first.name == code.wheel_name()
    names = zipfile.ZipFile(io.BytesIO(first.content)).namelist()
    assert "rlsteps/engine/worker.py" in names and not any("__pycache__" in n for n in names)
    assert any(n.endswith(".dist-info/RECORD") for n in names)
    wheel = tmp_path / first.name
    wheel.write_bytes(first.content)
    where = subprocess.run(  # imported from the wheel, ahead of the installed copy
        [sys.executable, "-c", "import rlsteps.engine.signals as s; print(s.__file__)"],
        env={"PYTHONPATH": str(wheel), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == f"{wheel}/rlsteps/engine/signals.py", where.stderr


def test_the_task_runs_with_the_jobs_wheel_first_on_the_path_unless_the_profile_says_installed(project):  # noqa: F811
    job = compiled("ci")
    wheel = job.job_dir / code.wheel_name()
    last = job.plan.files["sbatch.sh"].rstrip().splitlines()[-1]
    assert last.startswith(f"srun --nodes=1 --ntasks-per-node=1 /bin/sh -c '{code.ON_PATH}' {wheel} ")
    assert last.endswith("-m rlsteps.engine.worker " + str(job.job_dir / "config.yaml"))
    assert job.plan.code == code.wheel_name() and "code: the job's own wheel" in job.plan.summary
    add_profile(project, "  installed:\n    extends: ci\n    code: installed\n")
    assert "/bin/sh" not in script_of("installed") and compiled("installed").plan.code is None


def test_the_script_and_the_worker_agree_on_the_exit_code_of_a_checkpoint_on_request():
    from rlsteps.launch import slurm_script

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
    assert f"code: rlsteps {code.package_version()} from {wheel}/rlsteps" in log
    assert artifact_metadata(run_dir(project, "rl_rs"))["counters"]["step"] == 2


@needs_cluster
@pytest.mark.slow
def test_a_job_checkpointed_before_its_time_limit_is_requeued_and_resumes(tiny_world, project):  # noqa: F811
    """scancel --signal=USR1 delivers what --signal=USR1@SECONDS delivers before the limit: to the job's tasks.
    A tiny step takes ~0.2 s: the run is long enough that the signal lands well before its last step."""
    add_profile(project, "  again:\n    extends: ci\n    requeue: true\n")
    done = rlsteps("run", "rs", *TINY_RUN, "-b", "again", "train.max_steps=100", cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    record = submitted_record(project)
    wait_until(record, lambda: "step 2/100" in train_log(project), timeout=300, poll_s=0.05)
    subprocess.run(["scancel", "--signal=USR1", record.job_id], check=True)
    wait_until(record, ended(record), timeout=600)
    log = "\n".join(jobs.job_logs(record))
    assert jobs.job_status(record).state is JobState.SUCCEEDED, log
    assert "as asked (SIGUSR1" in log and "requeueing job" in log and "resuming from" in log, log
    assert artifact_metadata(run_dir(project, "rl_rs"))["counters"]["step"] == 100


def train_log(cwd: Path) -> str:
    path = run_dir(cwd, "rl_rs") / "train.log"
    return path.read_text() if path.exists() else ""


def test_the_dry_run_prints_the_script_verbatim_when_piped(project):  # noqa: F811
    shown = rlsteps("run", "rs", "-c", "tiny", "-b", "ci", "--dry-run", cwd=project, timeout=60)
    assert shown.returncode == 0, shown.stderr
    script = shown.stdout.split("----- sbatch.sh (written into the job dir) -----\n", 1)[1]
    expected = compiled("ci").plan.files["sbatch.sh"]
    name = expected.split("#SBATCH --job-name=", 1)[1].split("\n", 1)[0]
    printed_name = script.split("#SBATCH --job-name=", 1)[1].split("\n", 1)[0]  # compiled a moment apart
    assert script.replace(printed_name, name).rstrip() == expected.rstrip()  # not wrapped, not framed
