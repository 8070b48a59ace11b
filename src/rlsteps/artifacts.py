"""Artifact references over fsspec: detect what a path holds and check it against a step's manifest.

A reference is a local path or any fsspec URL. Detection reads only small metadata files
(config.json, metadata.json, the first bytes of a JSONL file), never weights.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Callable

from fsspec.core import url_to_fs

from rlsteps.catalog import Catalog, Step
from rlsteps.errors import ArtifactError

from rlsteps.engine.artifact import METADATA_FILE
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


@dataclass(frozen=True)
class ResolvedInput:
    name: str
    key: str
    ref: str | None
    required_type: str
    detected: list[str]
    status: str  # ok | absent | missing | wrong_type

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _exists(ref: str) -> bool:
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
    return any(a.endswith("ForSequenceClassification") for a in archs) and config.get("num_labels", len(config.get("id2label") or {1: 0})) == 1 and _has_weights(ref)


def _is_hf_any_model(ref: str) -> bool:
    return bool(_architectures(ref)) and _has_weights(ref)


def _is_megatron_dist(ref: str) -> bool:
    meta = _read_json(ref, "metadata.json") or {}
    return meta.get("sharded_backend") == "torch_dist"


DETECTORS: dict[str, Callable[[str], bool]] = {
    "jsonl": _is_jsonl,
    "hf_causal_lm": _is_hf_causal_lm,
    "hf_reward_model": _is_hf_reward_model,
    "hf_any_model": _is_hf_any_model,
    "megatron_dist": _is_megatron_dist,
}


def detect_types(catalog: Catalog, ref: str) -> list[str]:
    """Every concrete type whose detector accepts the reference; a metadata file's declared type first."""
    declared = (_read_json(ref, METADATA_FILE) or {}).get("type")
    found = [declared] if declared in catalog.types else []
    for t in catalog.types.values():
        if t.detect and t.name not in found and DETECTORS[t.detect](ref):
            found.append(t.name)
    return found


def satisfies(catalog: Catalog, detected: list[str], required: str) -> bool:
    return any(catalog.is_a(t, required) for t in detected)


def check_input(catalog: Catalog, spec_name: str, key: str, ref: str | None, required_type: str) -> ResolvedInput:
    if ref is None:
        return ResolvedInput(spec_name, key, None, required_type, [], "absent")
    try:
        present = _exists(ref)
    except (ValueError, ImportError, OSError) as err:
        raise ArtifactError(f"{key}: cannot open '{ref}': {err}") from err
    if not present:
        return ResolvedInput(spec_name, key, ref, required_type, [], "missing")
    detected = detect_types(catalog, ref)
    status = "ok" if satisfies(catalog, detected, required_type) else "wrong_type"
    return ResolvedInput(spec_name, key, ref, required_type, detected, status)


def resolve_inputs(catalog: Catalog, step: Step, config: dict[str, Any]) -> list[ResolvedInput]:
    """Check every input the manifest declares; raise ArtifactError (exit 3) naming the first problem."""
    resolved = [check_input(catalog, s.name, s.key, lookup(config, s.key), s.type) for s in step.consumes]
    for spec, item in zip(step.consumes, resolved):
        _raise_for(spec.required and not (spec.required_unless and lookup(config, spec.required_unless)), item)
    return resolved


def _raise_for(required: bool, item: ResolvedInput) -> None:
    if item.status == "absent" and required:
        raise ArtifactError(f"input '{item.name}' ({item.required_type}) is required", fix=f"pass {item.key}=PATH")
    if item.status == "missing":
        raise ArtifactError(f"input '{item.name}': {item.ref} does not exist", fix=f"pass {item.key}=PATH to a {item.required_type}")
    if item.status == "wrong_type":
        what = " or ".join(item.detected) if item.detected else "not a recognised artifact"
        raise ArtifactError(
            f"input '{item.name}': {item.ref} is {what}, but a {item.required_type} is required",
            fix=f"point {item.key} at a {item.required_type}",
        )


def lookup(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
