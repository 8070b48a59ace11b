"""NeMo-RL's master-config schema, as keys: which dotted keys NeMo-RL's MasterConfig has, for overrides and typos.

master_config_schema.json is generated from NeMo-RL's own config types at the pinned version (its TypedDicts and
pydantic model; the test suite regenerates it from the pinned source and compares). rlsteps reads it here, without
NeMo-RL installed: any key of the schema is a valid override of rl/nemo_rl/rlhf, an unknown one is refused with the
closest key of the schema. Sections NeMo-RL leaves open (`env`, typed dict[str, Any]) take any key below them.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from importlib import resources
from typing import Any

from rlsteps.dotted import leaves

SCHEMA_FILE = "master_config_schema.json"


@cache
def schema() -> dict[str, dict[str, Any]]:
    """dotted key -> {"type": annotation, "required": bool, "open": bool (any key below it is NeMo-RL's to judge)}."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text())


@cache
def _sections() -> frozenset[str]:
    """Every proper prefix of a schema key: the sections a key may stop at (policy, policy.generation, ...)."""
    prefixes = set()
    for key in schema():
        parts = key.split(".")
        prefixes.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return frozenset(prefixes)


def is_known(dotted: str) -> bool:
    """Whether NeMo-RL's schema has this key, a section of keys, or an open entry above it."""
    if dotted in schema() or dotted in _sections():
        return True
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        entry = schema().get(".".join(parts[:i]))
        if entry is not None:
            # below a key: only an open mapping or a list (policy.scheduler.0.kwargs) takes further parts
            return bool(entry.get("open")) or entry["type"].startswith(("list", "List"))
    return False


def unknown_keys(tree: dict[str, Any], sections: tuple[str, ...]) -> list[str]:
    """The leaf keys under `sections` of a config that NeMo-RL's schema does not have."""
    unknown = []
    for section in sections:
        value = tree.get(section)
        for key in leaves(value, section + ".") if isinstance(value, dict) else ():
            if not is_known(key):
                unknown.append(key)
    return unknown


def closest(dotted: str) -> str | None:
    """The schema key nearest to a mistyped one: by the whole key, else by its last part."""
    keys = sorted(schema()) + sorted(_sections())
    near = difflib.get_close_matches(dotted, keys, n=1, cutoff=0.6)
    if near:
        return near[0]
    leaf = dotted.rsplit(".", 1)[-1]
    same_leaf = [key for key in keys if key.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return same_leaf[0]
    near = difflib.get_close_matches(leaf, [key.rsplit(".", 1)[-1] for key in keys], n=1, cutoff=0.75)
    return next((key for key in keys if near and key.rsplit(".", 1)[-1] == near[0]), None)


def unknown_keys_problem(cfg: dict[str, Any], sections: tuple[str, ...]) -> str | None:
    """What a validated rl/nemo_rl/rlhf config says that NeMo-RL's master config does not have, each key with the
    closest one it has; None when every key is NeMo-RL's."""
    unknown = unknown_keys(cfg, sections)
    if not unknown:
        return None
    hints = [f"'{key}'" + (f" (did you mean '{near}'?)" if (near := closest(key)) else "") for key in unknown]
    return "keys NeMo-RL's master config does not have: " + ", ".join(hints)
