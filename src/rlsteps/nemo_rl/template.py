"""NeMo-RL's master config as rlsteps ships it (templates/*.yaml, package data), and the resolvers NeMo-RL's configs
use.

templates/master.yaml holds every key NeMo-RL v0.7.0's MasterConfig and drivers read; templates/genrm_env.yaml and
templates/reward_model_env.yaml add a recipe's data and env sections. rl/nemo_rl/rlhf's configs extend them through
`defaults:` (as `rlsteps:nemo_rl/templates/master.yaml`); rl/rlhf and rl/reinforce compile their own keys
over them (master_config).
"""

from __future__ import annotations

from importlib import resources

from omegaconf import DictConfig, OmegaConf

GENRM_ENV = "genrm_env.yaml"
REWARD_MODEL_ENV = "reward_model_env.yaml"
NEMO_RL_RESOLVERS = {  # ${mul:a,b} and its kin, as NeMo-RL registers them for its own configs
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}


def register_resolvers() -> None:
    for name, function in NEMO_RL_RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_resolver(name, function)


def master_template(env_file: str) -> DictConfig:
    """The shipped master config with a recipe's data and env sections, unresolved (interpolations kept)."""
    register_resolvers()
    folder = resources.files(__package__).joinpath("templates")
    parts = [OmegaConf.create(folder.joinpath(name).read_text()) for name in ("master.yaml", env_file)]
    return OmegaConf.merge(*parts)
