"""The typed output artifact: a directory whose metadata file, written last, says what it holds.

Torch-free: the command line reads the metadata through this module too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsspec.core import url_to_fs

from rlsteps.contract.disk import disk_full, is_disk_full

METADATA_FILE = "rlsteps_artifact.json"


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_artifact(target: Path, write_contents: Callable[[Path], None], metadata: dict[str, Any]) -> Path:
    """Write into a sibling temp dir, add the metadata last, then rename over the target.

    A kill at any point leaves either the previous artifact or the new one, never a mix; a write that fails (a full
    disk: DiskFull) removes what it wrote.
    """
    recover_interrupted_write(target)
    staging = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        write_contents(staging)
        size = sum(f.stat().st_size for f in staging.rglob("*") if f.is_file())
        full = {**metadata, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "size_bytes": size}
        (staging / METADATA_FILE).write_text(json.dumps(full, indent=2, sort_keys=True, default=str))
    except Exception as error:
        shutil.rmtree(staging, ignore_errors=True)  # nothing half-written stays behind
        if is_disk_full(error):
            raise disk_full(target.parent, what=f"the output {target.name}/") from error
        raise
    old = target.with_name(f".old-{target.name}-{os.getpid()}")
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def recover_interrupted_write(target: Path) -> None:
    """Undo what a writer killed mid-way left: put back a previous artifact it had moved aside (a kill between
    its two renames), and delete the staging and set-aside folders of writers no longer running."""
    if not target.exists():
        previous = [p for p in sorted(target.parent.glob(f".old-{target.name}-*")) if (p / METADATA_FILE).is_file()]
        if previous:
            previous[-1].rename(target)
    for leftover in [*target.parent.glob(f".tmp-{target.name}-*"), *target.parent.glob(f".old-{target.name}-*")]:
        if not _running(leftover.name.rsplit("-", 1)[-1]):
            shutil.rmtree(leftover, ignore_errors=True)


def _running(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def fingerprint(ref: str) -> str:
    """Which version of an input a run read: a typed artifact's content hash, else its producer job and
    creation time; a plain file or folder: its size and modification time."""
    fs, path = url_to_fs(ref)
    meta_path = f"{path.rstrip('/')}/{METADATA_FILE}"
    if fs.isfile(meta_path):
        with fs.open(meta_path, "rt") as f:
            meta = json.load(f)
        if meta.get("content_hash"):
            return str(meta["content_hash"])
        return f"{(meta.get('producer') or {}).get('job')}@{meta.get('created')}"
    info = fs.info(path)
    return f"size={info.get('size')},mtime={info.get('mtime') or info.get('created')}"


def input_versions(inputs: dict[str, Any]) -> dict[str, str]:
    """name -> fingerprint for every input reference that is set."""
    return {name: fingerprint(str(ref)) for name, ref in inputs.items() if ref}


def read_artifact_metadata(directory: Path) -> dict[str, Any] | None:
    path = directory / METADATA_FILE
    return json.loads(path.read_text()) if path.is_file() else None
