"""Whether a step's config can run on a given number of processes (the world size of a data-parallel run).

The command line asks before it writes or submits anything (the world size the profile's launcher plans:
plan.runner), and the worker asks again under torchrun (the world size it was started with): both read the same
rules from here. Torch-free and
standard library only, so the command line can import it without the engine's dependencies.

Each process generates `rollout.prompts_per_step / W` prompt groups (a group, all the rollouts of one prompt, never
spans processes) and trains `train.global_batch_size / W` rows per optimizer step, in micro batches of
`train.micro_batch_size`. A key that is missing or not an integer is left to the config's own validation.
"""

from __future__ import annotations

from typing import Any

SINGLE_PROCESS_ALGORITHMS = ("convert",)  # steps that run in one process whatever the world size


def world_size_problems(config: dict[str, Any], world_size: int) -> list[str]:
    """Every reason the config cannot run on `world_size` processes, one sentence each; empty when it can."""
    if world_size <= 1 or config.get("engine") == "nemo_rl":  # NeMo-RL splits the work and checks it itself
        return []
    algorithm = config.get("algorithm")
    if algorithm in SINGLE_PROCESS_ALGORITHMS:
        return [
            f"the {algorithm} step runs in one process, not {world_size}: "
            "run it on a profile with one process (nodes: 1 and one process per node)"
        ]
    return [
        problem
        for problem in (
            _prompts_problem(config, world_size),
            _batch_problem(config, world_size),
            _beside_training_problem(config, world_size),
        )
        if problem is not None
    ]


def _prompts_problem(config: dict[str, Any], world_size: int) -> str | None:
    prompts = _integer(config, "rollout", "prompts_per_step")
    if prompts is None or prompts % world_size == 0:
        return None
    return (
        f"rollout.prompts_per_step={prompts} is not a multiple of the world size {world_size} (each process "
        f"generates prompts_per_step / {world_size} prompt groups, and a group never spans processes): "
        f"set rollout.prompts_per_step={_nearest_multiple(prompts, world_size)}"
    )


def _batch_problem(config: dict[str, Any], world_size: int) -> str | None:
    rows = _integer(config, "train", "global_batch_size")
    micro = _integer(config, "train", "micro_batch_size")
    if rows is None or micro is None or rows % (world_size * micro) == 0:
        return None
    fixes = [f"train.global_batch_size={_nearest_multiple(rows, world_size * micro)}"]
    if rows % world_size == 0:
        fixes.append(f"train.micro_batch_size={_largest_divisor_up_to(rows // world_size, micro)}")
    return (
        f"train.global_batch_size={rows} is not a multiple of world size {world_size} x "
        f"train.micro_batch_size={micro} = {world_size * micro} (each process trains global_batch_size / "
        f"{world_size} rows per optimizer step, in micro batches of micro_batch_size): set " + " or ".join(fixes)
    )


def _beside_training_problem(config: dict[str, Any], world_size: int) -> str | None:
    age = _integer(config, "rollout", "max_age_steps")
    if age is None:
        return None
    return (
        f"rollout.max_age_steps={age}: the embedded engine draws rollouts beside training for one process, not "
        f"{world_size}: run it on a profile with one process, or set rollout.max_age_steps=0"
    )


def _integer(config: dict[str, Any], section: str, key: str) -> int | None:
    value = (config.get(section) or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _nearest_multiple(value: int, factor: int) -> int:
    """The multiple of factor closest to value, the larger one on a tie, never 0."""
    below = value // factor * factor
    above = below + factor
    return above if below == 0 or above - value <= value - below else below


def _largest_divisor_up_to(value: int, limit: int) -> int:
    return next(d for d in range(min(value, limit), 0, -1) if value % d == 0)
