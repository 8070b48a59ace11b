"""No run left behind: whatever ends `rlsteps run`, its worker and servers end with it; a run is a job from its first
second; one run per output directory.

The fast tests run the launcher's attached runner and the run lock with small Python scripts in place of the worker
(each installs the worker's own signal handlers); the slow ones run the real CLI and worker on the tiny world and
signal the CLI alone (its process, not its group), as a scheduler, an IDE or a parent script does.
"""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from rlsteps.catalog import load_catalog
from rlsteps.contract import run_lock
from rlsteps.contract.run_files import STOP_WITH_PARENT
from rlsteps.contract.worker_args import build_parser
from rlsteps.launch import local
from rlsteps.launch.base import JobState
from rlsteps.plan import compile as compile_module
from rlsteps.plan import submitted_jobs as jobs
from rlsteps.plan.job_dir import create_job_dir, write_job_files
from rlsteps.plan.runner import RunRequest, compile_request
from run_helpers import FAST, descendants, processes, rlsteps, start_rlsteps
from test_jobs import jobs_cli
from test_worker_signals import wait_gone

LAUNCHER = local.LAUNCHER
LONG = "train.max_steps=5000"  # runs for minutes: every slow test stops it
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 143}
STOPPED_WITHIN_S = 20  # from the signal to the CLI's exit, on a loaded two-core machine

# A stand-in for the worker: the worker's own handlers, a cleanup that a second signal would cut short (an uncaught
# KeyboardInterrupt or SIGTERM: not the exit code expected), and what ended it written to a file.
FAKE_WORKER = textwrap.dedent("""
    import os, pathlib, sys, time
    from rlsteps.engine.run import signals
    signals.install()
    out = pathlib.Path(sys.argv[1])
    out.write_text("started")
    try:
        time.sleep(60)
        code = 0
    except KeyboardInterrupt:
        code, how = 130, "SIGINT"
    except signals.Terminated:
        code, how = 143, "SIGTERM"
    time.sleep(0.5)  # stopping its servers
    out.write_text(f"{how} {os.getppid()}")
    os._exit(code)
""")

# A stand-in for the training loop: steps until a stop is asked for at a step's end, then a checkpoint's write that
# lasts longer than the parent watcher's poll, which a second SIGTERM would cut short.
FAKE_STEPPING_WORKER = textwrap.dedent("""
    import os, pathlib, sys, time
    from rlsteps.engine.run import signals
    signals.install()
    out = pathlib.Path(sys.argv[1])
    out.write_text("started")
    try:
        with signals.stops_at_step_end():
            while signals.stop_requested() is None:
                time.sleep(0.05)  # a step
        time.sleep(4 * signals.PARENT_POLL_S)  # the checkpoint's write
        out.write_text("checkpointed")
        os._exit(143)
    except signals.Terminated:
        out.write_text("cut short by a second SIGTERM")
        os._exit(1)
""")


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text("profiles:\n  here: {executor: local}\n")
    return tmp_path


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to what is left of a process group started for a test (nothing, when the test went well)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} after {timeout}s"
        time.sleep(0.1)


def start_attached_parent(tmp_path: Path, worker: str = FAKE_WORKER) -> tuple[subprocess.Popen, Path]:
    """A process that runs the fake worker with the launcher's attached runner and prints the code it returns."""
    marker = tmp_path / "worker-state"
    parent = textwrap.dedent(f"""
        import os, sys
        from rlsteps.launch.local import _run_attached
        env = {{**os.environ, {STOP_WITH_PARENT!r}: "1"}}  # as the launcher starts a worker
        print(_run_attached([sys.executable, "-c", {worker!r}, {str(marker)!r}], env), flush=True)
    """)
    process = subprocess.Popen(
        [sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    wait_until(lambda: marker.exists(), 60, "the fake worker did not start")
    return process, marker


def fake_worker_pid(parent: subprocess.Popen) -> int:
    [pid] = [pid for pid, cmd in descendants(parent.pid).items() if "signals.install" in cmd]
    return pid


# ----- signals to the CLI: passed on once, the worker's exit code returned ---------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_attached_runner_alone_reaches_the_worker_once_and_returns_its_code(tmp_path, sig):
    parent, marker = start_attached_parent(tmp_path)
    try:
        worker = fake_worker_pid(parent)
        started = time.monotonic()
        os.kill(parent.pid, sig)  # the runner alone, not its group
        out, _ = parent.communicate(timeout=30)
        assert time.monotonic() - started < 10
        assert out.strip() == str(CODES[sig])
        assert marker.read_text().split()[0] == ("SIGINT" if sig is signal.SIGINT else "SIGTERM")
        assert wait_gone(worker, 5)
    finally:
        kill_group(parent)


def test_ctrl_c_to_the_whole_group_reaches_the_worker_once(tmp_path):
    """The terminal's Ctrl-C signals the foreground group: the worker has a group of its own, so it is stopped once,
    by the runner, and its cleanup is not cut short by a second SIGINT."""
    parent, marker = start_attached_parent(tmp_path)
    try:
        worker = fake_worker_pid(parent)
        assert os.getpgid(worker) == worker != os.getpgid(parent.pid)
        os.killpg(parent.pid, signal.SIGINT)
        out, _ = parent.communicate(timeout=30)
        assert out.strip() == "130" and marker.read_text().startswith("SIGINT")
    finally:
        kill_group(parent)


def test_a_worker_outlives_a_runner_killed_with_sigkill_by_no_more_than_its_cleanup(tmp_path):
    parent, marker = start_attached_parent(tmp_path)
    try:
        worker = fake_worker_pid(parent)
        os.kill(parent.pid, signal.SIGKILL)
        assert wait_gone(worker, 5), "the worker outlived the runner killed with SIGKILL"
        assert marker.read_text().startswith("SIGTERM")  # stopped as on SIGTERM: its cleanup ran
    finally:
        kill_group(parent)


def test_a_worker_whose_runner_is_killed_mid_step_writes_its_checkpoint_uninterrupted(tmp_path):
    """The kernel's SIGTERM asks for a stop at the step's end; the parent watcher, which sees the same parent gone,
    must not send a second one that cuts the checkpoint's write short."""
    parent, marker = start_attached_parent(tmp_path, FAKE_STEPPING_WORKER)
    try:
        worker = fake_worker_pid(parent)
        os.kill(parent.pid, signal.SIGKILL)
        assert wait_gone(worker, 10), "the worker outlived the runner killed with SIGKILL"
        assert marker.read_text() == "checkpointed"
    finally:
        kill_group(parent)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (None, None)])
def test_an_error_raised_while_a_signal_unwinds_the_worker_ends_it_with_the_signals_code(
    monkeypatch, caplog, sig, code
):
    """A signal that cuts a checkpoint's write short has torch raise (a torn zip file, wrapped by its checkpointer):
    the run ended because of the signal, and says so; without a signal the same error is the run's own."""
    from rlsteps.engine.run import signals, worker

    def run(config, log_level):
        raise RuntimeError("CheckpointException ranks:dict_keys([0])\nunexpected pos 704 vs 598")

    monkeypatch.setattr(worker, "run", run)
    monkeypatch.setattr(signals, "_unwound_by", [sig] if sig else [])
    args = build_parser().parse_args(["unused.yaml"])
    if code is None:  # the run's own error: exit 1, its traceback in the log, the log and the rerun on the fix line
        assert worker._run_to_an_exit_code(args, signals) == 1
        assert "failed with RuntimeError: CheckpointException" in caplog.text and "Traceback" in caplog.text
        return
    assert worker._run_to_an_exit_code(args, signals) == code
    assert "stopped by a signal in the middle of its work (CheckpointException ranks" in caplog.text


def test_a_worker_whose_parent_is_killed_stops_even_without_the_kernels_signal(tmp_path):
    """torchrun killed under its workers: their parent is gone, and no prctl was set for them."""
    marker = tmp_path / "worker-state"
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", {FAKE_WORKER!r}, {str(marker)!r}])
        time.sleep(60)
    """)
    env = {**os.environ, STOP_WITH_PARENT: "1"}
    process = subprocess.Popen([sys.executable, "-c", parent], env=env, start_new_session=True)
    try:
        wait_until(lambda: marker.exists(), 60, "the fake worker did not start")
        worker = fake_worker_pid(process)
        os.kill(process.pid, signal.SIGKILL)
        assert wait_gone(worker, 5), "the worker outlived its parent"
        assert marker.read_text().startswith("SIGTERM")
    finally:
        kill_group(process)


# ----- a job from its first second; one kind of job id ------------------------------------------------------------


def test_two_jobs_compiled_in_the_same_second_get_different_ids(here, monkeypatch):
    frozen = datetime(2026, 1, 1)  # every job compiled at the same instant
    monkeypatch.setattr(compile_module, "datetime", type("Frozen", (), {"now": staticmethod(lambda: frozen)}))
    names = {compile_request(load_catalog(), RunRequest(step="rs", config="tiny")).job.name for _ in range(5)}
    assert len(names) == 5
    assert all(n.startswith("20260101-000000-") and n.endswith("-rl_rs") for n in names)


def submit(here: Path, mode: str, script: str):
    """Submit as the runner does, with `script` in place of the worker; returns (job, job dir, submission)."""
    request = RunRequest(step="rs", config="tiny", **({"batch_profile": "here"} if mode == "batch" else {}))
    compiled = compile_request(load_catalog(), request)
    job_dir = create_job_dir(compiled.job)
    plan = LAUNCHER.plan(compiled.job, job_dir)
    write_job_files(job_dir, compiled.job, plan, compiled.inputs)
    prefix = plan.command[:5] if mode == "batch" else []
    plan = dataclasses.replace(plan, command=[*prefix, sys.executable, "-c", script])
    return compiled.job, job_dir, LAUNCHER.submit(compiled.job, plan, job_dir)


def test_an_attached_run_is_recorded_when_it_starts_and_its_id_is_its_job_directory_as_for_b_local(here):
    # the stand-in worker sees its own record while it runs, then exits 7
    seen = here / "seen"
    script = textwrap.dedent(f"""
        import json, os, pathlib, time, sys
        record = pathlib.Path(os.environ["RLSTEPS_EXIT_FILE"]).parent / "submission.json"
        deadline = time.monotonic() + 30
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pathlib.Path({str(seen)!r}).write_text(record.read_text())
        sys.exit(7)
    """)
    job, job_dir, submission = submit(here, "attached", script)
    assert submission.exit_code == 7
    while_running = json.loads(seen.read_text())
    assert while_running["job_id"] == job_dir.name == submission.job_id
    assert while_running["extra"]["pid"] > 0 and while_running["extra"]["rlsteps_pid"] == os.getpid()
    record = LAUNCHER.record(job, submission)
    assert LAUNCHER.status(record).state is JobState.FAILED and "exit code 7" in LAUNCHER.status(record).detail
    batch_job, batch_dir, batched = submit(here, "batch", "print('quick')")
    assert batched.job_id == batch_dir.name  # one kind of job id: the job directory's name
    assert jobs.find_job(batched.job_id, [LAUNCHER.record(batch_job, batched)]).job_dir == str(batch_dir)


# ----- one run per output directory -------------------------------------------------------------------------------


def hold_lock_in_a_process(run_dir: Path, job: str) -> subprocess.Popen:
    code = (
        "import sys, time; from pathlib import Path; from rlsteps.contract.run_lock import RunLock; "
        f"RunLock(Path({str(run_dir)!r}), job={job!r}).acquire(); print('held', flush=True); time.sleep(120)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_the_run_lock_names_its_holder_and_a_dead_holders_lock_blocks_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert run_lock.holder(run_dir) is None
    holder = hold_lock_in_a_process(run_dir, "20260101-000000-abcdef-rl_rs")
    try:
        found = run_lock.holder(run_dir)
        assert found is not None and found.job == "20260101-000000-abcdef-rl_rs" and found.info["pid"] == holder.pid
        with pytest.raises(run_lock.RunDirectoryLocked, match="in use by job 20260101-000000-abcdef-rl_rs"):
            run_lock.RunLock(run_dir, job="second").acquire()
    finally:
        holder.kill()  # kill -9: the kernel releases the lock; the file stays, with the dead run's name in it
        holder.wait()
    assert "abcdef" in (run_dir / run_lock.LOCK_FILE).read_text()
    assert run_lock.holder(run_dir) is None
    lock = run_lock.RunLock(run_dir, job="rerun").acquire()
    assert json.loads((run_dir / run_lock.LOCK_FILE).read_text())["job"] == "rerun"
    lock.release()


def test_a_run_into_a_directory_in_use_is_refused_in_seconds_naming_the_job_and_how_to_stop_it(tiny_world, here):
    run_dir = here / "busy"
    run_dir.mkdir()
    holder = hold_lock_in_a_process(run_dir, "20260101-000000-abcdef-rl_rs")
    try:
        started = time.monotonic()
        refused = rlsteps("run", "rs", "-c", "tiny", f"output.dir={run_dir}", *FAST, cwd=here, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert time.monotonic() - started < 15
        assert "in use by job 20260101-000000-abcdef-rl_rs" in refused.stderr
        assert "rlsteps jobs cancel 20260101-000000-abcdef-rl_rs" in refused.stderr
        assert not (here / ".rlsteps" / "jobs").exists()  # refused before anything was written or started
    finally:
        holder.kill()
        holder.wait()


def test_the_worker_itself_refuses_a_directory_in_use_before_writing_there(tiny_world, here):
    """Two runs past the CLI's check at once, or a job started elsewhere: the worker's own claim decides."""
    run_dir = here / "busy"
    run_dir.mkdir()
    request = RunRequest(step="rs", config="tiny", overrides=(f"output.dir={run_dir}",))
    compiled = compile_request(load_catalog(), request)
    job_dir = create_job_dir(compiled.job)
    write_job_files(job_dir, compiled.job, compiled.plan, compiled.inputs)
    lock = run_lock.RunLock(run_dir, job="20260101-000000-abcdef-rl_rs").acquire()
    try:
        worker = subprocess.run(
            [sys.executable, "-m", "rlsteps.engine.run.worker", str(job_dir / "config.yaml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        lock.release()
    assert worker.returncode == run_lock.EXIT_IN_USE, worker.stderr
    assert "rlsteps jobs cancel 20260101-000000-abcdef-rl_rs" in worker.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [run_lock.LOCK_FILE]  # no train.log, no run.json


# ----- the real CLI and worker --------------------------------------------------------------------------------------


def start_run(here: Path, *extra: str) -> subprocess.Popen:
    return start_rlsteps("run", "rs", "-c", "tiny", LONG, *FAST, *extra, cwd=here, log=here / "cli.log")


def worker_and_server(cli: subprocess.Popen, timeout: float = 120) -> tuple[int, int]:
    def found() -> tuple[int | None, int | None]:
        tree = descendants(cli.pid)
        worker = next((p for p, c in tree.items() if "rlsteps.engine.run.worker" in c), None)
        server = next((p for p, c in tree.items() if "rlsteps.engine.rewards.rm" in c), None)
        return worker, server

    train_log = Path.cwd() / ".rlsteps" / "runs" / "rl_rs-tiny" / "train.log"

    def training() -> bool:  # signalled while it trains, as a user would
        return all(found()) and train_log.exists() and "step 1/" in train_log.read_text()

    wait_until(lambda: training() or cli.poll() is not None, timeout, "no training worker and reward server")
    assert cli.poll() is None, (Path.cwd() / "cli.log").read_text()
    return found()


def stop_all(cli: subprocess.Popen, *pids: int | None) -> None:
    kill_group(cli)
    for pid in pids:
        if pid and pid in processes():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_rlsteps_alone_stops_its_worker_and_server_and_exits_with_the_workers_code(tiny_world, here, sig):
    cli = start_run(here)
    worker = server = None
    try:
        worker, server = worker_and_server(cli)
        started = time.monotonic()
        os.kill(cli.pid, sig)
        assert cli.wait(timeout=60) == CODES[sig]
        assert time.monotonic() - started < STOPPED_WITHIN_S
        assert wait_gone(worker, 5) and wait_gone(server, 5), "a process outlived rlsteps"
        run_dir = here / ".rlsteps" / "runs" / "rl_rs-tiny"
        stop = re.search(
            rf"stopped at step (\d+) after a checkpoint \({sig.name}\)", (run_dir / "train.log").read_text()
        )
        assert stop, "the worker did not stop at a step's end with a checkpoint"
        assert (run_dir / "checkpoints" / f"step_{stop[1]}").is_dir()
        [record] = jobs.find_records()
        status = jobs.job_status(record)
        assert status.state is JobState.FAILED and f"exit code {CODES[sig]}" in status.detail
    finally:
        stop_all(cli, worker, server)


@pytest.mark.slow
def test_rlsteps_killed_with_sigkill_takes_its_worker_and_server_and_the_job_says_so(tiny_world, here):
    cli = start_run(here)
    worker = server = None
    try:
        worker, server = worker_and_server(cli)
        os.kill(cli.pid, signal.SIGKILL)
        assert wait_gone(worker, 10) and wait_gone(server, 10), "a process outlived rlsteps killed with SIGKILL"
        [record] = jobs.find_records()
        status = jobs.job_status(record)
        assert status.state is JobState.FAILED
        assert "exit code 143" in status.detail and "the rlsteps run that started it had ended" in status.detail
        train_log = (here / ".rlsteps" / "runs" / "rl_rs-tiny" / "train.log").read_text()
        stop = re.compile(r"(stopped at step \d+ after a checkpoint|terminated) \(SIGTERM\)")
        assert stop.search(train_log)
        # the terminal is no longer the run's: what the worker said after its rlsteps was gone is in worker.log
        terminal, worker_log = (here / "cli.log").read_text(), (Path(record.job_dir) / "worker.log").read_text()
        assert stop.search(worker_log) and not stop.search(terminal), terminal[-2000:]
    finally:
        stop_all(cli, worker, server)


@pytest.mark.slow
def test_a_worker_killed_with_sigkill_is_named_as_likely_out_of_memory_with_its_logged_peak(tiny_world, here):
    """The kernel's out-of-memory killer sends SIGKILL: rlsteps says so, with the peak memory the run logged."""
    cli = start_run(here)
    worker = server = None
    try:
        worker, server = worker_and_server(cli)
        os.kill(worker, signal.SIGKILL)
        assert cli.wait(timeout=60) == 1
        assert wait_gone(server, 10), "the reward server outlived its killed worker"
        terminal = (here / "cli.log").read_text()
        assert "Traceback" not in terminal
        [error] = [line for line in terminal.splitlines() if line.startswith("error:")]
        assert error.startswith("error: rl/rs failed with exit code 137: the worker was killed by SIGKILL, likely "
                                "for lack of memory (the kernel's out-of-memory killer: see dmesg); its peak "
                                "resident memory (RSS) logged was "), error  # fmt: skip
        assert re.search(r"was \d+\.\d\d GB, at step \d+ \(perf/peak_rss_gb in metrics.jsonl\)$", error), error
        assert "\nfix: give the run more memory or make its batches smaller" in terminal, terminal[-1000:]
    finally:
        stop_all(cli, worker, server)


@pytest.mark.slow
def test_a_running_attached_run_is_a_job_that_jobs_lists_follows_and_cancels_and_owns_its_directory(tiny_world, here):
    cli = start_run(here)
    worker = server = None
    try:
        worker, server = worker_and_server(cli)
        [listed] = json.loads(jobs_cli("list", "--json").stdout)
        job_id = listed["job_id"]
        assert listed["state"] == "running" and job_id == listed["name"] and listed["extra"]["pid"] == worker
        assert "running" in jobs_cli("status", job_id).output
        wait_until(lambda: "run directory" in jobs_cli("logs", job_id).output, 30, "no run log")
        started = time.monotonic()
        second = rlsteps("run", "rs", "-c", "tiny", *FAST, cwd=here, timeout=60)
        assert second.returncode == 2 and time.monotonic() - started < 15, second.stderr
        assert f"in use by job {job_id}" in second.stderr and f"rlsteps jobs cancel {job_id}" in second.stderr
        assert "cancelled" in jobs_cli("cancel", job_id).output
        assert cli.wait(timeout=30) == 143
        assert wait_gone(worker, 5) and wait_gone(server, 5)
        assert json.loads(jobs_cli("list", "--json").stdout)[0]["state"] == "cancelled"
    finally:
        stop_all(cli, worker, server)


# ----- Slurm, attached (-r): a signal to rlsteps cancels the job ---------------------------------------------------


@pytest.mark.slow
# SIGHUP: the terminal that streams the job closes (SIGTERM and SIGINT take the same handler: the local tests above)
@pytest.mark.parametrize("sig", [signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_rlsteps_streaming_a_slurm_job_cancels_the_job(
    tiny_world, slurm_cluster, tmp_path, monkeypatch, sig
):
    from test_launch_slurm import PROFILES, TINY_RUN

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text(PROFILES.format(shared=tmp_path / "shared" / "jobs"))
    cli = start_rlsteps("run", "rs", *TINY_RUN, "-r", "ci", LONG, cwd=tmp_path, log=tmp_path / "cli.log")
    try:
        wait_until(lambda: "step 1/" in (tmp_path / "cli.log").read_text() or cli.poll() is not None, 300, "no step")
        assert cli.poll() is None, (tmp_path / "cli.log").read_text()
        [record] = jobs.find_records()
        assert jobs.job_status(record).state is JobState.RUNNING
        os.kill(cli.pid, sig)  # rlsteps alone
        assert cli.wait(timeout=60) == CODES[sig], (tmp_path / "cli.log").read_text()[-3000:]
        assert f"cancelled Slurm job {record.job_id}" in (tmp_path / "cli.log").read_text()
        wait_until(lambda: jobs.job_status(record).state.ended, 60, "the Slurm job is still running")
        assert jobs.job_status(record).state is JobState.CANCELLED
    finally:
        kill_group(cli)
        for record in jobs.find_records():
            subprocess.run(["scancel", record.job_id], check=False)
