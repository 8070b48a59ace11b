"""Dotted keys (`policy.generation.top_k`) read from and written into nested dicts, as configs are held in memory."""

from __future__ import annotations

from typing import Any


def get(tree: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """The value at a dotted key, or `default` where a part of it is missing."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set a dotted key in a nested dict in place, making the sections on the way."""
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested dict by its dotted key (an empty mapping is a leaf)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(leaves(value, path + "."))
        else:
            flat[path] = value
    return flat
