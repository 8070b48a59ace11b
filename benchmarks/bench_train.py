"""The train phase: forward, backward and optimizer step over prompt+response rows, per precision and option.

Each step is what the training loop does with one global batch: micro-batches of `--micro-batch` rows through
`token_logprobs` (with `positions=`, the response positions, when that version of it is installed), the GRPO
clipped loss (`clipped_policy_loss`, token-level: divided by the batch's response tokens) or the REINFORCE
loss, `backward()` per micro-batch, then `optimizer_step` (clip, AdamW, schedule) from `build_optimizer` and
`build_scheduler`. The model is a random Qwen2 built from its config (nothing downloaded); every row is full
length (prompt then response), so each step trains the same tokens. The old log-probs are the new ones
detached, as on the first update of an on-policy step (ratio 1).

Configurations, built afresh and run one after the other in this process on the same rows, taking turns
`--rounds` times (the step times of all rounds pooled):

    float32        fp32 parameters and compute
    autocast-bf16  fp32 parameters (master weights), forward under torch.autocast(bfloat16)
    pure-bf16      parameters in bf16 (the old behaviour), with --pure-bf16
    + ckpt         the same with activation checkpointing (HF, non-reentrant), with --activation-checkpointing
    + compile      the same with torch.compile(model), with --compile
    + lora         the same with LoRA adapters (train.lora: peft on every linear layer but the output layer, rank
                   --lora-dim): only the adapters train and sit in the optimizer, with --lora
    + dynamic      the same with micro-batches by tokens (train.dynamic_batching: rows sorted by length, each
                   micro-batch within --micro-batch x the longest row a step can have), with --dynamic-batching;
                   with --varied-lengths, where responses are 1 to --response-len tokens long, it pads less
    + packed       the same with sequence packing (train.sequence_packing: rows end to end in --micro-batch rows of
                   the longest row a step can have, each attending only to itself), with --sequence-packing

With --reference each step first runs the reference policy's log-prob pass over the batch, as a REINFORCE or GRPO
step's prepare does, and the configuration holds that reference as a run does: a frozen copy of the policy in the
compute dtype, or under LoRA the policy itself with its adapters switched off (no copy).

A row's ratios compare it with its reference: a precision with the first configuration (the baseline), a
checkpointing or compile variant with the same precision without it. MFU needs the device's peak
(rlsteps.engine.records.throughput): "n/a" on CPU unless RLSTEPS_PEAK_TFLOPS is set. Peak memory is the CUDA
allocator's peak, or on CPU the process's peak RSS since the configuration started (interpreter and libraries
included). On CPU torch runs `--threads` threads (1 by default: two threads on two cores that other work also
uses wait on each other and time 3x slower and far less steadily); a CPU without native bf16 (no AVX512-BF16 or
AMX) emulates bf16 matmuls, some 30x slower than fp32, so bf16 rows there measure the emulation.

    python benchmarks/bench_train.py                                  # 256 x 4, fp32: about 10 s on CPU
    python benchmarks/bench_train.py --dtype float32 bfloat16 --pure-bf16 --activation-checkpointing
    python benchmarks/bench_train.py --device cuda --size 0.37b --dtype bfloat16 --pure-bf16 \\
        --rows 64 --prompt-len 512 --response-len 512 --micro-batch 8 --activation-checkpointing
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import inspect
import os
import statistics
import time
from dataclasses import dataclass, field, replace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlsteps.engine.algorithms.grpo import clipped_policy_loss
from rlsteps.engine.algorithms.reinforce import reinforce_loss
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.policy.logprobs import token_logprobs
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler, optimizer_step
from rlsteps.engine.policy.packing import pack_batch
from rlsteps.engine.records.throughput import (
    attended_length,
    mfu,
    model_flops,
    peak_memory_gb,
    peak_rss_gb,
    reset_peak_memory,
    synchronize,
)

# Qwen2-shaped models. 0.37b: Qwen1.5-0.5B's layers (1024 x 24, 16 heads, no GQA, MLP 2816) with a 32768
# vocabulary and an untied LM head instead of 151936 tied: 0.375B parameters. qwen2-0.5b: Qwen2-0.5B as it is.
SIZES = {
    "tiny": dict(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=704, vocab=4096, tied=False),
    "0.37b": dict(hidden=1024, layers=24, heads=16, kv_heads=16, intermediate=2816, vocab=32768, tied=False),
    "qwen2-0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, tied=True),
}
PRECISIONS = {"float32": torch.float32, "autocast-bf16": torch.bfloat16, "pure-bf16": torch.bfloat16}


@dataclass(frozen=True)
class Variant:
    precision: str  # a key of PRECISIONS
    checkpointing: bool = False
    compiled: bool = False
    lora: bool = False
    dynamic: bool = False
    packed: bool = False

    @property
    def name(self) -> str:
        options = (" + ckpt", self.checkpointing), (" + compile", self.compiled), (" + lora", self.lora)
        options += (" + dynamic", self.dynamic), (" + packed", self.packed)
        return self.precision + "".join(text for text, on in options if on)


@dataclass
class Result:
    """One configuration's timed steps over all rounds and its highest peak memory in GB."""

    step_seconds: list[float] = field(default_factory=list)
    peak_gb: float = 0.0
    padding: float = 0.0  # the share of the positions passed that are padding

    @property
    def median(self) -> float:
        return statistics.median(self.step_seconds)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=SIZES, default="tiny", help="a preset shape; the flags below override it")
    for flag in ("hidden", "layers", "heads", "kv-heads", "intermediate", "vocab"):
        parser.add_argument(f"--{flag}", type=int)
    parser.add_argument("--rows", type=int, default=8, help="rows of one global batch (one optimizer step)")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--loss", choices=("grpo", "reinforce"), default="grpo")
    parser.add_argument(
        "--dtype", nargs="+", choices=("float32", "bfloat16"), default=["float32"], help="bfloat16: fp32 + autocast"
    )
    parser.add_argument("--pure-bf16", action="store_true", help="add parameters-in-bf16 as the baseline")
    parser.add_argument("--activation-checkpointing", action="store_true", help="add each precision with it on")
    parser.add_argument("--compile", action="store_true", help="add each precision with torch.compile(model)")
    parser.add_argument("--lora", action="store_true", help="add each precision with LoRA adapters (train.lora)")
    parser.add_argument("--lora-dim", type=int, default=8, help="the adapters' rank (train.lora.dim)")
    parser.add_argument("--reference", action="store_true", help="hold the reference and run its log-prob pass")
    parser.add_argument(
        "--dynamic-batching", action="store_true", help="add each precision with micro-batches by tokens"
    )
    parser.add_argument("--sequence-packing", action="store_true", help="add each precision with packed rows")
    parser.add_argument(
        "--varied-lengths", action="store_true", help="responses 1 to --response-len tokens (seeded), not all full"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=1, help="configurations take turns this many times")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads: 1 is steadiest on a busy machine")
    return parser.parse_args()


def model_config(args: argparse.Namespace) -> Qwen2Config:
    """The preset, with --hidden also resetting heads (64 wide), KV heads and MLP width unless those are given."""
    shape = dict(SIZES[args.size])
    if args.hidden:
        hidden = args.hidden
        shape.update(hidden=hidden, heads=max(1, hidden // 64), intermediate=round(2.75 * hidden / 64) * 64)
        shape["kv_heads"] = shape["heads"]
    for key in ("layers", "heads", "kv_heads", "intermediate", "vocab"):
        shape[key] = getattr(args, key) or shape[key]
    return Qwen2Config(
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        intermediate_size=shape["intermediate"],
        vocab_size=shape["vocab"],
        tie_word_embeddings=shape["tied"],
        max_position_embeddings=args.prompt_len + args.response_len,
        use_cache=False,
    )


def variants(args: argparse.Namespace) -> list[tuple[Variant, Variant]]:
    """(configuration, its reference) pairs in run order; the first is the baseline, its own reference."""
    precisions = (["pure-bf16"] if args.pure_bf16 else []) + [
        "autocast-bf16" if dtype == "bfloat16" else dtype for dtype in args.dtype
    ]
    plain = [Variant(p) for p in dict.fromkeys(precisions)]
    pairs = [(variant, plain[0]) for variant in plain]
    for option, on in (
        ("checkpointing", args.activation_checkpointing),
        ("compiled", args.compile),
        ("lora", args.lora),
        ("dynamic", args.dynamic_batching),
        ("packed", args.sequence_packing),
    ):
        if on:
            pairs += [(replace(variant, **{option: True}), variant) for variant in plain]
    return pairs


def random_rows(args: argparse.Namespace, vocab: int, device: str) -> RolloutBatch:
    """prompt_len prompt tokens then response_len response tokens, none of them padding; with --varied-lengths,
    1 to response_len response tokens, uniformly (seeded), padded after."""
    g = torch.Generator().manual_seed(0)
    rows, width = args.rows, args.prompt_len + args.response_len
    responses = torch.full((rows,), args.response_len)
    if args.varied_lengths:
        responses = torch.randint(1, args.response_len + 1, (rows,), generator=g)
    tokens = torch.randint(1, vocab, (rows, width), generator=g)
    tokens[torch.arange(width)[None, :] >= (args.prompt_len + responses)[:, None]] = 0
    return RolloutBatch(
        tokens=tokens.to(device),
        prompt_lengths=torch.full((rows,), args.prompt_len, device=device),
        response_lengths=responses.to(device),
        is_end=torch.ones(rows, dtype=torch.bool, device=device),
        prompt_ids=[str(i // 4) for i in range(rows)],
        prompt_texts=[""] * rows,
        response_texts=[""] * rows,
        pad_id=0,
        extras={"advantages": torch.randn(rows, generator=g).to(device)},
    )


def takes_positions() -> bool:
    """Whether the installed token_logprobs computes log-probs at given positions only (`positions=`)."""
    return "positions" in inspect.signature(token_logprobs).parameters


def micro_loss(
    model: torch.nn.Module, micro: RolloutBatch, normaliser: float, loss: str, bin_tokens: int | None = None
) -> torch.Tensor:
    """The engine's token-level loss of one micro-batch: log-probs of the response tokens (packed into rows of
    bin_tokens when given), then GRPO or REINFORCE."""
    mask = micro.response_mask()
    if bin_tokens is not None:
        from rlsteps.engine.policy.logprobs import packed_token_logprobs

        logprobs = packed_token_logprobs(model, micro, bin_tokens)
    else:
        extra = {"positions": mask.bool()} if takes_positions() else {}
        logprobs = token_logprobs(model, micro.tokens, micro.attention_mask(), **extra)
    advantages = micro.extras["advantages"]
    if loss == "reinforce":
        return reinforce_loss(logprobs, advantages, mask, normaliser)[0]
    return clipped_policy_loss(logprobs, logprobs.detach(), advantages, mask, normaliser)[0]


def build(variant: Variant, config: Qwen2Config, args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    dtype = torch.bfloat16 if variant.precision == "pure-bf16" else torch.float32
    with torch.device(args.device):  # initialised where it runs
        model = Qwen2ForCausalLM(config).to(dtype=dtype).train()
    if variant.lora:
        from rlsteps.contract.config import LoraConfig
        from rlsteps.engine.policy.lora import apply_lora

        model = apply_lora(model, LoraConfig(enabled=True, dim=args.lora_dim, alpha=4 * args.lora_dim), seed=0)
    if variant.checkpointing:
        checkpoint_activations(model)
    return model


def reference_pass(variant: Variant, args: argparse.Namespace, model: torch.nn.Module):
    """The reference policy's log-prob pass as a run holds the reference (None without --reference): a frozen copy
    in the compute dtype, made now, or under LoRA the policy with its adapters off."""
    if not args.reference:
        return None
    if variant.lora:
        from rlsteps.engine.policy.lora import adapters_off

        frozen, switch = model, lambda: adapters_off(model)
    else:
        frozen, switch = copy.deepcopy(model).requires_grad_(False).eval().to(PRECISIONS[variant.precision]), None

    def logprobs(micro: RolloutBatch) -> None:
        with torch.no_grad(), switch() if switch else contextlib.nullcontext():
            token_logprobs(frozen, micro.tokens, micro.attention_mask())

    return logprobs


def checkpoint_activations(model: Qwen2ForCausalLM) -> None:
    """HF's activation checkpointing of every decoder layer, non-reentrant (the name changed in transformers 5)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def release_memory(device: str) -> None:
    """Free what the last configuration held, so the next one's peak starts from the same floor."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap otherwise


def passed_positions(batch: RolloutBatch, plan: list[list[int]], bin_tokens: int | None) -> int:
    """Positions the micro-batches' forward passes run: rows x the longest row, or packed rows x the fullest."""
    if bin_tokens is None:
        return sum(len(rows) * int(batch.sequence_lengths[rows].max()) for rows in plan)
    return sum(pack_batch(batch.select(rows), bin_tokens).tokens.numel() for rows in plan)


def run(
    variant: Variant, args: argparse.Namespace, config: Qwen2Config, batch: RolloutBatch
) -> tuple[list[float], float, float]:
    """One configuration built afresh, warmup then timed steps: (step seconds, peak memory in GB, padding share).

    Its peak memory counts from before its model is built: what the model, its gradients, the optimizer's state
    and the activations held at once.
    """
    release_memory(args.device)
    reset_peak_memory(args.device)
    model = build(variant, config, args)
    reference = reference_pass(variant, args, model)
    torch.compiler.reset()  # no graphs compiled for an earlier configuration (another dtype, autocast state)
    forward = torch.compile(model) if variant.compiled else model
    optimizer = build_optimizer(model, lr=1e-6, weight_decay=0.01)
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=args.warmup + args.steps, schedule="constant")
    normaliser = batch.response_mask().sum().item()
    precision = PRECISIONS[variant.precision]
    autocast = variant.precision == "autocast-bf16"
    seconds = []
    longest = args.prompt_len + args.response_len
    budget = args.micro_batch * longest if variant.dynamic else None
    bin_tokens = longest if variant.packed else None
    plan = batch.micro_batch_rows(args.micro_batch, budget, bin_tokens=bin_tokens)
    for step in range(args.warmup + args.steps):
        synchronize(args.device)
        start = time.perf_counter()
        for micro in batch.micro_batches(args.micro_batch) if reference else []:
            with torch.autocast(torch.device(args.device).type, dtype=precision, enabled=autocast):
                reference(micro)
        for micro in [batch.select(rows) for rows in plan]:
            with torch.autocast(torch.device(args.device).type, dtype=precision, enabled=autocast):
                loss = micro_loss(forward, micro, normaliser, args.loss, bin_tokens)
            loss.backward()
        optimizer_step(model, optimizer, scheduler, max_grad_norm=1.0)
        synchronize(args.device)
        if step >= args.warmup:
            seconds.append(time.perf_counter() - start)
    peak = peak_memory_gb(args.device) if torch.device(args.device).type == "cuda" else peak_rss_gb()
    return seconds, peak, 1 - int(batch.sequence_lengths.sum()) / passed_positions(batch, plan, bin_tokens)


def step_flops(config: Qwen2Config, batch: RolloutBatch) -> float:
    """Model FLOPs of one step; the LM head counts only the response positions when token_logprobs skips the rest."""
    lengths = batch.sequence_lengths
    tokens = int(lengths.sum())
    head = int(batch.response_mask().sum()) if takes_positions() else None
    return model_flops(config, tokens, attended_length(lengths), lm_head_tokens=head)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def describe(args: argparse.Namespace, config: Qwen2Config, batch: RolloutBatch) -> str:
    with torch.device("meta"):  # shapes only
        model = Qwen2ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    logprobs = "positions= (response positions only)" if takes_positions() else "full vocabulary at every position"
    return "\n".join(
        [
            f"device {args.device}, {torch.get_num_threads()} CPU threads, load average {load_average()}",
            f"Qwen2 {config.hidden_size} x {config.num_hidden_layers}, heads {config.num_attention_heads}/"
            f"{config.num_key_value_heads}, MLP {config.intermediate_size}, vocab {config.vocab_size}"
            f"{' tied' if config.tie_word_embeddings else ''}: {params / 1e6:.1f}M parameters",
            f"{len(batch)} rows x ({args.prompt_len} + {'1 to ' if args.varied_lengths else ''}{args.response_len}) "
            f"tokens ({int(batch.sequence_lengths.sum())} in all), micro-batch {args.micro_batch}, "
            f"{args.loss} loss, log-probs: {logprobs}; {args.warmup} warmup + {args.steps} timed steps",
            f"model FLOPs per step {step_flops(config, batch) / 1e9:.1f} G (engine.records.throughput.model_flops)",
        ]
    )


def table(
    results: dict[Variant, Result], pairs: list[tuple[Variant, Variant]], tokens: int, flops: float, device: str
) -> str:
    """One line per configuration: step seconds, tokens/s, MFU, peak memory, and the ratios to its reference."""
    memory = "peak GB" if torch.device(device).type == "cuda" else "peak RSS GB"
    columns = f"{'step s (min-max)':<22} {'tokens/s':>9} {'TFLOP/s':>8} {'MFU':>6} {memory:>12} {'padding':>8}"
    header = f"{'configuration':<26} {columns}  vs"
    lines = [header, "-" * len(header)]
    for variant, reference in pairs:
        r, ref = results[variant], results[reference]
        spread = f"{r.median:.3f} ({min(r.step_seconds):.3f}-{max(r.step_seconds):.3f})"
        used = mfu(flops, r.median, device, PRECISIONS[variant.precision])
        share = f"{100 * used:.1f}%" if used is not None else "n/a"
        ratios = f"{ref.median / r.median:.2f}x speed, {r.peak_gb / ref.peak_gb:.2f}x memory"
        versus = "baseline" if variant == reference else f"{ratios} of {reference.name}"
        speed, rate = tokens / r.median, flops / r.median / 1e12
        padding = f"{100 * r.padding:.0f}%"
        line = f"{variant.name:<26} {spread:<22} {speed:>9.0f} {rate:>8.3g} {share:>6} {r.peak_gb:>12.2f} {padding:>8}"
        line += f"  {versus}"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(args.threads)
    config = model_config(args)
    batch = random_rows(args, config.vocab_size, args.device)
    print(describe(args, config, batch))
    pairs = variants(args)
    results = {variant: Result() for variant, _ in pairs}
    for _ in range(args.rounds):  # in turns, so a busy spell on a shared machine slows every configuration
        for variant, result in results.items():
            seconds, peak, result.padding = run(variant, args, config, batch)
            result.step_seconds += seconds
            result.peak_gb = max(result.peak_gb, peak)
    tokens = int(batch.attention_mask().sum())
    print(table(results, pairs, tokens, step_flops(config, batch), args.device))
    print(f"load average {load_average()}")


if __name__ == "__main__":
    main()
