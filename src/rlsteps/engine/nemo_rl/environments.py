"""The env.* section of NeMo-RL's master config: where rewards come from.

rl/rlhf: NeMo-Gym's genrm_compare server compares a group's responses pairwise with a generative judge, served by a
vLLM NeMo-Gym starts on inputs.judge_model (or reached at judge.url); keys as Nemotron's rl/nemo_rl/rlhf step sets
them. rl/reinforce: NeMo-RL's reward-model environment serves inputs.reward_model itself (Bradley-Terry).
"""

from __future__ import annotations

from typing import Any

GYM_CONFIG_PATHS = [  # NeMo-Gym servers the rl/rlhf environment starts: the policy's model server and the judge
    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
    "resources_servers/genrm_compare/configs/genrm_compare.yaml",
]
PAIRINGS = {"circular": "circular", "all": "all_pairs"}  # rlsteps judge.pairing -> genrm_compare comparison_strategy


class NemoRlConfigError(ValueError):
    """A step config NeMo-RL cannot run as asked; the message names the key and the fix."""


def environment(cfg: dict[str, Any]) -> dict[str, Any]:
    return _rlhf_env(cfg) if cfg["algorithm"] == "grpo" else _reward_model_env(cfg)


def sequence_length(cfg: dict[str, Any]) -> int:
    """Prompt and response together: NeMo-RL's one length limit for training and vLLM."""
    return cfg["data"]["max_prompt_tokens"] + cfg["rollout"]["sampling"]["max_new_tokens"]


def reward_model_dtensor() -> dict[str, Any]:
    return {
        "_v2": True,
        "enabled": True,
        "cpu_offload": False,
        "sequence_parallel": False,
        "activation_checkpointing": False,
        "tensor_parallel_size": 1,
        "context_parallel_size": 1,
        "custom_parallel_plan": None,
    }


def _rlhf_env(cfg: dict[str, Any]) -> dict[str, Any]:
    judge, group = cfg["judge"], cfg["rollout"]["num_rollouts_per_prompt"]
    compare = {
        "genrm_model_server": {"type": "responses_api_models", "name": "genrm_model"},
        "genrm_responses_create_params": {
            "max_output_tokens": judge["max_tokens"],
            "temperature": judge["temperature"],
            "top_p": judge["top_p"],
        },
        "comparison_strategy": PAIRINGS[judge["pairing"]],
        "num_judges_per_comparison": 1,
        "num_rollouts_per_prompt": group,  # genrm_compare buffers a whole group before it compares
        "use_principle": judge["principle"] is not None,
        "aggregator_method": "simple_tiebreaker",
        "group_answer_length_penalty_coeff": judge["length_penalty"],
        "default_score": 3.0,
        "default_ranking": 3.5,
        "genrm_parse_retries": judge["max_retries"],
    }
    if judge["principle"] is not None:
        compare["default_principle"] = judge["principle"]
    return {
        "should_use_nemo_gym": True,
        "use_genrm_compare": True,
        "nemo_gym": {
            "config_paths": list(GYM_CONFIG_PATHS),
            "genrm_compare_resources_server": {"resources_servers": {"genrm_compare": compare}},
            "genrm_model": {"responses_api_models": {"vllm_model": _judge_server(cfg)}},
        },
    }


def _judge_server(cfg: dict[str, Any]) -> dict[str, Any]:
    """The judge NeMo-Gym reaches: a vLLM it starts on inputs.judge_model, or the server at judge.url."""
    judge = cfg["judge"]
    if judge["url"]:
        if not judge["model"]:
            raise NemoRlConfigError("judge.url is set but judge.model is not: name the model the server serves")
        return {
            "entrypoint": "app.py",
            "base_url": judge["url"],
            "api_key": judge["api_key"] or "dummy_key",
            "model": judge["model"],
            "spinup_server": False,
            "return_token_id_information": False,
        }
    model = cfg["inputs"].get("judge_model")
    if not model:
        raise NemoRlConfigError("rl/rlhf on NeMo-RL needs inputs.judge_model (NeMo-Gym serves it) or judge.url")
    return {
        "entrypoint": "app.py",
        "model": model,
        "spinup_server": True,
        "return_token_id_information": False,
        "uses_reasoning_parser": False,
        "server_args": {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.85, "max_model_len": 8192},
    }


def _reward_model_env(cfg: dict[str, Any]) -> dict[str, Any]:
    model = cfg["inputs"].get("reward_model")
    if not model:
        raise NemoRlConfigError(
            "rl/reinforce on NeMo-RL needs inputs.reward_model: NeMo-RL loads the reward model itself "
            "(rm.url, a running server, is for the embedded engine)"
        )
    rm = cfg["rm"]
    return {
        "reward_model": {
            "model_name": model,
            "tokenizer": {"name": model},
            "precision": cfg["run"]["dtype"],
            "batch_size": rm["batch_size"],
            "checkpoint_path": None,
            "max_model_len": rm["max_length"] or sequence_length(cfg),
            "resources": {"gpus_per_node": 1, "num_nodes": 1},
            "dtensor_cfg": reward_model_dtensor(),
            "reward_model_cfg": {"enabled": True, "reward_model_type": "bradley_terry"},
            "dynamic_batching": {"enabled": False},
            "sequence_packing": {"enabled": False},
            "max_grad_norm": None,
        }
    }
