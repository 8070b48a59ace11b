"""NeMo-Gym's servers, stood in for a NeMo-RL run on a CPU (tests/nemo_rl_run.py).

NeMo-RL's NemoGym actor runs as it is (its spin-up, the global config it hands Gym, the post-processing of Gym's
results into message logs). RunHelper.start parses that config with Gym's own get_global_config_dict and looks up
each server instance's folder and entrypoint as Gym does, but starts no process. RolloutCollectionHelper.run_examples
answers each row as the agent server would: the policy's answer (the prompt under the policy tokenizer's chat
template, then the stand-in engine's tokens) with a reward from the judge drawn per rollout.
"""

from __future__ import annotations

from pathlib import Path
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
