"""The cause and the fix line of a failed run: the next action for each failure the worker knows (a reward source
down, a reward function that raised, a judge whose answers do not parse, a missing package or file, code that called
sys.exit), and for any other the log to read and the command that resumes the run, with the step it resumes from.

Each fix ends in the rerun where a rerun is what comes next; `rlsteps run` prints it on its `fix:` line (the worker
leaves it in the failure file beside its exit code). Torch-free.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from rlsteps.contract.reward_config import reward_function_import_fix, reward_function_name_fix
from rlsteps.contract.run_files import correct_it, split_fix, then_rerun

API_REWARDS_MODULE = "rlsteps.api_rewards"  # rlsteps.run's callables (rlsteps.api.REWARDS_MODULE)
SAMPLES_FILE = "samples.jsonl"

_REWARD_FUNCTION = re.compile(r"reward function (?P<name>\S+) \((?P<module>[\w.]+):(?P<function>[\w.]+)\)")
_REWARD_FUNCTION_SPEC = re.compile(r"reward function '(?P<module>[\w.]+):(?P<attribute>[\w.]+)'")
_PIP_INSTALL = re.compile(r"pip install (?:'[^']+'|\S+)")
_REWARD_SERVER = re.compile(r"reward server at (?P<url>\S+) (?P<how>unavailable|failed)")
_JUDGE_AT = re.compile(r"the judge at (?P<url>\S+) failed all")
_SERVER_LOG = re.compile(r"the (?P<module>\S+) server (?:exited|did not answer).*?its log (?P<log>\S+) ends with")


class Failure:
    """An error that ended the run: the cause (its first line, the one `rlsteps run` shows), what the log says of it
    (every line: a server's log tail, a judge's last answers) and the fix line."""

    def __init__(self, cause: str, fix: str, said: str | None = None) -> None:
        self.cause, self.fix, self.said = cause, fix, said or cause


def failure_of(error: BaseException, run_dir: Path | None, argv: list[str] | None) -> Failure:
    """The cause and the fix of `error`: its own fix where it carries one, else the next action this module knows
    for it, else the log to read and the rerun."""
    text = str(getattr(error, "message", None) or error).strip() or type(error).__name__
    first, multiline = text.splitlines()[0], "\n" in text
    own = getattr(error, "fix", None)
    if own:
        return Failure(first, own, text)
    cause, fix = split_fix(first)
    if fix:
        return Failure(cause, fix, text if multiline else cause)
    return Failure(cause, next_action(error, cause, run_dir, argv), text)


class ExitCalled(Exception):
    """sys.exit called by code the run called (a user's module) before the run finished: never a success."""

    def __init__(self, exiting: SystemExit) -> None:
        from rlsteps.engine.call_site import raised_at

        self.where = raised_at(exiting)
        super().__init__(
            f"sys.exit({exiting.code!r}) was called{self.where} before the run finished: the run failed, nothing was "
            "output"
        )


def unforeseen(error: BaseException) -> str:
    """An exception no check of the run foresaw, in one line: its type, its first line and where it was raised."""
    from rlsteps.engine.call_site import raised_at

    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"the run failed with {type(error).__name__}{': ' + first_line if first_line else ''}{raised_at(error)}"


def say_failure(
    logger: logging.Logger, error: BaseException, config_path: Path, traceback: bool = False, cause: str | None = None
) -> None:
    """The error that ends the run, logged with its fix (the job's own rerun command in it); cause: the line to say
    instead of the error's own."""
    from rlsteps.engine.run.worker_log import log_failure

    run_dir, argv = run_context(config_path)
    failure = failure_of(error, run_dir, argv)
    log_failure(logger, cause or failure.said, failure.fix, traceback)


def run_context(config_path: Path) -> tuple[Path | None, list[str] | None]:
    """(the run directory, the command line the job was submitted with) of a job's config.yaml and the job.yaml
    beside it; None where either cannot be read (the config itself may be what failed)."""
    from omegaconf import OmegaConf

    try:
        config = OmegaConf.load(config_path)
        run_dir = Path(str(config.output.dir))
    except Exception:  # noqa: BLE001 (any failure to read it: the fix then says less)
        run_dir = None
    try:
        argv = OmegaConf.to_container(OmegaConf.load(Path(config_path).parent / "job.yaml")).get("argv")
    except Exception:  # noqa: BLE001
        argv = None
    return run_dir, [str(word) for word in argv] if isinstance(argv, list) else None


def next_action(error: BaseException, cause: str, run_dir: Path | None, argv: list[str] | None) -> str:
    """What to do about an error that carries no fix of its own, ending in the rerun."""
    if isinstance(error, ExitCalled):
        action = f"change the code{error.where or ' the run called'} to return or raise instead of calling sys.exit"
    elif isinstance(error, ImportError):
        told = _PIP_INSTALL.search(cause)
        action = f"{told[0]} into the job's Python" if told else f"install {error.name or 'what it names'} here"
    elif isinstance(error, FileNotFoundError) and error.filename:
        action = f"put back {error.filename}, or point the config at where it is now"
    else:
        action = stopped_action(cause, run_dir) or correct_it(run_dir)
    return then_rerun(action, run_dir, argv)


def stopped_action(cause: str, run_dir: Path | None) -> str | None:
    """The action for a run its reward sources or its learning stopped, by what the cause names; None for any other."""
    rules = (_reward_function_load_action, _reward_function_action, _reward_server_action, _judge_action)
    for rule in (*rules, _server_start_action):
        action = rule(cause)
        if action:
            return action
    if "made no optimizer update" in cause:
        samples = Path(run_dir) / SAMPLES_FILE if run_dir is not None else SAMPLES_FILE
        return (
            f"read the rollouts in {samples} and change what the error names (or raise train.max_steps_without_update)"
        )
    return None


def _reward_function_load_action(cause: str) -> str | None:
    """A reward function the run could not load (rlsteps.engine.rewards.functions.load_reward_function's words)."""
    found = _REWARD_FUNCTION_SPEC.search(cause)
    if not found:
        return None
    module, attribute = found["module"], found["attribute"]
    if ": cannot import " in cause:
        return reward_function_import_fix(module)
    if " has no callable " in cause:
        return reward_function_name_fix(attribute, module)
    return None


def _reward_function_action(cause: str) -> str | None:
    found = _REWARD_FUNCTION.search(cause)
    if not found:
        return None
    name, module, function = found["name"], found["module"], found["function"]
    if " took more than " in cause:
        return f"make {module}:{function} faster, or raise the timeout_s of reward {name}"
    if " returned " in cause or " is batched and returned " in cause:
        return f"make {module}:{function} return a finite float (or None) for every sample"
    call = f"{function}(messages, response)"
    if module == API_REWARDS_MODULE:
        reproduce = f"call {call} yourself on the sample the error names"
    else:
        reproduce = f'reproduce it with python -c "from {module} import {function}; print({call})" on the sample'
    return f"{reproduce} (its prompt and response are in the error), correct {function}"


def _reward_server_action(cause: str) -> str | None:
    found = _REWARD_SERVER.search(cause)
    if not found:
        return None
    if found["how"] == "failed":
        return f"read the reward server's own log for the error it answered at {found['url']}, and correct it"
    if "this run started" in cause:
        return f"read the log of the reward server this run started ({_its_log(cause)})"
    return f"start the reward server at {found['url']} (or set rm.url to one that answers)"


def _judge_action(cause: str) -> str | None:
    found = _JUDGE_AT.search(cause)
    if found:
        return (
            f"start the judge at {found['url']} (or set judge.url, judge.model and judge.api_key to one that answers)"
        )
    if "judge.on_failure=stop" in cause:
        return "make the judge answer every request, or set judge.on_failure=mask to train on the rest"
    if "judge.max_failure_rate" in cause:
        return "make the judge answer reliably (lower judge.concurrency, raise judge.timeout_s or max_failure_rate)"
    if "judge's answers did not parse" in cause or "no judge answer parsed" in cause:
        return (
            "set judge.structured_output=json_schema (if the judge's server supports it), raise judge.max_tokens, "
            "or use a judge that follows the JSON instruction"
        )
    return None


def _server_start_action(cause: str) -> str | None:
    found = _SERVER_LOG.search(cause)
    if not found:
        return None
    return f"read {found['log']}, the log of the {found['module']} server the run started, and correct what it says"


def _its_log(cause: str) -> str:
    found = re.search(r"its log: (?P<log>[^)]+)\)", cause)
    return found["log"] if found else "in the run directory"
