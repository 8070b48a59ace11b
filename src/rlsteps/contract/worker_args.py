"""The worker's command line: what `rlsteps run STEP ... -- ARGS` may pass it (checked before any job starts), and the
compiled config.yaml it reads. Standard library only at import (the schemas are imported where a config is read)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rlsteps.contract.entry_points import WORKER_MODULE

if TYPE_CHECKING:
    from rlsteps.contract.config_types import Section

WORKER_PROGRAM = f"python -m {WORKER_MODULE}"
WORKER_DESCRIPTION = f"The worker: `{WORKER_PROGRAM} JOB_DIR/config.yaml` runs one step to its end."


def load_config(path: Path) -> Section:
    """The compiled config.yaml of a job directory, validated by its step's schema."""
    from omegaconf import OmegaConf

    from rlsteps.contract.config import STEP_SCHEMAS

    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    schema = STEP_SCHEMAS[raw["algorithm"]]
    return schema.model_validate(raw)


def build_parser() -> argparse.ArgumentParser:
    """The worker's arguments; `rlsteps run STEP ... -- ARGS` passes ARGS here (checked before any job starts)."""
    parser = argparse.ArgumentParser(prog=WORKER_PROGRAM, description=WORKER_DESCRIPTION)
    parser.add_argument("config", type=Path, help="the compiled config.yaml in the job directory")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="how much the worker logs (default info)",
    )
    return parser


def unknown_worker_arguments(passthrough: list[str]) -> list[str]:
    """The words of `passthrough` the worker would not accept (torch-free: the compiler calls it)."""
    words = [w for w in passthrough if w not in ("-h", "--help")]  # valid, but parsing them would exit
    try:
        _, unknown = build_parser().parse_known_args(["config.yaml", *words])
    except SystemExit:  # a known option with a bad value; argparse has printed why
        return words
    return unknown
