"""`rlsteps jobs`: records found under ./.rlsteps/jobs and profiles' job_dir, ids resolved, the CLI's output."""

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_helpers import run_cli
from rlsteps.cli.jobs import jobs_app
from rlsteps.errors import UsageError
from rlsteps.launch import local
from rlsteps.launch.base import RECORD_FILE, JobRecord
from rlsteps.plan import submitted_jobs as jobs


def jobs_cli(*argv: str):
    return CliRunner().invoke(jobs_app, list(argv), env={"COLUMNS": "200"})


def finished_local_job(root: Path, name: str, exit_code: int, log: str = "", job_id: str = "4242") -> JobRecord:
    """A detached local job's directory as the launcher leaves it once the job has ended."""
    job_dir = root / name
    job_dir.mkdir(parents=True)
    (job_dir / local.LOG_FILE).write_text(log)
    (job_dir / local.EXIT_FILE).write_text(f"{exit_code}\n")
    record = JobRecord(
        launcher="local",
        job_id=job_id,
        job_dir=str(job_dir),
        step="rl/rs",
        submitted=f"2026-01-01T00:00:{name[-2:]}+0000",
        extra={"pid": int(job_id), "pid_started": None, "log": str(job_dir / local.LOG_FILE)},
    )
    record.save()
    return record


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A project directory whose profile `shared` keeps its job dirs elsewhere."""
    monkeypatch.chdir(tmp_path)
    shared = tmp_path / "shared" / "jobs"
    (tmp_path / "rlsteps.yaml").write_text(
        f"profiles:\n  shared: {{executor: local, job_dir: {shared}}}\n  broken: {{extends: nowhere}}\n"
    )
    return tmp_path, tmp_path / ".rlsteps" / "jobs", shared


def test_records_are_found_here_and_under_profile_job_dirs_once_each(workspace):
    _, here, shared = workspace
    first = finished_local_job(here, "20260101-000000-rl_rs-01", 0, job_id="11")
    second = finished_local_job(shared, "20260101-000000-rl_rs-02", 1, job_id="12")
    # the job dirs that exist here: the shipped example profiles' cluster folders (/lustre/...) hold no record here
    assert jobs.job_roots() == [here, shared]
    copy_dir = here / "20260101-000000-rl_rs-02"
    copy_dir.mkdir()
    second.save(copy_dir)  # the same job recorded in two places
    (here / "not-a-job").mkdir()
    (here / "corrupt").mkdir()
    (here / "corrupt" / RECORD_FILE).write_text("{not json")
    assert jobs.find_records() == [first, second]


def test_a_job_is_found_by_id_name_or_unique_prefix(workspace):
    _, here, _ = workspace
    a = finished_local_job(here, "20260101-000000-rl_rs-01", 0, job_id="11")
    b = finished_local_job(here, "20260101-000000-rl_reinforce-02", 0, job_id="12")
    assert jobs.find_job("11") == a
    assert jobs.find_job("20260101-000000-rl_reinforce-02") == b
    assert jobs.find_job("20260101-000000-rl_rs") == a
    with pytest.raises(UsageError, match="matches 2 jobs"):
        jobs.find_job("20260101")
    with pytest.raises(UsageError, match="no job '99'"):
        jobs.find_job("99")


def test_cancel_of_an_ended_job_sends_nothing(workspace):
    _, here, _ = workspace
    record = finished_local_job(here, "20260101-000000-rl_rs-01", 0)
    status, sent = jobs.cancel_job(record)
    assert status.state.value == "succeeded" and not sent
    assert not (Path(record.job_dir) / local.CANCELLED_FILE).exists()


def test_cli_list_status_logs_and_cancel(workspace):
    _, here, shared = workspace
    finished_local_job(here, "20260101-000000-rl_rs-01", 0, log="INFO step 1\nINFO output artifact\n", job_id="11")
    finished_local_job(shared, "20260101-000000-rl_rs-02", 2, log="ERROR bad prompts\n", job_id="12")
    listed = jobs_cli("list")
    assert listed.exit_code == 0, listed.output
    assert "20260101-000000-rl_rs-01" in listed.output and "succeeded" in listed.output
    assert "20260101-000000-rl_rs-02" in listed.output and "failed" in listed.output
    as_json = json.loads(jobs_cli("list", "--json").output)
    assert [(j["job_id"], j["state"]) for j in as_json] == [("11", "succeeded"), ("12", "failed")]
    status = jobs_cli("status", "12")
    assert status.exit_code == 0 and "failed" in status.output and "exit code 2" in status.output
    logs = jobs_cli("logs", "20260101-000000-rl_rs-01")
    assert logs.output == "INFO step 1\nINFO output artifact\n"
    cancelled = jobs_cli("cancel", "11")
    assert cancelled.exit_code == 0 and "already ended: succeeded" in cancelled.output
    unknown = jobs_cli("status", "nope")
    assert isinstance(unknown.exception, UsageError)


@pytest.mark.slow  # a detached run of the tiny step
def test_a_detached_run_writes_its_record_and_jobs_reads_it(tiny_world, workspace):
    root, here, _ = workspace
    (root / "rlsteps.yaml").write_text("profiles:\n  here: {executor: local}\n")
    bad = root / "long.jsonl"
    bad.write_text('{"prompt": "Describe the cat in many words."}\n')  # only the worker, with the tokenizer, sees
    too_long = "data.max_prompt_tokens=2"  # that it is too long: it fails at run time
    submitted = run_cli(
        "run", "rs", "-c", "tiny", "-b", "here", f"inputs.prompts={bad}", too_long, "run.num_threads=1", cwd=root
    )
    assert submitted.exit_code == 0, submitted.output
    [record] = jobs.find_records()
    assert record.launcher == "local" and record.step == "rl/rs" and record.job_id in submitted.stdout
    deadline = time.monotonic() + 120
    while not jobs.job_status(record).state.ended:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert jobs_cli("status", record.job_id).output.count("failed") == 1
    assert f"{bad}:1:" in jobs_cli("logs", record.job_id).output


def test_rlsteps_jobs_is_a_command_group_of_the_cli(workspace):
    listed = run_cli("jobs", "list", "--json", cwd=workspace[0])
    assert listed.exit_code == 0, f"`rlsteps jobs` is not mounted on the CLI: {listed.output}"
    assert json.loads(listed.stdout) == []


def test_jobs_list_fits_80_columns_and_never_breaks_a_job_name(workspace):
    _, here, _ = workspace
    names = ["20261125-021240-6eef16-rl_reinforce", "20261125-021241-0a1b2c-rl_nemo_rl_rlhf"]
    for i, name in enumerate(names):
        finished_local_job(here, name, i, job_id=str(4242 + i))
    listed = CliRunner().invoke(jobs_app, ["list"], env={"COLUMNS": "80"})
    lines = listed.output.splitlines()
    assert listed.exit_code == 0 and max(len(line) for line in lines) <= 80, listed.output
    assert all(any(line.startswith(name) for line in lines) for name in names), listed.output  # whole, copyable


def test_jobs_list_in_the_order_they_were_submitted_across_time_zones_and_within_a_second(tmp_path):
    submitted = {  # the name's random part sorts against the order; the times are what happened
        "z-first": "2026-11-26T10:00:00.000100+00:00",
        "a-second": "2026-11-26T11:00:00.000200+01:00",  # 10:00:00.0002 UTC
        "m-third": "2026-11-26T10:00:01+0000",  # an older record's form, to the second
    }
    for name, when in submitted.items():
        (tmp_path / name).mkdir()
        JobRecord("local", name, str(tmp_path / name), "rl/rs", when).save()
    assert [r.job_id for r in jobs.find_records([tmp_path])] == ["z-first", "a-second", "m-third"]
