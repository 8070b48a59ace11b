"""Judges a NeMo-RL GRPO master config (and the prompt rows it trains on) with NeMo-RL's and NeMo-Gym's own code.

    python tests/nemo_rl_oracle.py check CONFIG.yaml --driver grpo|nemo_gym
    python tests/nemo_rl_oracle.py rows FILE.jsonl --driver grpo|nemo_gym
    python tests/nemo_rl_oracle.py schema
    python tests/nemo_rl_oracle.py load CONFIG.yaml

check and rows print one JSON object {"problems": [...]} (one string a problem, each naming the dotted key) and exit
0; schema prints MasterConfig's keys as {"dotted.key": {"type": ..., "required": ...}}; load prints a NeMo-RL
config as NeMo-RL's load_config resolves it (its `defaults:`), as JSON. The pinned sources come
unpacked from tests/upstream.py; NeMo-RL's and NeMo-Gym's modules are imported with inert stand-ins for their heavy
dependencies, so this runs as a process of its own (never inside pytest's).

check covers what can be judged without running NeMo-RL (tests/nemo_rl_run.py runs its driver, setup and a GRPO
step on every config rlsteps compiles; this check is for the jobs that cannot carry that run, such as the stand-in
driver of the Ray job tests on a real Slurm):
  a. MasterConfig.model_validate (NeMo-RL's pydantic schema of the master config).
  b. --driver nemo_gym: env.nemo_gym as NeMo-RL hands it to NeMo-Gym, parsed and validated by Gym's own
     GlobalConfigDictParser (config_paths, server instances, refs between servers), then each server instance's
     folder and entrypoint as Gym's RunHelper.start looks them up.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import upstream  # noqa: E402


def gym_deps_on_path() -> None:
    """openai's types for NeMo-Gym's models, itsdangerous for its servers' imports (upstream.gym_deps), after the
    environment's own packages."""
    folder = os.environ.get("RLSTEPS_GYM_DEPS") or str(upstream.gym_deps())
    if folder not in sys.path:
        sys.path.append(folder)


DRIVERS = {"grpo": "examples/run_grpo.py", "nemo_gym": "examples/nemo_gym/run_grpo_nemo_gym.py"}


# ---------------------------------------------------------------------------------------------------------------
# Importing NeMo-RL and NeMo-Gym
# ---------------------------------------------------------------------------------------------------------------

_IMPORTED: dict[str, Any] = {}


def nemo_rl() -> dict[str, Any]:
    """The NeMo-RL (and NeMo-Gym) names the checks use, imported once with the stand-ins in place."""
    if not _IMPORTED:
        with upstream.nemo_rl_importable(), contextlib.redirect_stdout(sys.stderr):
            from nemo_rl.algorithms import grpo, opd
            from nemo_rl.models.generation.vllm import VllmConfig
            from nemo_rl.models.megatron.router_replay import router_replay_enabled
            from nemo_rl.utils.config import load_config, register_omegaconf_resolvers

            register_omegaconf_resolvers()
        _IMPORTED.update(
            grpo=grpo,
            opd=opd,
            VllmConfig=VllmConfig,
            router_replay_enabled=router_replay_enabled,
            load_config=load_config,
        )
    return _IMPORTED


def master_config_class():
    return nemo_rl()["grpo"].MasterConfig


# ---------------------------------------------------------------------------------------------------------------
# a. MasterConfig.model_validate
# ---------------------------------------------------------------------------------------------------------------


def schema_problems(config: dict) -> list[str]:
    from pydantic import ValidationError

    try:
        master_config_class().model_validate(config)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            # pydantic puts the union member's class name in loc for unions of TypedDicts: keep only real keys
            keys = [str(k) for k in item["loc"] if not (isinstance(k, str) and k[:1].isupper() and "[" not in k)]
            keys = [k for k in keys if not k.startswith(("function-", "typed-dict", "nullable", "union"))]
            problems.append(f"{'.'.join(keys) or '(top)'}: {item['msg']} (MasterConfig)")
        return sorted(set(problems))
    return []


def _get(state: dict, dotted: str, default: Any = None) -> Any:
    node: Any = state
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


# ---------------------------------------------------------------------------------------------------------------
# b. env.nemo_gym through NeMo-Gym's own config parsing
# ---------------------------------------------------------------------------------------------------------------


def gym_problems(config: dict) -> list[str]:
    env = config.get("env") or {}
    if not env.get("should_use_nemo_gym"):
        return ["env.should_use_nemo_gym: not true, but run_grpo_nemo_gym.py asserts _should_use_nemo_gym(config)"]
    section = env.get("nemo_gym")
    if not isinstance(section, dict):
        return ["env.nemo_gym: missing, but grpo.setup reads env_configs['nemo_gym'] to spin up NeMo-Gym"]
    gym_root = upstream.unpacked("nemo_gym")
    gym_deps_on_path()
    with upstream.nemo_rl_importable(), contextlib.redirect_stdout(sys.stderr):
        import nemo_gym
        from nemo_gym.config_types import ConfigError
        from nemo_gym.global_config import (
            HEAD_SERVER_KEY_NAME,
            NEMO_GYM_RESERVED_TOP_LEVEL_KEYS,
            GlobalConfigDictParser,
            GlobalConfigDictParserConfig,
            format_almost_server_warning,
        )
        from omegaconf import DictConfig, OmegaConf
    # What NeMo-RL hands Gym: run_grpo_nemo_gym.py:main pops is_trajectory_collection; grpo.setup's
    # _spinup_nemo_gym pops invalid_tool_call_patterns and thinking_tags; NemoGym._spinup
    # (nemo_rl/environments/nemo_gym.py) drops effort_levels, pops rollout_max_attempts_to_avoid_lp_nan, and adds
    # the policy's name, key and server URLs, the default host, the port range and the head server.
    initial = copy.deepcopy(section)
    for key in ("is_trajectory_collection", "invalid_tool_call_patterns", "thinking_tags", "effort_levels"):
        initial.pop(key, None)
    initial.pop("rollout_max_attempts_to_avoid_lp_nan", None)
    initial.update(
        policy_model_name=_get(config, "policy.model_name", "policy"),
        policy_api_key="dummy_key",
        policy_base_url=["http://127.0.0.1:8000/v1"],
    )
    initial.setdefault("default_host", "127.0.0.1")
    initial.setdefault("port_range_low", 15001)
    initial.setdefault("port_range_high", 20000)
    initial[HEAD_SERVER_KEY_NAME] = {"host": "0.0.0.0", "port": 15000}
    initial["ray_head_node_address"] = "127.0.0.1:6379"
    almost: list = []

    class Parser(GlobalConfigDictParser):
        def detect_and_report_almost_servers(self, global_config_dict):
            found = super().detect_and_report_almost_servers(global_config_dict)
            almost.extend(found)
            return found

    problems: list[str] = []
    cwd = os.getcwd()
    os.chdir(gym_root)  # config_paths are relative to the Gym root (or the working directory: Gym tries it first)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            parsed = Parser().parse(
                GlobalConfigDictParserConfig(
                    dotenv_path=gym_root / "nemo_gym_env.yaml",  # NemoGym._spinup's dotenv (absent in the sources)
                    initial_global_config_dict=DictConfig(initial),
                    skip_load_from_cli=True,
                )
            )
            GlobalConfigDictParser().raise_on_no_server_instances(parsed)
    except (ConfigError, ValueError, AssertionError, KeyError, FileNotFoundError) as error:
        if almost:  # Gym printed what is wrong with each: say it per server instance
            return [
                f"env.nemo_gym.{name}: NeMo-Gym rejects this server instance: "
                + " ".join(re.sub(r"\[/?[a-z ]+\]", "", format_almost_server_warning(name, err)).split())[:1500]
                for name, err in almost
            ]
        first = " ".join(str(error).split("Found global config dict yaml:")[0].split())
        return [f"env.nemo_gym: NeMo-Gym rejects it ({type(error).__name__}): {first[:1500]}"]
    except Exception as error:  # omegaconf interpolation errors and the like
        return [
            f"env.nemo_gym: NeMo-Gym cannot parse it ({type(error).__name__}): {' '.join(str(error).split())[:800]}"
        ]
    finally:
        os.chdir(cwd)
    # RunHelper.start (nemo_gym/cli/env.py): each server instance runs `python ENTRYPOINT` in
    # <Gym root>/<server type>/<implementation>, so both must exist.
    for name, value in OmegaConf.to_container(parsed, resolve=False).items():
        if name in NEMO_GYM_RESERVED_TOP_LEVEL_KEYS or not isinstance(value, dict) or not value:
            continue
        server_type = next(iter(value))
        inner = value[server_type]
        if not isinstance(inner, dict) or not inner:
            continue
        implementation = next(iter(inner))
        spec = inner[implementation]
        if not isinstance(spec, dict) or "entrypoint" not in spec:
            continue
        folder = Path(nemo_gym.PARENT_DIR) / server_type / implementation
        if not folder.is_dir():
            problems.append(
                f"env.nemo_gym.{name}.{server_type}.{implementation}: no such NeMo-Gym server ({folder.name} is not "
                f"under {server_type}/)"
            )
        elif not (folder / spec["entrypoint"]).is_file():
            problems.append(
                f"env.nemo_gym.{name}.{server_type}.{implementation}.entrypoint: {spec['entrypoint']} is not in "
                f"{server_type}/{implementation}"
            )
    return problems


# ---------------------------------------------------------------------------------------------------------------
# check, rows, schema
# ---------------------------------------------------------------------------------------------------------------


def check(config: dict, driver: str) -> list[str]:
    problems = schema_problems(config)
    if driver == "nemo_gym":
        problems += gym_problems(config)
    return problems


def load(path: str) -> dict:
    from omegaconf import OmegaConf

    cfg = nemo_rl()["load_config"](path)
    return OmegaConf.to_container(cfg, resolve=True)


def row_problems(path: str, driver: str) -> list[str]:
    lines = Path(path).read_text().splitlines()
    rows: list[tuple[int, dict]] = []
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"row {number}: not JSON ({error})")
            continue
        if not isinstance(row, dict):
            problems.append(f"row {number}: not a JSON object")
            continue
        rows.append((number, row))
    if driver == "nemo_gym":
        problems += gym_row_problems(rows)
    else:
        problems += response_row_problems(rows)
    return problems


def gym_row_problems(rows: list[tuple[int, dict]]) -> list[str]:
    """A rollout row as NeMo-RL hands it to Gym (NemoGymDataset keeps the line; rollouts.py reads
    row["responses_create_params"] and row["agent_ref"]["name"]; the agent's /run parses the row as Gym's
    BaseRunRequest), and the key genrm_compare groups a prompt's rollouts by (GenRMCompareResourcesServer.
    _get_verify_cohort_key: _ng_task_index, else prompt_id, else the input's hash; each with the input and
    principle)."""
    from pydantic import TypeAdapter, ValidationError

    gym_deps_on_path()
    with upstream.nemo_rl_importable(), contextlib.redirect_stdout(sys.stderr):
        from nemo_gym.base_resources_server import BaseRunRequest
        from nemo_gym.config_types import AgentServerRef
        from resources_servers.genrm_compare.app import GenRMCompareResourcesServer, GenRMCompareVerifyRequest
    fields = GenRMCompareVerifyRequest.model_fields
    cohort_fields = {
        (f.alias or name): TypeAdapter(f.annotation)
        for name, f in fields.items()
        if name in ("principle", "task_index", "rollout_index", "prompt_id")
    }
    problems: list[str] = []
    cohorts: dict[str, set[str]] = {}  # the prompt's id -> the genrm_compare cohort keys its rows get
    for number, row in rows:
        try:
            BaseRunRequest.model_validate(row)
        except ValidationError as error:
            for item in error.errors()[:5]:
                loc = ".".join(str(k) for k in item["loc"])
                problems.append(f"row {number}: {loc}: {item['msg']} (NeMo-Gym's BaseRunRequest)")
            continue
        agent_ref = row.get("agent_ref")
        if not isinstance(agent_ref, dict) or not isinstance(agent_ref.get("name"), str):
            problems.append(f"row {number}: agent_ref: missing or without a name (rollouts.py reads agent_ref.name)")
        else:
            try:
                AgentServerRef.model_validate(agent_ref)
            except ValidationError as error:
                for item in error.errors()[:3]:
                    loc = ".".join(["agent_ref", *(str(k) for k in item["loc"])])
                    problems.append(f"row {number}: {loc}: {item['msg']} (NeMo-Gym's AgentServerRef)")
        bad = False
        for key, adapter in cohort_fields.items():
            if key in row:
                try:
                    adapter.validate_python(row[key])
                except ValidationError as error:
                    problems.append(f"row {number}: {key}: {error.errors()[0]['msg']} (genrm_compare's verify request)")
                    bad = True
        if bad:
            continue
        if row.get("prompt_id") is None and row.get("_ng_task_index") is None:
            problems.append(f"row {number}: prompt_id: missing (genrm_compare then groups rollouts by the input alone)")
            continue
        messages = row["responses_create_params"].get("input") or []
        messages = messages if isinstance(messages, list) else [messages]
        body = types.SimpleNamespace(task_index=row.get("_ng_task_index"), prompt_id=row.get("prompt_id"))
        key = GenRMCompareResourcesServer._get_verify_cohort_key(None, body, messages, row.get("principle"))
        prompt = f"_ng_task_index {row['_ng_task_index']}" if row.get("_ng_task_index") is not None else None
        cohorts.setdefault(prompt or f"prompt_id {row['prompt_id']!r}", set()).add(key)
    for prompt, keys in cohorts.items():
        if len(keys) > 1:
            problems.append(
                f"prompt_id: the rows of {prompt} get {len(keys)} different genrm_compare cohort keys (their input or "
                "principle differ), so its rollouts are never compared as one cohort"
            )
    return problems


def response_row_problems(rows: list[tuple[int, dict]]) -> list[str]:
    """A row as NeMo-RL's ResponseDataset (input_key "input", output_key "output") formats it for
    math_hf_data_processor, which takes the user message's content as the prompt."""
    with upstream.nemo_rl_importable(), contextlib.redirect_stdout(sys.stderr):
        from nemo_rl.data.datasets.response_datasets.response_dataset import ResponseDataset
    dataset = types.SimpleNamespace(input_key="input", output_key="output", task_name="rows")
    problems = []
    for number, row in rows:
        try:
            formatted = ResponseDataset.format_data(dataset, row)
        except KeyError as error:
            problems.append(f"row {number}: {error.args[0]}: missing (ResponseDataset.format_data reads it)")
            continue
        if not isinstance(formatted["messages"][0]["content"], str):
            problems.append(f"row {number}: input: not a string (the prompt's text)")
    return problems


def _type_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return "None"
    if annotation is Any:
        return "Any"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None:
        name = getattr(origin, "__name__", None) or str(origin).replace("typing.", "")
        return f"{name}[{', '.join(_type_text(a) for a in args)}]" if args else name
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _members(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def _fields(annotation: Any) -> dict[str, tuple[Any, bool]] | None:
    """A TypedDict's or pydantic model's keys: {key: (annotation, required)}; None for anything else."""
    import typing_extensions
    from pydantic import BaseModel

    if typing_extensions.is_typeddict(annotation):
        hints = typing_extensions.get_type_hints(annotation)
        return {k: (v, k in annotation.__required_keys__) for k, v in hints.items()}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {k: (f.annotation, f.is_required()) for k, f in annotation.model_fields.items()}
    return None


def _walk_schema(prefix: str, annotation: Any, required: bool, out: dict) -> None:
    entry: dict[str, Any] = {"type": _type_text(annotation), "required": required}
    members = [m for m in _members(annotation) if m is not type(None)]
    if any(typing.get_origin(m) is dict for m in members) and not any(_fields(m) for m in members):
        entry["open"] = True
    if prefix:
        out[prefix] = entry
    variants = [f for f in (_fields(m) for m in members) if f is not None]
    keys: dict[str, list] = {}
    for variant in variants:
        for key, (child, child_required) in variant.items():
            keys.setdefault(key, []).append((child, child_required))
    for key, found in keys.items():
        child_types = []
        for child, _ in found:
            if child not in child_types:
                child_types.append(child)
        child = child_types[0] if len(child_types) == 1 else typing.Union[tuple(child_types)]  # noqa: UP007
        child_required = len(found) == len(variants) and all(r for _, r in found)
        _walk_schema(f"{prefix}.{key}" if prefix else key, child, child_required, out)


# policy.generation is typed GenerationConfig, but grpo.setup casts it to the backend's own config (VllmConfig,
# SGLangConfig, MCoreGenerationConfig) and reads that one's keys: the schema lists theirs too, never as required
# (VllmGeneration.__init__ checks VllmConfig's own required keys when it runs).
BACKEND_CONFIGS = {
    "policy.generation": [
        ("nemo_rl.models.generation.vllm.config", "VllmConfig"),
        ("nemo_rl.models.generation.sglang.config", "SGLangConfig"),
        ("nemo_rl.models.generation.megatron.config", "MCoreGenerationConfig"),
    ]
}


def schema() -> dict[str, dict]:
    import importlib

    out: dict[str, dict] = {}
    _walk_schema("", master_config_class(), True, out)
    for prefix, configs in BACKEND_CONFIGS.items():
        for module, name in configs:
            with upstream.nemo_rl_importable(), contextlib.redirect_stdout(sys.stderr):
                annotation = getattr(importlib.import_module(module), name)
            extra: dict[str, dict] = {}
            _walk_schema(prefix, annotation, False, extra)
            for key, entry in extra.items():
                if key != prefix and key not in out:
                    out[key] = {**entry, "required": False}
    _add_example_keys(out)
    return dict(sorted(out.items()))


EXAMPLE_CONFIGS = ("examples/configs/*.yaml", "examples/configs/recipes/llm/*.yaml", "examples/nemo_gym/**/*.yaml")


def _add_example_keys(out: dict[str, dict]) -> None:
    """Keys NeMo-RL's own GRPO example configs set that its config types do not declare (its code reads them all the
    same, e.g. policy.offload_optimizer_for_logprob): a key NeMo-RL ships in its examples is a valid override."""
    root = upstream.unpacked("nemo_rl")
    opened = [key for key, entry in out.items() if entry.get("open")]
    merged: dict[Path, dict] = {}
    for pattern in EXAMPLE_CONFIGS:
        for path in sorted(root.glob(pattern)):
            config = _inherited(path, merged)
            if not isinstance(config, dict) or "grpo" not in config:
                continue
            for key in _example_keys(config, ""):
                if key not in out and not any(key.startswith(o + ".") for o in opened):
                    out[key] = {"type": f"as in {path.relative_to(root)}", "required": False}


def _inherited(path: Path, merged: dict[Path, dict]) -> dict:
    """A config file as nemo_rl/utils/config.py:load_config_with_inheritance merges it with its `defaults:` (parents
    in order, then the file; a section marked `_override_: true` replaces the parents' instead of merging), as plain
    dicts, each file merged once (NeMo-RL's OmegaConf merges take seconds over all the examples)."""
    import yaml

    path = path.resolve()
    if path not in merged:
        own = yaml.safe_load(path.read_text()) or {}
        defaults = own.pop("defaults", None) if isinstance(own, dict) else None
        if defaults is None:
            merged[path] = own
        else:
            base: dict = {}
            for parent in [defaults] if isinstance(defaults, str) else defaults:
                base = _merge(base, copy.deepcopy(_inherited(path.parent / str(parent), merged)))
            merged[path] = _merge(base, own)
    return merged[path]


def _merge(base: dict, override: dict) -> dict:
    for key, value in override.items():
        if isinstance(value, dict) and value.pop("_override_", False):
            base[key] = value
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base


def _example_keys(tree: dict, prefix: str) -> list[str]:
    keys = []
    for name, value in tree.items():
        key = f"{prefix}{name}"
        keys.append(key)
        if isinstance(value, dict):
            keys += _example_keys(value, key + ".")
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check_parser = sub.add_parser("check", help="judge a master config YAML")
    check_parser.add_argument("config")
    check_parser.add_argument("--driver", choices=sorted(DRIVERS), required=True)
    rows_parser = sub.add_parser("rows", help="judge a prompt rows JSONL")
    rows_parser.add_argument("rows")
    rows_parser.add_argument("--driver", choices=sorted(DRIVERS), required=True)
    sub.add_parser("schema", help="MasterConfig's keys as JSON")
    load_parser = sub.add_parser("load", help="a NeMo-RL config YAML as NeMo-RL's load_config resolves it, as JSON")
    load_parser.add_argument("config")
    args = parser.parse_args(argv)
    if args.command == "check":
        result: Any = {"problems": check(load(args.config), args.driver)}
    elif args.command == "rows":
        result = {"problems": row_problems(args.rows, args.driver)}
    elif args.command == "load":
        result = load(args.config)
    else:
        result = schema()
    print(json.dumps(result, indent=2, sort_keys=args.command == "schema"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
