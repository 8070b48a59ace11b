"""Whether this Python can run the engine, asked first in a job: a stock image that lacks a dependency (or is too
old) fails in one line that names what is missing, not in an import traceback.

This module, and what the worker imports before it asks, parse on Python 3.8 (no newer syntax): it must be
able to say "too old" on the interpreter it checks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys

PYTHON = (3, 11)  # pyproject.toml's requires-python
# distribution -> (module, lower bound): what the engine imports, with pyproject.toml's bounds (a test holds them equal)
ENGINE_NEEDS = {
    "omegaconf": ("omegaconf", "2.4"),
    "pydantic": ("pydantic", "2.6"),
    "fsspec": ("fsspec", "2024.2"),
    "httpx": ("httpx", "0.27"),
    "torch": ("torch", "2.6"),
    "transformers": ("transformers", "5.4"),
    "tokenizers": ("tokenizers", "0.22.1"),
    "safetensors": ("safetensors", "0.4.3"),
    "numpy": ("numpy", "1.26"),
    "fastapi": ("fastapi", "0.110"),
    "uvicorn": ("uvicorn", "0.29"),
    "matplotlib": ("matplotlib", "3.8"),
}
# What reading and writing checkpoints and configs needs, and no more: the NeMo-RL job's own stages run in
# NeMo-RL's container, which has no reason to hold the engine's servers (fastapi, uvicorn) or plots (matplotlib).
CHECKPOINT_NEEDS = ("omegaconf", "pydantic", "fsspec", "torch", "transformers", "tokenizers", "safetensors", "numpy")
FIX = (
    "use an image or environment with them (pip install torch first, then pip install 'rlsteps[engine]' or the "
    "packages named), or point the profile's python (Slurm) at one that has them"
)
PYTHON_FIX = "use an image or environment with a newer Python, or point the profile's python (Slurm) at one"


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '2.13.0+cpu' -> (2, 13, 0), '2024.2' -> (2024, 2)."""
    numbers = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


def shortfalls(needs=tuple(ENGINE_NEEDS)) -> list[str]:
    """Each of these engine dependencies this Python cannot import, or has older than the bound, in words."""
    found = []
    for distribution in needs:
        module, lower = ENGINE_NEEDS[distribution]
        if importlib.util.find_spec(module) is None:
            found.append(f"{distribution} (not installed)")
            continue
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue  # importable without metadata (a source tree on the path): trust it
        if release(version) < release(lower):
            found.append(f"{distribution} {version} (needs >={lower})")
    return found


def problem(needs=tuple(ENGINE_NEEDS)) -> str | None:
    """One line saying why this Python cannot run the engine (or the part that needs only `needs`), or None."""
    where = f"the job's python ({sys.executable}, Python {sys.version.split()[0]})"
    if sys.version_info[:2] < PYTHON:
        return f"{where} is older than rlsteps needs (>={PYTHON[0]}.{PYTHON[1]}) (fix: {PYTHON_FIX})"
    missing = shortfalls(needs)
    if missing:
        return f"{where} lacks what the engine needs: {', '.join(missing)} (fix: {FIX})"
    return None
