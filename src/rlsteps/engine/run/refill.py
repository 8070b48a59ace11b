"""A step's rollouts as the step draws them, and dynamic sampling's refill: generation batches until the step holds
rollout.prompts_per_step prompt groups the recipe keeps (which ones, in what order: algorithms.dynamic_sampling).

Every process draws its share of each generation batch's prompt groups (World.mine) and judges its own groups; the
verdicts, gathered in prompt order, are the same on every process, so every process keeps the same groups. The
groups that train are then dealt to the processes as a step's prompts are (group i to process i mod W), their rows
exchanged among the processes where the process that drew a group is not the one that trains on it. The step's
rollout statistics (train/reward, ...) are those of every generation batch's rollouts, kept or not, as NeMo-RL logs
its rewards before the filter; the reward source's own metrics are the first batch's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlsteps.contract.config import RolloutConfig
from rlsteps.engine.algorithms.dynamic_sampling import Group, KeptGroups
from rlsteps.engine.algorithms.recipe import Recipe
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.distributed import World, all_gather, weighted_by_rows
from rlsteps.engine.rewards.scores import Scores


@dataclass
class Scored:
    whole: Scores  # every row of the step, in prompt order
    rollout_stats: dict[str, float]  # over the whole step
    mine: Scores | None = None  # this process's rows


@dataclass
class Drawn:
    """A step's rollouts (this process's rows), their scores, the reference's log-prob function and what drawing
    them took."""

    batch: RolloutBatch
    scored: Scored
    reference: Callable[[RolloutBatch], torch.Tensor] | None
    generated_tokens: float  # this process's response tokens over every generation batch
    generation_batches: int = 1


NextBatch = Callable[[int], tuple[Drawn, list[bool]]]  # k -> the step's k-th generation batch and its dropped groups


def refilled(
    first: Drawn, dropped: list[bool], draw: NextBatch, rollout: RolloutConfig, max_batches: int, world: World
) -> Drawn:
    """The step's rollouts from its first generation batch (`dropped`: each group's verdict, in prompt order) and as
    many more as `draw` gives until prompts_per_step groups are kept (KeptGroups raises past max_batches + 1).
    The reference's log-prob function is left for the caller to set."""
    per_prompt = rollout.num_rollouts_per_prompt
    kept = KeptGroups(rollout.prompts_per_step, max_batches)
    held: dict[Group, tuple[RolloutBatch, Scores]] = {}  # this process's rows of the groups kept
    stats, generated, drawn = [], 0.0, first
    while True:
        for i, j in enumerate(world.mine(len(dropped))):
            if not dropped[j]:
                rows = list(range(i * per_prompt, (i + 1) * per_prompt))
                held[(kept.generation_batches, j)] = (drawn.batch.select(rows), drawn.scored.mine.select(rows))
        stats.append(drawn.scored.rollout_stats)
        generated += drawn.generated_tokens
        kept.add(dropped)  # raises past the bound
        if kept.full:
            break
        drawn, dropped = draw(kept.generation_batches)
    every, mine = dealt(all_gather(world, held), kept.chosen(), world)
    scored = Scored(
        whole=concat_scores([scores for _, scores in every]),
        rollout_stats={**weighted_by_rows([(part, 1) for part in stats]), **kept.stats()},
        mine=concat_scores([scores for _, scores in mine]),
    )
    return Drawn(RolloutBatch.concat([rows for rows, _ in mine]), scored, None, generated, kept.generation_batches)


def dropped_groups(recipe: Recipe, drawn: Drawn, world: World) -> list[bool] | None:
    """Whether each prompt group of a generation batch is dropped, in prompt order, the same on every process (each
    judges its own groups); None where the recipe drops none."""
    mine = recipe.dropped_groups(drawn.batch, drawn.scored.mine)
    return None if mine is None else in_prompt_order(all_gather(world, mine), world)


def in_prompt_order(parts: list[list[bool]], world: World) -> list[bool]:
    """Each process's verdicts on its groups (process r holds positions r, r + W, ...) as one list in prompt order."""
    return [parts[j % world.size][j // world.size] for j in range(sum(map(len, parts)))]


def dealt(
    held: list[dict[Group, tuple[RolloutBatch, Scores]]], chosen: list[Group], world: World
) -> tuple[list[tuple[RolloutBatch, Scores]], list[tuple[RolloutBatch, Scores]]]:
    """Every chosen group's rows and scores in order, from the processes that hold them, and this process's share
    (the groups at its World.mine positions)."""
    groups = {group: rows for part in held for group, rows in part.items()}
    every = [groups[group] for group in chosen]
    return every, [every[i] for i in world.mine(len(chosen))]


def concat_scores(parts: list[Scores]) -> Scores:
    """The rows of every part in order; the reward source's metrics of the first (a refilled step's first batch)."""
    details = None if any(p.details is None for p in parts) else [d for p in parts for d in p.details]
    return Scores(
        rewards=torch.cat([p.rewards for p in parts]),
        valid=torch.cat([p.valid for p in parts]),
        metrics=dict(parts[0].metrics) if parts else {},
        details=details,
    )
