"""The local launcher's detached jobs: status from the exit-code wrapper and the pid, logs, cancel.

The wrapper is the launcher's own; the command inside it is a short Python script where a test
needs a job that succeeds, runs on, or ignores SIGTERM, and the real worker where it can fail fast.
"""

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import invoke
from rlsteps.catalog import load_catalog
from rlsteps.contract.run_files import EXIT_FILE_ENV
from rlsteps.errors import UsageError
from rlsteps.launch import local
from rlsteps.launch.base import JobRecord, JobState, Submission
from rlsteps.plan.job_dir import create_job_dir, write_job_files
from rlsteps.plan.runner import RunRequest, compile_request

LAUNCHER = local.LAUNCHER
WRAPPER_WORDS = 5  # /bin/sh -c WRAPPER NAME EXIT_FILE, then the worker's command


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text("profiles:\n  here: {executor: local}\n")
    return tmp_path


def start(script: str | None = None, passthrough: tuple[str, ...] = (), config_text: str | None = None) -> JobRecord:
    """Submit a detached local job as the runner does; `script` replaces the worker inside the wrapper,
    `config_text` the worker's config file."""
    compiled = compile_request(
        load_catalog(), RunRequest(step="rs", config="tiny", batch_profile="here", passthrough=passthrough)
    )
    job_dir = create_job_dir(compiled.job)
    plan = LAUNCHER.plan(compiled.job, job_dir)
    write_job_files(job_dir, compiled.job, plan, compiled.inputs)
    if config_text is not None:
        (job_dir / "config.yaml").write_text(config_text)
    if script is not None:  # a stand-in worker that, ending well, writes its exit record as the worker does
        script += f"\nimport os, pathlib; pathlib.Path(os.environ[{EXIT_FILE_ENV!r}]).write_text('0\\n')"
        plan = dataclasses.replace(plan, command=[*plan.command[:WRAPPER_WORDS], sys.executable, "-c", script])
    record = LAUNCHER.record(compiled.job, LAUNCHER.submit(compiled.job, plan, job_dir))
    record.save()
    return record


def wait_until_ended(record: JobRecord, timeout: float = 60) -> JobState:
    deadline = time.monotonic() + timeout
    while not (state := LAUNCHER.status(record).state).ended:
        assert time.monotonic() < deadline, f"still {state} after {timeout}s"
        time.sleep(0.1)
    return state


def wait_for_line(record: JobRecord, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in "\n".join(LAUNCHER.logs(record)):
        assert time.monotonic() < deadline, f"'{text}' not in the log after {timeout}s"
        time.sleep(0.1)


def test_the_detached_command_is_the_worker_inside_the_exit_code_wrapper(here):
    compiled = compile_request(load_catalog(), RunRequest(step="rs", config="tiny", batch_profile="here"))
    plan = LAUNCHER.plan(compiled.job, here / "jobdir")
    assert plan.command[:2] == ["/bin/sh", "-c"] and plan.command[4] == str(here / "jobdir" / local.EXIT_FILE)
    assert plan.command[WRAPPER_WORDS:] == [
        sys.executable,
        "-m",
        "rlsteps.engine.run.worker",
        str(here / "jobdir" / "config.yaml"),
    ]
    attached = compile_request(load_catalog(), RunRequest(step="rs", config="tiny")).plan
    assert attached.command[1:3] == ["-m", "rlsteps.engine.run.worker"]  # attached runs are unchanged: no wrapper


def test_a_job_that_succeeds_runs_then_succeeds_and_keeps_its_log(here):
    record = start("import time; print('started', flush=True); time.sleep(1.5); print('done')")
    assert LAUNCHER.status(record).state is JobState.RUNNING
    assert wait_until_ended(record) is JobState.SUCCEEDED
    assert LAUNCHER.status(record).detail.endswith("exit code 0")
    assert list(LAUNCHER.logs(record)) == ["started", "done"]
    assert (Path(record.job_dir) / local.EXIT_FILE).read_text().strip() == "0"


def test_the_real_worker_failing_gives_a_failed_status_and_its_log(here):
    record = start(config_text="algorithm: rs\ninputs: {prompts: p.jsonl}\n")  # no policy, no output dir
    assert wait_until_ended(record) is JobState.FAILED
    assert LAUNCHER.status(record).detail == f"pid {record.extra['pid']}, exit code 1"
    log = "\n".join(LAUNCHER.logs(record))
    assert "inputs.policy" in log and "Field required" in log


def test_following_the_log_returns_when_the_job_ends(here):
    record = start("import time\nfor i in range(4):\n    print(f'line {i}', flush=True); time.sleep(0.3)")
    started = time.monotonic()
    lines = list(LAUNCHER.logs(record, follow=True))
    assert lines == ["line 0", "line 1", "line 2", "line 3"]
    assert time.monotonic() - started < 20 and LAUNCHER.status(record).state is JobState.SUCCEEDED


def test_cancel_stops_the_whole_process_group(here):
    child = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('up', flush=True); time.sleep(60)"
    )
    record = start(child)
    wait_for_line(record, "up")
    group = int(record.extra["pid"])
    started = time.monotonic()
    LAUNCHER.cancel(record)
    assert time.monotonic() - started < local.CANCEL_GRACE_S  # SIGTERM was enough
    assert LAUNCHER.status(record).state is JobState.CANCELLED
    assert not local._group_exists(group)
    assert list(LAUNCHER.logs(record))[0] == "up"  # the wrapper's shell may add that its child was terminated
    assert (Path(record.job_dir) / local.EXIT_FILE).read_text().strip() == "143"  # the wrapper outlived SIGTERM


def test_cancel_kills_a_job_that_ignores_sigterm_after_the_grace_period(here, monkeypatch):
    monkeypatch.setattr(local, "CANCEL_GRACE_S", 1.0)
    record = start(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    wait_for_line(record, "up")
    started = time.monotonic()
    LAUNCHER.cancel(record)
    assert 1.0 <= time.monotonic() - started < 10
    assert not local._group_exists(int(record.extra["pid"]))
    assert LAUNCHER.status(record).state is JobState.CANCELLED


def test_a_job_killed_outside_rlsteps_is_failed_not_running(here):
    record = start("import time; print('up', flush=True); time.sleep(60)")
    wait_for_line(record, "up")
    os.killpg(int(record.extra["pid"]), signal.SIGKILL)
    assert wait_until_ended(record, timeout=10) is JobState.FAILED
    assert "ended without writing exit_code" in LAUNCHER.status(record).detail


def test_a_reused_pid_is_not_taken_for_the_job(here):
    record = start("print('quick')")
    wait_until_ended(record)
    (Path(record.job_dir) / local.EXIT_FILE).unlink()
    impostor = dataclasses.replace(record, extra={**record.extra, "pid": os.getpid(), "pid_started": "1"})
    assert LAUNCHER.status(impostor).state is JobState.FAILED


def test_an_attached_run_is_recorded_with_its_exit_code_and_its_run_log(here, monkeypatch):
    monkeypatch.chdir(here)
    compiled = compile_request(load_catalog(), RunRequest(step="rs", config="tiny"))
    record = LAUNCHER.record(compiled.job, Submission(job_id=compiled.job.name, job_dir=here, exit_code=3))
    status = LAUNCHER.status(record)
    assert status.state is JobState.FAILED and "exit code 3" in status.detail
    run_log = here / ".rlsteps" / "runs" / "rl_rs-tiny" / "train.log"
    assert record.extra["run_log"] == str(run_log)
    with pytest.raises(UsageError, match="ran attached and its run's log is gone"):
        LAUNCHER.logs(record)
    run_log.parent.mkdir(parents=True)
    run_log.write_text("INFO step 1/16\nERROR rewards unavailable\n")
    assert list(LAUNCHER.logs(record)) == ["INFO step 1/16", "ERROR rewards unavailable"]
    with pytest.raises(UsageError, match="ran attached"):
        LAUNCHER.cancel(record)


def test_ctrl_c_lets_an_attached_worker_finish_its_cleanup(tmp_path):
    """The worker gets SIGINT with us; we wait for its cleanup instead of killing it after a fraction of a second."""
    import signal
    import subprocess
    import sys
    import textwrap

    marker, started = tmp_path / "cleaned-up", tmp_path / "started"
    worker = textwrap.dedent(f"""
        import signal, time, pathlib
        try:
            pathlib.Path({str(started)!r}).write_text("yes")
            time.sleep(30)
        except KeyboardInterrupt:
            time.sleep(1.0)  # e.g. stopping a reward server
            pathlib.Path({str(marker)!r}).write_text("yes")
            raise SystemExit(130)
    """)
    parent = textwrap.dedent(f"""
        import os, sys
        from rlsteps.launch.local import _run_attached
        print(_run_attached([sys.executable, "-c", {worker!r}], dict(os.environ)), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not started.exists():  # Ctrl-C once the worker runs (a fixed sleep raced a loaded machine)
        assert proc.poll() is None and time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "130"
    assert marker.read_text() == "yes"


# ----- processes: nprocs_per_node ----------------------------------------------------------------------------------

TWO_PROCESSES = "profiles:\n  two: {executor: local, nprocs_per_node: 2, env_vars: {HF_HOME: /tmp/hf, HF_TOKEN: t0k}}\n"


def compiled_two(here: Path, batch: bool, overrides: tuple[str, ...] = ("train.micro_batch_size=8",)):
    (here / "rlsteps.yaml").write_text(TWO_PROCESSES)
    profile = {"batch_profile": "two"} if batch else {"run_profile": "two"}
    return compile_request(load_catalog(), RunRequest(step="rs", config="tiny", overrides=overrides, **profile))


def test_nprocs_per_node_runs_the_worker_under_torchrun_attached_and_detached(here):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    attached = compiled_two(here, batch=False)
    worker = ["-m", "rlsteps.engine.run.worker"]
    assert attached.plan.command == [*torchrun, *worker, str(attached.job_dir / "config.yaml")]
    assert "2 processes under torchrun" in attached.plan.summary
    detached = compiled_two(here, batch=True)
    assert detached.plan.command[:WRAPPER_WORDS] == [
        "/bin/sh",
        "-c",
        local.EXIT_CODE_WRAPPER,
        "rlsteps-job",
        str(detached.job_dir / local.EXIT_FILE),
    ]
    assert detached.plan.command[WRAPPER_WORDS:] == [
        *torchrun,
        "-m",
        "rlsteps.engine.run.worker",
        str(detached.job_dir / "config.yaml"),
    ]
    assert detached.plan.env == {"PYTHONUNBUFFERED": "1", "HF_HOME": "/tmp/hf"}  # the token travels unwritten
    assert detached.job.secret_env() == {"HF_TOKEN": "t0k"}


def test_an_unknown_local_key_is_a_usage_error_that_lists_the_known_ones(here):
    (here / "rlsteps.yaml").write_text("profiles:\n  typo: {executor: local, nproc_per_node: 2}\n")  # torchrun's
    with pytest.raises(UsageError, match="local profile 'typo' is invalid: nproc_per_node") as err:
        compile_request(load_catalog(), RunRequest(step="rs", config="tiny", batch_profile="typo"))
    assert err.value.fix == "the known keys are nprocs_per_node, env_vars"


def test_a_config_two_processes_cannot_run_is_refused_before_the_job_dir_is_written(tiny_world, here):
    with pytest.raises(UsageError) as err:
        compiled_two(here, batch=True, overrides=())  # tiny: 16 rows in micro batches of 16
    assert "(profile two: 1 node(s) x 2 process(es)): train.global_batch_size=16" in err.value.message
    result = invoke("run", "rs", "-c", "tiny", "-b", "two")
    assert result.exit_code == 2 and "train.micro_batch_size=8" in result.output
    assert not (here / ".rlsteps").exists()
    assert LAUNCHER.processes(compiled_two(here, batch=True).job) == (1, 2)  # micro batches of 8: 16 rows in two
