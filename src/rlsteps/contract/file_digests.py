"""A folder's files by their content: each file's size and SHA-256 written beside them when the folder is complete
(`digests.json`), and checked before the folder is trusted again. A checkpoint shard whose bytes were overwritten in
place keeps its length and its headers, so only its content tells: a run must never resume from it.

Torch-free and standard library only: the dry run checks a run's checkpoints with it as the worker does.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

DIGESTS_FILE = "digests.json"
CHUNK = 8 * 2**20  # read in 8 MiB pieces: a shard of gigabytes never sits in memory whole
NOT_DIGESTED = frozenset({DIGESTS_FILE, "COMPLETE"})  # the manifest itself, and the marker written after it


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    files = (Path(root) / name for root, _, names in os.walk(folder) for name in names)
    return sorted(p for p in files if p.relative_to(folder).as_posix() not in NOT_DIGESTED)


def write_digests(folder: Path) -> Path:
    """digests.json in `folder`: {relative path: {"bytes": size, "sha256": hex}} of every file under it."""
    entries = {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": file_digest(p)} for p in _files(folder)
    }
    target = folder / DIGESTS_FILE
    target.write_text(json.dumps({"files": entries}, indent=1, sort_keys=True) + "\n")
    return target


def digest_damage(folder: Path) -> str | None:
    """What differs from the folder's digests.json, in words naming the first file (absent, another length, other
    bytes); None when every file matches, or when the folder has no digests.json (one
    written before digests were: its sizes and headers are all there is to check)."""
    manifest = folder / DIGESTS_FILE
    if not manifest.is_file():
        return None
    try:
        entries = json.loads(manifest.read_text())["files"]
        expected = {name: (int(e["bytes"]), str(e["sha256"])) for name, e in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as error:
        return f"{manifest} is not a digest list ({type(error).__name__}: {error})"
    for name, (size, sha256) in sorted(expected.items()):
        path = folder / name
        if not path.is_file():
            return f"{path} is absent"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes where {size} were written"
        if file_digest(path) != sha256:
            return f"{path} does not hold the bytes that were written (its SHA-256 differs)"
    return None
