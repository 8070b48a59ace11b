"""What an artifact reference holds: the concrete types whose detectors accept a path or fsspec URL.

Detection reads only small metadata files (config.json, metadata.json, the name of a JSONL, parquet or arrow file,
a dataset folder's file names), never weights. It is torch-free and needs no catalog: the catalog names each type's
detector, and a job that checks its own inputs (on paths only the cluster sees) carries those names in its job.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from fsspec.core import url_to_fs

from rlsteps.contract.artifact import METADATA_FILE
from rlsteps.contract.megatron_files import find_checkpoint_dir
from rlsteps.contract.prompt_datasets import is_prompt_dataset

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def exists(ref: str) -> bool:
    fs, path = url_to_fs(ref)
    return fs.exists(path)


def _read_json(ref: str, name: str) -> dict[str, Any] | None:
    fs, path = url_to_fs(ref)
    target = f"{path.rstrip('/')}/{name}"
    if not fs.isfile(target):
        return None
    try:
        with fs.open(target, "rt") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None
    return data if isinstance(data, dict) else None


def _has_weights(ref: str) -> bool:
    fs, path = url_to_fs(ref)
    return any(fs.glob(f"{path.rstrip('/')}/{pattern}") for pattern in WEIGHT_PATTERNS)


def _architectures(ref: str) -> list[str]:
    config = _read_json(ref, "config.json") or {}
    return [str(a) for a in config.get("architectures") or []]


def _is_jsonl(ref: str) -> bool:
    fs, path = url_to_fs(ref)
    return fs.isfile(path) and path.endswith((".jsonl", ".json"))


def _is_hf_causal_lm(ref: str) -> bool:
    return any(a.endswith(CAUSAL_LM_SUFFIXES) for a in _architectures(ref)) and _has_weights(ref)


def _is_hf_reward_model(ref: str) -> bool:
    config = _read_json(ref, "config.json") or {}
    archs = _architectures(ref)
    return (
        any(a.endswith("ForSequenceClassification") for a in archs)
        and config.get("num_labels", len(config.get("id2label") or {1: 0})) == 1
        and _has_weights(ref)
    )


def _is_hf_any_model(ref: str) -> bool:
    return bool(_architectures(ref)) and _has_weights(ref)


def _is_megatron_dist(ref: str) -> bool:
    """A torch_dist checkpoint folder, or a Megatron checkpoint root whose tracker file (or newest iter_*) holds one."""
    fs, path = url_to_fs(ref)
    return find_checkpoint_dir(fs, path)[0] is not None


DETECTORS: dict[str, Callable[[str], bool]] = {
    "jsonl": _is_jsonl,
    "hf_dataset": is_prompt_dataset,
    "hf_causal_lm": _is_hf_causal_lm,
    "hf_reward_model": _is_hf_reward_model,
    "hf_any_model": _is_hf_any_model,
    "megatron_dist": _is_megatron_dist,
}


def detect(ref: str, detectors: Mapping[str, str | None]) -> list[str]:
    """Every type whose detector accepts the reference; a metadata file's declared type first.

    detectors: every known type -> the name of its detector in DETECTORS (None: known by metadata alone)."""
    declared = (_read_json(ref, METADATA_FILE) or {}).get("type")
    found = [declared] if declared in detectors else []
    for name, detector in detectors.items():
        if detector and name not in found and DETECTORS[detector](ref):
            found.append(name)
    return found
