"""prepare then the update of GRPO and REINFORCE, one pass and two, in however many processes torchrun starts.

    python -m torch.distributed.run --nproc-per-node 2 tests/distributed_one_pass.py OUT.pt

Every process takes its prompt groups (World.mine), runs the recipe's prepare (the policy's log-probs, when it asks,
from the loop's no-grad pass over the gathered policy; the reference's a fixed function of the tokens) and the
engine's PolicyUpdate, once with the two-pass path forced and once as configured (one optimizer step: the log-probs
from the update). The main process saves each run's statistics (prepare's weighted by rows over the processes, as
the loop weighs them) and the final weights, whole, to OUT.pt.
"""

from __future__ import annotations

import sys

import torch

from distributed_update import VOCAB, fixed_model
from rlsteps.contract.config import RECIPE_SCHEMAS
from rlsteps.engine.algorithms import RECIPES
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.distributed import join, leave, row_weighted_mean, world_from_env
from rlsteps.engine.policy.logprobs import batched_token_logprobs
from rlsteps.engine.policy.optim import build_optimizer, build_scheduler
from rlsteps.engine.policy.parallel import Precision, full_state_on_main, gathered, place_policy
from rlsteps.engine.rewards.scores import Scores
from rlsteps.engine.run.update import PolicyUpdate
from rlsteps.engine.run.worker import end_process

PROMPTS, PER_PROMPT = 4, 2
ROWS = PROMPTS * PER_PROMPT
REWARDS = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 0.25, 3.0, 1.0])
ENDED = torch.tensor([True, True, False, True, True, True, True, False])
OPTIONS = {
    "grpo": {"kl_beta": 0.05, "eps_low": 0.2, "eps_high": 0.28},
    "reinforce": {"initial_policy_kl_penalty": 0.2, "use_absolute_kl": False},
}


def rollouts() -> RolloutBatch:
    generator = torch.Generator().manual_seed(1)
    prompt_lengths = torch.tensor([3 + (i // PER_PROMPT) % 3 for i in range(ROWS)])
    response_lengths = torch.tensor([2 + (i * 5) % 7 for i in range(ROWS)])
    width = int((prompt_lengths + response_lengths).max())
    tokens = torch.randint(1, VOCAB, (ROWS, width), generator=generator)
    for i in range(ROWS):
        tokens[i, int(prompt_lengths[i] + response_lengths[i]) :] = 0
    return RolloutBatch(
        tokens=tokens, prompt_lengths=prompt_lengths, response_lengths=response_lengths, is_end=ENDED.clone(),
        prompt_ids=[f"p{i // PER_PROMPT}" for i in range(ROWS)], prompt_texts=[""] * ROWS,
        response_texts=[""] * ROWS, pad_id=0,
    )  # fmt: skip


def reference_logprobs(batch: RolloutBatch) -> torch.Tensor:
    return -0.02 * batch.tokens[:, 1:].float() * batch.response_mask()


def one_run(algorithm: str, two_pass: bool, world, device) -> tuple[dict[str, float], dict | None]:
    cfg = RECIPE_SCHEMAS[algorithm].model_validate(
        {
            "algorithm": algorithm,
            "inputs": {"prompts": "-", "policy": "-"},
            "output": {"dir": "-"},
            "rollout": {"prompts_per_step": PROMPTS, "num_rollouts_per_prompt": PER_PROMPT},
            "train": {"global_batch_size": ROWS, "micro_batch_size": 2, "lr": 1e-3, "warmup_steps": 0},
            algorithm: OPTIONS[algorithm],
        }
    )
    recipe = RECIPES[algorithm](cfg)
    recipe.two_pass = two_pass
    model = place_policy(fixed_model(), world, device, Precision.named("float32"), activation_checkpointing=False)
    optimizer = build_optimizer(model, cfg.train.lr, cfg.train.weight_decay, tuple(cfg.train.betas))
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=10)
    update = PolicyUpdate(model, optimizer, scheduler, recipe, cfg.train, device, Precision.named("float32"), world)

    def policy_logprobs(batch: RolloutBatch) -> torch.Tensor:
        with gathered(model, device):
            return batched_token_logprobs(model, batch, 3)

    rows = [j * PER_PROMPT + k for j in world.mine(PROMPTS) for k in range(PER_PROMPT)]
    scores = Scores(rewards=REWARDS[rows], valid=torch.ones(len(rows), dtype=torch.bool))
    batch, stats = recipe.prepare(rollouts().select(rows), scores, policy_logprobs, reference_logprobs)
    stats = row_weighted_mean(world, stats, len(rows))
    result = update(batch)
    state = full_state_on_main(model, world) if world.is_distributed else model.state_dict()
    return {**stats, **result.stats, "optimizer_steps": result.optimizer_steps}, state


def main(out: str) -> None:
    world = world_from_env()
    device = join(world, torch.device("cpu"))
    runs = {}
    for algorithm in OPTIONS:
        for two_pass in (True, False):
            stats, state = one_run(algorithm, two_pass, world, device)
            if state is not None:
                runs[(algorithm, two_pass)] = (stats, {k: v.detach().cpu() for k, v in state.items()})
    leave(world)
    if world.is_main:
        torch.save(runs, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_process(0)  # as the worker ends, without the interpreter's teardown (its docstring says why)
