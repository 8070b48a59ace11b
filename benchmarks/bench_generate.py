"""Time rlsteps' batched KV-cache sampler against Hugging Face `model.generate` on the same model.

Both sides get the same random Llama-style model, the same left-padded prompts of mixed lengths,
the same max_new_tokens and sampling settings. The EOS id is out of the vocabulary so every
run decodes exactly max_new_tokens steps and the two do the same amount of work.

    python benchmarks/bench_generate.py                 # CPU, a few minutes at most
    python benchmarks/bench_generate.py --device cuda --batch 64 --hidden 1024 --layers 8
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlsteps.engine.generation.backend import SamplingParams
from rlsteps.engine.generation.builtin import generate


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy machine)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--min-prompt", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args()


def build_model(args: argparse.Namespace) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.max_prompt + args.max_new_tokens,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).to(args.device).eval()


def random_prompts(args: argparse.Namespace) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(args.min_prompt, args.max_prompt + 1, (args.batch,), generator=g)
    return [torch.randint(1, args.vocab, (int(n),), generator=g).tolist() for n in lengths]


def left_pad(prompts: list[list[int]], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def median_seconds(run: Callable[[], object], repeats: int, device: str) -> tuple[float, object]:
    result = run()  # warm-up
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = run()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(args)
    prompts = random_prompts(args)
    ids, mask = left_pad(prompts, args.device)
    never = args.vocab  # an EOS the model cannot emit: both sides decode the full length
    settings = {
        "greedy": SamplingParams(args.max_new_tokens, temperature=0.0),
        "sampling": SamplingParams(args.max_new_tokens, temperature=1.0, top_k=50, top_p=0.95),
    }

    print(
        f"device={args.device} threads={args.threads} model=llama h{args.hidden} L{args.layers} V{args.vocab} "
        f"batch={args.batch} prompt={args.min_prompt}-{args.max_prompt} new={args.max_new_tokens} "
        f"repeats={args.repeats} (median seconds)"
    )
    for name, params in settings.items():

        def ours(params=params) -> list[list[int]]:
            g = torch.Generator(device=args.device).manual_seed(0)
            out = generate(
                model, prompts, params, eos_token_id=never, pad_token_id=0, generator=g, batch_size=args.batch
            )
            return out.response_ids

        def hf(params=params) -> list[list[int]]:
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=args.max_new_tokens,
                    do_sample=params.temperature > 0,
                    temperature=params.temperature or None,
                    top_k=params.top_k or None,
                    top_p=params.top_p,
                    eos_token_id=never,
                    pad_token_id=0,
                )
            return out[:, ids.shape[1] :].tolist()

        ours_s, ours_ids = median_seconds(ours, args.repeats, args.device)
        hf_s, hf_ids = median_seconds(hf, args.repeats, args.device)
        tokens = args.batch * args.max_new_tokens
        same = f" identical_tokens={ours_ids == hf_ids}" if name == "greedy" else ""
        print(
            f"{name:9s} rlsteps {ours_s:7.3f}s ({tokens / ours_s:7.0f} tok/s)   "
            f"hf.generate {hf_s:7.3f}s ({tokens / hf_s:7.0f} tok/s)   hf/rlsteps={hf_s / ours_s:5.2f}{same}"
        )


if __name__ == "__main__":
    main()
