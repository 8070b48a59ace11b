"""A step's inputs against its manifest: present, of the required type, pending, convertible, or for the job
to check (on a path only its cluster sees).

A reference is a local path or any fsspec URL; what it holds is decided by rlsteps.artifacts.detect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from rlsteps.artifacts.detect import detect_types, detectors_of, exists
from rlsteps.catalog import ArtifactSpec, Catalog, Step
from rlsteps.contract.hub import is_hub_id
from rlsteps.contract.input_check import InputInJob, InputProblem, damaged_weights, missing, wrong_type
from rlsteps.dotted import get
from rlsteps.errors import ArtifactError

PUBLISH_FIX = "or publish it to the artifact store (rlsteps artifacts publish) and pass {key}=artifact:NAME"


@dataclass(frozen=True)
class ResolvedInput:
    name: str
    key: str
    ref: str | None
    required_type: str
    detected: list[str]
    # ok | absent | missing | wrong_type | malformed (of the type, but broken: see problem)
    # | pending (an earlier stage, or the run itself, writes it first)
    # | in_job (on a cluster path: the job checks it) | unreachable (on this machine, which the job cannot see)
    # | hub (a Hugging Face Hub id not in this machine's cache, or for a job that cannot see it: the job resolves it)
    status: str
    problem: str | None = None  # what is broken, for a malformed input (its message starts "input 'NAME': ")
    fix: str | None = None  # and what to do about it
    path: str | None = None  # a Hub id's snapshot folder in this machine's Hugging Face cache, checked as the input

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k not in ("problem", "fix", "path")}

    @property
    def location(self) -> str:
        """Where the input's files are read here: a Hub id's cached snapshot, else the reference itself."""
        return self.path or str(self.ref)

    def malformed(self, problem: InputProblem) -> ResolvedInput:
        return replace(self, status="malformed", problem=problem.message, fix=problem.fix)


@dataclass(frozen=True)
class Reach:
    """Which input paths a job sees: the submitting machine's files or not, and the paths only its cluster has."""

    launcher: str = "local"
    sees_local_files: bool = True
    cluster_paths: tuple[str, ...] = ()  # absolute folders: inputs under them are checked in the job

    def on_cluster(self, ref: str) -> bool:
        return _is_local(ref) and any(_under(ref, folder) for folder in self.cluster_paths)

    def unreachable(self, ref: str) -> bool:
        return _is_local(ref) and not self.sees_local_files and not self.on_cluster(ref)

    def describe(self) -> str:
        where = ", ".join(self.cluster_paths) or "none declared"
        return f"the {self.launcher} job sees remote URLs and its cluster paths ({where})"


def _is_local(ref: str) -> bool:
    return "://" not in ref or ref.startswith("file://")


def _under(ref: str, folder: str) -> bool:
    path, folder = ref.removeprefix("file://").rstrip("/"), folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


def satisfies(catalog: Catalog, detected: list[str], required: str) -> bool:
    return any(catalog.is_a(t, required) for t in detected)


def check_input(
    catalog: Catalog,
    spec_name: str,
    key: str,
    ref: str | None,
    required_type: str,
    reach: Reach = Reach(),
    hub_id: bool = False,
) -> ResolvedInput:
    if ref is None:
        return ResolvedInput(spec_name, key, None, required_type, [], "absent")
    if hub_id and is_hub_id(ref):
        return _hub_input(catalog, ResolvedInput(spec_name, key, ref, required_type, [], "hub"), reach)
    if reach.on_cluster(ref):
        return ResolvedInput(spec_name, key, ref, required_type, [], "in_job")
    if reach.unreachable(ref):
        return ResolvedInput(spec_name, key, ref, required_type, [], "unreachable")
    try:
        present = exists(ref)
    except (ValueError, ImportError, OSError) as err:
        raise ArtifactError(f"{key}: cannot open '{ref}': {err}") from err
    if not present:
        return ResolvedInput(spec_name, key, ref, required_type, [], "missing")
    return _detected(catalog, ResolvedInput(spec_name, key, ref, required_type, [], "ok"))


def _detected(catalog: Catalog, item: ResolvedInput) -> ResolvedInput:
    """An input that exists, by what its files hold: ok, wrong_type, or malformed (weights cut short)."""
    detected = detect_types(catalog, item.location)
    status = "ok" if satisfies(catalog, detected, item.required_type) else "wrong_type"
    item = replace(item, detected=detected, status=status)
    damage = damaged_weights(item.name, item.key, item.location) if status == "ok" else None  # headers and sizes
    return item if damage is None else item.malformed(damage)


def _hub_input(catalog: Catalog, item: ResolvedInput, reach: Reach) -> ResolvedInput:
    """A Hugging Face Hub id: in this machine's cache (and for a job that reads this machine's files), its snapshot
    checked as a folder; else the job's to resolve where it runs (status hub), unless the Hub is off here
    (HF_HUB_OFFLINE) for a run on this machine: missing, with how to fetch it."""
    from rlsteps.contract.hub import cached_snapshot, not_cached, offline, repo_type_of

    if not reach.sees_local_files:
        return item
    repo_type = repo_type_of(item.name)
    folder = cached_snapshot(str(item.ref), repo_type)
    if folder is not None:
        return _detected(catalog, replace(item, path=str(folder)))
    if offline() and reach.launcher == "local":
        problem = not_cached(item.name, item.key, str(item.ref), repo_type)
        return replace(item, status="missing", problem=problem.message, fix=problem.fix)
    return item


def promised_input(
    catalog: Catalog, spec_name: str, key: str, ref: str, required_type: str, produced_type: str
) -> ResolvedInput:
    """An input an earlier pipeline stage will write: checked against the type that stage's manifest declares."""
    status = "pending" if catalog.is_a(produced_type, required_type) else "wrong_type"
    return ResolvedInput(spec_name, key, ref, required_type, [produced_type], status)


@dataclass(frozen=True)
class Conversion:
    """A convert step (types.toml convert_to) that turns an input's type into the one a step requires."""

    step_id: str
    source: str
    target: str


def conversion_for(catalog: Catalog, detected: list[str], required: str) -> Conversion | None:
    for found in detected:
        for source in sorted(catalog.ancestors(found)):
            for target, step_id in catalog.types[source].convert_to if source in catalog.types else ():
                if catalog.is_a(target, required):
                    return Conversion(step_id, source, target)
    return None


def required_here(spec: ArtifactSpec, config: dict[str, Any]) -> bool:
    if spec.reward_source and not uses_reward_source(config, spec.reward_source):
        return False
    return spec.required and not (spec.required_unless and lookup(config, spec.required_unless))


def uses_reward_source(config: dict[str, Any], source: str) -> bool:
    """Whether the config's rewards have an entry of this source (reward_model | judge)."""
    rewards = config.get("rewards") or {}
    return any(isinstance(entry, dict) and entry.get("source") == source for entry in rewards.values())


def check_inputs(
    catalog: Catalog,
    step: Step,
    config: dict[str, Any],
    promised: Mapping[str, str] = {},
    built_before_run: str | None = None,
    reach: Reach = Reach(),
) -> list[ResolvedInput]:
    """The state of every input the manifest declares, raising nothing.

    promised: input name -> the type an earlier pipeline stage will write there (not on disk yet).
    built_before_run: a folder the run fills before it starts (the tiny world): missing inputs in it are pending.
    reach: which paths the job sees (inputs on cluster paths are the job's to check).
    """
    return [_check_one(catalog, s, config, promised, built_before_run, reach) for s in step.consumes]


def _check_one(
    catalog: Catalog,
    spec: ArtifactSpec,
    config: dict[str, Any],
    promised: Mapping[str, str],
    built_before_run: str | None,
    reach: Reach,
) -> ResolvedInput:
    ref = lookup(config, spec.key)
    item = (
        promised_input(catalog, spec.name, spec.key, ref, spec.type, promised[spec.name])
        if spec.name in promised
        else check_input(catalog, spec.name, spec.key, ref, spec.type, reach, spec.hub_id)
    )
    if item.status == "missing" and built_before_run and str(ref).startswith(built_before_run):
        item = replace(item, status="pending")
    return item


def resolve_inputs(
    catalog: Catalog,
    step: Step,
    config: dict[str, Any],
    promised: Mapping[str, str] = {},
    reach: Reach = Reach(),
    checked: list[ResolvedInput] | None = None,
) -> list[ResolvedInput]:
    """Check every input the manifest declares; raise ArtifactError (exit 3) naming the first problem.

    checked: the inputs as the compile found them (runner.compile_request); only those it could not see yet are
    looked at again (pending: in the tiny world built since, or an earlier pipeline stage's output)."""
    if checked is None:
        resolved = check_inputs(catalog, step, config, promised, reach=reach)
    else:
        resolved = [
            _check_one(catalog, spec, config, promised, None, reach) if item.status == "pending" else item
            for spec, item in zip(step.consumes, checked, strict=True)
        ]
    for spec, item in zip(step.consumes, resolved):
        if item.status == "unreachable":
            raise refusal(catalog, item, reach)
        raise_for(catalog, required_here(spec, config), item)
    return resolved


def refusal(catalog: Catalog, item: ResolvedInput, reach: Reach = Reach()) -> ArtifactError | None:
    """The error a run stops with for an input that was given and cannot be used (missing, malformed, of the wrong
    type, out of the job's reach); None for any other input, an absent one included."""
    if item.status == "unreachable":
        return ArtifactError(
            f"input '{item.name}': {item.ref} is on this machine; {reach.describe()}",
            fix=f"copy it under a cluster path and pass {item.key}=THAT_PATH, " + PUBLISH_FIX.format(key=item.key),
        )
    if item.status not in ("missing", "malformed", "wrong_type"):
        return None
    try:
        raise_for(catalog, False, item)
    except ArtifactError as error:
        return error
    return None


def inputs_in_job(catalog: Catalog, resolved: list[ResolvedInput]) -> list[InputInJob]:
    """What the job needs to check its inputs on cluster paths, and the Hub ids it resolves, itself (recorded in its
    job.yaml)."""
    detectors = detectors_of(catalog)
    return [
        InputInJob(
            name=item.name,
            key=item.key,
            ref=str(item.ref),
            required_type=item.required_type,
            wanted=type_phrase(catalog, item.required_type),
            accepted=catalog.subtypes(item.required_type),
            detectors=detectors,
        )
        for item in resolved
        if item.status in ("in_job", "hub")
    ]


def type_phrase(catalog: Catalog, name: str) -> str:
    """A type as a message names it: an abstract one with the types that stand for it."""
    kinds = [t.name for t in catalog.types.values() if name in t.is_a]
    return f"{name} ({' or '.join(kinds)})" if catalog.types[name].abstract and kinds else name


def raise_for(catalog: Catalog, required: bool, item: ResolvedInput, allow_convert: bool = False) -> Conversion | None:
    """Raise ArtifactError for an unusable input; return the conversion to run when one is allowed and available."""
    wanted = type_phrase(catalog, item.required_type)
    if item.status == "absent" and required:
        raise ArtifactError(f"input '{item.name}' ({wanted}) is required", fix=f"pass {item.key}=PATH")
    if item.status == "missing" and item.problem is None:
        problem = missing(item.name, item.key, str(item.ref), wanted)
        raise ArtifactError(problem.message, fix=problem.fix)
    if item.status in ("missing", "malformed"):
        raise ArtifactError(str(item.problem), fix=item.fix)
    if item.status != "wrong_type":
        return None
    problem = wrong_type(item.name, str(item.ref), item.detected, wanted)
    conversion = conversion_for(catalog, item.detected, item.required_type)
    if conversion is None:
        raise ArtifactError(problem, fix=f"point {item.key} at a {wanted}")
    if not allow_convert:
        raise ArtifactError(
            problem,
            fix=f"convert it with the step {conversion.step_id} (in a pipeline, set convert: true), "
            f"or point {item.key} at a {item.required_type}",
        )
    if conversion.step_id not in catalog.steps:
        raise ArtifactError(
            f"{problem}; converting {conversion.source} to {conversion.target} needs the step "
            f"{conversion.step_id}, which is not available in this catalog",
            fix=f"convert it outside rlsteps and point {item.key} at the {item.required_type}",
        )
    return conversion


def produced_type(spec: ArtifactSpec, config: dict[str, Any]) -> str:
    """The type a step writes for an output: the value of its type_key in this config, else the manifest's type."""
    chosen = lookup(config, spec.type_key) if spec.type_key else None
    return str(chosen or spec.type)


def output_ref(config: dict[str, Any], spec: ArtifactSpec) -> str:
    """Where a step writes an output: the folder named after it in the run directory its key holds.

    For example <output.dir>/policy."""
    return f"{str(lookup(config, spec.key)).rstrip('/')}/{spec.name}"


def with_value(config: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of the config with one dotted key set."""
    head, _, rest = dotted.partition(".")
    return {**config, head: with_value(config.get(head) or {}, rest, value) if rest else value}


def lookup(config: dict[str, Any], dotted: str) -> Any:
    return get(config, dotted)
