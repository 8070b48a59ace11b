"""Every failure ends in `fix: <the next action>`: a known one with its own (a full disk, a reward server or judge
down, a judge whose answers do not parse, a user's reward function that raised, non-finite weights, a kill), any
other with the log that holds it and the command that resumes the run, from the step it resumes from. Never "see
the log above" alone.

The cause and the fix travel from the worker to `rlsteps run` in the failure file beside the exit code; the real
runs below go through it (the reward server down is in test_bad_inputs.py)."""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path

import pytest

from rlsteps.contract.run_files import (
    CHECKPOINTS_DIR,
    COMPLETE,
    EXIT_FILE_ENV,
    FAILURE_FILE,
    MASKED,
    TRAIN_LOG,
    read_failure,
    rerun_command,
)
from rlsteps.engine.run.failure_fix import ExitCalled, failure_of, unforeseen
from rlsteps.engine.run.worker_log import last_error, log_failure, record_failure
from rlsteps.errors import DiskFull, RunFailed
from rlsteps.plan.worker_exit import worker_failure
from rlsteps.secrets import MASK
from run_helpers import FAST, rlsteps

ARGV = ["rlsteps", "run", "rs", "-c", "tiny", "output.dir=/runs/a"]
RERUN = "then rerun `rlsteps run rs -c tiny output.dir=/runs/a`"
FROM_0 = "no checkpoint yet: a rerun starts from step 0"


def run_dir_at_step(tmp_path: Path, step: int) -> Path:
    run = tmp_path / "run"
    (run / CHECKPOINTS_DIR / f"step_{step}").mkdir(parents=True)
    (run / CHECKPOINTS_DIR / f"step_{step}" / COMPLETE).write_text("")
    (run / TRAIN_LOG).write_text("ERROR ...\n")
    return run


class RunStopped(RuntimeError):
    """As the loop raises it (rlsteps.engine.run.step.RunStopped): only its words tell what stopped the run."""


STOPPED = {
    "reward server given by URL": (
        "rewards unavailable at step 3: reward server at http://rm:8000 unavailable after 4 attempts over 9.0s; last "
        "error: ConnectError; check the reward server at rm.url: is it up, and reachable from here?",
        "start the reward server at http://rm:8000 (or set rm.url to one that answers)",
    ),
    "reward server the run started": (
        "rewards unavailable at step 3: reward server at http://127.0.0.1:4100 unavailable after 4 attempts over "
        "9.0s; last error: ReadTimeout; the reward server this run started stopped answering (its log: "
        "/runs/a/rm_server.log); a rerun starts it afresh",
        "read the log of the reward server this run started (/runs/a/rm_server.log)",
    ),
    "reward server answering errors": (
        "rewards unavailable at step 3: reward server at http://rm:8000 failed after 4 attempts over 2.0s: HTTP 500",
        "read the reward server's own log for the error it answered at http://rm:8000, and correct it",
    ),
    "judge down": (
        "rewards unavailable at step 2: the judge at http://judge:8000/v1 failed all 64 comparisons after 3 attempts "
        "each (last error: ConnectError); start the judge server",
        "start the judge at http://judge:8000/v1 (or set judge.url, judge.model and judge.api_key to one that answers)",
    ),
    "judge unparsable": (
        "rewards unavailable at step 2: the judge's answers did not parse in 90% of 64 comparisons "
        "(judge.max_parse_failure_rate=0.5); the last answers:",
        "set judge.structured_output=json_schema (if the judge's server supports it), raise judge.max_tokens, or use "
        "a judge that follows the JSON instruction",
    ),
    "judge stop on a failure": (
        "rewards unavailable at step 2: 3 judge request(s) failed and judge.on_failure=stop (set "
        "judge.on_failure=mask to train on the rest)",
        "make the judge answer every request, or set judge.on_failure=mask to train on the rest",
    ),
    "reward function raised": (
        "rewards unavailable at step 1: reward function mine (my_rewards:reward) on sample 0 (prompt 'p1', response "
        "'Hi') raised ZeroDivisionError: no score",
        'reproduce it with python -c "from my_rewards import reward; print(reward(messages, response))" on the '
        "sample (its prompt and response are in the error), correct reward",
    ),
    "reward function given to rlsteps.run": (
        "rewards unavailable at step 1: reward function brevity (rlsteps.api_rewards:brevity) on sample 0 (prompt "
        "'p1', response 'Hi') raised KeyError: 'x'",
        "call brevity(messages, response) yourself on the sample the error names (its prompt and response are in "
        "the error), correct brevity",
    ),
    "reward function too slow": (
        "rewards unavailable at step 1: reward function mine (my_rewards:reward) took more than 5 s over 64 samples; "
        "make it faster or raise its timeout_s",
        "make my_rewards:reward faster, or raise the timeout_s of reward mine",
    ),
    "reward server that never came up": (
        "rewards unavailable at step 1: the rlsteps.engine.rewards.rm.server server exited with code 1 before it "
        "was ready; its log /runs/a/rm_server.log ends with:",
        "read /runs/a/rm_server.log, the log of the rlsteps.engine.rewards.rm.server server the run started, and "
        "correct what it says",
    ),
}


@pytest.mark.parametrize("case", list(STOPPED))
def test_a_run_its_rewards_stopped_names_the_next_action_then_the_rerun_from_its_checkpoint(case, tmp_path):
    message, action = STOPPED[case]
    run = run_dir_at_step(tmp_path, 2)
    failure = failure_of(RunStopped(message), run, ARGV)
    assert failure.cause == message
    assert failure.fix == f"{action}, {RERUN}: a rerun resumes from step 2, the last checkpoint"


def test_a_run_that_made_no_update_for_too_long_points_at_its_rollouts(tmp_path):
    run = run_dir_at_step(tmp_path, 6)
    stopped = RunStopped("5 steps in a row made no optimizer update (train.max_steps_without_update=5): ...")
    assert failure_of(stopped, run, ARGV).fix == (
        f"read the rollouts in {run / 'samples.jsonl'} and change what the error names (or raise "
        f"train.max_steps_without_update), {RERUN}: a rerun resumes from step 6, the last checkpoint"
    )


def test_rlsteps_own_errors_keep_their_fix_and_a_fix_written_into_the_line_is_taken_from_it(tmp_path):
    full = DiskFull("no space left on /runs/a (1.0 MB free)", fix="free 4 MB or move output.dir to a disk with room")
    assert vars(failure_of(full, None, ARGV)) == {
        "cause": "no space left on /runs/a (1.0 MB free)",
        "fix": "free 4 MB or move output.dir to a disk with room",
        "said": "no space left on /runs/a (1.0 MB free)",
    }
    damaged = RuntimeError("checkpoint /runs/a/step_4 cannot be read (EOFError: x) (fix: move it aside)")
    assert failure_of(damaged, None, ARGV).fix == "move it aside"


def test_the_log_keeps_every_line_of_a_cause_and_the_failure_file_its_first(tmp_path):
    answers = RunStopped(
        "rewards unavailable at step 2: the judge's answers did not parse in 90% of 64 comparisons "
        "(judge.max_parse_failure_rate=0.5); the last answers:\n  'A is better'\nask for structured output"
    )
    failure = failure_of(answers, None, ARGV)
    assert failure.said == str(answers) and failure.cause == str(answers).splitlines()[0]


def test_a_missing_package_a_missing_file_and_a_sys_exit_each_name_what_to_do(tmp_path):
    missing = ModuleNotFoundError("No module named 'peft'", name="peft")
    assert failure_of(missing, None, ARGV).fix == f"install peft here, {RERUN}: {FROM_0}"
    hinted = ImportError("Megatron checkpoints need megatron-core: pip install 'rlsteps[megatron]' (megatron-core)")
    assert (
        failure_of(hinted, None, ARGV).fix
        == f"pip install 'rlsteps[megatron]' into the job's Python, {RERUN}: {FROM_0}"
    )
    gone = FileNotFoundError(2, "No such file or directory", "/data/prompts.jsonl")
    assert failure_of(gone, None, ARGV).fix == (
        f"put back /data/prompts.jsonl, or point the config at where it is now, {RERUN}: {FROM_0}"
    )
    try:
        raise SystemExit(3)
    except SystemExit as exiting:
        called = ExitCalled(exiting)
    assert str(called).startswith(f"sys.exit(3) was called at {Path(__file__)}:")
    fix = failure_of(called, None, ARGV).fix
    assert fix.startswith(f"change the code at {Path(__file__)}:")
    assert fix.endswith(f" to return or raise instead of calling sys.exit, {RERUN}: {FROM_0}")


def test_a_reward_function_the_worker_could_not_load_names_what_to_make_of_it():
    cannot = ValueError("reward function 'my_rewards:reward': cannot import my_rewards: No module named 'my_rewards'")
    assert failure_of(cannot, None, ARGV).fix == (
        f"make my_rewards importable where the run starts (its folder on PYTHONPATH, or its package installed), "
        f"{RERUN}: {FROM_0}"
    )
    unnamed = ValueError("reward function 'my_rewards:reward': my_rewards has no callable 'reward'")
    assert failure_of(unnamed, None, ARGV).fix == (
        f"define reward in my_rewards, or name a function it defines, {RERUN}: {FROM_0}"
    )


def test_an_unforeseen_error_names_the_log_and_the_rerun_with_the_step_it_resumes_from(tmp_path):
    run = run_dir_at_step(tmp_path, 4)
    try:
        {}["policy"]
    except KeyError as error:
        failure = failure_of(error, run, ARGV)
        said = unforeseen(error)
    assert said.startswith("the run failed with KeyError: 'policy' at ") and str(Path(__file__)) in said
    assert failure.fix == (
        f"read the full error in {run / TRAIN_LOG} and correct what it names, {RERUN}: a rerun resumes from step 4, "
        "the last checkpoint"
    )


def test_the_rerun_is_the_command_as_given_unless_a_secret_in_it_is_masked():
    assert MASKED == MASK
    assert rerun_command(["rlsteps", "run", "rs", "rm.url=http://a b"]) == "rerun `rlsteps run rs 'rm.url=http://a b'`"
    assert rerun_command(["rlsteps", "run", "rs", f"rm.token={MASK}"]) == "rerun the same command"
    assert rerun_command(["rlsteps.run", "rl/rs", "train.lr=1e-5"]) == "call the same rlsteps.run(...) again"
    assert rerun_command(None) == "rerun the same command"


def test_the_failure_file_holds_the_cause_and_its_fix_and_the_cli_prints_them(tmp_path, monkeypatch):
    monkeypatch.setenv(EXIT_FILE_ENV, str(tmp_path / "exit_code"))
    monkeypatch.delenv("RANK", raising=False)
    logger = logging.getLogger("rlsteps.test_failure_fixes")
    logger.addHandler(last_error)
    try:
        log_failure(logger, "the run failed with OSError: gone\nmore", "read it, then rerun")
        record_failure(1)
    finally:
        logger.removeHandler(last_error)
    assert (tmp_path / FAILURE_FILE).read_text() == "the run failed with OSError: gone\nfix: read it, then rerun\n"
    assert read_failure(tmp_path) == ("the run failed with OSError: gone", "read it, then rerun")
    error = worker_failure("rl/rs", 1, tmp_path, None, ARGV)
    assert isinstance(error, RunFailed) and error.fix == "read it, then rerun"
    assert error.message == "rl/rs failed with exit code 1: the run failed with OSError: gone"


def test_a_worker_that_left_no_cause_names_its_log_and_the_rerun(tmp_path):
    run = run_dir_at_step(tmp_path, 8)
    assert worker_failure("rl/rs", 1, tmp_path, run, ARGV).fix == (
        f"read the full error in {run / TRAIN_LOG} and correct what it names, {RERUN}: a rerun resumes from step 8, "
        "the last checkpoint"
    )
    crashed = worker_failure("rl/rs", 128 + 11, tmp_path, run, ARGV)
    assert crashed.message.endswith("the worker crashed with SIGSEGV (a fault in native code)")
    assert crashed.fix == (
        f"read the last lines of {run / TRAIN_LOG} for what it was doing, {RERUN}: a rerun resumes from step 8, the "
        "last checkpoint"
    )
    killed = worker_failure("rl/rs", 128 + 9, tmp_path, run, ARGV)
    assert killed.fix.startswith("give the run more memory or make its batches smaller") and RERUN in killed.fix


# ---------------------------------------------------------------------------------------------------------------
# through the real command line: the worker's fix on the CLI's fix line

RAISING_FUNCTION = 'def reward(messages, response):\n    raise ZeroDivisionError("no score")\n'
RAISING_IMPORT = (
    'raise RuntimeError("the reward module is broken")\n\n\ndef reward(messages, response):\n    return 0.0\n'
)
ONE_STEP = ["train.max_steps=1", "validation.interval=0", "rewards.reward_model=null", *FAST]


def run_with_reward(tmp_path: Path, monkeypatch, source: str) -> tuple[object, list[str], Path]:
    (tmp_path / "my_rewards.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    given = ["run", "rl/rs", "-c", "tiny", f"output.dir={out}", "rewards.mine.function=my_rewards:reward", *ONE_STEP]
    return rlsteps(*given, cwd=tmp_path, timeout=300), ["rlsteps", *given], out


def test_a_reward_function_that_raised_ends_in_how_to_reproduce_it(tiny_world, tmp_path, monkeypatch):
    done, argv, _ = run_with_reward(tmp_path, monkeypatch, RAISING_FUNCTION)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    *_, error, fix = done.stderr.rstrip("\n").splitlines()
    assert error.startswith("error: rl/rs failed with exit code 1: rewards unavailable at step 1: reward function mine")
    assert fix == (
        'fix: reproduce it with python -c "from my_rewards import reward; print(reward(messages, response))" on the '
        "sample (its prompt and response are in the error), correct reward, then rerun "
        f"`{shlex.join(argv)}`: {FROM_0}"
    )


def test_an_unforeseen_error_ends_in_its_log_and_the_rerun(tiny_world, tmp_path, monkeypatch):
    done, argv, out = run_with_reward(tmp_path, monkeypatch, RAISING_IMPORT)
    assert done.returncode == 1, done.stderr[-3000:]
    *_, error, fix = done.stderr.rstrip("\n").splitlines()
    assert error.startswith("error: rl/rs failed with exit code 1: the run failed with RuntimeError: the reward "
                            f"module is broken at {tmp_path / 'my_rewards.py'}:1"), done.stderr[-3000:]  # fmt: skip
    assert fix == f"fix: read the full error in {out / TRAIN_LOG} and correct what it names, then rerun " + (
        f"`{shlex.join(argv)}`: {FROM_0}"
    )
    assert "Traceback" in (out / TRAIN_LOG).read_text()  # where the fix line sends the user


def test_a_python_that_cannot_run_the_engine_leaves_its_cause_and_fix(tmp_path, monkeypatch):
    from rlsteps.engine.run import preflight, worker

    monkeypatch.setenv(EXIT_FILE_ENV, str(tmp_path / "exit_code"))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(preflight, "problem", lambda: "the job's python lacks what the engine needs: torch (fix: pip "
                        "install torch)")  # fmt: skip
    with pytest.raises(SystemExit):
        worker.main([str(tmp_path / "config.yaml")])
    assert read_failure(tmp_path) == ("the job's python lacks what the engine needs: torch", "pip install torch")


def test_rlsteps_run_from_python_raises_the_cause_and_the_next_action(tiny_world, tmp_path, monkeypatch):
    import rlsteps

    monkeypatch.chdir(tmp_path)

    def broken(messages, response):
        raise KeyError("no score")

    overrides = {"run.num_threads": 1, "train.max_steps": 1, "validation.interval": 0, "rewards.reward_model": None}
    with pytest.raises(RunFailed) as failed:
        rlsteps.run("rl/rs", overrides=overrides, rewards={"broken": broken}, say=lambda line: None)
    assert failed.value.message.startswith("rl/rs failed with exit code 1: rewards unavailable at step 1: reward ")
    assert failed.value.fix == (
        "call broken(messages, response) yourself on the sample the error names (its prompt and response are in the "
        "error), correct broken, then call the same rlsteps.run(...) again: no checkpoint yet: a rerun starts from "
        "step 0"
    )


def test_a_lora_run_without_peft_is_refused_before_it_starts(monkeypatch):
    """The worker's own refusal comes once its reward server is up; rlsteps and the dry run say it first."""
    import importlib.util

    from rlsteps.plan.worker_extras import missing_extra_problem

    config = {"train": {"lora": {"enabled": True}}}
    assert missing_extra_problem(config) is None  # peft is installed here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    refused = missing_extra_problem(config)
    assert refused.exit_code == 1 and refused.message.startswith("train.lora.enabled needs the peft library")
    assert missing_extra_problem({"train": {"lora": {"enabled": False}}}) is None
