"""The reward functions a config names (rewards.NAME.function, validation.reward_functions), found before the job
starts where its worker runs here: a module this Python cannot import, or one that defines no such name, is refused
with the worker's own words, in a second, by the run and its dry run alike.

Nothing of the user's code runs: the module is found as `import` finds it (sys.meta_path, without executing a parent
package), and its source is read for the names it binds at its top level. Where that cannot tell (a module that is
not Python source, a `from x import *`, a module `__getattr__`), the worker's import is left to decide. Torch-free.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlsteps.contract.reward_config import reward_function_import_fix, reward_function_name_fix
from rlsteps.errors import UsageError


def reward_function_problem(config: dict[str, Any]) -> UsageError | None:
    """The first reward function of the config its worker could not load here; None when each is found (or where
    finding it without running code cannot tell)."""
    for spec in _function_specs(config):
        problem = _spec_problem(spec)
        if problem is not None:
            return problem
    return None


def _function_specs(config: dict[str, Any]) -> Iterator[str]:
    for entry in (config.get("rewards") or {}).values():
        if isinstance(entry, dict) and isinstance(entry.get("function"), str):
            yield entry["function"]
    for spec in ((config.get("validation") or {}).get("reward_functions") or {}).values():
        if isinstance(spec, str):
            yield spec


def _spec_problem(spec: str) -> UsageError | None:
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        return UsageError(
            f"reward function {spec!r} must read 'package.module:function'", fix="write it as package.module:function"
        )
    try:
        found, missing = _find_module(module)
    except Exception:  # noqa: BLE001 (a finder that fails here: the worker's import decides)
        return None
    if missing is not None:
        return UsageError(
            f"reward function {spec!r}: cannot import {module}: No module named {missing!r}",
            fix=reward_function_import_fix(module),
        )
    names = _top_level_names(found)
    if names is None or "." in attribute or attribute in names:
        return None
    return UsageError(
        f"reward function {spec!r}: {module} has no callable {attribute!r}",
        fix=reward_function_name_fix(attribute, module, found.origin),
    )


def _find_module(name: str) -> tuple[Any, str | None]:
    """(the module's spec, None), or (None, the first dotted prefix no finder knows) as ImportError names it."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None), None
    parts = name.split(".")
    path, spec = None, None
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        spec = _spec_of(prefix, path)
        if spec is None:
            return None, prefix
        path = spec.submodule_search_locations
        if path is None and depth < len(parts):  # a module, not a package: the worker's import says so
            raise LookupError(f"{prefix} is not a package")
    return spec, None


def _spec_of(name: str, path: Any) -> importlib.machinery.ModuleSpec | None:
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None) or importlib.machinery.ModuleSpec(name, None)
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path) if find is not None else None
        if spec is not None:
            return spec
    if path is None:  # the worker starts as `python -m`, with its working directory (this one) on its path
        return importlib.machinery.PathFinder.find_spec(name, [os.getcwd()])
    return None


def _top_level_names(spec: Any) -> set[str] | None:
    """The names a module's source binds at its top level; None where its source cannot tell."""
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not str(origin).endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # the worker's import says what is wrong with it
    names: set[str] = set()
    for node in _top_level_statements(tree.body):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            return None
        names |= _bound_by(node)
    return None if "__getattr__" in names else names


def _top_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Each statement run at import, those inside if/try/with blocks included."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, ast.If | ast.Try | ast.With) and getattr(node, block, None):
                yield from _top_level_statements(getattr(node, block))
        for handler in getattr(node, "handlers", []) if isinstance(node, ast.Try) else []:
            yield from _top_level_statements(handler.body)


def _bound_by(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {
        name.id for target in targets if target is not None for name in ast.walk(target) if isinstance(name, ast.Name)
    }
