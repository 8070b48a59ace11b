"""Which run a run directory belongs to, so a rerun resumes only the run it would continue.

The first start of a run writes <run>/run.json with the run's identity: its config less the keys that may change
between a run and its continuation (more steps, other logging and checkpoint settings, a moved server and its
token, other threads). A later start into the same directory resumes only with the same identity; any other
difference (a learning rate, a prompt file, an algorithm setting) would continue one run under another's name,
so it is refused with the keys that differ and the fix. `rlsteps run` and its dry run ask before the job starts; the
worker's own claim is the one that counts. Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlsteps.contract.disk import FULL_ERRNOS, disk_full
from rlsteps.errors import UsageError

RUN_FILE = "run.json"
# dotted prefixes that a continuation may change
RESUMABLE = (
    "train.max_steps", "train.max_epochs", "train.max_steps_without_update",
    "validation", "checkpoint", "logging", "output",
    "run.num_threads", "run.device", "run.overlap_reference",
    "rm.url", "rm.token", "rm.timeout_s", "rm.max_retries", "rm.backoff_s", "rm.concurrency", "rm.server",
    "judge.url", "judge.api_key", "judge.concurrency", "judge.timeout_s", "judge.max_retries",
    "judge.max_parse_failure_rate", "judge.on_failure",
)  # fmt: skip


class RunDirectoryInUse(UsageError):
    """The run directory holds checkpoints of a run with another config: a config error, exit 2."""


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The flat config a continuation must keep: every dotted key but those it may change. The secrets (server
    tokens, API keys) are among those, so the record written to disk never holds one."""
    return {k: v for k, v in flatten(config).items() if not any(k == p or k.startswith(p + ".") for p in RESUMABLE)}


def changed_keys(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The dotted keys of two configs whose values differ, those a continuation may change left out."""
    return _differences(identity(before), identity(after))


def claim_run_directory(run_dir: Path, config: dict[str, Any], has_checkpoints: bool) -> None:
    """Record the identity of a new run, or check that a run with checkpoints here is the one being continued."""
    path = run_dir / RUN_FILE
    refused = another_run_problem(run_dir, config, has_checkpoints)
    if refused is not None:
        raise refused
    if path.is_file() and has_checkpoints:
        return
    staging = path.with_name(f".{RUN_FILE}.{os.getpid()}")
    try:
        staging.write_text(json.dumps({"identity": identity(config)}, indent=2, sort_keys=True, default=str) + "\n")
        staging.replace(path)
    except OSError as error:
        staging.unlink(missing_ok=True)
        if error.errno in FULL_ERRNOS:
            raise disk_full(run_dir, what=RUN_FILE) from error
        raise


def another_run_problem(
    run_dir: Path, config: dict[str, Any], has_checkpoints: bool, ignored: Callable[[str], bool] = lambda key: False
) -> RunDirectoryInUse | None:
    """The refusal of a start whose run directory holds checkpoints of a run with another config; None when there
    is none to resume or the recorded run is this one. ignored: keys whose difference cannot be judged here (the
    submitting side leaves out the inputs the job resolves itself)."""
    path = run_dir / RUN_FILE
    recorded = json.loads(path.read_text())["identity"] if path.is_file() else None
    if recorded is None or not has_checkpoints:
        return None
    current = identity(config)
    changed = [key for key in _differences(recorded, current) if not ignored(key)]
    if not changed:
        return None
    shown = ", ".join(f"{k} ({_value(recorded, k)} -> {_value(current, k)})" for k in changed[:6])
    more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
    return RunDirectoryInUse(
        f"{run_dir} holds checkpoints of a run with another config: {shown}{more}; resuming it would continue that "
        "run under this config",
        fix=f"pass output.dir=NEW_DIR for a new run, or move {run_dir} away; rerun with the recorded config to "
        "resume it",
    )


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k, "<unset>") != new.get(k, "<unset>"))


def _value(flat: dict[str, Any], dotted: str) -> str:
    return json.dumps(flat.get(dotted, "<unset>"), default=str)
