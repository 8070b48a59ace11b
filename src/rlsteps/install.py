"""This install of rlsteps: its version, the source it was built from, and where the catalog it ships lies.

A wheel or an sdist carries `_source.json` in the package, written when it was built: the git commit of the checkout
it came from (setup.py writes it; a wheel built from an sdist keeps the sdist's). An editable install or a source tree
on the path asks git at run time. The catalog (steps/, manifests/, the example profiles and pipelines) lies at the top
of a checkout, and in a wheel inside the package as `share/`, with the same layout.
"""

from __future__ import annotations

import json
import os
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

VERSION = "0.1.0"  # rlsteps.__version__, and the wheel's (pyproject.toml reads it here)
PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_FILE = "_source.json"  # in a built package: where it was built from
SHIPPED_DIR = "share"  # in a built package: the catalog, as the top of the checkout holds it
ROOT_ENV = "RLSTEPS_ROOT"  # read the shipped catalog from this folder instead (another checkout)


def version() -> str:
    return VERSION


def git_state(directory: Path) -> dict[str, Any] | None:
    """The commit checked out where `directory` lies, and whether tracked files differ from it; None outside git."""
    try:
        head = _git(directory, "rev-parse", "--show-toplevel", "HEAD")
        if head is None:
            return None
        top, sha = head.splitlines()
        dirty = _git(directory, "status", "--porcelain", "--untracked-files=no")
        return {"sha": sha, "dirty": bool(dirty and dirty.strip()), "top": top}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def _git(directory: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=5)
    return done.stdout if done.returncode == 0 else None


def source() -> dict[str, Any]:
    """Where this rlsteps's code came from: {"git": sha, "dirty": bool, "from": "wheel" | "checkout"}, or
    {"from": "unknown"}. A built package answers from its _source.json; a checkout's package from git."""
    built = resources.files("rlsteps").joinpath(SOURCE_FILE)  # a wheel on PYTHONPATH is a zip archive: no Path
    if built.is_file():
        return {**json.loads(built.read_text()), "from": "wheel"}
    state = git_state(PACKAGE_DIR)
    checkout = PACKAGE_DIR.parents[1]
    if state is not None and Path(state["top"]).resolve() == checkout.resolve():
        return {"git": state["sha"], "dirty": state["dirty"], "from": "checkout", "path": str(checkout)}
    return {"from": "unknown"}


def describe(found: dict[str, Any] | None = None) -> str:
    """`rlsteps 0.1.0 (git 6e717fa, a wheel)`: the version and its source (source() by default) in words, as --version
    and the logs say it."""
    found = source() if found is None else found
    if "git" not in found:
        return f"rlsteps {version()} (source unknown)"
    changes = ", with uncommitted changes" if found.get("dirty") else ""
    where = "a wheel" if found["from"] == "wheel" else f"the checkout {found['path']}"
    return f"rlsteps {version()} (git {found['git'][:12]}{changes}, {where})"


def shipped_catalog() -> Path | None:
    """The folder holding the catalog this rlsteps ships: $RLSTEPS_ROOT, else share/ in the package (a wheel), else the
    checkout the package lies in (an editable install); None when neither holds it."""
    if env := os.environ.get(ROOT_ENV):
        return Path(env).expanduser().resolve()
    for folder in (PACKAGE_DIR / SHIPPED_DIR, PACKAGE_DIR.parents[1]):
        if (folder / "manifests" / "types.toml").is_file() and (folder / "steps").is_dir():
            return folder
    return None
