"""The frozen Job: everything a launcher needs, compiled once and passed on unchanged."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from rlsteps import secrets

Mode = Literal["local", "attached", "batch"]


def sanitise_name(text: str) -> str:
    """A name safe in file names, job names and shell words: letters, digits, '.', '_' and '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-") or "job"


class Job(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str  # <timestamp>-<step slug>: the job directory's name and the cluster job name
    step_id: str
    algorithm: str
    config_name: str
    config_source: str
    mode: Mode  # local: here, attached; attached: -r PROFILE; batch: -b PROFILE
    executor: str
    profile_name: str | None
    profile_source: str | None
    launcher_settings: dict[str, Any]
    config: dict[str, Any]  # merged and resolved; holds real secret values: never print or write it as is
    overrides: list[str]
    passthrough: list[str]
    force_squash: bool
    argv: list[str]
    created: str
    depends_on: list[str] = []  # batch job ids that must succeed first (pipeline stages on Slurm)
    unset_keys: list[str] = []  # required keys without a value: only a dry run compiles such a job
    inputs_in_job: list[dict[str, Any]] = []  # inputs on cluster paths, checked by the job itself (InputInJob)
    notes: list[str] = []  # what the compile decided that the user should know (the engine, keys not honoured)

    def public_config(self) -> dict[str, Any]:
        return secrets.mask(self.config)

    def worker_config(self) -> dict[str, Any]:
        """The config the worker reads: each secret replaced by an interpolation of its environment variable."""
        cfg = _deep_copy(self.config)
        for path in secrets.secret_paths(cfg):
            *parents, leaf = path.split(".")
            node = cfg
            for p in parents:
                node = node[p]
            node[leaf] = "${oc.env:" + secrets.env_name(path) + "}"
        return cfg

    def secret_env(self) -> dict[str, str]:
        """Environment variables that carry the secrets to the worker process (never written to disk)."""
        env = {secrets.env_name(p): str(v) for p, v in secrets.secret_paths(self.config).items()}
        for key, value in (self.launcher_settings.get("env_vars") or {}).items():
            if secrets.is_secret(key, value):
                env[key] = str(value)
        return env

    def public_launcher_settings(self) -> dict[str, Any]:
        return secrets.mask(self.launcher_settings)

    def public_argv(self) -> list[str]:
        return secrets.mask_argv(self.argv)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
