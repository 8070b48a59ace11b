"""Time writing and reading a policy as checkpoint_megatron against checkpoint_hf (safetensors), same model.

Both forms get the same random Llama-style model (GQA) and its tokenizer. Each round writes the model
in each form into a fresh folder, then reads it back into the engine's model (load_policy), and checks
the weights came back bit for bit. The first Megatron write in a process also starts megatron's helper
process; it is reported apart and left out of the medians.

    python benchmarks/bench_checkpoint.py                          # about a minute on 2 cores
    python benchmarks/bench_checkpoint.py --hidden 1024 --layers 16 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rlsteps.engine.policy.model import load_policy, save_policy

FORMS = ("checkpoint_hf", "checkpoint_megatron")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def build_model(args: argparse.Namespace) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=max(2, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=2048, tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config).to(getattr(torch, args.dtype)).eval()


def build_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    word_level = Tokenizer(models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def timed(action: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def one_round(model, tokenizer, form: str, scratch: Path, dtype: torch.dtype) -> tuple[float, float, int]:
    target = scratch / form
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    write_s, _ = timed(lambda: save_policy(model, tokenizer, target, form))
    read_s, (loaded, _) = timed(lambda: load_policy(target, dtype=dtype))
    expected, got = model.state_dict(), loaded.state_dict()
    if set(expected) != set(got) or not all(torch.equal(expected[k], got[k]) for k in expected):
        raise SystemExit(f"{form}: the weights did not come back bit for bit")
    return write_s, read_s, folder_size(target)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    model, tokenizer, dtype = build_model(args), build_tokenizer(), getattr(torch, args.dtype)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"Llama {args.layers} layers x {args.hidden}, vocab {args.vocab}: {params / 1e6:.1f}M parameters, {args.dtype}"
    )
    times: dict[str, dict[str, list[float]]] = {form: {"write": [], "read": []} for form in FORMS}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        first_write, _, _ = one_round(model, tokenizer, "checkpoint_megatron", Path(scratch), dtype)
        print(f"first checkpoint_megatron write in this process (imports megatron-core's writer): {first_write:.2f} s")
        for _ in range(args.repeats):
            for form in FORMS:  # alternate, so load drifts hit both forms alike
                write_s, read_s, sizes[form] = one_round(model, tokenizer, form, Path(scratch), dtype)
                times[form]["write"].append(write_s)
                times[form]["read"].append(read_s)
    print(f"\n{'form':<22}{'write s (median)':>18}{'read s (median)':>18}{'MB':>8}{'write / hf':>12}{'read / hf':>11}")
    base = {op: statistics.median(times["checkpoint_hf"][op]) for op in ("write", "read")}
    for form in FORMS:
        med = {op: statistics.median(times[form][op]) for op in ("write", "read")}
        print(
            f"{form:<22}{med['write']:>18.3f}{med['read']:>18.3f}{sizes[form] / 1e6:>8.1f}"
            f"{med['write'] / base['write']:>12.2f}{med['read'] / base['read']:>11.2f}"
        )
    print("every round: weights bit-identical after the round trip")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":  # megatron's writer forks its writer processes
    main()
