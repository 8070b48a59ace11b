"""Which run a run directory belongs to, so a rerun resumes only the run it would continue.

The first start of a run writes <run>/run.json with its config. A later start into the same directory resumes
only when its config is the same but for the keys that may change between a run and its continuation (more
steps, other logging and checkpoint settings, a moved server, other threads); any other difference (a learning
rate, a prompt file, an algorithm setting) would continue one run under another's name, so it is refused with
the keys that differ and the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
# dotted prefixes that a continuation may change
RESUMABLE = (
    "train.max_steps", "train.max_epochs", "train.max_steps_without_update",
    "validation", "checkpoint", "logging", "output",
    "run.num_threads", "run.device",
    "rm.url", "rm.token", "rm.timeout_s", "rm.max_retries", "rm.backoff_s", "rm.concurrency", "rm.server",
    "judge.url", "judge.api_key", "judge.concurrency", "judge.timeout_s", "judge.max_retries",
    "judge.max_parse_failure_rate", "judge.on_failure",
)  # fmt: skip


class RunDirectoryInUse(RuntimeError):
    """The run directory holds checkpoints of a run with another config."""


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def changed_keys(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ, those a continuation may change left out."""
    old, new = flatten(before), flatten(after)
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k, "<unset>") != new.get(k, "<unset>"))
    return [k for k in keys if not any(k == p or k.startswith(p + ".") for p in RESUMABLE)]


def claim_run_directory(run_dir: Path, config: dict[str, Any], has_checkpoints: bool) -> None:
    """Record the config of a new run, or check that a run with checkpoints here is the one being continued."""
    path = run_dir / RUN_FILE
    recorded = json.loads(path.read_text()) if path.is_file() else None
    if recorded is not None and has_checkpoints:
        changed = changed_keys(recorded["config"], config)
        if changed:
            shown = ", ".join(f"{k} ({_value(recorded['config'], k)} -> {_value(config, k)})" for k in changed[:6])
            more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
            raise RunDirectoryInUse(
                f"{run_dir} holds checkpoints of a run with another config: {shown}{more}; resuming it would "
                f"continue that run under this config. Pass output.dir=NEW_DIR for a new run, or move {run_dir} "
                "away; rerun with the recorded config to resume it"
            )
        return
    staging = path.with_name(f".{RUN_FILE}.{os.getpid()}")
    staging.write_text(json.dumps({"config": config}, indent=2, sort_keys=True, default=str) + "\n")
    staging.replace(path)


def _value(config: dict[str, Any], dotted: str) -> str:
    return json.dumps(flatten(config).get(dotted, "<unset>"), default=str)
