"""Hugging Face Hub ids as inputs: a model (or a prompt dataset) named `org/name` instead of a path.

An id resolves to its snapshot folder in the Hugging Face cache (HF_HOME, HF_HUB_CACHE), the folder the job then reads
as it reads any other: `models--org--name/snapshots/<revision>/` for a model, `datasets--org--name/...` for a dataset.
A dry run and the submitting machine look only in the cache (no network): an id found there is checked like a folder.
The job resolves the id where it runs: from the cache, or, when it is not there and the Hub is reachable (no
HF_HUB_OFFLINE), fetched into the cache at its start, before anything loads. huggingface_hub is imported only when an
id is given; it never imports torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from rlsteps.contract.input_problem import InputProblem

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")  # a prompt file's name, never a dataset id
DATASET_INPUTS = ("prompts", "val_prompts")  # the inputs whose Hub ids name datasets; every other names a model
TRUE_WORDS = {"1", "ON", "YES", "TRUE"}  # as huggingface_hub reads HF_HUB_OFFLINE


def is_hub_id(ref: str) -> bool:
    """A Hugging Face Hub id (org/name), as opposed to a path that exists, a URL or a prompt file's name."""
    return (
        HUB_ID.fullmatch(ref) is not None
        and not ref.lower().endswith(FILE_SUFFIXES)
        and ".." not in ref
        and not Path(ref).exists()
    )


def repo_type_of(input_name: str) -> str:
    return "dataset" if input_name in DATASET_INPUTS else "model"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in TRUE_WORDS


def cache_folder() -> str:
    """The hub cache as huggingface_hub finds it (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def cached_snapshot(repo_id: str, repo_type: str = "model") -> Path | None:
    """The id's snapshot folder in this machine's cache (its main revision), or None; never the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache_folder(), local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def not_cached(name: str, key: str, repo_id: str, repo_type: str = "model") -> InputProblem:
    """An id neither on this machine nor in its cache, with HF_HUB_OFFLINE set (or asked without the network)."""
    command = f"hf download {repo_id}" + (" --repo-type dataset" if repo_type == "dataset" else "")
    return InputProblem(
        f"input '{name}': {repo_id} is not a path here nor a Hugging Face Hub {repo_type} in the cache "
        f"{cache_folder()} (HF_HUB_OFFLINE=1: nothing is fetched)",
        fix=f"fetch it on a machine with network with `{command}` (or huggingface-cli download) and HF_HOME "
        f"pointing at the same cache, or unset HF_HUB_OFFLINE to let the run fetch it, or pass {key}=PATH",
    )


@cache
def snapshot(name: str, key: str, repo_id: str) -> Path:
    """The id's snapshot folder where the job runs: from the cache, or fetched into it when the Hub is reachable.

    InputProblem (exit 3) when it is in neither place; the same id is resolved once a process."""
    repo_type = repo_type_of(name)
    if offline():
        found = cached_snapshot(repo_id, repo_type)
        if found is None:
            raise not_cached(name, key, repo_id, repo_type)
        return found
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache_folder()))
    except Exception as error:  # noqa: BLE001 - no such repository, gated, no network: huggingface_hub's own errors
        raise InputProblem(
            f"input '{name}': the Hugging Face Hub {repo_type} {repo_id} cannot be fetched: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
            fix=f"check the id and the network (HF_ENDPOINT); for a gated or private one set HF_TOKEN; or fetch it "
            f"elsewhere with `hf download {repo_id}` into this HF_HOME, or pass {key}=PATH",
        ) from None


def with_snapshots(inputs: dict[str, object]) -> dict[str, tuple[str, Path]]:
    """Every input given as a Hub id -> (the id, its snapshot folder here), fetching where the Hub is reachable."""
    return {
        name: (ref, snapshot(name, f"inputs.{name}", ref))
        for name, ref in inputs.items()
        if isinstance(ref, str) and is_hub_id(ref)
    }


def with_hub_snapshots(cfg: Any, say: Callable[[str], None] | None = None) -> Any:
    """A step's config with each input given as a Hub id replaced by its snapshot folder where the job runs (what
    the run then reads, records and fingerprints: the revision it read); unchanged without one."""
    found = with_snapshots(cfg.inputs.model_dump())
    for name, (repo_id, folder) in found.items():
        if say is not None:
            say(f"input '{name}': {repo_id} is {folder} in the Hugging Face cache")
    if not found:
        return cfg
    given = {**cfg.inputs.model_dump(), **{name: str(folder) for name, (_, folder) in found.items()}}
    return cfg.model_copy(update={"inputs": type(cfg.inputs).model_validate(given)})
