"""Rollouts beside training (rollout.max_age_steps = k > 0): a sampler in a process of its own (the built-in sampler,
or a vLLM engine with rollout.backend=vllm) draws step s's rollouts with the policy as it was after step s - k, while
the trainer trains the steps between.

The lag is fixed. After step n the trainer sends its weights (version n + 1: the RL steps they have seen) and asks
for step n + 1 + k's rollouts; the process answers requests and takes weights in the order they were sent, so
step s's rollouts always come from version max(0, s - k), and a rollout is at most k steps old (exactly k once the
first k steps are past). Rows are drawn from their own seeds (generation.rollouts), so what a step trains on is
decided by (seed, step, weights version) alone: a resumed run draws what the run never stopped would have.

A checkpoint taken when n steps are done holds the rollouts of steps n .. n + k - 1, which older weights drew (the
process is waited for); the checkpoint's own weights draw step n + k's. With both, a resume is exact. The trainer's
log-probs of a rollout differ from the sampler's by k steps of training: the importance weights (train.
truncated_importance_sampling, required here as NeMo-RL's asynchronous loop requires its correction) weigh each
token by min(p_trainer / p_sampler, cap).

The process ignores the signals a scheduler sends the job (the trainer answers them with a checkpoint) and ends
when the trainer closes it or its pipe closes (the trainer died).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlsteps.contract.prompts import Prompt
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.generation.backend import Generation, SamplingParams
from rlsteps.engine.generation.rollouts import (
    Sampler,
    build_rollout_batch,
    rollout_rows,
    rollout_seeds,
    step_seed,
)

log = logging.getLogger(__name__)
IGNORED_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")
PARENT_CHECK_S = 2.0  # between the rollout process's looks at whether the trainer is still alive, while idle
ANSWER_TIMEOUT_S = 5.0  # between looks at whether the process is still alive while waiting for an answer
BESIDE_STATE = "rollouts_beside"  # the checkpoint's trainer-state entry: {step: (Generation fields, version)}


class GenerationProcessDied(RuntimeError):
    """The rollout process ended or failed; the message has its error."""


@dataclass
class InFlight:
    """Rollouts drawn ahead of training, and the weights' version that drew them."""

    generation: Generation
    version: int  # the RL steps the weights that drew it had seen
    seconds: float = 0.0  # the rollout process's time drawing it (0: restored from a checkpoint)


class GenerationProcess:
    """A sampler in a spawned process: weights and requests in, generations out, all in order.

    `make_sampler` builds the process's sampler there (BuiltinProcessSampler, VllmProcessSampler; picklable: a
    functools.partial of one). Weights go over a torch.multiprocessing queue as shared-memory tensors; each version
    is kept alive here until the process says it has loaded it.
    """

    def __init__(self, make_sampler: Callable[[], Any], threads: int) -> None:
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        self._requests, self._answers = context.Queue(), context.Queue()
        self._process = context.Process(
            target=serve,
            args=(self._requests, self._answers, make_sampler, threads),
            name="rlsteps-rollouts",
            daemon=True,
        )
        self._process.start()
        self._unloaded: dict[int, dict[str, torch.Tensor]] = {}  # versions sent, not yet loaded: kept alive
        self._ready: dict[int, tuple[Generation, float]] = {}

    @classmethod
    def builtin(cls, model: nn.Module, tokenizer: Any, batch_rows: int, threads: int, device: str) -> GenerationProcess:
        """The built-in sampler on `device`, with a model of the policy's config and dtype."""
        dtype = next(model.parameters()).dtype
        return cls(
            functools.partial(BuiltinProcessSampler, _underlying_config(model), tokenizer, batch_rows, device, dtype),
            threads,
        )

    def send_weights(self, model: nn.Module, version: int) -> None:
        weights = {
            name: tensor.detach().to("cpu", copy=True).share_memory_() for name, tensor in sampled_weights(model)
        }
        self._unloaded[version] = weights
        self._requests.put(("weights", version, weights))

    def ask(self, step: int, prompt_token_ids: list[list[int]], params: SamplingParams, seeds: list[int]) -> None:
        self._requests.put(("generate", step, prompt_token_ids, params, seeds))

    def answer(self, step: int) -> tuple[Generation, float]:
        """Step `step`'s generation and the seconds it took, waited for (answers of other steps kept until asked)."""
        while step not in self._ready:
            self._take_one()
        return self._ready.pop(step)

    def close(self) -> None:
        if self._process.is_alive():
            self._requests.put(("stop",))
            self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._unloaded.clear()

    def _take_one(self) -> None:
        try:
            kind, key, value = self._answers.get(timeout=ANSWER_TIMEOUT_S)
        except queue.Empty:
            if not self._process.is_alive():
                raise GenerationProcessDied(
                    f"the rollout process ended (exit {self._process.exitcode}) before answering: killed, or out of "
                    "memory (rollout.max_age_steps=0 samples in the training process instead)"
                ) from None
            return
        if kind == "loaded":
            self._unloaded.pop(key, None)
        elif kind == "generated":
            self._ready[key] = value
        else:
            raise GenerationProcessDied(f"the rollout process failed ({key}):\n{value}")


def serve(requests, answers, make_sampler: Callable[[], Any], threads: int) -> None:
    """The rollout process: its sampler built, then requests answered in order."""
    for name in IGNORED_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    torch.set_num_threads(threads)
    try:
        sampler = make_sampler()
    except Exception:  # the trainer raises it, with this traceback
        answers.put(("failed", "starting its sampler", traceback.format_exc()))
        return
    trainer = multiprocessing.parent_process()
    while True:
        try:
            message = requests.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if trainer is not None and not trainer.is_alive():  # the trainer was killed: nothing will ask again
                return
            continue
        if message[0] == "stop":
            return
        try:
            if message[0] == "weights":
                _, version, weights = message
                sampler.load(weights)
                answers.put(("loaded", version, None))
            else:
                _, step, prompt_token_ids, params, seeds = message
                started = time.perf_counter()
                generation = sampler.generate(prompt_token_ids, params, seeds)
                answers.put(("generated", step, (generation, time.perf_counter() - started)))
        except Exception:  # the trainer raises it, with this traceback
            loading = message[0] == "weights"
            doing = f"loading the weights of version {message[1]}" if loading else f"drawing step {message[1] + 1}"
            answers.put(("failed", doing, traceback.format_exc()))
            return


class BuiltinProcessSampler:
    """The rollout process's built-in sampler, on a model of the policy's config whose weights it is sent."""

    def __init__(self, config: Any, tokenizer: Any, batch_rows: int, device: str, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        from rlsteps.engine.generation.builtin import BuiltinBackend

        self.model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
        self.backend = BuiltinBackend(tokenizer, batch_rows)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        load_sampled_weights(self.model, weights)

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams, seeds: list[int]) -> Generation:
        return self.backend.generate(self.model, prompt_token_ids, params, seeds)


class VllmProcessSampler:
    """The rollout process's vLLM engine (generation.vllm_backend.VllmBackend), started there by `start` (which takes
    the device) and sent each version's weights as the colocated engine is. vLLM's in-process engine takes the first
    GPU it sees, so on `cuda:N` the process sees that GPU alone (CUDA_VISIBLE_DEVICES, set before CUDA starts)."""

    def __init__(self, start: Callable[..., Any], device: str) -> None:
        where = torch.device(device)
        if where.type == "cuda" and where.index:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(where.index + 1)]
            os.environ["CUDA_VISIBLE_DEVICES"] = ids[where.index]
            where = torch.device("cuda", 0)
        self.backend = start(device=where)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        self.backend.load_named_weights(weights.items())

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams, seeds: list[int]) -> Generation:
        return self.backend.generate(None, prompt_token_ids, params, seeds)


def sampled_weights(model: nn.Module):
    """The policy's weights as its architecture names them (LoRA's merged in, a compiled module's prefix gone)."""
    from rlsteps.engine.generation.vllm_backend import policy_weights

    for name, tensor in policy_weights(model):
        yield name.replace("_orig_mod.", ""), tensor


def load_sampled_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Every parameter of `model` from `weights` (a tied one under the name it is sent by); a ValueError naming
    what is missing or unknown."""
    parameters = dict(model.named_parameters())
    unknown = sorted(set(weights) - set(parameters))
    missing = sorted(set(parameters) - set(weights))
    if unknown or missing:
        raise ValueError(
            f"the rollout process's model and the policy differ: unknown {unknown[:3]}, missing {missing[:3]}"
        )
    with torch.no_grad():
        for name, tensor in weights.items():
            parameters[name].copy_(tensor)


def _underlying_config(model: nn.Module) -> Any:
    from rlsteps.engine.policy.model import underlying_model

    return underlying_model(model).config


class BesideSampler(Sampler):
    """The loop's Sampler with each step's rollouts from the rollout process, k steps ahead of training (see the
    module doc); validation samples here, from the policy as it is."""

    def __init__(
        self,
        sampler: Sampler,
        process: GenerationProcess,
        max_age: int,
        seed: int,
        prompts_of: Callable[[int], list[Prompt]],
    ) -> None:
        super().__init__(sampler.tokenizer, sampler.rollout, sampler.backend)
        self.process, self.max_age, self.seed, self.prompts_of = process, max_age, seed, prompts_of
        self._versions: dict[int, int] = {}  # step -> the version asked to draw it
        self._restored: dict[int, InFlight] = {}
        self._figures: dict[str, float] = {}

    def start(self, model: nn.Module, next_step: int, restored: dict[int, InFlight] | None = None) -> None:
        """The first k steps from `next_step` asked for (drawn by its weights), but those a checkpoint restored."""
        self._restored = dict(restored or {})
        missing = [s for s in range(next_step, next_step + self.max_age) if s not in self._restored]
        if missing:
            self.process.send_weights(model, next_step)
        for step in missing:
            self._ask(step, max(0, step - self.max_age))

    def rollouts(self, model, prompts, n, seed, prompt_positions=None) -> RolloutBatch:
        """Step seed[1]'s rollouts, drawn ahead; the weights as they are now sent to draw the step k later."""
        run_seed, step = seed
        if (run_seed, n) != (self.seed, self.rollout.num_rollouts_per_prompt) or [p.id for p in prompts] != [
            p.id for p in self.prompts_of(step)
        ]:
            raise RuntimeError(f"step {step + 1} asked for other rollouts than those drawn beside training")
        self.process.send_weights(model, step)
        self._ask(step + self.max_age, step)
        drawn = self._restored.pop(step, None) or self._answer(step)
        rows, token_ids = rollout_rows(prompts, self.tokenizer, n)
        batch = build_rollout_batch(rows, token_ids, drawn.generation, self.tokenizer)
        self._figures = {"rollout/age": float(step - drawn.version)}
        if drawn.seconds:
            tokens = float(batch.response_lengths.sum())
            self._figures.update(
                {"perf/generation_tokens_per_s": tokens / drawn.seconds, "timers/generation": drawn.seconds}
            )
        return batch

    def step_figures(self) -> dict[str, float]:
        """The last step's: its rollouts' age, and the rollout process's own generation time and rate."""
        return dict(self._figures)

    def checkpoint_state(self, next_step: int) -> dict[str, Any]:
        """What a checkpoint before step `next_step` keeps: the rollouts older weights drew (waited for)."""
        kept = {s: d for s, d in self._restored.items() if s < next_step + self.max_age}
        for step in sorted(s for s in self._versions if s < next_step + self.max_age and s not in kept):
            kept[step] = self._answer(step)
        self._restored.update(kept)
        return {BESIDE_STATE: in_flight_state(kept)}

    def close(self) -> None:
        self.process.close()

    def _ask(self, step: int, version: int) -> None:
        prompts, n = self.prompts_of(step), self.rollout.num_rollouts_per_prompt
        _, token_ids = rollout_rows(prompts, self.tokenizer, n)
        seeds = rollout_seeds(step_seed(self.seed, step), range(len(prompts)), n)
        self.process.ask(step, token_ids, self.sampling_params(), seeds)
        self._versions[step] = version

    def _answer(self, step: int) -> InFlight:
        if step not in self._versions:
            raise RuntimeError(f"step {step + 1}'s rollouts were never asked for")
        generation, seconds = self.process.answer(step)
        return InFlight(generation, self._versions.pop(step), seconds)


def in_flight_state(kept: dict[int, InFlight]) -> dict[int, dict[str, Any]]:
    """In-flight rollouts as a checkpoint's trainer state holds them."""
    return {
        step: {
            "response_ids": d.generation.response_ids,
            "is_end": d.generation.is_end,
            "logprobs": d.generation.logprobs,
            "version": d.version,
        }
        for step, d in kept.items()
    }


def in_flight_from_state(state: dict[int, dict[str, Any]] | None) -> dict[int, InFlight]:
    """A checkpoint's in-flight rollouts (in_flight_state) back as they were drawn."""
    return {
        int(step): InFlight(Generation(s["response_ids"], s["is_end"], s["logprobs"]), s["version"])
        for step, s in (state or {}).items()
    }


def rollouts_beside(
    cfg: Any,
    sampler: Sampler,
    model: nn.Module,
    prompts: list[Prompt],
    next_step: int,
    device: torch.device,
    restored: dict[int, InFlight],
    vllm_start: Callable[..., Any] | None = None,
) -> BesideSampler:
    """The loop's sampler for a run at `next_step` with rollouts beside training (its in-flight rollouts `restored`
    from the checkpoint): the rollout process started with the policy's weights. On a CPU the cores are split
    between the two processes; on a GPU it takes the second device where there is one. vllm_start: the process
    samples with vLLM, started by it (VllmBackend's arguments but the device); None: the built-in sampler."""
    from rlsteps.engine.generation.sizing import CPU_BATCH
    from rlsteps.engine.inputs.data import prompt_indices

    per_step = cfg.rollout.prompts_per_step

    def prompts_of(step: int) -> list[Prompt]:
        indices, _ = prompt_indices(cfg.seed, step * per_step, per_step, len(prompts))
        return [prompts[i] for i in indices]

    threads, where = generation_resources(device)
    if vllm_start is None:
        batch_rows = cfg.rollout.generation_batch_size or CPU_BATCH
        process = GenerationProcess.builtin(model, sampler.tokenizer, batch_rows, threads, where)
    else:
        process = GenerationProcess(functools.partial(VllmProcessSampler, vllm_start, where), threads)
    beside = BesideSampler(sampler, process, cfg.rollout.max_age_steps, cfg.seed, prompts_of)
    beside.start(model, next_step, restored)
    log.info(
        "rollouts: drawn beside training up to %d step(s) ahead, by %s in a process of its own (%s); validation "
        "samples here, with the built-in sampler",
        cfg.rollout.max_age_steps,
        "the built-in sampler" if vllm_start is None else "vLLM",
        f"{threads} thread(s)" if where == "cpu" else where,
    )
    return beside


def generation_resources(device: torch.device) -> tuple[int, str]:
    """(threads, device) of the rollout process: half the cores (the trainer keeps the rest), or the second GPU
    where there is one, else the trainer's."""
    if device.type != "cuda":
        total = torch.get_num_threads()
        mine = max(1, total // 2)
        torch.set_num_threads(max(1, total - mine))
        return mine, "cpu"
    second = torch.cuda.device_count() > 1 and (device.index or 0) == 0
    return 1, "cuda:1" if second else str(device)
