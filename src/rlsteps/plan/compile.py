"""Config chain + profile + overrides -> one validated, frozen Job.

Order: the step config and the files it names under `defaults:` (each extends the previous, the
step's own keys on top); then the profile's `config:` overlay; then `key=value` overrides, which win.
An override of a key that does not exist is an error naming the closest key; `+key=value` adds one.
A step whose config is NeMo-RL's master config (rl/nemo_rl/rlhf) takes any key of NeMo-RL's schema, and so does the
pass-through section `nemo_rl.` of the steps that compile to it; a key the schema lacks is refused there with the
schema's closest key.
"""

from __future__ import annotations

import difflib
import os
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    GrammarParseError,
    InterpolationKeyError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    UnsupportedInterpolationType,
)
from pydantic import BaseModel, ValidationError

from rlsteps.catalog import Step, load_catalog
from rlsteps.contract.config import NEMO_RL_SECTIONS, STEP_SCHEMAS  # torch-free
from rlsteps.contract.eval_config import EvalConfig  # noqa: F401  registers eval/policy in STEP_SCHEMAS
from rlsteps.errors import UsageError
from rlsteps.launch.job import Job, Mode, sanitise_name
from rlsteps.plan import resolvers
from rlsteps.plan.key_hints import closest_key_hint, flat_keys
from rlsteps.plan.profiles import Profile

resolvers.register()
PASS_THROUGH_SECTIONS = ("nemo_rl",)  # keys of another tool's config, passed on as they are
PACKAGE_PREFIX = "rlsteps:"  # a config's `defaults:` entry inside the package


def config_source(step: Step, ref: str) -> Path:
    """-c NAME (a file under the step's folder) or -c PATH (any YAML file)."""
    as_path = Path(ref).expanduser()
    if ref.endswith((".yaml", ".yml")) or as_path.is_file():
        if not as_path.is_file():
            raise UsageError(f"config file {ref} not found")
        return as_path.resolve()
    candidate = step.config_path(ref)
    if not candidate.is_file():
        names = sorted(p.stem for p in step.config_dir.glob("*.yaml"))
        close = difflib.get_close_matches(ref, names, n=2)
        hint = f"did you mean {', '.join(close)}?" if close else f"{step.id} has configs: {', '.join(names)}"
        raise UsageError(f"config '{ref}' not found for {step.id}", fix=hint)
    return candidate


def load_config_chain(path: Path, _seen: tuple[Path, ...] = ()) -> DictConfig:
    """A YAML file merged over the files its `defaults:` names, depth first, cycle-checked."""
    path = path.resolve()
    if path in _seen:
        raise UsageError(f"config defaults form a cycle: {' -> '.join(str(p) for p in (*_seen, path))}")
    try:
        own = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError) as err:
        raise UsageError(f"{path}: cannot read config: {err}") from err
    if not isinstance(own, DictConfig):
        raise UsageError(f"{path}: a config file must be a mapping")
    bases = own.pop("defaults", None)
    base_list = [bases] if isinstance(bases, str) else list(bases or [])
    merged = OmegaConf.create({})
    for base in base_list:
        merged = OmegaConf.merge(merged, load_config_chain(_base_path(path, str(base)), (*_seen, path)))
    return OmegaConf.merge(merged, own)


def _base_path(path: Path, base: str) -> Path:
    """A `defaults:` entry: a file beside the config, or `rlsteps:RELATIVE` inside the installed package (the NeMo-RL
    master config it ships)."""
    if base.startswith(PACKAGE_PREFIX):
        return Path(str(resources.files("rlsteps").joinpath(base.removeprefix(PACKAGE_PREFIX))))
    return path.parent / base


def apply_overrides(cfg: DictConfig, overrides: list[str], schema: type[BaseModel] | None = None) -> DictConfig:
    """The overrides merged over cfg. A key must be in cfg, or a field of schema (the step's config schema) that the
    config files leave at its default (train.compile), or a NeMo-RL key where the config speaks NeMo-RL's language."""
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip("+"):
            raise UsageError(f"override '{item}' is not key=value", fix="write e.g. train.lr=1e-5")
        adding = key.startswith("+") or _names_a_new_entry(key)
        key = key.lstrip("+")
        if not adding and not _has_key(cfg, key) and not _schema_has_key(schema, key):
            _check_nemo_rl_key(cfg, key)
        try:
            value = OmegaConf.from_dotlist([f"{key}={item.split('=', 1)[1]}"])
            cfg = OmegaConf.merge(cfg, value)
        except OmegaConfBaseException as err:
            raise config_error(err, [item]) from None
    return cfg


def _names_a_new_entry(key: str) -> bool:
    """rewards.NAME.FIELD=..., validation.reward_functions.NAME=...: a new entry of a section whose entries the user
    names, with a field such an entry has (any other key of it is still an unknown key)."""
    from rlsteps.contract.reward_config import RewardEntry  # torch-free

    fields_of_entry = {  # "": the entry is a value
        "rewards": set(RewardEntry.model_fields),
        "validation.reward_functions": {""},
        "data.chat_template_kwargs": {""},  # a chat template's own switches: enable_thinking, ...
    }
    for section, fields in fields_of_entry.items():
        if key.startswith(section + "."):
            name, _, field = key.removeprefix(section + ".").partition(".")
            return bool(name) and field in fields
    return False


def _check_nemo_rl_key(cfg: DictConfig, key: str) -> None:
    """A key this config lacks: welcome where NeMo-RL's schema has it (its own config, or the pass-through section),
    else refused with the closest key."""
    from rlsteps.nemo_rl.schema import closest, is_known  # torch-free

    nemo_rl_key = _nemo_rl_key(cfg, key)
    if nemo_rl_key is None:
        raise UsageError(f"unknown config key '{key}'", fix=closest_key_hint(cfg, key))
    if not is_known(nemo_rl_key):
        near = closest(nemo_rl_key)
        prefix = key.removesuffix(nemo_rl_key)
        hint = f"did you mean '{prefix}{near}'?" if near else "see NeMo-RL's examples/configs/grpo_math_1B.yaml"
        raise UsageError(f"unknown config key '{key}': NeMo-RL's master config has no '{nemo_rl_key}'", fix=hint)


def _nemo_rl_key(cfg: DictConfig, key: str) -> str | None:
    """The key as NeMo-RL names it, where this config speaks NeMo-RL's language there; else None."""
    if _passed_through(cfg, key):
        return key.partition(".")[2]
    if cfg.get("algorithm") == "nemo_rl_grpo" and key.partition(".")[0] in NEMO_RL_SECTIONS:
        return key
    return None


def overrides_for(step: Step, config_ref: str, overrides: list[str], strict: bool = False) -> list[str]:
    """The key=value overrides whose key this step's config has (or that add a key with +): what a pipeline-wide
    setting means for a stage of another kind, such as a convert stage among RL steps. strict: an override this
    config lacks raises the unknown-key UsageError instead."""
    cfg = load_config_chain(config_source(step, config_ref))
    schema = step_schema(step)
    if strict:
        apply_overrides(cfg, overrides, schema)
    return [
        item
        for item in overrides
        if item.startswith("+")
        or _has_key(cfg, key := item.partition("=")[0])
        or _schema_has_key(schema, key)
        or _nemo_rl_key(cfg, key)
    ]


def step_schema(step: Step) -> type[BaseModel] | None:
    """The config schema of the step's algorithm (None for an algorithm without one: _validate refuses it)."""
    return STEP_SCHEMAS.get(step.algorithm)


def compile_job(
    step: Step,
    config_ref: str,
    *,
    mode: Mode = "local",
    profile: Profile | None = None,
    overrides: list[str] = (),
    passthrough: list[str] = (),
    force_squash: bool = False,
    argv: list[str] = (),
    depends_on: list[str] = (),
    allow_unset: bool = False,
) -> Job:
    """The job for a step's config, profile and overrides. Required keys left unset (???) are refused all at once,
    unless allow_unset (a dry run): then the job lists them as what the run will need."""
    source = config_source(step, config_ref)
    cfg = load_config_chain(source)
    if profile is not None and profile.config_overlay:
        cfg = OmegaConf.merge(cfg, profile.config_overlay)
    cfg = apply_overrides(cfg, list(overrides), step_schema(step))
    try:
        unset = sorted(OmegaConf.missing_keys(cfg))  # resolves interpolations on its way
    except OmegaConfBaseException as err:
        raise config_error(err, list(overrides)) from None
    if unset and not allow_unset:
        raise UsageError(
            f"required config {'keys' if len(unset) > 1 else 'key'} without a value: {', '.join(unset)}",
            fix="pass " + " ".join(f"{key}=VALUE" for key in unset),
        )
    resolved = _resolve(cfg, list(overrides))
    validated = _validate(step, resolved)
    algorithm, notes = step.algorithm, []
    if step.algorithm == "nemo_rl_grpo":
        resolved, algorithm, notes = _nemo_rl_step(step, source, resolved, validated, profile, list(overrides))
        if algorithm != step.algorithm:  # on the embedded engine: the unset keys by their rl/rlhf names
            from rlsteps.nemo_rl.embedded import embedded_key

            unset = [embedded_key(key) for key in unset]
    created = datetime.now().astimezone()  # to the microsecond: jobs compiled in one second still list in order
    return Job(
        name=f"{created:%Y%m%d-%H%M%S}-{os.urandom(3).hex()}-{sanitise_name(step.slug)}",  # two in one second differ
        step_id=step.id,
        algorithm=algorithm,
        config_name=Path(config_ref).stem,
        config_source=str(source),
        mode=mode,
        executor=profile.executor if profile else "local",
        profile_name=profile.name if profile else None,
        profile_source=profile.source if profile else None,
        launcher_settings=profile.launcher_settings if profile else {"executor": "local"},
        config=resolved,
        overrides=list(overrides),
        passthrough=list(passthrough),
        force_squash=force_squash,
        argv=list(argv),
        depends_on=list(depends_on),
        created=created.isoformat(timespec="microseconds"),
        unset_keys=unset,
        notes=notes,
    )


def _nemo_rl_step(
    step: Step,
    source: Path,
    cfg: dict[str, Any],
    validated: dict[str, Any],
    profile: Profile | None,
    overrides: list[str],
) -> tuple[dict[str, Any], str, list[str]]:
    """rl/nemo_rl/rlhf's job config, algorithm and notes for the engine it runs on: NeMo-RL on a Slurm or Lepton
    profile (engine auto), else the embedded engine with the config mapped onto rl/rlhf's recipe. `validated`: cfg
    with its schema's defaults."""
    from rlsteps.nemo_rl.embedded import EMBEDDED_STEP, to_embedded

    engine = validated["engine"]
    if engine == "auto":
        engine = "nemo_rl" if profile is not None and profile.executor in ("slurm", "lepton") else "embedded"
    if engine == "nemo_rl":
        derived = {key: validated[key] for key in ("inputs", "nemo_rl_job")}
        return {**cfg, **derived, "engine": "nemo_rl"}, step.algorithm, []
    base = load_catalog().find(EMBEDDED_STEP).config_path(validated["embedded_config"])
    if not base.is_file():
        raise UsageError(f"embedded_config '{validated['embedded_config']}': {EMBEDDED_STEP} has no such config")
    recipe, notes = to_embedded(
        validated, _resolve(load_config_chain(base)), _set_keys(step, source, profile, overrides)
    )
    try:
        STEP_SCHEMAS["grpo"].model_validate(recipe)
    except ValidationError as err:
        problems = "; ".join(_describe(e) for e in err.errors())
        raise UsageError(f"invalid config on the embedded engine: {problems}") from None
    lead = (
        f"engine: embedded ({EMBEDDED_STEP}'s recipe on rlsteps's loop; on a GPU profile engine=nemo_rl runs NeMo-RL)"
    )
    return recipe, "grpo", [lead, *notes]


def _set_keys(step: Step, source: Path, profile: Profile | None, overrides: list[str]) -> list[str]:
    """The keys the user set: in the step's own config files (not the shared bases), the profile and overrides."""
    keys = [item.partition("=")[0].lstrip("+") for item in overrides]
    if profile is not None and profile.config_overlay:
        keys += flat_keys(OmegaConf.create(profile.config_overlay))
    todo = [source]
    while todo:
        path = todo.pop()
        own = OmegaConf.load(path)
        bases = own.pop("defaults", None)
        keys += flat_keys(own)
        for base in [bases] if isinstance(bases, str) else list(bases or []):
            candidate = (path.parent / str(base)).resolve()
            if candidate.parent == step.config_dir.resolve():
                todo.append(candidate)
    return sorted(set(keys))


def _resolve(cfg: DictConfig, overrides: list[str] = ()) -> dict[str, Any]:
    """The plain config; a key still unset stays "???" (only a dry run gets here with one)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as err:
        raise config_error(err, overrides) from None


LITERAL = r"write \${...} for a literal ${"


def config_error(err: OmegaConfBaseException, overrides: list[str] = ()) -> UsageError:
    """OmegaConf's error as one line: the key (and the override that set it), the cause, and the fix."""
    key = getattr(err, "full_key", None) or "?"
    cause = str(err).splitlines()[0] if str(err) else type(err).__name__
    setting = next((item for item in overrides if item.partition("=")[0].lstrip("+") == key), None)
    where = f"override '{setting}'" if setting else f"config key '{key}'"
    if "Missing mandatory value" in cause:  # an interpolation of an unset key
        return UsageError(f"{where} refers to a key without a value ({cause})", fix=f"pass {key}=VALUE")
    if isinstance(err, InterpolationKeyError):
        fix = f"${{...}} must name a key of the config, e.g. ${{train.lr}}; {LITERAL}"
    elif isinstance(err, UnsupportedInterpolationType):
        fix = f"the resolvers are {', '.join(_resolvers())}; {LITERAL}"
    elif isinstance(err, GrammarParseError):
        fix = f"close each ${{ with }}; {LITERAL}"
    elif isinstance(err, InterpolationResolutionError):
        fix = f"give what the interpolation reads (an environment variable for oc.env), or a plain value; {LITERAL}"
    else:
        fix = None if setting is None else f"give {key} a value of the type it takes"
    return UsageError(f"{where}: {cause}", fix=fix)


def _resolvers() -> list[str]:
    from omegaconf.basecontainer import BaseContainer

    return sorted(getattr(BaseContainer, "_resolvers", {}))


def _validate(step: Step, cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as the worker sees it (defaults filled in), or a UsageError naming every problem."""
    algorithm = cfg.get("algorithm", step.algorithm)
    if algorithm != step.algorithm:
        raise UsageError(f"config says algorithm '{algorithm}' but {step.id} runs '{step.algorithm}'")
    schema = step_schema(step)
    if schema is None:
        raise UsageError(f"{step.id}: no config schema for algorithm '{step.algorithm}'")
    nemo_rl = step.algorithm == "nemo_rl_grpo"
    if nemo_rl:
        from rlsteps.nemo_rl.key_map import with_derived_keys  # torch-free

        cfg = with_derived_keys(cfg)
    try:
        validated = schema.model_validate(cfg).model_dump(mode="json")
    except ValidationError as err:
        problems = [_describe(e) for e in err.errors()]
        keys = [".".join(str(part) for part in e["loc"]) for e in err.errors() if e["type"] != "value_error"]
        fix = f"give {', '.join(dict.fromkeys(keys))} a value of the type it takes" if keys else _SCHEMA_FIX
        raise UsageError("invalid config: " + "; ".join(problems), fix=fix) from None
    if nemo_rl:
        from rlsteps.nemo_rl.schema import unknown_keys_problem  # torch-free

        problem = unknown_keys_problem(validated, NEMO_RL_SECTIONS)
        if problem:
            raise UsageError("invalid config: " + problem, fix=_SCHEMA_FIX)
    return validated


_SCHEMA_FIX = "change the keys the message names (key=value, or in the config file)"


def worker_config_hash(step: Step, cfg: dict[str, Any]) -> str:
    """The config hash the worker writes into its output artifact for this config."""
    from rlsteps.contract.artifact import config_hash

    return config_hash(_validate(step, cfg))


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}'"
    if error["type"] == "value_error":  # cross-field checks name their keys themselves
        return message
    return f"{key}: {message} (got {error.get('input')!r})"


def _passed_through(cfg: DictConfig, dotted: str) -> bool:
    """A key under a pass-through section this config has: any key there is another tool's to judge."""
    section, dot, rest = dotted.partition(".")
    return bool(dot and rest) and section in PASS_THROUGH_SECTIONS and _has_key(cfg, section)


def _schema_has_key(schema: type[BaseModel] | None, dotted: str) -> bool:
    """Whether dotted names a field of the schema, through its nested sections (train.lora.dim)."""
    model: Any = schema
    for part in dotted.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return False
        model = model.model_fields[part].annotation
    return True


def _has_key(cfg: Any, dotted: str) -> bool:
    node = cfg
    for part in dotted.split("."):
        if isinstance(node, DictConfig) and part in node.keys():  # keys() also lists ??? values
            node = node._get_node(part)
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
        else:
            return False
    return True
