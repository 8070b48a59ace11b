"""How fast a phase ran and how much of the device it used: tokens/s, model FLOPs, MFU and peak memory.

Model FLOPs count the matrix multiplications a decoder-only causal LM needs per token, read off its Hugging
Face config (`flops_per_token`, `model_flops`); MFU divides the FLOPs a phase did per second by the device's
dense peak (`peak_flops`, `mfu`). Peak memory is the CUDA allocator's high-water mark, or on CPU the process's
peak resident set (`peak_memory_gb`, `peak_rss_gb`, `reset_peak_memory`). `PhaseMeter` sums the tokens and
seconds of a phase made of several calls.

Nothing here imports transformers: a config is read through its attributes, so any object with the same
names (a `types.SimpleNamespace` in a test) works.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rlsteps.engine.device import tf32_matmuls

PEAK_TFLOPS_ENV = "RLSTEPS_PEAK_TFLOPS"
GB = 1e9  # memory figures are decimal gigabytes

# Model types whose MLP is two matrices (up, down) with a plain activation; every other type is read as the
# llama/qwen2/mistral-style gated MLP of three (gate, up, down).
UNGATED_MLP_MODEL_TYPES = frozenset({"gpt2", "gpt_bigcode", "gpt_neox", "gptj", "falcon", "phi", "starcoder2"})

# Dense (no sparsity) peak FLOP/s per GPU from NVIDIA's datasheets (H100/H200, A100, L40S, L40, L4, A10):
# (words of the CUDA device name, bf16 and fp16, tf32, fp32). The datasheets print the tensor-core figures
# with 2:4 sparsity; these are half of those. First match wins, so the more specific names come first.
PEAK_FLOPS = (
    (("H100", "PCIe"), 756e12, 378e12, 51e12),
    (("H100", "NVL"), 835e12, 418e12, 60e12),
    (("H100",), 989e12, 495e12, 67e12),  # SXM: "NVIDIA H100 80GB HBM3"
    (("H200", "NVL"), 835e12, 418e12, 60e12),
    (("H200",), 989e12, 495e12, 67e12),  # SXM
    (("GH200",), 989e12, 495e12, 67e12),
    (("A100",), 312e12, 156e12, 19.5e12),  # SXM4 and PCIe alike
    (("L40S",), 362e12, 183e12, 91.6e12),
    (("L40",), 181e12, 90.5e12, 90.5e12),
    (("L4",), 121e12, 60e12, 30.3e12),
    (("A10",), 125e12, 62.5e12, 31.2e12),  # not the A10G, a different part
)


def _config_value(config: object, *names: str, default: object = None) -> object:
    """The first of `names` the config sets (not None): HF configs and GPT-2's older names alike."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is None:
        raise ValueError(f"the model config sets none of {', '.join(names)}; cannot count its FLOPs")
    return default


def _is_gated_mlp(config: object) -> bool:
    """GPT-2 naming (n_embd) or a model type known to have an ungated MLP means two matrices; otherwise three."""
    if getattr(config, "n_embd", None) is not None:
        return False
    return getattr(config, "model_type", None) not in UNGATED_MLP_MODEL_TYPES


EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")  # mixture-of-experts configs


def _check_dense(config: object) -> None:
    experts = max(int(getattr(config, name, None) or 0) for name in EXPERT_COUNTS)
    if experts > 1:
        raise ValueError(f"the model config has {experts} experts: flops_per_token counts dense decoders only")


def flops_per_token(config: object, seq_len: float, *, backward: bool = True) -> float:
    """FLOPs per token of a dense decoder-only causal LM: forward and backward (3x forward), or forward alone.

    With h = hidden size, L = layers, q = heads * head_dim, k = key/value heads * head_dim (GQA: k < q),
    f = MLP intermediate size, m = 3 for a gated MLP (gate, up, down) or 2 (GPT-2: up, down; f = 4h unless
    n_inner says otherwise), V = vocabulary and s = `seq_len`, the mean number of positions a token attends to
    (see `attended_length`), and 2 FLOPs per multiply-add:

        forward = L * (2h(q + 2k)      QKV projections
                       + 2qh           attention output projection
                       + 2mhf          MLP
                       + 4qs)          attention scores QK^T and the weighted sum of V, s positions each
                  + 2hV                LM head
        training = 3 * forward         the backward pass takes gradients for both inputs and weights

    Embedding lookups, norms, activations, softmax and rotary embeddings are elementwise and left out, as in
    the usual MFU convention (PaLM, Megatron); a tied LM head costs the same matmul as an untied one.
    Raises ValueError for a mixture-of-experts config, whose per-token count depends on the routing.
    """
    _check_dense(config)
    h = int(_config_value(config, "hidden_size", "n_embd"))
    layers = int(_config_value(config, "num_hidden_layers", "n_layer"))
    heads = int(_config_value(config, "num_attention_heads", "n_head"))
    kv_heads = int(_config_value(config, "num_key_value_heads", default=heads))
    head_dim = int(_config_value(config, "head_dim", default=h // heads))
    ffn = int(_config_value(config, "intermediate_size", "n_inner", default=4 * h))
    q, k = heads * head_dim, kv_heads * head_dim
    mlp_matrices = 3 if _is_gated_mlp(config) else 2
    per_layer = 2 * h * (q + 2 * k) + 2 * q * h + 2 * mlp_matrices * h * ffn + 4 * q * seq_len
    return _passes(backward) * (layers * per_layer + _lm_head_flops(config))


def _lm_head_flops(config: object) -> float:
    """2hV: the forward FLOPs of one token's logits."""
    return 2.0 * int(_config_value(config, "hidden_size", "n_embd")) * int(_config_value(config, "vocab_size"))


def _passes(backward: bool) -> float:
    """Training costs 3 forwards (the backward computes gradients of the inputs and of the weights), else 1."""
    return 3.0 if backward else 1.0


def model_flops(
    config: object, tokens: int, seq_len: float, *, lm_head_tokens: int | None = None, backward: bool = True
) -> float:
    """The model FLOPs of a phase that ran `tokens` tokens through the model (see `flops_per_token`).

    `lm_head_tokens`: how many of them went through the LM head, when fewer did (log-probs computed at the
    response positions only); all of them by default.
    """
    total = tokens * flops_per_token(config, seq_len, backward=backward)
    if lm_head_tokens is not None:
        total -= (tokens - lm_head_tokens) * _passes(backward) * _lm_head_flops(config)
    return total


def attended_length(sequence_lengths: Iterable[int] | torch.Tensor) -> float:
    """The mean number of positions a token attends to over causal rows of these lengths, weighted by token.

    Token i of a row (1-based) attends to i positions, so a row of n tokens contributes n(n + 1) / 2.
    """
    if not isinstance(sequence_lengths, torch.Tensor):
        sequence_lengths = torch.tensor(list(sequence_lengths))
    lengths = sequence_lengths.double()
    total = float(lengths.sum())
    return float((lengths * (lengths + 1) / 2).sum()) / total if total else 0.0


def _name_words(name: str) -> set[str]:
    return {word.lower() for word in re.split(r"[\s\-_]+", name) if word}


def peak_flops_by_name(device_name: str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """The datasheet's dense peak FLOP/s of the GPU called `device_name` for matmuls in `dtype`, or None.

    bf16 and fp16 share a figure. fp32 gets the TF32 figure when torch lets fp32 matmuls run on TF32 tensor
    cores (`torch.set_float32_matmul_precision("high")`), otherwise the plain fp32 one: MFU is then measured
    against what the device could do at the precision the matmuls actually ran in. Other dtypes: None.
    """
    words = _name_words(device_name)
    for name, half, tf32, fp32 in PEAK_FLOPS:
        if {w.lower() for w in name} <= words:
            if dtype in (torch.bfloat16, torch.float16):
                return half
            if dtype == torch.float32:
                return tf32 if tf32_matmuls() else fp32
            return None
    return None


def peak_flops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """The dense peak FLOP/s of `device` for matmuls in `dtype` (see `peak_flops_by_name`), or None if unknown.

    RLSTEPS_PEAK_TFLOPS (TFLOP/s) overrides the table on any device and for any dtype: it gives an MFU on a
    GPU the table lacks, or on CPU, where there is no table (None without it).
    """
    override = os.environ.get(PEAK_TFLOPS_ENV, "").strip()
    if override:
        try:
            value = float(override)
        except ValueError:
            value = float("nan")
        if not value > 0:
            raise ValueError(f"{PEAK_TFLOPS_ENV}={override!r}: give the peak in TFLOP/s, a positive number")
        return value * 1e12
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_by_name(torch.cuda.get_device_name(device), dtype)


def mfu(flops: float, seconds: float, device: torch.device | str, dtype: torch.dtype) -> float | None:
    """Model FLOPs utilisation: the fraction of the device's peak (0..1) that `flops` in `seconds` reached.

    None when the peak is unknown (CPU, a GPU not in the table, no RLSTEPS_PEAK_TFLOPS) or no time passed.
    """
    peak = peak_flops(device, dtype)
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / peak


def peak_memory_gb(device: torch.device | str) -> float | None:
    """The CUDA allocator's peak of allocated tensor memory in GB (1e9 bytes) since the last reset; None off CUDA.

    On CPU use `peak_rss_gb`: it measures something else (the whole process), hence the other name.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / GB


def peak_rss_gb() -> float:
    """The process's peak resident set size in GB (1e9 bytes): a stand-in for peak memory on CPU.

    It counts everything the process holds (the interpreter, torch's libraries, freed memory the allocator
    kept), not only tensors, so compare it between runs of the same program rather than read it as the model's
    footprint.
    """
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return maxrss / GB if sys.platform == "darwin" else maxrss * 1024 / GB


def reset_peak_memory(device: torch.device | str) -> None:
    """Start a new peak: the CUDA allocator's statistics, or on Linux the process's RSS high-water mark.

    Linux resets the latter (what `peak_rss_gb` reads) to the current RSS on writing 5 to /proc/self/clear_refs;
    where that is not allowed the peak stays the process's lifetime peak.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def synchronize(device: torch.device | str) -> None:
    """Wait for the kernels queued on a CUDA device, so a timer stops after them; nothing to wait for on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class PhaseMeter:
    """Tokens and seconds of one phase (generation, training), summed over the calls that make it up.

    meter = PhaseMeter(device)
    with meter.measure(tokens=int(batch.attention_mask().sum())):
        ...
    meter.tokens_per_s
    """

    device: torch.device | str = "cpu"
    tokens: int = 0
    seconds: float = 0.0

    @contextmanager
    def measure(self, tokens: int) -> Iterator[None]:
        """Time the block (synchronising CUDA at both ends) and count `tokens` for it."""
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.add(tokens, time.perf_counter() - start)

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    @property
    def tokens_per_s(self) -> float | None:
        """None until some time was measured."""
        return self.tokens / self.seconds if self.seconds > 0 else None
