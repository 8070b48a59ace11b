"""The worker: `python -m rlsteps.engine.run.worker JOB_DIR/config.yaml` runs one step to its end.

It reads the compiled config (secrets arrive through the environment). A recipe serves or reaches
the reward source, runs the shared loop, and writes the typed output artifact and a metrics plot;
a convert step reads the checkpoint and writes it in the other form.

Before anything else it asks whether its Python can run the engine (rlsteps.engine.run.preflight), so the module
imports only the standard library at the top (its command line is rlsteps.contract.worker_args): a missing dependency
is one line, not an import traceback. Then the main process claims the run directory (rlsteps.contract.run_lock) for
its whole life: a second run into the same output.dir stops at once with exit 2, naming the run that holds it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlsteps.contract.worker_args import build_parser, load_config
from rlsteps.engine.run import preflight

if TYPE_CHECKING:
    from rlsteps.contract.config import ConvertConfig, RecipeConfig

    StepConfig = RecipeConfig | ConvertConfig

log = logging.getLogger("rlsteps")
_held: list[Any] = []  # the run directory's lock, held until the process ends


def run(config_path: Path, log_level: str = "info") -> int:
    import rlsteps.contract.eval_config  # noqa: F401  registers eval/policy's schema beside the recipes'
    from rlsteps.contract.artifact import input_versions
    from rlsteps.contract.config import ConvertConfig
    from rlsteps.contract.hub import with_hub_snapshots
    from rlsteps.contract.input_check import check_inputs_in_job
    from rlsteps.contract.output_dir import make_output_dir
    from rlsteps.engine.distributed import world_from_env
    from rlsteps.engine.records.output import job_record
    from rlsteps.engine.run.worker_log import log_to

    cfg = load_config(config_path)
    world = world_from_env()  # torchrun's processes; one process when started plainly
    run_dir = Path(cfg.output.dir)
    log_to(None, log_level, world.rank)  # the terminal alone until the run directory is known to be usable
    make_output_dir(run_dir)
    if world.is_main and not _claim(run_dir, config_path):  # before a line is written there
        from rlsteps.contract.run_lock import EXIT_IN_USE

        return EXIT_IN_USE
    log_to(run_dir / ("train.log" if world.is_main else f"train.rank{world.rank}.log"), log_level, world.rank)
    _refuse_world_size(cfg, world.size)
    job = job_record(config_path)
    for checked in check_inputs_in_job(job.get("inputs_in_job") or []):  # on cluster paths: first, before any load
        log.info("input '%s': %s is a %s (checked in the job)", checked.name, checked.ref, checked.required_type)
    cfg = with_hub_snapshots(cfg, log.info)  # Hugging Face Hub ids: their snapshots in the cache, fetched if need be
    versions = input_versions(cfg.inputs.model_dump())  # before the step: what this run actually reads
    log.info("%s: run directory %s", cfg.algorithm, run_dir)
    if cfg.algorithm == "eval":  # eval/policy: responses generated and scored, a report written; no training
        from rlsteps.engine.eval.run import run_eval

        return run_eval(cfg, run_dir, world, job, versions)
    done = _finished_output(cfg, run_dir, versions)
    if done:  # a rerun of a finished run: no server, no policy load, no torch import
        log.info("already done: %s", done)
        return 0
    from rlsteps.engine.records.run_end import run_plot

    plot = None if isinstance(cfg, ConvertConfig) or not world.is_main else run_plot(run_dir, _plotted_extra_keys(cfg))
    with plot or contextlib.nullcontext():  # a run that ends before its output lets the plotting process go
        return _run_to_output(cfg, run_dir, world, job, versions, plot)


def run_here(config_path: Path, log_level: str = "info") -> int:
    """run() in the calling process (a notebook, a script: rlsteps.api), which goes on after it: the run directory's
    lock released and the root logger's handlers put back once it has ended, whatever ended it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return run(config_path, log_level)
    finally:
        while _held:
            _held.pop().release()
        root.handlers[:] = handlers
        root.setLevel(level)


def _run_to_output(cfg: StepConfig, run_dir: Path, world: Any, job: dict, versions: dict, plot: Any) -> int:
    """Serve the rewards and train (or read the checkpoint to convert), then write the output and draw the plot."""
    from rlsteps.contract.config import ConvertConfig
    from rlsteps.contract.run_identity import RunDirectoryInUse
    from rlsteps.engine.records.output import write_policy_output
    from rlsteps.engine.run import signals

    converting = isinstance(cfg, ConvertConfig)
    with contextlib.ExitStack() as servers:  # stopped before the output is written
        try:  # the main process serves (or reaches) the rewards and scores for all
            rewards = None if converting or not world.is_main else _start_rewards(cfg, run_dir, servers)
        except RunDirectoryInUse as refused:
            log.error("%s", refused)
            return refused.exit_code
        if plot:
            plot.start()  # it imports matplotlib on what the run leaves idle
        _prepare_torch(cfg)  # while a reward server loads
        from rlsteps.engine.run.step import RunStopped

        try:
            model, tokenizer, counters = (
                _convert(cfg) if converting else _train(cfg, run_dir, rewards, world, plot.cue if plot else None)
            )
        except RunStopped as stopped:
            if world.is_main:
                from rlsteps.engine.run.failure_fix import failure_of
                from rlsteps.engine.run.worker_log import log_failure

                failure = failure_of(stopped, run_dir, job.get("argv"))
                log_failure(log, failure.said, failure.fix)
            else:
                log.debug("%s", stopped)
            return 1
        except signals.CheckpointRequested as paused:
            (log.warning if world.is_main else log.debug)("%s", paused)
            return signals.EXIT_CHECKPOINTED
    if not world.is_main:
        return 0  # the main process writes the output
    if converting:
        write_policy_output(cfg, model, tokenizer, counters, job, versions)
        return 0
    from rlsteps.engine.records.run_end import draw_plot, summarise

    try:  # the plot, cued at the last step's metrics, is drawn while the output is written
        write_policy_output(cfg, model, tokenizer, counters, job, versions)
        summarise(run_dir, _plotted_extra_keys(cfg))
    finally:
        draw_plot(plot)
    return 0


def _plotted_extra_keys(cfg: RecipeConfig) -> list[str]:
    """What the run's plot and end summary show beside its main figures: each reward term's validation mean (of
    more than one) and each validation reward function."""
    terms = list(cfg.reward_terms) if len(cfg.reward_terms) > 1 else []
    return [f"val/reward/{name}" for name in terms] + [f"val/{n}" for n in cfg.validation.reward_functions]


def _claim(run_dir: Path, config_path: Path) -> bool:
    """Hold the run directory's lock; False (and why, on stderr) when another live run holds it."""
    from rlsteps.contract.run_lock import RunDirectoryLocked, RunLock

    job_dir = config_path.resolve().parent
    try:
        _held.append(RunLock(run_dir, job=job_dir.name, job_dir=str(job_dir)).acquire())
    except RunDirectoryLocked as refused:
        log.error("%s (fix: %s)", refused, refused.holder.fix())
        return False
    return True


def _refuse_world_size(cfg: StepConfig, world_size: int) -> None:
    """A world the step cannot be split over (the launchers refuse it before submitting; torchrun by hand may not)."""
    from rlsteps.contract.world_check import world_size_problems
    from rlsteps.errors import RunFailed

    problems = world_size_problems(cfg.model_dump(mode="json"), world_size)
    if problems:
        raise RunFailed(
            f"this step cannot run on {world_size} processes: " + "; ".join(problems),
            fix="change the config as each problem says, or start it on a number of processes that fits it",
        )


def _finished_output(cfg: StepConfig, run_dir: Path, versions: dict[str, str]) -> str | None:
    """What the run produced, when its output was written from this very config and these input versions."""
    from rlsteps.contract.artifact import config_hash, read_artifact_metadata
    from rlsteps.engine.records.output import OUTPUT_NAME

    target = run_dir / OUTPUT_NAME
    written = read_artifact_metadata(target) or {}
    if (
        written.get("config_hash") != config_hash(cfg.model_dump(mode="json"))
        or written.get("input_versions") != versions
    ):
        return None
    steps = (written.get("counters") or {}).get("step")
    at = f" after {steps} steps" if steps is not None else ""
    return f"{target} holds the {written.get('type')} this config wrote{at} ({written.get('created')}); nothing to do"


def _check_megatron_output(cfg: StepConfig) -> None:
    """A run that could not write its Megatron output fails now, not after training: no megatron-core,
    or a Hugging Face policy whose architecture has no Megatron GPT layout."""
    from rlsteps.contract.config import ConvertConfig
    from rlsteps.contract.model_families import LayoutError, gpt_shape
    from rlsteps.engine.megatron.compat import require_megatron

    require_megatron()  # installed; imported only to write, at the end
    source = Path(cfg.inputs.checkpoint if isinstance(cfg, ConvertConfig) else cfg.inputs.policy)
    if (source / "config.json").is_file():
        try:
            gpt_shape(json.loads((source / "config.json").read_text()))
        except LayoutError as error:
            raise LayoutError(
                f"{error}; the output would be a checkpoint_megatron: pass output.type=checkpoint_hf "
                "to write the Hugging Face form"
            ) from error


def _start_rewards(cfg: RecipeConfig, run_dir: Path, servers: contextlib.ExitStack) -> Any:
    """Claim the run directory, then start the reward source (a local server loads while the worker goes on)."""
    from rlsteps.contract.run_files import CHECKPOINTS_DIR
    from rlsteps.contract.run_identity import claim_run_directory
    from rlsteps.engine.checkpoints.resume import CheckpointManager
    from rlsteps.engine.rewards.combined import open_reward_source

    has_checkpoints = CheckpointManager(run_dir / CHECKPOINTS_DIR).latest() is not None
    claim_run_directory(run_dir, cfg.model_dump(mode="json"), has_checkpoints)
    return servers.enter_context(open_reward_source(cfg, run_dir))


def _prepare_torch(cfg: StepConfig) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bar is the one to watch
    if cfg.run.num_threads:
        torch.set_num_threads(cfg.run.num_threads)
    if cfg.output.type == "checkpoint_megatron":
        _check_megatron_output(cfg)
    if getattr(cfg, "train", None) is not None and cfg.train.lora.enabled:
        from rlsteps.engine.policy.lora import require_peft

        require_peft()  # before the policy loads
    from rlsteps.install import PACKAGE_DIR, describe

    log.info("code: %s from %s", describe(), PACKAGE_DIR)


def _train(
    cfg: RecipeConfig, run_dir: Path, rewards: Any, world: Any, at_last_record: Any
) -> tuple[Any, Any, dict[str, int]]:
    from rlsteps.engine.algorithms import recipe_class
    from rlsteps.engine.run.loop import train

    run_prompts = _measured_prompts(cfg)  # a bad prompt stops the run in seconds, and the server with it
    say = log.info if world.is_main else log.debug
    recipe = recipe_class(cfg.algorithm)(cfg)
    result = train(
        cfg, recipe, rewards, run_dir, say=say, run_prompts=run_prompts, world=world, at_last_record=at_last_record
    )
    from rlsteps.engine.distributed import leave

    leave(world)  # the main process writes the output alone (megatron-core's save makes a group of its own)
    return result.model, result.tokenizer, result.counters.as_dict()


def _measured_prompts(cfg: RecipeConfig) -> Any:
    """Every prompt the run reads, rendered with the policy's tokenizer and measured against max_prompt_tokens,
    before the policy loads (while its reward server starts): a bad line is exit 3 with its file:line in seconds.
    The prompts go on to the loop, which then does not read them again."""
    from rlsteps.contract.input_check import PROMPT_FILE_FIX, InputProblem
    from rlsteps.contract.prompts import PromptFileError
    from rlsteps.engine.inputs.data import load_run_prompts
    from rlsteps.engine.policy.model import load_policy_tokenizer

    try:
        tokenizer = load_policy_tokenizer(cfg.inputs.policy)
    except (ValueError, OSError) as error:
        fix = "save the policy's tokenizer into its folder, or point inputs.policy at a checkpoint that has one"
        raise InputProblem(f"input 'policy': {error}", fix=fix) from None
    try:
        return load_run_prompts(cfg, tokenizer, say=log.info)  # a large file tells its progress
    except PromptFileError as error:  # with the fix the dry run gives it
        raise InputProblem(str(error), fix=error.fix or PROMPT_FILE_FIX) from None


def _convert(cfg: ConvertConfig) -> tuple[Any, Any, dict[str, int]]:
    import torch

    from rlsteps.engine.policy.model import load_policy

    dtype = "auto" if cfg.run.dtype == "auto" else getattr(torch, cfg.run.dtype)
    model, tokenizer = load_policy(cfg.inputs.checkpoint, dtype=dtype)
    log.info(
        "read %s (%s, %s parameters); writing it as %s",
        cfg.inputs.checkpoint,
        model.dtype,
        f"{sum(p.numel() for p in model.parameters()):,}",
        cfg.output.type,
    )
    return model, tokenizer, {}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    unable = preflight.problem()
    if unable:
        print(f"ERROR {unable}", file=sys.stderr)
        _leave_cause(unable)
        sys.exit(1)
    from rlsteps.engine.run import signals

    signals.install()
    try:
        code = _run_to_an_exit_code(args, signals)
    except BaseException:
        from rlsteps.engine.run.worker_log import record_exit_code

        record_exit_code(1)  # a traceback follows; the job has ended all the same
        raise
    end_process(code)


def _leave_cause(line: str) -> None:
    """A cause said before the logs are set up (this Python cannot run the engine), left for the CLI's error with
    its fix, as record_failure leaves a logged one."""
    from rlsteps.contract.run_files import EXIT_FILE_ENV, FAILURE_FILE, failure_text, split_fix

    path = os.environ.get(EXIT_FILE_ENV)
    if path and os.environ.get("RANK", "0") == "0":
        with contextlib.suppress(OSError):
            Path(path).with_name(FAILURE_FILE).write_text(failure_text(*split_fix(line)))


def _run_to_an_exit_code(args: argparse.Namespace, signals: Any) -> int:
    from rlsteps.contract.input_check import EXIT_INPUT, InputProblem
    from rlsteps.contract.run_files import rerun_starts
    from rlsteps.engine.checkpoints.resume import CheckpointError
    from rlsteps.engine.rewards.functions import RewardFunctionError
    from rlsteps.engine.run.failure_fix import ExitCalled, say_failure, unforeseen
    from rlsteps.errors import RlstepsError

    try:
        code = run(args.config, args.log_level)
        _leave_process_group()
        return code
    except InputProblem as problem:
        say_failure(log, problem, args.config)
        return EXIT_INPUT
    except signals.StoppedBySignal as stopped:
        log.warning("%s", stopped)
        return stopped.exit_code
    except KeyboardInterrupt:
        log.error("interrupted before the run could end its step: %s", rerun_starts(_run_dir_of(args.config)))
        return 130
    except SystemExit as exiting:  # code the run called (a user's module) ended it: never a success
        say_failure(log, ExitCalled(exiting), args.config)
        return 1
    except signals.Terminated:
        log.error("terminated (SIGTERM): servers stopped; %s", rerun_starts(_run_dir_of(args.config)))
        return signals.EXIT_TERMINATED
    except RlstepsError as error:  # output.dir unusable, a full disk: said with its exit code
        say_failure(log, error, args.config)
        return error.exit_code
    except (
        ValueError,
        FileNotFoundError,
        ImportError,
        CheckpointError,
    ) as error:  # bad data, paths, a missing extra, a damaged checkpoint: say what, no traceback
        say_failure(log, error, args.config)
        return 2 if isinstance(error, RewardFunctionError) else 1  # a reward function named wrong: a config error
    except Exception as error:
        code = signals.unwinding_exit_code()
        if code is None:  # a failure no check foresaw: its traceback in the log, the log and the rerun on the fix line
            say_failure(log, error, args.config, traceback=True, cause=unforeseen(error))
            return 1
        # a signal cut a checkpoint's write or a cleanup short: what that raised is its consequence, not the cause
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        log.error(
            "stopped by a signal in the middle of its work (%s): the last complete checkpoint is intact; "
            "rerun to resume",
            first_line,
        )
        return code


def _run_dir_of(config_path: Path) -> Path | None:
    """The run directory a job's config names (None when it cannot be read): where a rerun would resume from."""
    try:
        return Path(load_config(config_path).output.dir)
    except Exception:  # the config itself may be what failed
        return None


def _leave_process_group() -> None:
    """Under torchrun, leave the process group once every process is done with it."""
    if "torch" in sys.modules:
        from rlsteps.engine.distributed import leave, world_from_env

        leave(world_from_env())


def end_process(code: int) -> None:
    """Exit once every exit handler has run and every log is flushed, without the interpreter's teardown. Two
    reasons:
    - the teardown of torch, transformers and megatron-core costs 2.2 s of finalising modules and tensors on two
      cores (measured); every file the run wrote is closed by then, each in its `with` block;
    - under torchrun, a gloo worker thread can still be releasing its last collective's tensors when the main
      thread ends (the process group lives on after destroy_process_group in the model's FSDP state). Releasing a
      tensor that has a Python object takes the GIL; once the teardown has begun, Python 3.11 ends a thread that
      takes the GIL with pthread_exit, whose unwinding through torch's noexcept release aborts the process
      ("terminate called without an active exception"; tests/gloo_ending.py shows it). Without a teardown,
      there is no such moment.
    The distributed tests' torchrun scripts end through here too."""
    import atexit

    from rlsteps.engine.run.worker_log import record_exit_code, record_failure

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    record_failure(code)
    record_exit_code(code)
    os._exit(code)


if __name__ == "__main__":
    main()
