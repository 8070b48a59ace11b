"""Tokens/s of rlsteps' built-in sampler against Hugging Face `model.generate`, and vLLM with --vllm, on one model.

Every engine gets the same random Llama model, the same prompts of mixed lengths, the same max_new_tokens and
sampling settings, and decodes exactly max_new_tokens per row: the EOS id lies outside the vocabulary (vLLM:
ignore_eos), so all do the same work. Each engine runs once untimed (warm-up; compilation with --compile), then
the engines take turns for --repeats rounds. One line per setting: median seconds and tokens/s (rows x
max_new_tokens / s) per engine, their ratios to HF generate, and for greedy whether the tokens match HF's.

Settings: greedy (temperature 0), sampling (temperature 1, no filter: the rollout default), filtered
(temperature 1, top-k 50, top-p 0.95). Presets (any flag given overrides its value):

    tiny  the tiny world's shape: Llama 64 x 2 layers, 2 heads of 32, vocab 580; 128 prompts of 8-24 tokens, 32 new
    100m  Llama 768 x 12 layers, 12 heads of 64, MLP 2048, vocab 32000 tied (110M); 16 prompts of 16-64, 64 new
    135m  SmolLM2-135M's shape (576 x 30 layers, 9 heads of 64, 3 KV heads, MLP 1536, vocab 49152 tied) and the
          verifiable example's rollouts: 16 prompts of 40-50 tokens, each drawn 4 times (--group), 8 new

    python benchmarks/bench_generate.py --preset tiny --threads 1
    python benchmarks/bench_generate.py --preset 100m --threads 2 --repeats 3
    python benchmarks/bench_generate.py --preset 135m --settings sampling --repeats 3
    .venv-vllm/bin/python benchmarks/bench_generate.py --preset tiny --vllm     # rlsteps installed there too
    python benchmarks/bench_generate.py --device cuda --preset 100m --batch 64 --dtype bfloat16

vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) from the same model written with save_pretrained to
a temporary folder, enforce_eager, one request per prompt with its own seed. Its CPU attention needs heads of
32, 64, ... dimensions (not 16). --compile adds the built-in sampler with its decode step compiled (DecodeOptions).
--group N lays each prompt out N times in a row, as a group's rollouts are (batch / N distinct prompts), and adds
the built-in sampler prefilling every copy (DecodeOptions(share_prefill=False)), against its default of one prefill
per distinct prompt.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlsteps.engine.generation.backend import SamplingParams
from rlsteps.engine.generation.builtin import DecodeOptions, generate

PRESETS = {
    "tiny": dict(
        hidden=64, layers=2, heads=2, intermediate=256, vocab=580, batch=128, min_prompt=8, max_prompt=24, new=32
    ),
    "100m": dict(
        hidden=768, layers=12, heads=12, intermediate=2048, vocab=32000, batch=16, min_prompt=16, max_prompt=64, new=64
    ),
    "135m": dict(
        hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152, batch=64, min_prompt=40,
        max_prompt=50, new=8, group=4,
    ),
}  # fmt: skip
DEFAULTS = dict(kv_heads=None, group=1)  # where a preset does not say: as many KV heads as heads, distinct prompts
SETTINGS = {
    "greedy": dict(temperature=0.0),
    "sampling": dict(temperature=1.0),
    "filtered": dict(temperature=1.0, top_k=50, top_p=0.95),
}
Engine = Callable[[SamplingParams], list[list[int]]]
EACH_COPY = "builtin-prefill-each"  # the built-in sampler prefilling every copy of a prompt


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (and vLLM's OpenMP threads)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--vllm", action="store_true", help="also time vLLM (needs `import vllm` to work)")
    parser.add_argument("--compile", action="store_true", help="also time the built-in sampler compiled")
    for name in PRESETS["135m"]:
        flag = "--max-new-tokens" if name == "new" else "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, type=int, help="overrides the preset")
    args = parser.parse_args()
    for name, value in {**DEFAULTS, **PRESETS[args.preset]}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.batch % args.group:
        parser.error(f"--batch {args.batch} is not a whole number of groups of {args.group}")
    return args


def build_model(args: argparse.Namespace) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads or args.heads,
        max_position_embeddings=args.max_prompt + args.new,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return LlamaForCausalLM(config).to(device=args.device, dtype=getattr(torch, args.dtype)).eval()


def random_prompts(args: argparse.Namespace) -> list[list[int]]:
    """batch / group distinct prompts, each `group` times in a row."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(args.min_prompt, args.max_prompt + 1, (args.batch // args.group,), generator=g)
    distinct = [torch.randint(1, args.vocab, (int(n),), generator=g).tolist() for n in lengths]
    return [prompt for prompt in distinct for _ in range(args.group)]


def builtin_engine(model: LlamaForCausalLM, prompts: list[list[int]], decode: DecodeOptions) -> Engine:
    never = model.config.vocab_size  # an EOS the model cannot emit: every row decodes max_new_tokens
    rows = dict(seeds=list(range(len(prompts))), batch_size=len(prompts))

    def run(params: SamplingParams) -> list[list[int]]:
        return generate(model, prompts, params, eos_token_id=never, pad_token_id=0, decode=decode, **rows).response_ids

    return run


def hf_engine(model: LlamaForCausalLM, prompts: list[list[int]]) -> Engine:
    width = max(map(len, prompts))
    device = next(model.parameters()).device
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    def run(params: SamplingParams) -> list[list[int]]:
        sampling = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=model.config.vocab_size,
                pad_token_id=0,
                **(dict(do_sample=True, **sampling) if params.temperature > 0 else dict(do_sample=False)),
            )
        return out[:, width:].tolist()

    return run


def vllm_engine(model: LlamaForCausalLM, prompts: list[list[int]], args: argparse.Namespace) -> Engine:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import vllm
    from vllm.inputs import TokensPrompt

    folder = tempfile.mkdtemp(prefix="bench-generate-")
    model.save_pretrained(folder)
    llm = vllm.LLM(
        model=folder,
        dtype=args.dtype,
        max_model_len=args.max_prompt + args.new,
        skip_tokenizer_init=True,
        enforce_eager=True,
        seed=0,
    )
    requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def run(params: SamplingParams) -> list[list[int]]:
        sampling = [
            vllm.SamplingParams(
                max_tokens=params.max_new_tokens,
                ignore_eos=True,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                seed=i,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        outputs = llm.generate(requests, sampling, use_tqdm=False)
        return [list(out.outputs[0].token_ids) for out in outputs]

    return run


def timed_rounds(engines: dict[str, Engine], params: SamplingParams, args: argparse.Namespace) -> dict[str, tuple]:
    """Per engine: (median seconds, the last run's tokens). One untimed run each, then the engines take turns."""
    tokens = {name: run(params) for name, run in engines.items()}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, run in engines.items():
            _synchronize(args.device)
            start = time.perf_counter()
            tokens[name] = run(params)
            _synchronize(args.device)
            seconds[name].append(time.perf_counter() - start)
    for name, rows in tokens.items():
        if any(len(row) != params.max_new_tokens for row in rows):
            raise RuntimeError(f"{name} stopped a row before max_new_tokens: the engines did different work")
    return {name: (statistics.median(seconds[name]), tokens[name]) for name in engines}


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def report(setting: str, results: dict[str, tuple], tokens: int) -> str:
    hf_seconds, hf_tokens = results["hf.generate"]
    timings = "  ".join(f"{name} {s:.3f}s ({tokens / s:.0f} tok/s)" for name, (s, _) in results.items())
    ratios = "  ".join(f"{name}/hf={hf_seconds / s:.2f}" for name, (s, _) in results.items() if name != "hf.generate")
    line = f"{setting:9s} {timings}  {ratios}"
    if EACH_COPY in results:
        line += f"  one prefill per prompt: {results[EACH_COPY][0] / results['builtin'][0]:.2f}x as fast"
    if setting == "greedy":
        same = {name: _share_equal(rows, hf_tokens) for name, (_, rows) in results.items() if name != "hf.generate"}
        line += "  greedy tokens as hf: " + " ".join(f"{name} {share:.0%}" for name, share in same.items())
    return line


def _share_equal(rows: list[list[int]], reference: list[list[int]]) -> float:
    return sum(a == b for row, ref in zip(rows, reference) for a, b in zip(row, ref)) / sum(map(len, reference))


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(args)
    prompts = random_prompts(args)
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"preset={args.preset} device={args.device} dtype={args.dtype} threads={args.threads} model=llama "
        f"h{args.hidden} L{args.layers} heads{args.heads} V{args.vocab} ({millions:.1f}M) batch={args.batch} "
        f"prompt={args.min_prompt}-{args.max_prompt} group={args.group} new={args.new} repeats={args.repeats} "
        f"(medians); {_load()}"
    )
    engines = {"builtin": builtin_engine(model, prompts, DecodeOptions())}
    if args.group > 1:
        engines[EACH_COPY] = builtin_engine(model, prompts, DecodeOptions(share_prefill=False))
    if args.compile:
        engines["builtin+compile"] = builtin_engine(model, prompts, DecodeOptions(compile=True))
    engines["hf.generate"] = hf_engine(model, prompts)
    if args.vllm:
        engines["vllm"] = vllm_engine(model, prompts, args)
    for setting in args.settings:
        params = SamplingParams(args.new, **SETTINGS[setting])
        print(report(setting, timed_rounds(engines, params, args), args.batch * args.new), flush=True)
    print(_load())


if __name__ == "__main__":
    main()
