"""The typed output artifact: a directory whose metadata file, written last, says what it holds.

Torch-free: the command line reads the metadata through this module too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

METADATA_FILE = "rlsteps_artifact.json"


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_artifact(target: Path, write_contents: Callable[[Path], None], metadata: dict[str, Any]) -> Path:
    """Write into a sibling temp dir, add the metadata last, then rename over the target.

    A kill at any point leaves either the previous artifact or the new one, never a mix.
    """
    staging = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    write_contents(staging)
    size = sum(f.stat().st_size for f in staging.rglob("*") if f.is_file())
    full = {**metadata, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "size_bytes": size}
    (staging / METADATA_FILE).write_text(json.dumps(full, indent=2, sort_keys=True, default=str))
    old = target.with_name(f".old-{target.name}-{os.getpid()}")
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def read_artifact_metadata(directory: Path) -> dict[str, Any] | None:
    path = directory / METADATA_FILE
    return json.loads(path.read_text()) if path.is_file() else None
