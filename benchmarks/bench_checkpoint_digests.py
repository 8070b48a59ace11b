"""What checking checkpoints by their content costs: a run's step checkpoint (weights and AdamW state through
torch.distributed.checkpoint, as the loop writes it) saved with every file's SHA-256 (digests.json) and without, and
the resume's check of it (rlsteps.contract.checkpoint_damage) with and without the digests' read, on one model.

    python benchmarks/bench_checkpoint_digests.py                    # a ~60M-parameter model, about a minute
    python benchmarks/bench_checkpoint_digests.py --hidden 1024 --layers 12 --repeats 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlsteps.contract.checkpoint_damage import checkpoint_damage
from rlsteps.engine.checkpoints import resume
from rlsteps.engine.checkpoints.resume import CheckpointManager
from rlsteps.engine.checkpoints.train_state import write_train_state


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def model_and_optimizer(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=max(2, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128), tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 8, dtype=torch.long)).logits.sum().backward()
    optimizer.step()  # AdamW's moments exist: the checkpoint holds what a run's does
    return model, optimizer


def save_seconds(model, optimizer, root: Path, digests: bool) -> tuple[float, Path]:
    shutil.rmtree(root, ignore_errors=True)
    manager = CheckpointManager(root)
    original = resume.write_digests
    if not digests:
        resume.write_digests = lambda folder: None
    try:
        start = time.perf_counter()
        info = {"consumed_samples": 1, "epoch": 0, "optimizer_steps": 1}
        path = manager.save(
            1, model, None, {"scheduler": {}}, info, write_state=lambda f: write_train_state(model, optimizer, f)
        )
        return time.perf_counter() - start, path
    finally:
        resume.write_digests = original


def check_seconds(path: Path, content: bool) -> float:
    start = time.perf_counter()
    assert checkpoint_damage(path, content=content) is None
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    model, optimizer = model_and_optimizer(args)
    params = sum(p.numel() for p in model.parameters())
    rows: dict[str, list[float]] = {"save": [], "save with digests": [], "check": [], "check with digests": []}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "checkpoints"
        save_seconds(model, optimizer, root, digests=True)  # warm-up: the first DCP save in a process
        for _ in range(args.repeats):
            plain, path = save_seconds(model, optimizer, root, digests=False)
            rows["save"].append(plain)
            rows["check"].append(check_seconds(path, content=False))
            with_digests, path = save_seconds(model, optimizer, root, digests=True)
            rows["save with digests"].append(with_digests)
            rows["check with digests"].append(check_seconds(path, content=True))
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(f"model: {params / 1e6:.1f}M parameters; checkpoint {size / 2**20:.0f} MiB (weights and AdamW state)")
    medians = {name: statistics.median(seconds) for name, seconds in rows.items()}
    for name, median in medians.items():
        print(f"{name:>20}: median {median:.3f} s over {args.repeats}")
    added = medians["save with digests"] - medians["save"]
    ratio = medians["save with digests"] / medians["save"]
    read_rate = size / 2**20 / max(medians["check with digests"] - medians["check"], 1e-9)
    print(f"digests add {added:.3f} s to a save ({ratio:.2f}x); a resume reads {read_rate:.0f} MiB/s to check them")


if __name__ == "__main__":
    main()
