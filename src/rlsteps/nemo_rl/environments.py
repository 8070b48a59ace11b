"""The env.* section of NeMo-RL's master config: where rewards come from, compiled for the pinned NeMo-Gym.

With the judge (rl/nemo_rl/rlhf, rl/rlhf): NeMo-Gym's genrm_compare server compares a group's responses pairwise
with a generative reward model. The user names the judge at the seed step's key
env.nemo_gym.genrm_model.responses_api_models.vllm_model: with `model` alone, Gym is to start vLLM on it, which in
the pinned Gym only its `genrm_model` server type does (its `vllm_model` type only reaches a running server), so
the block is compiled to that type. A `base_url` (a judge already served) is refused: genrm_compare's config in the
pinned Gym always declares its own genrm_model server, and a second server type in that instance is what Gym refuses.
Without the judge (rl/reinforce): NeMo-RL's reward-model environment serves a Bradley-Terry reward model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from rlsteps.dotted import get

SERVE_KWARGS_PARALLEL = ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size")
JUDGE_SERVER_DEFAULTS = {  # NeMo-Gym's genrm_model server, as its genrm_compare config declares it
    "entrypoint": "app.py",
    "return_token_id_information": False,
    "uses_reasoning_parser": False,  # the judge answers in JSON, not with a reasoning trace
    "supports_principle_role": True,
    "hf_home": None,
    "vllm_serve_env_vars": {"VLLM_RAY_DP_PACK_STRATEGY": "strict"},
    "debug": False,
}


class NemoRlConfigError(ValueError):
    """A step config NeMo-RL cannot run as asked; the message names the key, `fix` the keys to set (NeMo-RL's, as
    `changes`, where the fix is a set of values)."""

    def __init__(self, message: str, fix: str | None = None, changes: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.changes = changes or {}
        self.fix = fix or (assignments(self.changes) if self.changes else None)


def assignments(changes: dict[str, Any], name: Callable[[str], str] = str) -> str:
    """`key=value` overrides that set `changes` (a key named by `name`), as a user types them."""
    return " ".join(f"{name(key)}={_typed(value)}" for key, value in changes.items())


def _typed(value: Any) -> str:
    """A value as an override writes it: true/false, null, or as it prints."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def uses_gym(master: dict[str, Any]) -> bool:
    return bool(get(master, "env.should_use_nemo_gym"))


def judge_block(master: dict[str, Any]) -> dict[str, Any] | None:
    """The user's judge block (the seed's `vllm_model` instance under genrm_model), or None without the judge."""
    return get(master, "env.nemo_gym.genrm_model.responses_api_models.vllm_model")


def judge_gpus(master: dict[str, Any]) -> int:
    """The GPUs Gym's vLLM for the judge takes (tensor x data x pipeline parallel); 0 for a judge served elsewhere.
    Reads the user's block or the compiled one (Gym's genrm_model server)."""
    servers = get(master, "env.nemo_gym.genrm_model.responses_api_models") or {}
    block = servers.get("genrm_model") or servers.get("vllm_model")
    if not block or block.get("base_url"):
        return 0
    kwargs = block.get("vllm_serve_kwargs") or {}
    gpus = 1
    for key in SERVE_KWARGS_PARALLEL:
        gpus *= int(kwargs.get(key) or 1)
    return gpus


def compile_judge(master: dict[str, Any]) -> list[str]:
    """The judge block rewritten in place for the pinned Gym, genrm_compare tied to the GRPO group; the notes."""
    gym = master["env"]["nemo_gym"]
    block = judge_block(master)
    if block is None:
        raise NemoRlConfigError(
            "env.nemo_gym.genrm_model.responses_api_models.vllm_model is missing: set its model, the judge NeMo-Gym "
            "serves (a Hugging Face id or path)"
        )
    if block.get("base_url"):
        raise NemoRlConfigError(
            "a judge already served (base_url, or rl/rlhf's judge.url) cannot be used on NeMo-RL with the pinned "
            "NeMo-Gym: its genrm_compare config always declares the genrm_model server that starts vLLM, and a second "
            "server type beside it is refused; leave base_url unset and name the judge's model, which Gym serves"
        )
    if not block.get("model"):
        raise NemoRlConfigError(
            "the judge has no model: set env.nemo_gym.genrm_model.responses_api_models.vllm_model.model "
            "(a Hugging Face id or path)"
        )
    server = copy.deepcopy(JUDGE_SERVER_DEFAULTS)
    server.update({k: copy.deepcopy(v) for k, v in block.items() if k not in ("base_url", "api_key")})  # unset here
    gym["genrm_model"] = {"responses_api_models": {"genrm_model": server}}
    return _tie_group(master) + [
        f"judge: NeMo-Gym starts vLLM on {block['model']} on {judge_gpus(master)} GPU(s) of its own (its genrm_model "
        "server; the seed's vllm_model type only reaches a running server in the pinned Gym)"
    ]


def _tie_group(master: dict[str, Any]) -> list[str]:
    """genrm_compare buffers num_rollouts_per_prompt rollouts of a prompt before it compares: GRPO's group size."""
    compare = get(master, "env.nemo_gym.genrm_compare_resources_server.resources_servers.genrm_compare")
    group = master["grpo"]["num_generations_per_prompt"]
    if compare is None:
        return []
    before = compare.get("num_rollouts_per_prompt")
    compare["num_rollouts_per_prompt"] = group
    if before not in (None, group):
        return [f"genrm_compare.num_rollouts_per_prompt {before} -> {group}: it must equal the GRPO group size"]
    return []


def reward_model_env(cfg: dict[str, Any]) -> dict[str, Any]:
    """rl/reinforce's reward model for NeMo-RL's reward-model environment (the rest of env.reward_model is the
    template's)."""
    model = cfg["inputs"].get("reward_model")
    if not model:
        raise NemoRlConfigError(
            "rl/reinforce on NeMo-RL needs inputs.reward_model: NeMo-RL loads the reward model itself "
            "(rm.url, a running server, is for the embedded engine)"
        )
    rm = cfg["rm"]
    values: dict[str, Any] = {"model_name": model, "precision": cfg["run"]["dtype"], "batch_size": rm["batch_size"]}
    if rm["max_length"]:
        values["max_model_len"] = rm["max_length"]
    return {"env": {"reward_model": values}}
