"""Run and batch profiles: where and how a step runs.

Profiles are read from ./rlsteps.yaml, then each entry of $RLSTEPS_PROFILES in order (files or folders, separated
by os.pathsep as in PATH; a folder gives its *.yaml files in name order), then ~/.config/rlsteps/profiles.yaml;
the first file that defines a name wins. Under those, the example profiles rlsteps ships (its profiles/ folder:
my_slurm, my_lepton, ...), so they work from any folder; built in, under every file: `local` (this machine), so
`-b local` detaches a run with no file at all. A profile may `extends:` another (cycles are errors).
Each file holds a `profiles:` mapping of name -> settings; `executor` names the launcher.
A profile's optional `config:` mapping is merged over the step config (cluster paths, devices).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlsteps.errors import UsageError
from rlsteps.install import shipped_catalog

PROFILES_ENV = "RLSTEPS_PROFILES"
BUILTIN_SOURCE = "built in"
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {"local": {"executor": "local"}}


@dataclass(frozen=True)
class Profile:
    name: str
    source: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def executor(self) -> str:
        return str(self.settings.get("executor", "local"))

    @property
    def config_overlay(self) -> dict[str, Any]:
        return dict(self.settings.get("config") or {})

    @property
    def launcher_settings(self) -> dict[str, Any]:
        return {k: v for k, v in self.settings.items() if k not in ("config", "extends")}


def profile_files() -> list[Path]:
    """The profile files that exist, the first to define a name winning."""
    candidates = [Path.cwd() / "rlsteps.yaml", *_env_entries()]
    candidates.append(Path.home() / ".config" / "rlsteps" / "profiles.yaml")
    found = []
    for path in candidates:
        if path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()))
        elif path.is_file():
            found.append(path)
    return found


def shipped_profile_files() -> list[Path]:
    """The example profile files rlsteps ships (its profiles/ folder), read after the user's own."""
    catalog = shipped_catalog()
    folder = catalog / "profiles" if catalog is not None else None
    return sorted(folder.glob("*.yaml")) if folder is not None and folder.is_dir() else []


def _env_entries() -> list[Path]:
    return [Path(entry).expanduser() for entry in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if entry]


def load_profiles(files: list[Path] | None = None) -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (raw settings, source file); earlier files win."""
    found: dict[str, tuple[dict[str, Any], str]] = {}
    for path in [*profile_files(), *shipped_profile_files()] if files is None else files:
        try:
            raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
        except Exception as err:  # omegaconf raises several YAML error types
            raise UsageError(f"{path}: cannot read profiles: {err}") from err
        profiles = raw.get("profiles", {}) if isinstance(raw, dict) else {}
        if not isinstance(profiles, dict):
            raise UsageError(f"{path}: `profiles:` must be a mapping of name -> settings")
        for name, settings in profiles.items():
            found.setdefault(str(name), (_checked_settings(str(name), settings, path), str(path)))
    for name, settings in BUILTIN_PROFILES.items():
        found.setdefault(name, (settings, BUILTIN_SOURCE))
    return found


def _checked_settings(name: str, settings: Any, path: Path) -> dict[str, Any]:
    """A profile's settings as a mapping, its `config:` a mapping and its `extends:` a name; else one UsageError
    naming the file, the profile and the key."""
    fix = f"write it as `{name}: {{executor: local, ...}}` under `profiles:` (see rlsteps' example profiles)"
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise UsageError(f"{path}: profile '{name}' must be a mapping of settings, got {settings!r}", fix=fix)
    if not isinstance(settings.get("config") or {}, dict):
        raise UsageError(
            f"{path}: profile '{name}': config must be a mapping of step config keys, got {settings['config']!r}",
            fix="write e.g. `config: {run: {device: cuda}}`",
        )
    if not isinstance(settings.get("extends", ""), str):
        raise UsageError(f"{path}: profile '{name}': extends must be a profile's name, got {settings['extends']!r}")
    return settings


def resolve_profile(name: str, files: list[Path] | None = None) -> Profile:
    known = load_profiles(files)
    chain = _extends_chain(name, known)
    merged = OmegaConf.create({})
    for link in reversed(chain):
        merged = OmegaConf.merge(merged, {k: v for k, v in known[link][0].items() if k != "extends"})
    try:
        settings = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as error:  # an interpolation to a key no profile has, a resolver that fails
        cause = str(error).strip().splitlines()[0]
        raise UsageError(
            f"{known[name][1]}: profile '{name}' cannot be resolved: {cause}",
            fix="correct or remove that ${...} interpolation",
        ) from None
    return Profile(name=name, source=known[name][1], settings=settings)


def _extends_chain(name: str, known: dict[str, tuple[dict[str, Any], str]]) -> list[str]:
    chain: list[str] = []
    current: str | None = name
    while current is not None:
        if current not in known:
            raise UsageError(f"unknown profile '{current}'", fix=_unknown_profile_fix(current, known))
        if current in chain:
            raise UsageError(f"profile '{name}' extends itself: {' -> '.join(chain + [current])}")
        chain.append(current)
        current = known[current][0].get("extends")
    return chain


def _unknown_profile_fix(name: str, known: dict[str, tuple[dict[str, Any], str]]) -> str:
    """The closest names, else every name known and the files read: where the user would define it."""
    close = difflib.get_close_matches(name, list(known), n=3)
    if close:
        return f"did you mean {', '.join(close)}?"
    where = ", ".join(str(p) for p in [*profile_files(), *shipped_profile_files()]) or "no profile file found"
    absent = [str(p) for p in _env_entries() if not p.exists()]
    where += f"; ${PROFILES_ENV} names {', '.join(absent)}, not found" if absent else ""
    return f"use one of {', '.join(sorted(known))}, or define it under `profiles:` in ./rlsteps.yaml (read: {where})"
