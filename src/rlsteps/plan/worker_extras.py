"""The optional packages a config's options make the worker import, found before the job starts where its worker runs
here: a LoRA run without peft is refused in a second, by the run and its dry run alike, in the worker's words (which
would otherwise refuse it once its reward server is up). Found, not imported: torch-free."""

from __future__ import annotations

import importlib.util
from typing import Any

from rlsteps.dotted import get
from rlsteps.errors import RunFailed

# as rlsteps.engine.policy.lora.require_peft says it, in the worker
LORA_INSTALL_HINT = "pip install 'rlsteps[lora]' (peft) into the job's Python, or train.lora.enabled=false"


def missing_extra_problem(config: dict[str, Any]) -> RunFailed | None:
    """The refusal of a config whose options need a package this Python lacks; None when none is missing."""
    if get(config, "train.lora.enabled") and importlib.util.find_spec("peft") is None:
        return RunFailed("train.lora.enabled needs the peft library, which this Python lacks", fix=LORA_INSTALL_HINT)
    return None
