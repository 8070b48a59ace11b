"""What a NeMo-RL job holds on each policy GPU, estimated from the policy's config.json when the job compiles, and a
config over the profile's `gpu_memory_gib` refused with its largest term named; pure but for that read.

The rules, each from the code that holds the memory (NeMo-RL v0.7.0; vLLM 0.20, which it pins):
- Parameters, counted from config.json as transformers builds a Llama-like decoder: the embedding, per layer q/k/v/o
  (grouped key-value heads; Qwen2's q/k/v biases, Qwen3's q/k norms), the gated MLP or the routed experts, their
  router and shared experts, two RMSNorms, the final norm, and the output layer unless tied.
- DTensor (models/automodel/setup.py, dtensor_policy_worker.py): the model is loaded in float32 ("fp32 master
  weights") and FSDP2 shards it over every policy GPU (dp x cp x tp; HSDP's dp_replicate_size copies); grads are
  kept like the parameters (reduce_dtype float32) and AdamW's exp_avg and exp_avg_sq too: 4 + 4 + 8 = 16 bytes a
  parameter, the mixed-precision Adam figure; FSDP2 gathers a layer (and the next, prefetched) in policy.precision.
  cpu_offload keeps all three on the CPU. With LoRA only the adapters have gradients and optimizer state.
- Megatron (models/megatron/setup.py): parameters in policy.precision and a gradient buffer (float32 with
  grad_reduce_in_fp32) on each tensor x pipeline shard; the distributed optimizer's float32 main parameters, main
  gradients (where the buffer is not float32) and Adam states sharded over the data-parallel ranks: Megatron-LM's
  table, 4 + 16/d bytes (bf16 grads), 6 + 12/d (fp32 grads), 8 + 8/d (fp32 parameters).
- Activations at one micro-batch (train_mb_tokens with packing or dynamic batching, else train_micro_batch_size x
  max_total_sequence_length), per token and layer in policy.precision. DTensor (transformers' modules, what torch's
  autograd saves): 8h (the norms' float32 copies, the residual) + 3 (q + kv) (before and after rotary, the
  attention's output) + 4 x the MLP width (gate, up, the activation, their product; the top-k experts' widths for
  MoE). Megatron (Transformer Engine's fused norm-linear and rotary; Korthikanti et al. 2022's count without
  dropout, with a gated MLP): 4h + 2 (q + kv) + 3 x the MLP width, every layer's worth on the first pipeline stage
  (1F1B keeps pp micro-batches in flight). The h terms split by tp only with sequence parallelism; with activation
  checkpointing a layer's input per layer and one layer recomputed. The logits: 3 float32 copies of tokens x
  vocabulary / tp at their peak (the logits, their log-softmax, its gradient): often the largest term.
- The colocated vLLM (algorithms/grpo.py, models/generation/vllm/vllm_worker.py): the engine starts first with
  enable_sleep_mode and claims gpu_memory_utilization x the GPU (vLLM's request_memory); refit_policy_generation
  offloads the optimizer (offload_before_refit), wakes vLLM's weights while the policy's are still on the GPU, then
  moves the policy to the CPU (offload_after_refit) and wakes the KV cache; finish_generation puts vLLM to sleep
  (level 1: weights to the CPU, KV cache dropped) before log-probs and training. So training, refit and generation
  alternate: the peak is the largest of the phases, never their sum.
- vLLM's KV cache (v1/worker/gpu_worker.py determine_available_memory, v1/core/kv_cache_utils.py): the share less
  the weights and the profiled peak; it must hold one request of max_model_len (cdiv(max_model_len, 16) blocks of
  2 x kv heads / tp x head_dim x dtype bytes a token and layer, plus the null block) or vLLM refuses to start.
Not counted: CUDA contexts, NCCL buffers, the refit's buffer (a fraction of what is free), fragmentation.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlsteps.dotted import get, put
from rlsteps.nemo_rl.environments import NemoRlConfigError, judge_gpus
from rlsteps.nemo_rl.memory_terms import (
    GIB,
    Parameters,
    Phase,
    Term,
    count_parameters,
    gib,
    policy_phases,
    vllm_fit,
)
from rlsteps.nemo_rl.model_shapes import Shape, read_shape
from rlsteps.nemo_rl.placement import COMPILED_JUDGE

__all__ = ["GIB", "Parameters", "Phase", "Term", "check_memory", "count_parameters", "estimate"]

VLLM = "policy.generation.vllm_cfg"
JUDGE_KWARGS = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.vllm_serve_kwargs"  # the user's keys
VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's CacheConfig.gpu_memory_utilization: the judge's server, unless set


@dataclass(frozen=True)
class Estimate:
    phases: tuple[Phase, ...]  # on each policy GPU; generation's own GPUs where it is not colocated
    kv: str  # what the policy's vLLM KV cache holds, said
    judge: Phase | None = None
    judge_kv: str = ""

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda phase: phase.bytes)


def estimate(master: dict[str, Any], shape: Shape, gpu_bytes: float | None) -> Estimate:
    """The phases of a compiled master config on one GPU, in bytes; `gpu_bytes` sizes vLLM's share (None: the
    share is said as a fraction)."""
    params = count_parameters(shape)
    phases, kv = policy_phases(master, shape, params, gpu_bytes)
    judge, judge_kv = _judge(master, gpu_bytes)
    return Estimate(phases=phases, kv=kv, judge=judge, judge_kv=judge_kv)


def check_memory(master: dict[str, Any], ref: str | None, gpu_memory_gib: float | None) -> list[str]:
    """The estimate as one note; a config over the stated GPU memory refused (NemoRlConfigError naming its largest
    term, with the mildest of the changes that shrink it with which it fits, else the strongest)."""
    shape, why = read_shape(ref)
    if shape is None or not shape.counted:
        reason = why or f"{shape.source if shape else ref}: not a Llama-like text decoder (MLA, Mamba, a vision tower)"
        return [f"no memory estimate per GPU: the policy's config.json is not read here ({reason})"]
    gpu = gpu_memory_gib * GIB if gpu_memory_gib else None
    found = estimate(master, shape, gpu)
    note = _said(found, gpu_memory_gib)
    if gpu is not None:
        _refuse_over(master, shape, found, gpu_memory_gib)
    return [note]


def _said(found: Estimate, stated: float | None) -> str:
    phases = "; ".join(phase.said() for phase in found.phases)
    judge = f"; the judge's GPUs: {found.judge.said()}, {found.judge_kv}" if found.judge else ""
    peak = found.peak
    head = "memory per GPU, estimated in GiB (training, refit and generation alternate: NeMo-RL sleeps vLLM)"
    if stated:
        tail = f"peak {gib(peak.bytes, 1)} ({peak.name}) of the profile's gpu_memory_gib {stated:g}"
    else:
        tail = (
            f"peak {gib(peak.bytes, 1)} ({peak.name}); the profile does not state gpu_memory_gib, so it is not "
            "checked against the GPUs (set it beside gpus_per_node)"
        )
    return f"{head}: {phases}; {found.kv}{judge}; {tail}"


REFUSES = "vLLM refuses"  # how a KV cache that cannot hold one request is said


def _refuse_over(master: dict[str, Any], shape: Shape, found: Estimate, stated: float) -> None:
    gpu = stated * GIB
    phases = [phase for phase in found.phases if phase.bytes > gpu]
    if phases:
        phase = max(phases, key=lambda p: p.bytes)
        term = phase.largest
        raise NemoRlConfigError(
            f"the job does not fit its GPUs: {phase.name} takes about {phase.bytes / GIB:.1f} GiB per GPU, over the "
            f"profile's gpu_memory_gib {stated:g} ({phase.said()}); the largest term is {term.name} "
            f"({term.bytes / GIB:.1f} GiB: {term.rule})",
            fix=None if term.changes else term.advice,
            changes=_fitting_change(master, shape, term, phase.name, gpu),
        )
    if found.kv.startswith(REFUSES):
        raise NemoRlConfigError(f"the policy's vLLM would not start: {found.kv}", changes=_kv_fix(master, shape, gpu))
    if found.judge_kv.startswith(REFUSES):
        raise NemoRlConfigError(f"the judge's vLLM would not start: {found.judge_kv}", changes=_judge_fix(master, gpu))


def _fitting_change(master: dict[str, Any], shape: Shape, term: Term, phase: str, gpu: float) -> dict[str, Any]:
    """Of the term's changes (mildest first), the first with which the phase fits, else the strongest."""
    if not term.changes:
        return {}
    for change in term.changes:
        trial = copy.deepcopy(master)
        for key, value in change.items():
            put(trial, key, value)
        phases, _ = policy_phases(trial, shape, count_parameters(shape), gpu)
        if all(p.bytes <= gpu for p in phases if p.name == phase):
            return dict(change)
    return dict(term.changes[-1])


def _utilization(now: float, starts: Callable[[float], bool]) -> float | None:
    """The smallest gpu_memory_utilization above `now`, in steps of 0.05 up to 0.95, with which vLLM starts."""
    return next((step / 20 for step in range(math.floor(now * 20) + 1, 20) if starts(step / 20)), None)


def _kv_fix(master: dict[str, Any], shape: Shape, gpu: float) -> dict[str, Any]:
    """The policy's vLLM: the gpu_memory_utilization with which one request fits, else its tensor parallelism
    doubled where the heads divide."""
    vllm = master["policy"]["generation"]["vllm_cfg"]

    def starts(utilization: float) -> bool:
        trial = copy.deepcopy(master)
        put(trial, f"{VLLM}.gpu_memory_utilization", utilization)
        return not policy_phases(trial, shape, count_parameters(shape), gpu)[1].startswith(REFUSES)

    utilization = _utilization(float(vllm["gpu_memory_utilization"]), starts)
    if utilization is not None:
        return {f"{VLLM}.gpu_memory_utilization": utilization}
    tp = int(vllm.get("tensor_parallel_size") or 1) * 2
    return {f"{VLLM}.tensor_parallel_size": tp} if shape.heads % tp == 0 else {}


def _judge_fix(master: dict[str, Any], gpu: float) -> dict[str, Any]:
    """The judge's vLLM the same way, in the keys of the user's judge block (placement moves its GPUs with them)."""
    kwargs = get(master, COMPILED_JUDGE + ".vllm_serve_kwargs") or {}

    def starts(utilization: float) -> bool:
        trial = copy.deepcopy(master)
        put(trial, COMPILED_JUDGE + ".vllm_serve_kwargs.gpu_memory_utilization", utilization)
        return not _judge(trial, gpu)[1].startswith(REFUSES)

    utilization = _utilization(float(kwargs.get("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION), starts)
    if utilization is not None:
        return {f"{JUDGE_KWARGS}.gpu_memory_utilization": utilization}
    return {f"{JUDGE_KWARGS}.tensor_parallel_size": int(kwargs.get("tensor_parallel_size") or 1) * 2}


def _judge(master: dict[str, Any], gpu: float | None) -> tuple[Phase | None, str]:
    """The judge's vLLM on its own GPUs (NeMo-Gym's genrm_model server): its weights at its tensor x pipeline
    parallelism within its share, and its KV cache at its max_model_len."""
    server = get(master, COMPILED_JUDGE)
    if not server or not judge_gpus(master):
        return None, ""
    shape, _ = read_shape(server.get("model"))
    if shape is None or not shape.counted:
        return None, ""
    kwargs = server.get("vllm_serve_kwargs") or {}
    utilization = float(kwargs.get("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION)
    dtype = 4 if str(kwargs.get("dtype") or "") in ("float32", "float") else 2
    phase, kv = vllm_fit(
        shape,
        tp=int(kwargs.get("tensor_parallel_size") or 1),
        pp=int(kwargs.get("pipeline_parallel_size") or 1),
        utilization=utilization,
        max_len=kwargs.get("max_model_len"),
        dtype_bytes=dtype,
        kwargs=kwargs,
        gpu=gpu,
        name="judge",
        fix=(),
    )
    return phase, kv
