"""NeMo-Gym's servers, stood in for a NeMo-RL run on a CPU (tests/nemo_rl_run.py).

NeMo-RL's NemoGym actor runs as it is (its spin-up, the global config it hands Gym, the post-processing of Gym's
results into message logs). RunHelper.start parses that config with Gym's own get_global_config_dict and looks up
each server instance's folder and entrypoint as Gym does, but starts no process; for a server that starts vLLM on
GPUs of its own (Gym's local_vllm_model and the genrm_model judge built on it) it reserves them in Ray as that
server does, with Gym's own LocalVLLMModel._select_vllm_server_head_node (the placement group of its first
data-parallel rank), and keeps them for the run. RolloutCollectionHelper.run_examples
answers each row as the agent server would: the policy's answer (the prompt under the policy tokenizer's chat
template, then the stand-in engine's tokens) with a reward from the judge drawn per rollout.
"""

from __future__ import annotations

import ast
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nemo_rl_standin_vllm import draw_answer, seed_of

_GYM: dict[str, Any] = {}


def gym_stand_ins() -> tuple[type, type]:
    from nemo_gym.cli.env import _resolve_server_dir
    from nemo_gym.global_config import NEMO_GYM_RESERVED_TOP_LEVEL_KEYS, GlobalConfigDictParser, get_global_config_dict
    from omegaconf import DictConfig, OmegaConf

    class RunHelper:
        """Gym's RunHelper.start up to where it would start the servers' processes."""

        def start(self, global_config_dict_parser_config) -> None:
            config = get_global_config_dict(global_config_dict_parser_config=global_config_dict_parser_config)
            GlobalConfigDictParser().raise_on_no_server_instances(config)
            servers = []
            for name in (k for k in config if k not in NEMO_GYM_RESERVED_TOP_LEVEL_KEYS):
                spec = config[name]
                if not isinstance(spec, DictConfig):
                    continue
                kind = next(iter(spec))
                if not isinstance(spec[kind], DictConfig):
                    continue
                implementation = next(iter(spec[kind]))
                inner = spec[kind][implementation]
                if not isinstance(inner, DictConfig) or "entrypoint" not in inner:
                    continue
                folder = _resolve_server_dir(Path(kind, implementation))
                if not (folder / inner.entrypoint).is_file():
                    raise FileNotFoundError(f"NeMo-Gym server {name}: no {inner.entrypoint} in {folder}")
                servers.append(name)
                if "vllm_serve_kwargs" in inner and not inner.get("base_url"):
                    reserve_vllm_server_gpus(name, OmegaConf.to_container(inner, resolve=True))
            _GYM.update(config=OmegaConf.to_container(config, resolve=True), servers=servers)

        def shutdown(self) -> None:
            return None

    class RolloutCollectionHelper:
        """The agent's /run for each row: the policy's answer and the judge's reward, as Gym returns them."""

        def run_examples(self, examples, head_server_config=None, semaphore=None):
            from transformers import AutoConfig, AutoTokenizer

            model = _GYM["config"]["policy_model_name"]
            tokenizer = AutoTokenizer.from_pretrained(model)
            vocab = AutoConfig.from_pretrained(model).vocab_size

            async def run(row: dict, number: int) -> tuple[dict, dict]:
                params = row["responses_create_params"]
                prompt = tokenizer.apply_chat_template(params["input"], tokenize=True, add_generation_prompt=True)
                prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
                tokens, _ = draw_answer(prompt, params["max_output_tokens"], vocab, tokenizer.eos_token_id, number)
                item = {
                    "type": "message", "role": "assistant", "id": f"msg_{number}", "status": "completed",
                    "content": [{"type": "output_text", "text": tokenizer.decode(tokens), "annotations": []}],
                    "prompt_token_ids": prompt, "generation_token_ids": tokens,
                    "generation_log_probs": [-1.0] * len(tokens),
                }  # fmt: skip
                reward = (seed_of(row.get("prompt_id"), number) % 1000) / 1000
                return row, {"responses_create_params": params, "response": {"output": [item]}, "reward": reward}

            return [run(row, n) for n, row in enumerate(examples)]

    return RunHelper, RolloutCollectionHelper


LOCAL_VLLM_SERVER = ("responses_api_models/local_vllm_model/app.py", "LocalVLLMModel")


def gym_method(relative_path: str, class_name: str, method_name: str, scope: dict[str, Any]):
    """A method of a NeMo-Gym class compiled from Gym's own source alone, over the names in `scope` (the server's
    module imports Gym's Anthropic converter, whose types need the anthropic package, not installed here)."""
    import upstream

    path = upstream.unpacked("nemo_gym") / relative_path
    tree = ast.parse(path.read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name)
    method = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == method_name)
    namespace = dict(scope)
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[method_name]


def reserve_vllm_server_gpus(name: str, server: dict[str, Any]):
    """The placement group Gym's vLLM server `name` reserves for its first data-parallel rank, made by Gym's own
    code from the server's vllm_serve_kwargs and vllm_serve_env_vars (as its _configure_vllm_serve passes them)."""
    import ray
    from ray.util.placement_group import PlacementGroup

    names = {"ray": ray, "Namespace": Namespace, "Dict": dict, "PlacementGroup": PlacementGroup}
    select = gym_method(*LOCAL_VLLM_SERVER, "_select_vllm_server_head_node", names)
    env_vars = {"HF_HUB_ENABLE_HF_TRANSFER": "1", **server["vllm_serve_env_vars"]}
    server_args = Namespace(**server["vllm_serve_kwargs"])
    return select(SimpleNamespace(config=SimpleNamespace(name=name)), server_args, env_vars)
