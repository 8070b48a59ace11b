"""Which backend samples a run's rollouts (rollout.backend), and building it once the policy is in place."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlsteps.engine.device import compile_cache
from rlsteps.engine.distributed import World, barrier, from_main
from rlsteps.engine.generation.backend import GenerationBackend, eos_token_ids
from rlsteps.engine.generation.builtin import BuiltinBackend
from rlsteps.engine.generation.sizing import auto_generation_batch_size, rollout_shape
from rlsteps.engine.generation.vllm_backend import VllmBackend, check_vllm_runs, vllm_installed

ENGINE_MODEL_PREFIX = ".rollout-model-"  # a Megatron policy in Hugging Face form, for vLLM to start from


def backend_name(requested: str, device: torch.device, processes_on_node: int) -> str:
    """builtin or vllm: auto is vLLM on a GPU where it is installed and it can run (on a CPU its start outweighs
    its speed). vLLM's in-process engine puts itself on a node's first GPU, so on GPUs it runs with one training
    process per node; asked for with more, the run stops here with what to change."""
    shares_a_gpu = device.type == "cuda" and processes_on_node > 1
    if requested == "auto":
        return "vllm" if device.type == "cuda" and vllm_installed() and not shares_a_gpu else "builtin"
    if requested == "vllm" and shares_a_gpu:
        raise ValueError(
            f"rollout.backend=vllm runs on a node's first GPU, and this node has {processes_on_node} training "
            "processes: run one process per node (nprocs_per_node: 1) or rollout.backend=builtin"
        )
    return requested


def processes_on_this_node() -> int:
    """The training processes on this node (torchrun's LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


@contextlib.contextmanager
def engine_checkpoint(policy: str, initial: nn.Module, tokenizer: Any, run_dir: Path, world: World) -> Iterator[Path]:
    """The Hugging Face directory vLLM builds its model from: the policy input when it is one; else the initial
    policy written there by the main process (before it is sharded), removed when the run ends."""
    if (Path(policy) / "config.json").is_file():
        yield Path(policy)
        return
    written = None
    if world.is_main:
        for stale in run_dir.glob(ENGINE_MODEL_PREFIX + "*"):  # left by a run that was killed
            shutil.rmtree(stale, ignore_errors=True)
        written = Path(tempfile.mkdtemp(dir=run_dir, prefix=ENGINE_MODEL_PREFIX))
        initial.save_pretrained(written)
        tokenizer.save_pretrained(written)
    written = Path(from_main(world, str(written) if written else None))
    try:
        yield written
    finally:
        barrier(world)
        if world.is_main:
            shutil.rmtree(written, ignore_errors=True)


def build_backend(
    name: str,
    cfg: Any,
    model: nn.Module,
    tokenizer: Any,
    device: torch.device,
    compute_dtype: torch.dtype,
    engine_dir: Path | None,
    say: Callable[[str], None],
    cleanup: contextlib.ExitStack,
    role: str = "rollouts",
) -> GenerationBackend:
    """The run's backend, holding the policy's current weights; says which and how it is sized, as what samples
    `role`. What it must give back before the run ends goes on `cleanup`."""
    shape = rollout_shape(cfg)
    if name == "builtin":
        rows = cfg.rollout.generation_batch_size or auto_generation_batch_size(
            model.config, shape, _free_bytes(device), torch.finfo(compute_dtype).bits // 8
        )
        builtin = BuiltinBackend(tokenizer, rows)
        compiled = builtin.decode.for_device(device).compile
        said = f", its decode step compiled at the first rollouts (cached in {compile_cache()})" if compiled else ""
        say(f"{role}: the built-in sampler, {rows} rows per batch{said}")
        return builtin
    backend = vllm_start(cfg, model, tokenizer, compute_dtype, engine_dir, device)(device=device)
    cleanup.callback(backend.close)
    backend.load_weights(model)  # a resumed run's weights, not the checkpoint vLLM started from
    say(f"rollouts: vLLM in process ({str(compute_dtype).removeprefix('torch.')}, up to {shape.tokens} tokens a row)")
    return backend


def vllm_start(
    cfg: Any,
    model: nn.Module,
    tokenizer: Any,
    compute_dtype: torch.dtype,
    engine_dir: Path,
    device: torch.device,
    beside: bool = False,
) -> functools.partial:
    """VllmBackend with the run's arguments but the device (picklable: a process of its own can start it). beside:
    for a process that samples while the policy trains, which never sleeps; whether vLLM runs the policy on a device
    of `device`'s kind is checked here first, where a refusal is one line (the engine's start checks it itself)."""
    if beside:
        check_vllm_runs(engine_dir, device)
    settings = cfg.rollout.vllm.model_copy(update={"sleep": False}) if beside else cfg.rollout.vllm
    return functools.partial(
        VllmBackend,
        engine_dir,
        settings,
        max_model_len=rollout_shape(cfg).tokens,
        dtype=compute_dtype,
        eos_token_ids=eos_token_ids(model, tokenizer),
        seed=cfg.seed,
    )


def _free_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free
