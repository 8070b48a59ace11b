"""One train phase on a fixed global batch, in however many processes torchrun starts (or one, run plainly).

    python -m torch.distributed.run --nproc-per-node 2 tests/distributed_update.py OUT.pt ROWS GLOBAL MICRO DTYPE

Every process takes its prompts' rows (World.mine: each is one prompt here, as in rejection sampling with
top_n 1), runs the engine's PolicyUpdate for a few RL steps and the main process saves the loss of each and the
final weights, whole, to OUT.pt. The tests compare them with one process's.
"""

from __future__ import annotations

import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlsteps.contract.config import RSConfig
from rlsteps.engine.algorithms.recipe import ROW_MASK
from rlsteps.engine.algorithms.rs import RejectionSampling
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.distributed import join, leave, world_from_env
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler
from rlsteps.engine.policy.parallel import Precision, full_state_on_main, place_policy
from rlsteps.engine.run.update import PolicyUpdate
from rlsteps.engine.run.worker import end_process

VOCAB, STEPS = 96, 3


def fixed_model() -> torch.nn.Module:
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def fixed_batch(rows: int) -> RolloutBatch:
    """Rows of different prompt and response lengths, right-padded; one prompt per row."""
    generator = torch.Generator().manual_seed(1)
    prompt_lengths = torch.tensor([3 + i % 4 for i in range(rows)])
    response_lengths = torch.tensor([2 + (i * 5) % 7 for i in range(rows)])
    width = int((prompt_lengths + response_lengths).max())
    tokens = torch.randint(1, VOCAB, (rows, width), generator=generator)
    for i in range(rows):
        tokens[i, int(prompt_lengths[i] + response_lengths[i]) :] = 0
    batch = RolloutBatch(
        tokens=tokens, prompt_lengths=prompt_lengths, response_lengths=response_lengths,
        is_end=torch.ones(rows, dtype=torch.bool), prompt_ids=[f"p{i}" for i in range(rows)],
        prompt_texts=[""] * rows, response_texts=[""] * rows, pad_id=0,
    )  # fmt: skip
    batch.extras[ROW_MASK] = torch.ones(rows)
    return batch


def config(rows: int, global_batch: int, micro: int) -> RSConfig:
    return RSConfig.model_validate(
        {
            "algorithm": "rs",
            "inputs": {"prompts": "-", "policy": "-"},
            "output": {"dir": "-"},
            "rollout": {"prompts_per_step": rows, "num_rollouts_per_prompt": 1, "top_n_rollouts": 1},
            "train": {"global_batch_size": global_batch, "micro_batch_size": micro, "lr": 1e-3, "warmup_steps": 0},
        }
    )


def train_phase(rows: int, global_batch: int, micro: int, dtype: str) -> tuple[list[float], dict | None]:
    world = world_from_env()
    device = join(world, torch.device("cpu"))
    cfg = config(rows, global_batch, micro)
    precision = Precision.named(dtype)
    model = place_policy(fixed_model(), world, device, precision, activation_checkpointing=False)
    optimizer = build_optimizer(model, cfg.train.lr, cfg.train.weight_decay, tuple(cfg.train.betas))
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=10)
    update = PolicyUpdate(model, optimizer, scheduler, RejectionSampling(cfg), cfg.train, device, precision, world)
    batch = fixed_batch(rows).select(world.mine(rows))
    losses = [update(batch).stats["train/loss"] for _ in range(STEPS)]
    state = full_state_on_main(model, world) if world.is_distributed else model.state_dict()
    leave(world)
    return losses, state


def main(out: str, rows: str, global_batch: str, micro: str, dtype: str) -> None:
    losses, state = train_phase(int(rows), int(global_batch), int(micro), dtype)
    if state is not None:
        torch.save({"losses": losses, "weights": {k: v.detach().cpu() for k, v in state.items()}}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_process(0)  # as the worker ends, without the interpreter's teardown (its docstring says why)
