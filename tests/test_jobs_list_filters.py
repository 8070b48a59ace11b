"""`rlsteps jobs list` keeps the jobs a user asks for: by step (an id or a glob), state (a job state, or done, active,
ended), launcher, submission time (--since a time ago or a date) and the --last N newest; only the jobs the cheap
options keep are asked their status, newest first, until --last of them are found."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cli_helpers import invoke
from rlsteps.launch import local
from rlsteps.launch.base import JobRecord, JobState
from rlsteps.plan import submitted_jobs as jobs

NOW = datetime.now(UTC)


def recorded_job(root: Path, name: str, step: str, hours_ago: float, exit_code: int | None = 0, launcher="local"):
    """A job's directory with its record: a local job that ended with `exit_code`, or one of another launcher."""
    job_dir = root / name
    job_dir.mkdir(parents=True)
    if launcher == "local" and exit_code is not None:
        (job_dir / local.EXIT_FILE).write_text(f"{exit_code}\n")
    record = JobRecord(
        launcher=launcher,
        job_id=name,
        job_dir=str(job_dir),
        step=step,
        submitted=(NOW - timedelta(hours=hours_ago)).isoformat(),
        extra={"pid": 4242, "pid_started": None} if launcher == "local" else {},
    )
    record.save()
    return record


@pytest.fixture
def listed(tmp_path, monkeypatch):
    """Five jobs, oldest first: rs ok (3 days ago), rs failed (30 h), reinforce ok (5 h), a Slurm rlhf job (2 h),
    reinforce failed (1 h); `listed(*options)` gives the names `jobs list --json` prints and the jobs asked."""
    monkeypatch.chdir(tmp_path)
    here = tmp_path / ".rlsteps" / "jobs"
    recorded_job(here, "a-rs-ok", "rl/rs", 72)
    recorded_job(here, "b-rs-failed", "rl/rs", 30, exit_code=1)
    recorded_job(here, "c-reinforce-ok", "rl/reinforce", 5)
    recorded_job(here, "d-rlhf-slurm", "rl/nemo_rl/rlhf", 2, launcher="slurm")
    recorded_job(here, "e-reinforce-failed", "rl/reinforce", 1, exit_code=2)
    asked: list[str] = []
    real_status = jobs.job_status

    def status(record):
        asked.append(record.job_id)
        if record.launcher == "slurm":  # no Slurm here: a running job, as squeue would say
            return jobs.JobStatus(JobState.RUNNING, "RUNNING")
        return real_status(record)

    monkeypatch.setattr(jobs, "job_status", status)

    def run(*options: str) -> tuple[list[str], list[str]]:
        asked.clear()
        result = invoke("jobs", "list", "--json", *options)
        assert result.exit_code == 0, result.output
        return [job["name"] for job in json.loads(result.stdout)], list(asked)

    return run


def test_with_no_option_every_job_is_listed(listed):
    names, asked = listed()
    assert names == ["a-rs-ok", "b-rs-failed", "c-reinforce-ok", "d-rlhf-slurm", "e-reinforce-failed"]
    assert sorted(asked) == sorted(names)


def test_by_step_an_id_or_a_glob_and_only_those_are_asked(listed):
    assert listed("--step", "rl/rs") == (["a-rs-ok", "b-rs-failed"], ["b-rs-failed", "a-rs-ok"])
    names, _ = listed("--step", "rl/nemo_rl/*", "--step", "rl/reinforce")
    assert names == ["c-reinforce-ok", "d-rlhf-slurm", "e-reinforce-failed"]
    assert listed("--step", "rs") == ([], [])  # an id is matched whole


def test_by_state_and_the_words_for_several(listed):
    assert listed("--state", "failed")[0] == ["b-rs-failed", "e-reinforce-failed"]
    assert listed("--state", "done")[0] == ["a-rs-ok", "c-reinforce-ok"]
    assert listed("--state", "active")[0] == ["d-rlhf-slurm"]
    assert listed("--state", "ended")[0] == ["a-rs-ok", "b-rs-failed", "c-reinforce-ok", "e-reinforce-failed"]
    assert listed("--state", "running", "--state", "succeeded")[0] == ["a-rs-ok", "c-reinforce-ok", "d-rlhf-slurm"]


def test_by_launcher_no_other_launcher_is_asked(listed):
    assert listed("--launcher", "slurm") == (["d-rlhf-slurm"], ["d-rlhf-slurm"])


def test_since_a_time_ago_or_a_date(listed):
    assert listed("--since", "6h")[0] == ["c-reinforce-ok", "d-rlhf-slurm", "e-reinforce-failed"]
    assert listed("--since", "1d12h")[0] == ["b-rs-failed", "c-reinforce-ok", "d-rlhf-slurm", "e-reinforce-failed"]
    since = (NOW - timedelta(hours=3)).isoformat()
    assert listed("--since", since) == (["d-rlhf-slurm", "e-reinforce-failed"], ["e-reinforce-failed", "d-rlhf-slurm"])


def test_last_keeps_the_newest_and_asks_no_more_than_it_needs(listed):
    assert listed("--last", "2") == (["d-rlhf-slurm", "e-reinforce-failed"], ["e-reinforce-failed", "d-rlhf-slurm"])
    names, asked = listed("--last", "1", "--state", "done")  # the newest job that succeeded
    assert names == ["c-reinforce-ok"] and asked == ["e-reinforce-failed", "d-rlhf-slurm", "c-reinforce-ok"]
    assert listed("--last", "1", "--step", "rl/rs", "--state", "failed") == (["b-rs-failed"], ["b-rs-failed"])


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--state", "runing"], "no job state 'runing'"),
        (["--launcher", "kubernetes"], "no launcher 'kubernetes'"),
        (["--since", "yesterday"], "--since yesterday is no time ago or date"),
        (["--last", "0"], "--last 0 keeps no job"),
    ],
)
def test_an_option_it_cannot_read_is_exit_2_with_the_fix(listed, options, said):
    result = invoke("jobs", "list", *options)
    assert result.exit_code == 2 and said in result.stderr, result.output


def test_no_job_matching_is_said_so(listed):
    result = invoke("jobs", "list", "--step", "rl/sft")
    assert result.exit_code == 0 and result.stdout == ""


def test_the_help_names_every_filter():
    result = invoke("jobs", "list", "--help")
    for option in ("--step", "--state", "--launcher", "--since", "--last", "done", "active", "ended", "30m"):
        assert option in result.stdout, result.stdout
