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

check covers:
  a. MasterConfig.model_validate (NeMo-RL's pydantic schema of the master config).
  b. The keys NeMo-RL's code reads without a default (`cfg["a"]["b"]`, not `.get`) that the config lacks, found by
     walking the driver script, grpo.setup / grpo_train (and the grpo.py functions they hand the config to), the vLLM
     generation setup and NeMo-Gym's config setup with `ast` (READ_SCOPE), evaluating each `if` against the config
     (GUARDS and PREDICATES first, then the test's own expression) so that a branch the config does not take is not
     walked; asserts and raises the config definitely reaches are reported too (e.g. run_grpo_nemo_gym.py refuses a
     non-null grpo.max_val_samples). VllmGeneration's own required-key check is run on policy.generation.
  c. --driver nemo_gym: env.nemo_gym as NeMo-RL hands it to NeMo-Gym, parsed and validated by Gym's own
     GlobalConfigDictParser (config_paths, server instances, refs between servers), then each server instance's
     folder and entrypoint as Gym's RunHelper.start looks them up.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import io
import json
import os
import re
import sys
import types
import typing
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass
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


# ---------------------------------------------------------------------------------------------------------------
# b. Keys read without a default: the static walk
# ---------------------------------------------------------------------------------------------------------------


class _Unknown:
    """A value the walk cannot know (computed at run time). Any truth test on it fails, so a NeMo-RL predicate
    called on a config that holds one raises and counts as undecided."""

    def __bool__(self):
        raise TypeError("unknown value")

    def __repr__(self):
        return "<unknown>"


UNKNOWN = _Unknown()
MISSING = object()


@dataclass(frozen=True)
class Ref:
    """The master config's subtree at `path`. `soft`: the prefix reached through `.get(key, default)`; reads below it
    count only where that key exists (otherwise the default is in effect). `default`: the `.get` default."""

    path: tuple[str, ...]
    soft: tuple[str, ...] | None = None
    default: Any = UNKNOWN


# Where the walk goes: the modules and the functions or classes in them it follows a config into. "*": any function
# of that module. Calls into anything else are not followed (their own keys are out of this check's scope).
READ_SCOPE: dict[str, set[str] | str] = {
    "examples/run_grpo.py": "*",
    "examples/nemo_gym/run_grpo_nemo_gym.py": "*",
    "nemo_rl/algorithms/grpo.py": "*",
    "nemo_rl/models/generation/__init__.py": {"configure_generation_config"},
    "nemo_rl/models/generation/vllm/vllm_generation.py": {"VllmGeneration"},
    "nemo_rl/environments/nemo_gym.py": {"setup_nemo_gym_config"},
}

# Calls that hand back the master config itself (the driver's loading of it).
ROOT_CALLS = {"load_config", "parse_hydra_overrides", "OmegaConf.to_container", "MasterConfig"}


def _master(state: dict):
    return master_config_class().model_construct(**state)


# Predicates the walk evaluates by calling NeMo-RL's own function on the config as the walk has it at that point
# (None: undecided, e.g. the function raised or met a value only known at run time).
PREDICATES: dict[str, Callable[[dict], Any]] = {
    # nemo_rl/algorithms/grpo.py: async rollouts (vLLM async_engine, ...): guards async-only reads and asserts
    "_should_use_async_rollouts": lambda s: nemo_rl()["grpo"]._should_use_async_rollouts(_master(s)),
    # nemo_rl/algorithms/grpo.py: env.should_use_nemo_gym (its own asserts are walked, so it raising is undecided)
    "_should_use_nemo_gym": lambda s: nemo_rl()["grpo"]._should_use_nemo_gym(_master(s)),
    "_should_log_nemo_gym_responses": lambda s: nemo_rl()["grpo"]._should_log_nemo_gym_responses(_master(s)),
    # nemo_rl/models/policy/utils.py: policy.router_replay.enabled
    "router_replay_enabled": lambda s: nemo_rl()["router_replay_enabled"](s.get("policy", {})),
    # nemo_rl/algorithms/opd.py: on_policy_distillation with non-colocated teachers
    "opd_module.is_non_colocated_teachers_enabled": lambda s: nemo_rl()["opd"].is_non_colocated_teachers_enabled(
        _master(s)
    ),
}


def _get(state: dict, dotted: str, default: Any = None) -> Any:
    node: Any = state
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


@dataclass(frozen=True)
class Guard:
    where: str  # the upstream file:function whose `if` this is
    test: str  # the `if` test as ast.unparse writes it
    prefix: str  # the keys (or the callee's keys) that only this branch reads
    holds: Callable[[dict], Any]  # the test, evaluated on the config as the walk has it there


# `if` tests the walk cannot evaluate from the config's own values (they read run-time state, or the keys they test
# only exist under a condition), each with what it guards. Every other `if` is evaluated from its own expression
# against the config; one that cannot be is walked both ways (its reads are reported).
GUARDS: list[Guard] = [
    Guard(
        "examples/run_grpo.py:main",
        "overrides",
        "(none: hydra overrides from the command line; rlsteps passes none)",
        lambda s: False,
    ),
    Guard(
        "examples/nemo_gym/run_grpo_nemo_gym.py:main",
        "overrides",
        "(none: hydra overrides from the command line; rlsteps passes none)",
        lambda s: False,
    ),
    Guard(
        "examples/nemo_gym/run_grpo_nemo_gym.py:main",
        "is_trajectory_collection",
        "collect_trajectories: policy.generation.colocated.enabled, policy.max_total_sequence_length",
        lambda s: bool(_get(s, "env.nemo_gym.is_trajectory_collection", False)),
    ),
    Guard(
        "examples/nemo_gym/run_grpo_nemo_gym.py:main",
        "val_dataset is not None",
        "grpo.max_val_samples, grpo.val_batch_size (written, from the validation rows)",
        lambda s: _get(s, "data.validation") is not None,
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "checkpointing_pretrained is not None",
        "policy.pretrained_checkpoint (written)",
        lambda s: _get(s, "checkpointing.pretrained_checkpoint") is not None,
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "last_checkpoint_path is not None",
        "(dataloader state of a resumed run; no config keys)",
        lambda s: None,
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "rm_env_enabled",
        "env.reward_model.resources.num_nodes / gpus_per_node",
        lambda s: "reward_model" in json.dumps(_get(s, "data", {}), default=str),
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "enable_nemo_gym",
        "env.nemo_gym (NeMo-Gym spin-up)",
        lambda s: bool(_get(s, "env.should_use_nemo_gym")),
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "enable_opd_teachers",
        "on_policy_distillation teachers",
        lambda s: (
            bool(_get(s, "on_policy_distillation.enabled"))
            and _predicate("opd_module.is_non_colocated_teachers_enabled", s)
        ),
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "colocated_inference",
        "cluster.gpus_per_node vs policy.generation.colocated.resources",
        lambda s: _get(s, "policy.generation.colocated.enabled"),
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "not colocated_inference",
        "policy.generation.mcore_generation_config.refit_backend (megatron), collective init",
        lambda s: not _get(s, "policy.generation.colocated.enabled", True),
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "segment_size is not None",
        "policy.generation.vllm_cfg.tensor_parallel_size (topology-aware placement)",
        lambda s: _get(s, "cluster.segment_size") is not None,
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "backend == 'megatron'",
        "policy.generation.mcore_generation_config",
        lambda s: _get(s, "policy.generation.backend") == "megatron",
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "backend == 'vllm'",
        "policy.generation.vllm_cfg (precision, kv_cache_dtype)",
        lambda s: _get(s, "policy.generation.backend") == "vllm",
    ),
    Guard(
        "nemo_rl/algorithms/grpo.py:setup",
        "backend == 'sglang'",
        "policy.generation.sglang_cfg",
        lambda s: _get(s, "policy.generation.backend") == "sglang",
    ),
]


def _predicate(name: str, state: dict) -> Any:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return bool(PREDICATES[name](_plain(state)))
    except Exception:
        return None


def _plain(value: Any) -> Any:
    """The state with unknown values dropped, as NeMo-RL's predicates take it."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not UNKNOWN}
    if isinstance(value, list):
        return [_plain(v) for v in value if v is not UNKNOWN]
    return value


class _Module:
    def __init__(self, root: Path, rel: str) -> None:
        self.rel = rel
        self.tree = ast.parse((root / rel).read_text(), rel)
        self.defs: dict[str, ast.AST] = {
            n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        self.imports: dict[str, tuple[str, str]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)


@dataclass
class _Frame:
    module: _Module
    where: str
    env: ChainMap
    cls: ast.ClassDef | None
    definite: bool = True  # every statement so far is certainly reached for this config
    armed: tuple = ()  # inside a branch the config decided (the keys its test read): a raise here is the config's


class _LoopJump(Exception):
    """A definite continue or break in a loop the walk runs item by item."""


class _Terminated(Exception):
    """A definite return or raise: the rest of the function is not reached."""

    def __init__(self, value: Any = UNKNOWN) -> None:
        self.value = value


def _memo_key(value: Any) -> str:
    if isinstance(value, tuple) and value[:1] in (("local",), ("func",)):
        return f"{value[0]}:{id(value[-1])}"
    if isinstance(value, tuple):
        return repr(tuple(_memo_key(v) for v in value))
    return repr(value)


class ReadWalk:
    """Walks NeMo-RL's code from the driver's main() with the config's values, recording the reads it lacks."""

    def __init__(self, root: Path, config: dict) -> None:
        self.root = root
        self.state = copy.deepcopy(config)
        self.modules: dict[str, _Module] = {}
        self.missing: dict[tuple[str, ...], str] = {}
        self.failures: list[str] = []
        self.active: set = set()
        self.memo: dict = {}
        self.guards = {(g.where, g.test): g for g in GUARDS}
        self.guards_hit: set = set()
        self.touched: list | None = None  # the config paths the expression being evaluated reads
        self.required_fields = {
            name for name, field in master_config_class().model_fields.items() if field.is_required()
        }

    # -- modules -------------------------------------------------------------------------------------------------

    def module(self, rel: str) -> _Module:
        if rel not in self.modules:
            self.modules[rel] = _Module(self.root, rel)
        return self.modules[rel]

    def resolve(self, module: _Module, name: str, hops: int = 3) -> tuple[_Module, ast.AST] | None:
        """The function or class `name` means in `module` (through a package's re-exports), where READ_SCOPE lets
        the walk follow it."""
        if name in module.defs:
            allowed = READ_SCOPE.get(module.rel)
            if allowed is None or (allowed != "*" and name not in allowed):
                return None
            return module, module.defs[name]
        if name not in module.imports or hops == 0:
            return None
        dotted, qual = module.imports[name]
        rel = dotted.replace(".", "/")
        rel = f"{rel}/__init__.py" if (self.root / rel / "__init__.py").is_file() else f"{rel}.py"
        if not dotted.startswith("nemo_rl") or not (self.root / rel).is_file():
            return None
        return self.resolve(self.module(rel), qual, hops - 1)

    # -- the config as the walk has it -----------------------------------------------------------------------------

    def lookup(self, path: tuple[str, ...]) -> Any:
        node: Any = self.state
        for key in path:
            if node is UNKNOWN:
                return UNKNOWN
            if not isinstance(node, dict) or key not in node:
                return MISSING
            node = node[key]
        return node

    def read(self, ref: Ref, where: str) -> None:
        if ref.soft is not None and self.lookup(ref.soft) in (MISSING, None):
            return
        node: Any = self.state
        for i, key in enumerate(ref.path):
            if node is UNKNOWN or not isinstance(node, dict) and node is not None:
                return
            here = ref.path[: i + 1]
            if node is None:
                parent = ".".join(ref.path[:i])
                self.missing.setdefault(here, f"{parent}: is null, but {where} reads {'.'.join(ref.path)} from it")
                return
            if key not in node:
                self.missing.setdefault(here, f"{'.'.join(here)}: missing, but {where} reads it without a default")
                return
            node = node[key]

    def write(self, path: tuple[str, ...], value: Any) -> None:
        if not path:
            return
        parent = self.lookup(path[:-1])
        if isinstance(value, Ref):
            if value.path == path:  # x["k"] = f(x["k"]) handing back the same section
                return
            value = self.value(value)
            if value is MISSING:
                value = UNKNOWN
        if isinstance(parent, dict):
            parent[path[-1]] = value

    def value(self, x: Any) -> Any:
        """The concrete value of an expression's result (UNKNOWN where the walk cannot know it)."""
        if isinstance(x, Ref):
            if self.touched is not None:
                self.touched.append(x.path)
            found = self.lookup(x.path)
            if found is MISSING:
                return x.default if x.soft is not None else UNKNOWN
            return found
        if isinstance(x, tuple):
            return tuple(self.value(v) for v in x)
        return x

    def truth(self, x: Any) -> bool | None:
        v = self.value(x)
        try:
            return bool(v)
        except TypeError:
            return None

    # -- functions -----------------------------------------------------------------------------------------------

    def call(self, module: _Module, node: ast.AST, cls: ast.ClassDef | None, args: list, kwargs: dict, env=None):
        """Walks a function (a class: its __init__) with the arguments bound; its return value where known."""
        if isinstance(node, ast.ClassDef):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is None:
                return UNKNOWN
            self.call(module, init, node, args, kwargs, env=ChainMap({}))
            return UNKNOWN
        qual = f"{cls.name}.{node.name}" if cls is not None else node.name
        where = f"{module.rel}:{qual}"
        params = [a.arg for a in node.args.posonlyargs + node.args.args]
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
        if cls is not None and not static and params:
            params = params[1:]
        bound: dict[str, Any] = {}
        defaults = node.args.defaults
        for name, default in zip(params[len(params) - len(defaults) :], defaults):
            bound[name] = self.const(default)
        for kw, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
            if default is not None:
                bound[kw.arg] = self.const(default)
        for name, arg in zip(params, args):
            bound[name] = arg
        for name, arg in kwargs.items():
            bound[name] = arg
        key = (where, tuple(sorted((k, _memo_key(v)) for k, v in bound.items())), id(env))
        if key in self.active:
            return UNKNOWN
        if key in self.memo:
            return self.memo[key]
        self.active.add(key)
        frame_env = (env if env is not None else ChainMap({})).new_child(bound)
        frame = _Frame(module, where, frame_env, cls)
        result = UNKNOWN
        try:
            self.block(node.body, frame)
        except _Terminated as done:
            result = done.value
        finally:
            self.active.discard(key)
        self.memo[key] = result
        return result

    def const(self, node: ast.AST) -> Any:
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return UNKNOWN

    # -- statements ----------------------------------------------------------------------------------------------

    def block(self, body: list, frame: _Frame) -> None:
        for stmt in body:
            self.stmt(stmt, frame)

    def branch(self, body: list, frame: _Frame, definite: bool) -> None:
        if definite:
            self.block(body, frame)
            return
        sub = _Frame(frame.module, frame.where, frame.env, frame.cls, False, frame.armed)
        try:
            self.block(body, sub)
        except (_Terminated, _LoopJump):
            pass

    def stmt(self, node: ast.stmt, frame: _Frame) -> None:  # noqa: C901 (one branch per statement kind)
        if isinstance(node, ast.Expr):
            self.ev(node.value, frame)
        elif isinstance(node, ast.Assign):
            value = self.ev(node.value, frame)
            for target in node.targets:
                self.assign(target, value, frame)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.assign(node.target, self.ev(node.value, frame), frame)
        elif isinstance(node, ast.AugAssign):
            self.ev(node.value, frame)
            if isinstance(node.target, ast.Subscript):
                base = self.subscript_base(node.target, frame)
                if base is not None:
                    self.read(base, frame.where)
                    self.write(base.path, UNKNOWN)
            elif isinstance(node.target, ast.Name):
                frame.env[node.target.id] = UNKNOWN
        elif isinstance(node, ast.If):
            saved, self.touched = self.touched, []
            decided = self.decide(node.test, frame)
            keys, self.touched = self.keys(self.touched), saved
            if decided is None:
                self.branch(node.body, frame, False)
                self.branch(node.orelse, frame, False)
            else:
                armed = keys or frame.armed or ("(no key)",)
                taken = _Frame(frame.module, frame.where, frame.env, frame.cls, frame.definite, armed)
                self.branch(node.body if decided else node.orelse, taken, frame.definite)
        elif isinstance(node, ast.Assert):
            saved, self.touched = self.touched, []
            holds = self.truth(self.ev(node.test, frame))
            keys, self.touched = self.keys(self.touched), saved
            if holds is False and frame.definite:
                self.failures.append(
                    f"{', '.join(keys) or '(no key)'}: {frame.where}: assert {ast.unparse(node.test)} fails"
                    f"{self.message(node.msg)}"
                )
        elif isinstance(node, ast.Raise):
            if frame.definite and frame.armed:
                what = ast.unparse(node.exc.func if isinstance(node.exc, ast.Call) else node.exc) if node.exc else ""
                msg = node.exc.args[0] if isinstance(node.exc, ast.Call) and node.exc.args else None
                self.failures.append(f"{', '.join(frame.armed)}: {frame.where}: raises {what}{self.message(msg)}")
        elif isinstance(node, ast.Return):
            value = self.ev(node.value, frame) if node.value is not None else None
            if frame.definite:
                raise _Terminated(value)
        elif isinstance(node, ast.For | ast.AsyncFor):
            items = self.value(self.ev(node.iter, frame))
            if isinstance(items, list | tuple) and len(items) <= 16 and isinstance(node.target, ast.Name):
                for item in items:  # a short literal list: each item in turn, as the loop runs it
                    frame.env[node.target.id] = item
                    try:
                        self.branch(node.body, frame, frame.definite)
                    except _LoopJump as jump:
                        if jump.args[0] == "break":
                            break
            else:
                self.assign(node.target, UNKNOWN, frame)
                self.branch(node.body, frame, False)
            self.branch(node.orelse, frame, False)
        elif isinstance(node, ast.Continue | ast.Break):
            if frame.definite:
                raise _LoopJump("continue" if isinstance(node, ast.Continue) else "break")
        elif isinstance(node, ast.While):
            self.ev(node.test, frame)
            self.branch(node.body, frame, False)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self.ev(item.context_expr, frame)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, UNKNOWN, frame)
            self.block(node.body, frame)
        elif isinstance(node, ast.Try):
            self.branch(node.body, frame, frame.definite and not node.handlers)
            for handler in node.handlers:
                self.branch(handler.body, frame, False)
            self.branch(node.orelse, frame, False)
            self.branch(node.finalbody, frame, frame.definite)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            frame.env[node.name] = ("local", node, frame.env)

    def keys(self, touched: list) -> list[str]:
        """The dotted keys a test read (the longest of each chain)."""
        paths = sorted(set(touched or ()), key=len, reverse=True)
        kept: list[tuple] = []
        for path in paths:
            if path and not any(k[: len(path)] == path for k in kept):
                kept.append(path)
        return sorted(".".join(p) for p in kept)

    def message(self, node: ast.AST | None) -> str:
        if node is None:
            return ""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        else:
            text = ast.unparse(node)
        return ": " + " ".join(text.split())[:300]

    def decide(self, test: ast.expr, frame: _Frame) -> bool | None:
        guard = self.guards.get((frame.where, ast.unparse(test)))
        if guard is not None:
            self.guards_hit.add((guard.where, guard.test))
            try:
                holds = guard.holds(self.state)
            except Exception:
                holds = None
            if holds is not None:
                return bool(holds)
            return self.truth(self.ev(test, frame))
        return self.truth(self.ev(test, frame))

    def assign(self, target: ast.expr, value: Any, frame: _Frame) -> None:
        if isinstance(target, ast.Name):
            frame.env[target.id] = value
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            frame.env[f"self.{target.attr}"] = value
        elif isinstance(target, ast.Subscript):
            base = self.subscript_base(target, frame)
            if base is not None:
                self.write(base.path, value)
            elif isinstance(target.value, ast.Name) and isinstance(frame.env.get(target.value.id), dict | list):
                frame.env[target.value.id] = UNKNOWN
        elif isinstance(target, ast.Tuple | ast.List):
            values = value if isinstance(value, tuple) and len(value) == len(target.elts) else None
            for i, element in enumerate(target.elts):
                self.assign(element, values[i] if values is not None else UNKNOWN, frame)

    def subscript_base(self, target: ast.Subscript, frame: _Frame) -> Ref | None:
        """The Ref a subscript store writes (its container read as a load)."""
        container = self.ev(target.value, frame)
        key = self.value(self.ev(target.slice, frame))
        if isinstance(container, Ref) and isinstance(key, str):
            return Ref(container.path + (key,), container.soft)
        return None

    # -- expressions ---------------------------------------------------------------------------------------------

    def ev(self, node: ast.expr | None, frame: _Frame) -> Any:  # noqa: C901 (one branch per expression kind)
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in frame.env:
                return frame.env[node.id]
            found = self.resolve(frame.module, node.id)
            return ("func",) + found if found is not None else UNKNOWN
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return frame.env.get(f"self.{node.attr}", UNKNOWN)
            base = self.ev(node.value, frame)
            if isinstance(base, Ref) and not node.attr.startswith(("_", "model_")):
                ref = Ref(base.path + (node.attr,), base.soft)
                if base.path == () and node.attr in self.required_fields:
                    self.read(ref, frame.where)
                    return ref
                # a pydantic field with a default (MasterConfig.data_plane, loss_fn's fields): never a missing read
                return Ref(ref.path, ref.path, None)
            return UNKNOWN
        if isinstance(node, ast.Subscript):
            base = self.ev(node.value, frame)
            key = self.value(self.ev(node.slice, frame))
            if isinstance(base, Ref) and isinstance(key, str):
                ref = Ref(base.path + (key,), base.soft)
                self.read(ref, frame.where)
                return ref
            base_value = self.value(base)
            if isinstance(base_value, dict) and isinstance(key, str) and key in base_value:
                return base_value[key]
            return UNKNOWN
        if isinstance(node, ast.Call):
            return self.ev_call(node, frame)
        if isinstance(node, ast.BoolOp):
            result: Any = UNKNOWN
            for operand in node.values:
                result = self.ev(operand, frame)
                truth = self.truth(result)
                if truth is None:
                    for rest in node.values[node.values.index(operand) + 1 :]:
                        self.ev(rest, frame)
                    return UNKNOWN
                if truth is (isinstance(node.op, ast.Or)):
                    return result
            return result
        if isinstance(node, ast.UnaryOp):
            operand = self.value(self.ev(node.operand, frame))
            if isinstance(node.op, ast.Not):
                truth = self.truth(operand)
                return UNKNOWN if truth is None else not truth
            if isinstance(node.op, ast.USub) and isinstance(operand, int | float):
                return -operand
            return UNKNOWN
        if isinstance(node, ast.Compare):
            return self.compare(node, frame)
        if isinstance(node, ast.IfExp):
            decided = self.truth(self.ev(node.test, frame))
            if decided is None:
                self.ev(node.body, frame)
                self.ev(node.orelse, frame)
                return UNKNOWN
            return self.ev(node.body if decided else node.orelse, frame)
        if isinstance(node, ast.Tuple):
            return tuple(self.ev(e, frame) for e in node.elts)
        if isinstance(node, ast.List):
            values = [self.value(self.ev(e, frame)) for e in node.elts]
            return values if all(v is not UNKNOWN for v in values) else UNKNOWN
        if isinstance(node, ast.Dict):
            keys = [self.value(self.ev(k, frame)) if k is not None else UNKNOWN for k in node.keys]
            values = [self.value(self.ev(v, frame)) for v in node.values]
            if all(k is not UNKNOWN for k in keys):
                return dict(zip(keys, values))
            return UNKNOWN
        if isinstance(node, ast.Lambda):
            return UNKNOWN
        for child in ast.iter_child_nodes(node):  # comprehensions, f-strings, arithmetic: their reads only
            if isinstance(child, ast.expr):
                self.ev(child, frame)
            elif isinstance(child, ast.comprehension):
                self.ev(child.iter, frame)
                self.assign(child.target, UNKNOWN, frame)
                for cond in child.ifs:
                    self.ev(cond, frame)
        return UNKNOWN

    def compare(self, node: ast.Compare, frame: _Frame) -> Any:
        left = self.value(self.ev(node.left, frame))
        result: Any = True
        for op, right_node in zip(node.ops, node.comparators):
            right = self.value(self.ev(right_node, frame))
            if result is UNKNOWN or left is UNKNOWN or right is UNKNOWN or left is MISSING or right is MISSING:
                result, left = UNKNOWN, right
                continue
            try:
                outcome = {
                    ast.Eq: lambda a, b: a == b,
                    ast.NotEq: lambda a, b: a != b,
                    ast.Is: lambda a, b: a is b,
                    ast.IsNot: lambda a, b: a is not b,
                    ast.In: lambda a, b: a in b,
                    ast.NotIn: lambda a, b: a not in b,
                    ast.Lt: lambda a, b: a < b,
                    ast.LtE: lambda a, b: a <= b,
                    ast.Gt: lambda a, b: a > b,
                    ast.GtE: lambda a, b: a >= b,
                }[type(op)](left, right)
            except TypeError:
                outcome = UNKNOWN
            if outcome is UNKNOWN:
                result = UNKNOWN
            else:
                result = result and outcome
            left = right
        return result

    def ev_call(self, node: ast.Call, frame: _Frame) -> Any:  # noqa: C901 (one branch per kind of call)
        func_text = ast.unparse(node.func)
        func = node.func
        if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "self"):
            base = self.ev(func.value, frame)
            args = [self.ev(a, frame) for a in node.args]
            for kw in node.keywords:
                self.ev(kw.value, frame)
            if isinstance(base, Ref) and func.attr in ("get", "setdefault", "pop", "keys", "items", "values", "update"):
                return self.ref_method(base, func.attr, args, node, frame)
            base_value = self.value(base)
            if isinstance(base_value, list | dict | set) and isinstance(func.value, ast.Name):
                frame.env[func.value.id] = UNKNOWN  # groups.append(...): a local container the walk stops following
            if isinstance(base_value, str) and func.attr in ("startswith", "endswith", "lower", "upper", "strip"):
                try:
                    return getattr(base_value, func.attr)(*[self.value(a) for a in args])
                except TypeError:
                    return UNKNOWN
            if isinstance(base_value, dict) and func.attr == "get" and args:
                key = self.value(args[0])
                return base_value.get(key, self.value(args[1]) if len(args) > 1 else None)
            if isinstance(func.value, ast.Name) and func.value.id in ("OmegaConf",) and func.attr == "to_container":
                return Ref(())
            if func_text in PREDICATES:
                return self.predicate(func_text)
            # Class.method(...) of a class in scope (VllmGeneration.init_cluster_placement_groups)
            if isinstance(func.value, ast.Name):
                found = self.resolve(frame.module, func.value.id)
                if found is not None and isinstance(found[1], ast.ClassDef):
                    method = next((n for n in found[1].body if getattr(n, "name", None) == func.attr), None)
                    if method is not None and any(isinstance(a, Ref) for a in args):
                        return self.call(found[0], method, found[1], args, {})
            self.walk_local_args(args, frame)
            return UNKNOWN
        args = [self.ev(a, frame) for a in node.args if not isinstance(a, ast.Starred)]
        for a in node.args:
            if isinstance(a, ast.Starred):
                self.ev(a.value, frame)
        kwargs = {}
        for kw in node.keywords:
            value = self.ev(kw.value, frame)
            if kw.arg is not None:
                kwargs[kw.arg] = value
        if isinstance(func, ast.Attribute):  # self.method(...)
            method = next(
                (n for n in (frame.cls.body if frame.cls else []) if getattr(n, "name", None) == func.attr), None
            )
            if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
                return self.call(frame.module, method, frame.cls, args, kwargs, env=self.self_env(frame))
            return UNKNOWN
        if not isinstance(func, ast.Name):
            return UNKNOWN
        name = func.id
        if name in ROOT_CALLS:
            return Ref(())
        if name == "cast" and len(args) == 2:
            return args[1]
        if name == "dict" and len(args) == 1 and isinstance(args[0], Ref):
            return args[0]
        if name in ("bool", "int", "float", "str", "len") and len(args) == 1:
            v = self.value(args[0])
            try:
                return (
                    UNKNOWN
                    if v is UNKNOWN
                    else {"bool": bool, "int": int, "float": float, "str": str, "len": len}[name](v)
                )
            except (TypeError, ValueError):
                return UNKNOWN
        local = frame.env.get(name)
        if isinstance(local, tuple) and local[:1] == ("local",):
            return self.walk_local(local, frame, args, kwargs)
        if isinstance(local, tuple) and local[:1] == ("func",):  # trainer = _select_trainer(...); trainer(...)
            return self.call(local[1], local[2], None, args, kwargs)
        self.walk_local_args(list(args) + list(kwargs.values()), frame)
        found = self.resolve(frame.module, name)
        result = UNKNOWN
        if found is not None and (any(isinstance(a, Ref) for a in list(args) + list(kwargs.values()))):
            cls = found[1] if isinstance(found[1], ast.ClassDef) else None
            result = self.call(found[0], found[1], None if cls is None else None, args, kwargs)
        if name in PREDICATES:
            return self.predicate(name)
        return result

    def predicate(self, name: str) -> Any:
        decided = _predicate(name, self.state)
        return UNKNOWN if decided is None else decided

    def self_env(self, frame: _Frame) -> ChainMap:
        return ChainMap({k: v for k, v in frame.env.items() if isinstance(k, str) and k.startswith("self.")})

    def walk_local(self, local: tuple, frame: _Frame, args: list, kwargs: dict) -> Any:
        _, fn, closure = local
        return self.call(frame.module, fn, frame.cls, args, kwargs, env=closure)

    def walk_local_args(self, args: list, frame: _Frame) -> None:
        """A nested function handed to another call (executor.submit(init_vllm), init_generation_fn=init_vllm)
        runs there: walk it."""
        for a in args:
            if isinstance(a, tuple) and a[:1] == ("local",):
                self.walk_local(a, frame, [], {})

    def ref_method(self, base: Ref, method: str, args: list, node: ast.Call, frame: _Frame) -> Any:
        key = self.value(args[0]) if args else UNKNOWN
        if method == "get" and isinstance(key, str):
            default = self.value(args[1]) if len(args) > 1 else None
            return Ref(base.path + (key,), base.path + (key,), default)
        if method == "setdefault" and isinstance(key, str):
            if self.lookup(base.path + (key,)) is MISSING:
                self.write(base.path + (key,), self.value(args[1]) if len(args) > 1 else None)
            return Ref(base.path + (key,), base.soft)
        if method == "pop" and isinstance(key, str):
            path = base.path + (key,)
            if len(args) < 2:
                self.read(Ref(path, base.soft), frame.where)
            found = self.lookup(path)
            container = self.lookup(base.path)
            if isinstance(container, dict):
                container.pop(key, None)
            if found is MISSING:
                return self.value(args[1]) if len(args) > 1 else UNKNOWN
            return found
        if method in ("keys", "items", "values", "copy", "update"):
            return UNKNOWN
        return UNKNOWN


def read_problems(config: dict, driver: str) -> list[str]:
    root = upstream.unpacked("nemo_rl")
    walk = ReadWalk(root, config)
    module = walk.module(DRIVERS[driver])
    with contextlib.redirect_stdout(sys.stderr):
        walk.call(module, module.defs["main"], None, [], {})
    problems = list(walk.missing.values()) + walk.failures
    problems += vllm_required_key_problems(walk.state)
    return sorted(set(problems))


def vllm_required_key_problems(state: dict) -> list[str]:
    """VllmGeneration.__init__'s own check: every key VllmConfig requires is in policy.generation (model_name is
    written by grpo.setup)."""
    generation = _get(state, "policy.generation")
    if not isinstance(generation, dict) or generation.get("backend") != "vllm":
        return []
    required = sorted(nemo_rl()["VllmConfig"].__required_keys__)
    return [
        f"policy.generation.{key}: missing, but VllmGeneration.__init__ requires every VllmConfig key"
        for key in required
        if key not in generation
    ]


# ---------------------------------------------------------------------------------------------------------------
# c. env.nemo_gym through NeMo-Gym's own config parsing
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
    problems += read_problems(config, driver)
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
# (VllmGeneration.__init__ checks VllmConfig's own required keys, see vllm_required_key_problems).
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
