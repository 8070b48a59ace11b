"""An evaluation's per-prompt results on disk: one JSONL file a phase (the policy's responses, the baseline's, the
judge's verdicts), each line one prompt done, appended a batch at a time in one write and synced. A kill leaves at
most a torn last line, which the reader drops (and the next append overwrites), so a rerun goes on from the first
prompt not done and never redoes a finished one.

The run directory is bound to the config that started it (eval_run.json holds its hash): results of another config
are never mixed into a report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESULTS_DIR = "results"
IDENTITY_FILE = "eval_run.json"
PHASES = ("policy", "baseline", "judge")


class ResultsOfAnotherConfig(ValueError):
    """The run directory holds results of another config."""


def results_path(run_dir: Path, phase: str) -> Path:
    return run_dir / RESULTS_DIR / f"{phase}.jsonl"


def read_results(path: Path) -> list[dict[str, Any]]:
    """The whole lines of a results file, in order; a torn last line (a kill mid-write) is cut off the file."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with path.open("r+b") as handle:
            handle.truncate(len(whole))
    return [json.loads(line) for line in whole.decode("utf-8").splitlines() if line.strip()]


def append_results(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Append the records as whole lines in one write, synced before returning."""
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    if not text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as handle:
        handle.write(text.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def claim_for_config(run_dir: Path, config_hash: str) -> None:
    """Bind the run directory to this config, or raise ResultsOfAnotherConfig when results of another are there."""
    identity = run_dir / IDENTITY_FILE
    if identity.is_file():
        held = json.loads(identity.read_text()).get("config_hash")
        has_results = any(results_path(run_dir, phase).is_file() for phase in PHASES)
        if held != config_hash and has_results:
            raise ResultsOfAnotherConfig(
                f"{run_dir} holds the results of another eval config; give this one its own output.dir=DIR, or "
                f"delete {run_dir / RESULTS_DIR} to evaluate afresh"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    partial = identity.with_suffix(".partial")
    partial.write_text(json.dumps({"config_hash": config_hash}))
    os.replace(partial, identity)


def done_ids(records: list[dict[str, Any]]) -> set[str]:
    return {record["id"] for record in records}
