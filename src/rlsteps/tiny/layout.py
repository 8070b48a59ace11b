"""Where the offline tiny world lives on disk. Torch-free, so configs can name its paths cheaply.

$RLSTEPS_HOME (default ~/.cache/rlsteps) / tiny / <version>-seed<seed> /
    {policy, policy_megatron, reward_model, train.jsonl, val.jsonl}
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "RLSTEPS_HOME"
TINY_WORLD_VERSION = "v21"  # bump when the tiny world's recipe or its checkpoint format changes: part of the cache key


@dataclass(frozen=True)
class TinyWorld:
    root: Path
    policy: Path
    policy_megatron: Path  # the same SFT policy as a Megatron-Core distributed checkpoint
    reward_model: Path
    train_prompts: Path
    val_prompts: Path


def rlsteps_home(home: Path | None = None) -> Path:
    return Path(home or os.environ.get(HOME_ENV) or Path.home() / ".cache" / "rlsteps").expanduser()


def tiny_world_dir(seed: int = 0, home: Path | None = None) -> Path:
    return rlsteps_home(home) / "tiny" / f"{TINY_WORLD_VERSION}-seed{seed}"


def tiny_world_paths(seed: int = 0, home: Path | None = None) -> TinyWorld:
    root = tiny_world_dir(seed, home)
    return TinyWorld(
        root=root,
        policy=root / "policy",
        policy_megatron=root / "policy_megatron",
        reward_model=root / "reward_model",
        train_prompts=root / "train.jsonl",
        val_prompts=root / "val.jsonl",
    )


def load_tiny_world(seed: int = 0, home: Path | None = None) -> TinyWorld | None:
    """The built world, or None. Only a finished build has world.json (it is renamed into place whole)."""
    world = tiny_world_paths(seed, home)
    if (world.root / "world.json").is_file():
        return world
    if world.root.exists():
        raise RuntimeError(f"{world.root} exists but is not a finished tiny world (no world.json): delete it and retry")
    return None
