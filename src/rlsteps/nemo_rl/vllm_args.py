"""The keywords a NeMo-RL job hands to vLLM, checked against vLLM's own argument names (vllm_fields, torch-free).

- policy.generation.vllm_kwargs: NeMo-RL's vLLM workers pass them to vllm.LLM / AsyncEngineArgs beside keywords of
  their own (nemo_rl/models/generation/vllm/vllm_worker.py, `llm_kwargs = dict(...)`): a name vLLM's engine does not
  know is a TypeError when the worker starts, and one NeMo-RL passes itself is given twice (a TypeError too).
- the judge's vllm_serve_kwargs: NeMo-Gym's vLLM server parses them with vLLM's server argument parser into a
  namespace, which keeps a name it does not know without a word: the setting would be lost.
An entry set to null is dropped (vLLM's default), which is how a refusal's fix removes a misspelt one.
"""

from __future__ import annotations

import difflib
from typing import Any

from rlsteps.dotted import get
from rlsteps.nemo_rl.environments import NemoRlConfigError
from rlsteps.nemo_rl.key_map import JUDGE
from rlsteps.nemo_rl.vllm_fields import ENGINE_ARGS, SERVE_ARGS, VLLM_VERSION

VLLM_KWARGS = "policy.generation.vllm_kwargs"
SERVE_KWARGS = JUDGE + ".vllm_serve_kwargs"  # the user's key; compile_judge moves the block to Gym's genrm_model
COMPILED_SERVE = "env.nemo_gym.genrm_model.responses_api_models.genrm_model"
# what NeMo-RL v0.7.0's vLLM worker passes to vLLM itself (vllm_worker.py:435), and the policy.generation.vllm_cfg
# key (or other setting) that says it; tests/test_nemo_rl_vllm_args.py reads the worker's call to compare
NEMO_RL_KEYWORDS = {
    "model": "policy.model_name",
    "served_model_name": "policy.model_name",
    "load_format": "policy.generation.vllm_cfg.load_format",
    "skip_tokenizer_init": "policy.generation.vllm_cfg.skip_tokenizer_init",
    "tensor_parallel_size": "policy.generation.vllm_cfg.tensor_parallel_size",
    "pipeline_parallel_size": "policy.generation.vllm_cfg.pipeline_parallel_size",
    "enable_expert_parallel": "policy.generation.vllm_cfg.expert_parallel_size",
    "gpu_memory_utilization": "policy.generation.vllm_cfg.gpu_memory_utilization",
    "enable_prefix_caching": "policy.generation.vllm_cfg.enable_prefix_caching",
    "dtype": "policy.generation.vllm_cfg.precision",
    "seed": "grpo.seed",
    "enforce_eager": "policy.generation.vllm_cfg.enforce_eager",
    "max_model_len": "policy.generation.vllm_cfg.max_model_len",
    "trust_remote_code": "(always true)",
    "worker_extension_cls": "(NeMo-RL's weight-update extension)",
    "enable_sleep_mode": "(always true)",
    "disable_log_stats": "(always false: NeMo-RL reads vLLM's metrics)",
    "logprobs_mode": "(always processed_logprobs)",
}


def check_vllm_keywords(master: dict[str, Any]) -> list[str]:
    """Refuses a keyword vLLM would refuse or lose (NemoRlConfigError with the fix); null entries dropped; notes."""
    notes = []
    generation = master["policy"]["generation"]
    if generation.get("backend") == "vllm":
        notes += _check(generation, "vllm_kwargs", VLLM_KWARGS, ENGINE_ARGS, NEMO_RL_KEYWORDS)
    server = get(master, COMPILED_SERVE)
    if server:
        notes += _check(server, "vllm_serve_kwargs", SERVE_KWARGS, ENGINE_ARGS | SERVE_ARGS)
    return notes


def _check(section: dict[str, Any], name: str, key: str, known: frozenset[str], taken=None) -> list[str]:
    """section[name]'s entries checked against `known` and `taken` (what NeMo-RL passes itself); nulls dropped."""
    taken = taken or {}
    kwargs = section.get(name) or {}
    dropped = sorted(entry for entry, value in kwargs.items() if value is None)
    section[name] = {entry: value for entry, value in kwargs.items() if value is not None}
    for entry, value in section[name].items():
        if entry in taken:
            raise NemoRlConfigError(
                f"{key}.{entry}: NeMo-RL's vLLM worker passes {entry} to vLLM itself (from {taken[entry]}), and vLLM "
                "would get it twice",
                changes={f"{key}.{entry}": None},
            )
        if entry not in known:
            raise _unknown(key, entry, value, known, bool(taken))
    return [f"{key}: {', '.join(dropped)} null, so dropped (vLLM's defaults)"] if dropped else []


def _unknown(key: str, entry: str, value: Any, known: frozenset[str], engine: bool) -> NemoRlConfigError:
    close = difflib.get_close_matches(entry, sorted(known), n=1, cutoff=0.75)
    what = (
        "vLLM's AsyncEngineArgs would refuse it when NeMo-RL's worker starts"
        if engine
        else "vLLM's server arguments do not have it, and NeMo-Gym would pass it on to be ignored"
    )
    guess = f"; did you mean {close[0]}?" if close else ""
    said = f"{key}.{entry} is not an argument of vLLM {VLLM_VERSION}: {what}{guess}"
    changes = {f"{key}.{entry}": None}
    if close:
        changes[f"{key}.{close[0]}"] = value
    return NemoRlConfigError(said, changes=changes)
