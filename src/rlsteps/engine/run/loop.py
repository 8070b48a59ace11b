"""The one training loop every recipe shares: rollout -> score -> prepare -> update -> validate -> checkpoint.

Counters: `step` (RL steps), `consumed_samples` (prompts, not rollouts), `optimizer_steps`, `epoch`.
The prompts of a step and its sampling seed are pure functions of (seed, consumed_samples) and
(seed, step), so a run resumed from a checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rlsteps.contract.checkpoint_damage import STATE_DIR
from rlsteps.contract.config import RecipeConfig
from rlsteps.contract.disk import checkpoint_estimate, disk_full, is_disk_full
from rlsteps.contract.run_files import CHECKPOINTS_DIR, METRICS_FILE, read_metrics
from rlsteps.engine.algorithms.recipe import Recipe
from rlsteps.engine.checkpoints.finite import refuse_non_finite
from rlsteps.engine.checkpoints.integrity import DAMAGED_PREFIX, set_aside_damaged
from rlsteps.engine.checkpoints.resume import CheckpointError, CheckpointManager, restore_rng_state
from rlsteps.engine.checkpoints.rewind import rewind_records
from rlsteps.engine.checkpoints.train_state import read_train_state
from rlsteps.engine.device import compile_cache, resolve_device
from rlsteps.engine.distributed import (
    SINGLE,
    World,
    join,
    reduce_max,
)
from rlsteps.engine.generation.backend_choice import (
    backend_name,
    build_backend,
    engine_checkpoint,
    processes_on_this_node,
    vllm_start,
)
from rlsteps.engine.generation.beside import BESIDE_STATE, InFlight, in_flight_from_state, rollouts_beside
from rlsteps.engine.generation.rollouts import Sampler
from rlsteps.engine.generation.sizing import check_rollout_fits, rollout_shape
from rlsteps.engine.inputs.data import RunPrompts, load_run_prompts, steps_per_epoch
from rlsteps.engine.policy.lora import apply_lora, has_adapters
from rlsteps.engine.policy.model import load_policy
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler
from rlsteps.engine.policy.parallel import (
    Precision,
    full_state_on_main,
    place_policy,
    reference_copy,
    unsharded_copy,
)
from rlsteps.engine.records.metrics import MetricsWriter
from rlsteps.engine.records.progress import TrainingProgress
from rlsteps.engine.records.reward_hacking import RECORD_FILE, HackingWatch, Remedies
from rlsteps.engine.records.samples import SampleLog
from rlsteps.engine.records.throughput import (
    peak_flops,
)
from rlsteps.engine.records.trackers import open_trackers
from rlsteps.engine.rewards.functions import FunctionScorer
from rlsteps.engine.rewards.scores import RewardSource
from rlsteps.engine.run import signals
from rlsteps.engine.run.step import Counters, StepRun
from rlsteps.engine.run.update import PolicyUpdate

log = logging.getLogger(__name__)
step_log = logging.getLogger("rlsteps.steps")  # one line per step, for train.log (the worker keeps it off the terminal)


@dataclass
class RunResult:
    counters: Counters
    model: torch.nn.Module
    tokenizer: object


def train(
    cfg: RecipeConfig,
    recipe: Recipe,
    rewards: RewardSource | None,
    run_dir: Path,
    say: Callable[[str], None] = print,
    run_prompts: RunPrompts | None = None,
    world: World = SINGLE,
    at_last_record: Callable[[], None] | None = None,
) -> RunResult:
    """run_prompts: the prompts already loaded and measured (the worker does it before the policy loads); else
    they are loaded here, with the policy's tokenizer. rewards: the main process's source (None elsewhere).
    at_last_record: called once the last step's metrics are logged, before its checkpoint (the worker's plotting
    process draws them then, beside the checkpoint and the output). Every process of `world` calls train; the
    result's model is whole on the main process only."""
    signals.checkpointed(None)  # this run's, once it resumes from or writes one
    try:
        with contextlib.ExitStack() as cleanup:  # what the run made for itself, removed however it ends
            return _train(cleanup, cfg, recipe, rewards, run_dir, say, run_prompts, world, at_last_record)
    except (KeyboardInterrupt, signals.Terminated) as stopping:  # a signal unwound it at once: say what is kept
        if signals.unwinding_signal() is None:  # not the worker's handlers (Ctrl-C in a notebook): as it came
            raise
        raise signals.unwound(signals.unwinding_signal()) from stopping
    except OSError as error:  # a write that met a full disk (each writer has undone its part)
        if signals.unwinding_signal() is not None:  # cut short by the signal that has the run unwinding
            raise signals.unwound(signals.unwinding_signal(), _first_line(error)) from error
        if not is_disk_full(error):
            raise
        need = CheckpointManager(run_dir / CHECKPOINTS_DIR).needed_bytes() or None
        raise disk_full(run_dir, need=need, what="the next checkpoint") from error
    except Exception as error:  # what a signal's unwinding raised is its consequence: said with what is kept
        if signals.unwinding_signal() is None:
            raise
        raise signals.unwound(signals.unwinding_signal(), _first_line(error)) from error


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _train(
    cleanup: contextlib.ExitStack,
    cfg: RecipeConfig,
    recipe: Recipe,
    rewards: RewardSource | None,
    run_dir: Path,
    say: Callable[[str], None],
    run_prompts: RunPrompts | None,
    world: World,
    at_last_record: Callable[[], None] | None,
) -> RunResult:
    device = join(world, resolve_device(cfg.run.device))
    precision = Precision.named(cfg.run.dtype)
    peak_flops(device, precision.compute)  # a malformed RLSTEPS_PEAK_TFLOPS stops the run now, not after a step
    checkpoints = CheckpointManager(
        run_dir / CHECKPOINTS_DIR,
        keep_last=cfg.checkpoint.keep_last,
        keep_top_k=cfg.checkpoint.keep_top_k,
        metric=cfg.checkpoint.metric,
    )
    set_aside_damaged(checkpoints, cfg.checkpoint.start_over_if_damaged, world, log.warning)  # before any is read
    checkpoints.check_room(world)  # room for a checkpoint like the latest: before the policy loads
    initial, tokenizer = load_policy(cfg.inputs.policy, device="cpu", dtype=torch.float32)
    check_rollout_fits(rollout_shape(cfg), initial.config)
    sampler_name = backend_name(cfg.rollout.backend, device, processes_on_this_node())
    engine_dir = (
        cleanup.enter_context(engine_checkpoint(cfg.inputs.policy, initial, tokenizer, run_dir, world))
        if sampler_name == "vllm"
        else None
    )  # written before the policy is sharded (and before adapters, so vLLM starts from the base)
    lora = cfg.train.lora.enabled
    if lora:  # the reference is the base with the adapters off: no copy
        initial = apply_lora(initial, cfg.train.lora, cfg.seed)
    checkpoints.size_hint = _checkpoint_size(initial)
    checkpoints.check_room(world)  # before the first checkpoint: room for the estimate, before anything is written
    reference = (
        reference_copy(initial, world, device, precision, cfg.run.offload_reference)
        if recipe.needs_reference and not lora
        else None
    )  # the initial policy, frozen; taken before the policy moves, so a resume never holds three copies
    model = place_policy(initial, world, device, precision, cfg.train.activation_checkpointing)
    run_prompts = run_prompts or load_run_prompts(cfg, tokenizer)
    prompts, val_prompts = run_prompts.train, run_prompts.validation
    reward_functions = [FunctionScorer.load(name, spec) for name, spec in cfg.validation.reward_functions.items()]
    total_steps = planned_steps(cfg, len(prompts), say)

    optimizer, scheduler = _optimizer_and_schedule(cfg, recipe, model, total_steps)
    counters, in_flight = _resume(checkpoints, model, optimizer, scheduler, world, say)
    # the records of what came after the checkpoint (a stopped run's later steps) go: they are made again
    rewind_records(run_dir, counters.step if checkpoints.latest() else None, records=world.is_main)
    beside = bool(cfg.rollout.max_age_steps)  # rollouts drawn k steps ahead, in a process of their own
    backend = (  # beside training, the process draws the rollouts and the built-in sampler here the validation's
        build_backend("builtin", cfg, model, tokenizer, device, precision.compute, None, say, cleanup, "validation")
        if beside
        else build_backend(sampler_name, cfg, model, tokenizer, device, precision.compute, engine_dir, say, cleanup)
    )
    if cfg.train.compile:
        say(
            "train.compile: the policy's forward compiles at the first update and once more when its shapes first "
            f"change, tens of seconds each (cached in {compile_cache()} for later runs)"
        )
    sampler = Sampler(tokenizer, cfg.rollout, backend)
    if beside:
        start = (
            vllm_start(cfg, model, tokenizer, precision.compute, engine_dir, device, beside=True)
            if sampler_name == "vllm"
            else None
        )
        sampler = rollouts_beside(cfg, sampler, model, prompts, counters.step, device, in_flight, start)
        cleanup.callback(sampler.close)
    run = StepRun(
        cfg,
        recipe,
        rewards,
        model,
        tokenizer,
        reference,
        checkpoints,
        sampler,
        counters,
        device,
        PolicyUpdate(model, optimizer, scheduler, recipe, cfg.train, device, precision, world),
        precision=precision,
        world=world,
        say=say,
        reward_functions=reward_functions,
    )
    with contextlib.ExitStack() as outputs:
        metrics, progress = _main_outputs(outputs, cfg, run_dir, run, total_steps, counters.step)
        if counters.step == 0 and val_prompts:
            metrics.log(0, run.validate(val_prompts))
        outputs.enter_context(signals.stops_at_step_end())  # SIGTERM/SIGINT: checkpoint at the step's end, stop
        while counters.step < total_steps:
            step_metrics = run.step(prompts)
            step_metrics.update(sampler.step_figures())
            if val_prompts and cfg.validation.interval and counters.step % cfg.validation.interval == 0:
                step_metrics.update(run.validate(val_prompts))
            metrics.log(counters.step, step_metrics)
            if counters.step == total_steps and at_last_record is not None:
                at_last_record()
            progress.update(counters.step, step_metrics)
            step_log.info("step %d/%d %s", counters.step, total_steps, _step_line(step_metrics))
            run.stop_if_not_learning(step_metrics)
            # read once (the signal may arrive at any moment), and on any process: all of them checkpoint
            requested = bool(reduce_max(world, float(signals.checkpoint_requested())))
            stop = int(reduce_max(world, float(signals.stop_requested() or 0)))
            if (
                requested
                or stop
                or counters.step == total_steps
                or (cfg.checkpoint.interval and counters.step % cfg.checkpoint.interval == 0)
            ):
                _refuse_non_finite_step(run, checkpoints, world)
                run.save(step_metrics)
                signals.checkpointed(counters.step)
            if stop:
                raise signals.stopped(counters.step, stop)
            if requested and counters.step < total_steps:
                raise signals.CheckpointRequested(
                    f"checkpoint written at step {counters.step} of {total_steps}, as asked (SIGUSR1: the job's "
                    "time limit is near); run again, or let the requeued job resume from it"
                )
    return RunResult(counters=counters, model=_whole_on_main(run.model, cfg, world), tokenizer=tokenizer)


def _resume(
    checkpoints, model, optimizer, scheduler, world: World, say: Callable[[str], None]
) -> tuple[Counters, dict[int, InFlight]]:
    """The counters to start from, the latest checkpoint's, its weights and optimizer state read in place; and the
    rollouts it holds that were drawn beside training and not yet trained on."""
    latest = checkpoints.latest()
    if latest is None:
        return Counters(), {}
    loaded = checkpoints.load(latest)
    try:
        if loaded.policy_dir.name == STATE_DIR:
            read_train_state(model, optimizer, loaded.policy_dir)
        else:
            _read_policy_layout(loaded, model, optimizer, world)
    except CheckpointError:
        raise
    except (RuntimeError, ValueError, OSError, EOFError) as error:  # damage its sizes do not show (bytes changed)
        cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CheckpointError(
            f"checkpoint {latest} cannot be read ({type(error).__name__}: {cause}) (fix: move it aside, e.g. mv "
            f"{latest} {latest.with_name(DAMAGED_PREFIX + latest.name)}, and rerun to resume from the one before it)"
        ) from error
    aside = f"mv {latest} {latest.with_name(DAMAGED_PREFIX + latest.name)}"
    fix = f"move it aside ({aside}) and rerun to resume from the one before it"
    refuse_non_finite(model, f"in checkpoint {latest}", fix, world)
    scheduler.load_state_dict(loaded.trainer_state["scheduler"])
    restore_rng_state(loaded.trainer_state["rng"])
    counters = Counters(**{k: loaded.info[k] for k in ("step", "consumed_samples", "optimizer_steps", "epoch")})
    written_by = loaded.trainer_state.get("world_size", 1)
    on = f"; written by {written_by} process(es), read by {world.size}" if written_by != world.size else ""
    say(f"resuming from {latest} (step {counters.step}, {counters.consumed_samples} prompts consumed{on})")
    signals.checkpointed(counters.step)
    return counters, in_flight_from_state(loaded.trainer_state.get(BESIDE_STATE))


def _refuse_non_finite_step(run: StepRun, checkpoints: CheckpointManager, world: World) -> None:
    """A step whose update left a weight NaN or infinite stops before its checkpoint: none is written or pruned."""
    latest = checkpoints.latest()
    resume = f"a rerun resumes from {latest.name}, the last intact checkpoint" if latest else "no checkpoint was kept"
    fix = f"lower train.lr or train.max_grad_norm; {resume}"
    refuse_non_finite(run.model, f"after step {run.counters.step}, before its checkpoint", fix, world)


def _checkpoint_size(model: torch.nn.Module) -> int:
    """What a checkpoint of the policy takes before one exists to measure: its fp32 weights (the adapters alone,
    with LoRA) and AdamW's two fp32 moments of every trained parameter (the loop keeps both in fp32 whatever the
    compute dtype)."""
    trained = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    weights = trained if has_adapters(model) else sum(t.numel() * 4 for t in model.state_dict().values())
    return checkpoint_estimate(weights, trained)


def _read_policy_layout(loaded, model, optimizer, world: World) -> None:
    """A checkpoint of the one-process layout (policy/ in Hugging Face form, the optimizer in trainer_state.pt)."""
    if world.is_distributed:
        raise CheckpointError(
            f"{loaded.policy_dir.parent} holds a one-process checkpoint (policy/, no {STATE_DIR}/); resume it "
            "with one process, which writes the next checkpoint in the layout any number of processes reads"
        )
    saved, _ = load_policy(loaded.policy_dir, device="cpu", dtype=torch.float32)
    model.load_state_dict(saved.state_dict())
    optimizer.load_state_dict(loaded.trainer_state["optimizer"])


def _whole_on_main(model: torch.nn.Module, cfg: RecipeConfig, world: World) -> torch.nn.Module | None:
    """The trained policy as one plain model on the main process (gathered from the shards of several)."""
    if not world.is_distributed:
        return model
    state = full_state_on_main(model, world)
    if not world.is_main:
        return None
    return unsharded_copy(
        cfg.inputs.policy, state, lora=cfg.train.lora if cfg.train.lora.enabled else None, seed=cfg.seed
    )


def _main_outputs(stack, cfg: RecipeConfig, run_dir: Path, run: StepRun, total_steps: int, initial_step: int):
    """metrics.jsonl, samples.jsonl and the progress bar: the main process's; the others write nothing."""
    if not run.world.is_main:
        return _Nowhere(), _Nowhere()
    metrics = stack.enter_context(_metrics_writer(cfg, run_dir))
    run.samples = stack.enter_context(SampleLog(run_dir / "samples.jsonl"))
    if cfg.logging.reward_hacking.enabled:
        run.watch = stack.enter_context(contextlib.closing(_hacking_watch(cfg, run.recipe, run_dir)))
    progress = stack.enter_context(TrainingProgress(total=total_steps, initial=initial_step))
    run.progress = progress  # validation draws its own beside it
    return metrics, progress


def _hacking_watch(cfg: RecipeConfig, recipe: Recipe, run_dir: Path) -> HackingWatch:
    """The run's watch for reward hacking, knowing the figures of the steps it resumes after."""
    history = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
    remedies = Remedies(recipe.kl_penalty_key, cfg.reward_terms)
    functions = [f"val/{name}" for name in cfg.validation.reward_functions]
    return HackingWatch(cfg.logging.reward_hacking, remedies, run_dir / RECORD_FILE, history, functions)


class _Nowhere:
    """Where a process other than the main one logs metrics and progress."""

    def log(self, *args, **kwargs) -> None:
        pass

    def update(self, *args, **kwargs) -> None:
        pass


def planned_steps(cfg: RecipeConfig, num_prompts: int, say: Callable[[str], None]) -> int:
    """RL steps this run makes: train.max_steps, unless train.max_epochs (when set) ends the data first; said at
    the start either way, so a cut is never silent."""
    per_epoch = steps_per_epoch(num_prompts, cfg.rollout.prompts_per_step)
    t = cfg.train
    epochs = math.ceil(t.max_steps / per_epoch)
    if t.max_epochs is None or t.max_epochs >= epochs:
        say(
            f"{t.max_steps} steps (train.max_steps), {_epochs(t.max_steps, per_epoch)}: {num_prompts} prompts at "
            f"{cfg.rollout.prompts_per_step} per step make {per_epoch} steps an epoch"
        )
        return t.max_steps
    total = t.max_epochs * per_epoch
    log.warning(
        "running %d steps, not train.max_steps=%d: train.max_epochs=%d over %d prompts at %d per step gives %d "
        "steps per epoch; set train.max_epochs=%d (or null) to run them all",
        total, t.max_steps, t.max_epochs, num_prompts, cfg.rollout.prompts_per_step, per_epoch, epochs,
    )  # fmt: skip
    return total


def _epochs(steps: int, per_epoch: int) -> str:
    """How much of the data `steps` go through, in words: "half of one epoch", "3/16 of one epoch", "2.5 epochs"."""
    if steps < per_epoch:
        return f"{'half' if 2 * steps == per_epoch else f'{steps}/{per_epoch}'} of one epoch"
    epochs = steps / per_epoch
    return "one epoch" if epochs == 1 else f"{epochs:.3g} epochs"


def _step_line(metrics: dict[str, float]) -> str:
    keys = ("train/reward", "train/loss", "train/grad_norm", "train/optimizer_steps", "timers/step")
    shown = [f"{k.split('/')[1]}={metrics[k]:.4g}" for k in keys if isinstance(metrics.get(k), int | float)]
    return " ".join(shown + [f"{k}={v:.4g}" for k, v in metrics.items() if k.startswith("val/")])


def _optimizer_and_schedule(cfg: RecipeConfig, recipe: Recipe, model: torch.nn.Module, total_steps: int):
    """AdamW and a schedule over every optimizer step of the run (several per RL step when batches are split)."""
    per_rl_step = math.ceil(recipe.train_rows_per_step() / cfg.train.global_batch_size)
    optimizer = build_optimizer(model, cfg.train.optimizer_lr, cfg.train.weight_decay, tuple(cfg.train.betas))
    scheduler = build_scheduler(
        optimizer,
        warmup_steps=cfg.train.warmup_steps,
        schedule=cfg.train.schedule,
        total_steps=max(1, total_steps * per_rl_step),
        min_lr_ratio=cfg.train.min_lr_ratio,
    )
    return optimizer, scheduler


def _metrics_writer(cfg: RecipeConfig, run_dir: Path) -> MetricsWriter:
    return MetricsWriter(run_dir / METRICS_FILE, trackers=open_trackers(cfg.logging, run_dir))
