"""Whether a run can write the output form its config asks for, asked before anything starts: a checkpoint_megatron
needs megatron-core where the run writes it, and a policy whose architecture has a Megatron GPT layout
(rlsteps.contract.model_families). The dry run says it in one line with the fix, where the run would otherwise train
and then fail at its end. Torch-free.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from rlsteps.artifacts.inputs import ResolvedInput, lookup, produced_type
from rlsteps.catalog import Catalog, Step
from rlsteps.contract.model_families import megatron_form_refusal
from rlsteps.errors import UsageError

MEGATRON_FORM = "checkpoint_megatron"
HF_FORM_FIX = "output.type=checkpoint_hf"  # every step that writes a policy takes it (manifests: type_key)


def output_form_problem(
    catalog: Catalog, step: Step, config: dict[str, Any], inputs: list[ResolvedInput], runs_here: bool
) -> UsageError | None:
    """Why the run could not write its checkpoint_megatron output; None when it can, or where that is not known here.

    runs_here: the run's worker starts on this machine, in this environment (its megatron-core is the run's)."""
    if not _writes_megatron(catalog, step, config) or lookup(config, "engine") == "nemo_rl":
        return None  # NeMo-RL's job converts with Megatron-Bridge inside its own container
    if runs_here and not _megatron_core_installed():
        return UsageError(
            "the output is a checkpoint_megatron and megatron-core is not installed: the run would train and then "
            "fail to write it",
            fix=f"pip install 'rlsteps[megatron]', or pass {HF_FORM_FIX} to write the Hugging Face form",
        )
    for item in inputs:
        why = _architecture_problem(catalog, item)
        if why is not None:
            return UsageError(
                f"input '{item.name}' ({item.ref}): {why}; the output would be a checkpoint_megatron",
                fix=f"pass {HF_FORM_FIX} to write the Hugging Face form",
            )
    return None


def _megatron_core_installed() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None  # imports the megatron namespace alone
    except ImportError:
        return False


def _writes_megatron(catalog: Catalog, step: Step, config: dict[str, Any]) -> bool:
    return any(catalog.is_a(produced_type(spec, config), MEGATRON_FORM) for spec in step.produces)


def _architecture_problem(catalog: Catalog, item: ResolvedInput) -> str | None:
    """The Megatron layout's refusal of a Hugging Face policy given as this input (a checkpoint_hf on this machine)."""
    if item.status != "ok" or not any(catalog.is_a(found, "checkpoint_hf") for found in item.detected):
        return None
    config_file = Path(item.location) / "config.json"  # a Hub id: its snapshot in this machine's cache
    try:
        hf_config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a remote or unreadable folder: the worker asks again at its start
    try:
        return megatron_form_refusal(hf_config) if isinstance(hf_config, dict) else None
    except (KeyError, TypeError, ValueError):  # a config.json without the sizes: the input's own check says so
        return None
