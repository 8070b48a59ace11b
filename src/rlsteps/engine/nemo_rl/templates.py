"""NeMo-RL's master config as rlsteps ships it (steps/rl/nemo_rl/*.yaml), and the resolvers NeMo-RL's configs use.

master.yaml holds every key NeMo-RL v0.7.0's MasterConfig and drivers read; genrm_env.yaml and reward_model_env.yaml
add a recipe's data and env sections. rl/nemo_rl/rlhf's configs extend them through `defaults:`; rl/rlhf and
rl/reinforce compile their own keys over them (master_config).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rlsteps.catalog import project_root

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
    folder = project_root() / "steps" / "rl" / "nemo_rl"
    return OmegaConf.merge(OmegaConf.load(folder / "master.yaml"), OmegaConf.load(folder / env_file))
