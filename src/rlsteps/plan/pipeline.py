"""Pipelines: stages run in order, each a step whose inputs may be bound to an earlier stage's output.

A pipeline file:

    name: tiny
    overrides: [run.num_threads=1]          # every stage, before its own
    convert: false                          # allow convert steps (types.toml convert_to) for mistyped inputs
    stages:
      - {name: rs, step: rl/rs, config: tiny, overrides: [train.max_steps=3], publish: tiny-rs}
      - {name: reinforce, step: rl/reinforce, config: tiny, inputs: {policy: "stage:rs"}}

An input bound to `stage:NAME` (or `stage:NAME.OUTPUT`) reads that stage's output artifact, and
`stage:NAME.inputs.INPUT` what that stage read as INPUT (an eval stage's baseline: the RL stage's input policy); any
other value is a reference (a path, an fsspec URL, artifact:NAME[:vN]). Every stage is compiled and its inputs
type-checked before the first one starts. A stage's run directory defaults to
.rlsteps/pipelines/<pipeline>/<stage>. A stage whose output exists and was written from the same config
and the same input versions is skipped; a failed stage stops the pipeline, and a rerun skips what finished
and resumes the failed stage from its last checkpoint.

A batch pipeline (-b) returns once its jobs are submitted; the chain it submitted is recorded in
.rlsteps/pipelines/<pipeline>/chain.json. A rerun (-b, -r or here) first asks each recorded job's state and is
refused while one has not ended: a second chain would write the same run directories.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, ValidationError

from rlsteps.artifacts.inputs import Conversion, lookup, output_ref, produced_type, raise_for, required_here
from rlsteps.catalog import ArtifactSpec, Catalog, Step
from rlsteps.contract.artifact import input_versions, read_artifact_metadata
from rlsteps.errors import RunFailed, UsageError
from rlsteps.launch.base import JobRecord, Submission, get_launcher
from rlsteps.plan.chain import RUNS_DIR, ChainJob, chain_file, previous_chain, write_chain
from rlsteps.plan.compile import overrides_for, worker_config_hash
from rlsteps.plan.runner import Compiled, RunRequest, compile_request, execute
from rlsteps.secrets import mask_argv

STAGE_PREFIX = "stage:"
INPUT_PREFIX = "inputs."  # stage:NAME.inputs.INPUT: the reference that stage read as INPUT


class StageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    step: str
    config: str = "default"
    overrides: list[str] = []
    inputs: dict[str, str] = {}  # input name -> stage:NAME[.OUTPUT] or a reference
    publish: str | None = None  # register the output in the artifact store under this name
    convert: bool | None = None  # None: the pipeline's setting


class PipelineSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    overrides: list[str] = []
    convert: bool = False
    stages: list[StageSpec]


@dataclass(frozen=True)
class StagePlan:
    name: str
    step: Step
    request: RunRequest
    compiled: Compiled
    outputs: dict[str, tuple[str, str]]  # output name -> (type, reference)
    upstream: tuple[str, ...]  # the stages whose outputs it reads
    publish: str | None = None


@dataclass
class StageOutcome:
    name: str
    action: str  # ran | skipped | submitted | would run | would skip
    detail: str = ""
    job_id: str | None = None


@dataclass
class PipelineRequest:
    path: Path
    run_profile: str | None = None
    batch_profile: str | None = None
    overrides: tuple[str, ...] = ()  # key=value for every stage, STAGE:key=value for one
    argv: tuple[str, ...] = ()


def shipped_pipelines() -> dict[str, Path]:
    """The example pipelines rlsteps ships (its examples/pipelines/ folder), by name."""
    from rlsteps.install import shipped_catalog

    catalog = shipped_catalog()
    folder = catalog / "examples" / "pipelines" if catalog is not None else None
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))} if folder is not None and folder.is_dir() else {}


def find_pipeline(path: Path) -> Path:
    """A pipeline file: the path itself when it is a file, else the shipped example of that name (`tiny`)."""
    if path.is_file():
        return path
    shipped = shipped_pipelines()
    if path.suffix not in (".yaml", ".yml") and len(path.parts) == 1 and str(path) in shipped:
        return shipped[str(path)]
    names = ", ".join(shipped) or "none"
    raise UsageError(
        f"pipeline file {path} not found (in {Path.cwd()})",
        fix=f"give a pipeline YAML file's path, or a shipped example's name: {names}"
        + (f" (from {next(iter(shipped.values())).parent})" if shipped else ""),
    )


def load_pipeline(path: Path) -> PipelineSpec:
    path = find_pipeline(path)
    try:
        spec = PipelineSpec.model_validate(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    except ValidationError as err:
        causes = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise UsageError(
            f"{path}: invalid pipeline: {causes}", fix="see the shipped example: rlsteps pipeline show tiny"
        ) from None
    except Exception as err:  # omegaconf raises several YAML error types
        raise UsageError(f"{path}: cannot read the pipeline: {err}") from err
    names = [s.name for s in spec.stages]
    if not names or len(set(names)) != len(names):
        raise UsageError(f"{path}: stage names must be present and unique (got {', '.join(names) or 'none'})")
    # a stage's config may be a YAML file next to the pipeline file
    stages = [
        s.model_copy(update={"config": str(path.parent / s.config)})
        if s.config.endswith((".yaml", ".yml")) and not Path(s.config).is_absolute()
        else s
        for s in spec.stages
    ]
    return spec.model_copy(update={"stages": stages})


def plan_pipeline(catalog: Catalog, spec: PipelineSpec, request: PipelineRequest) -> list[StagePlan]:
    """Compile every stage and type-check every input (bound ones against the upstream manifest); launch nothing."""
    shared, per_stage = _split_overrides(request.overrides, {s.name for s in spec.stages})
    if any(s.publish for s in spec.stages):
        from rlsteps.artifacts.store import store_root

        store_root()  # a stage that publishes needs a store: say so before anything runs
    wide = _pipeline_wide(catalog, spec, [*spec.overrides, *shared])
    plans: dict[str, StagePlan] = {}
    for stage in spec.stages:
        step = catalog.find(stage.step)
        defaults = [f"{o.key}={RUNS_DIR / spec.name / stage.name}" for o in step.produces]
        bindings, promised, upstream = _bind_inputs(step, stage, plans)
        overrides = [*defaults, *wide[stage.name], *stage.overrides, *per_stage.get(stage.name, []), *bindings]
        run_request = RunRequest(
            step=step.id,
            config=stage.config,
            run_profile=request.run_profile,
            batch_profile=request.batch_profile,
            overrides=tuple(overrides),
            argv=request.argv,
            promised=tuple(promised.items()),
        )
        compiled = compile_request(catalog, run_request)
        allow = spec.convert if stage.convert is None else stage.convert
        for input_spec, item in zip(step.consumes, compiled.inputs):
            conversion = raise_for(catalog, required_here(input_spec, compiled.job.config), item, allow_convert=allow)
            if conversion is not None:  # plan again with the convert stage in place
                return plan_pipeline(
                    catalog, _with_conversion(catalog, spec, stage, input_spec, conversion, item.ref), request
                )
        outputs = {
            o.name: (produced_type(o, compiled.job.config), output_ref(compiled.job.config, o)) for o in step.produces
        }
        plans[stage.name] = StagePlan(stage.name, step, run_request, compiled, outputs, upstream, stage.publish)
    return list(plans.values())


def _with_conversion(
    catalog: Catalog, spec: PipelineSpec, stage: StageSpec, input_spec: ArtifactSpec, conversion: Conversion, ref: str
) -> PipelineSpec:
    """The pipeline with a convert stage inserted before STAGE, and STAGE's input bound to the converter's output."""
    converter = catalog.steps[conversion.step_id]
    source = next((c for c in converter.consumes if catalog.is_a(conversion.source, c.type)), None)
    if source is None or len(converter.produces) != 1:
        raise UsageError(
            f"{converter.id} must consume a {conversion.source} and produce one artifact",
            fix=f"fix {converter.manifest_path}",
        )
    name = f"{stage.name}-convert-{input_spec.name}"
    convert = StageSpec(name=name, step=converter.id, inputs={source.name: stage.inputs.get(input_spec.name, ref)})
    rebound = stage.model_copy(update={"inputs": {**stage.inputs, input_spec.name: STAGE_PREFIX + name}})
    at = spec.stages.index(stage)
    return spec.model_copy(update={"stages": [*spec.stages[:at], convert, rebound, *spec.stages[at + 1 :]]})


def _bind_inputs(
    step: Step, stage: StageSpec, plans: dict[str, StagePlan]
) -> tuple[list[str], dict[str, str], tuple[str, ...]]:
    """Overrides that point each bound input at its reference, the types promised by upstream stages, and those
    stages."""
    by_name = {c.name: c for c in step.consumes}
    overrides, promised, upstream = [], {}, []
    for input_name, value in stage.inputs.items():
        if input_name not in by_name:
            raise UsageError(
                f"stage '{stage.name}': {step.id} has no input '{input_name}'",
                fix=f"its inputs are {', '.join(by_name)}",
            )
        ref = value
        if value.startswith(STAGE_PREFIX):
            source, _, output = value.removeprefix(STAGE_PREFIX).partition(".")
            if source not in plans:
                raise UsageError(
                    f"stage '{stage.name}': input '{input_name}' reads stage '{source}', which does not run before it",
                    fix=f"bind it to one of the earlier stages: {', '.join(plans) or 'none'}",
                )
            if output.startswith(INPUT_PREFIX):  # what that stage read: e.g. an RL stage's input policy, to compare
                ref, promised_type = _stage_input(plans[source], output.removeprefix(INPUT_PREFIX))
                if promised_type:
                    promised[input_name] = promised_type
                upstream.append(source)
                overrides.append(f"{by_name[input_name].key}={ref}")
                continue
            outputs = plans[source].outputs
            if not output and len(outputs) != 1:
                raise UsageError(
                    f"stage '{source}' has several outputs",
                    fix=f"write stage:{source}.OUTPUT with OUTPUT in {', '.join(outputs)}",
                )
            promised_type, ref = outputs[output] if output in outputs else next(iter(outputs.values()))
            promised[input_name] = promised_type
            upstream.append(source)
        overrides.append(f"{by_name[input_name].key}={ref}")
    return overrides, promised, tuple(dict.fromkeys(upstream))


def _stage_input(plan: StagePlan, name: str) -> tuple[str, str | None]:
    """(reference, type promised by a stage before it, if any) of the input NAME of an earlier stage."""
    spec = next((c for c in plan.step.consumes if c.name == name), None)
    ref = lookup(plan.compiled.job.config, spec.key) if spec is not None else None
    if ref is None:
        given = ", ".join(c.name for c in plan.step.consumes if lookup(plan.compiled.job.config, c.key))
        raise UsageError(
            f"stage '{plan.name}' has no input '{name}' to bind",
            fix=f"write stage:{plan.name}.inputs.NAME with NAME in {given}",
        )
    return str(ref), dict(plan.request.promised).get(name)


def _pipeline_wide(catalog: Catalog, spec: PipelineSpec, overrides: list[str]) -> dict[str, list[str]]:
    """stage -> the pipeline-wide overrides whose key its config has; one that no stage has is an unknown key."""
    per_stage = {s.name: overrides_for(catalog.find(s.step), s.config, overrides) for s in spec.stages}
    unused = [item for item in overrides if not any(item in kept for kept in per_stage.values())]
    if unused:
        first = spec.stages[0]
        overrides_for(catalog.find(first.step), first.config, unused, strict=True)  # raises, naming the closest key
    return per_stage


def _split_overrides(overrides: tuple[str, ...], stages: set[str]) -> tuple[list[str], dict[str, list[str]]]:
    shared: list[str] = []
    per_stage: dict[str, list[str]] = {}
    for item in overrides:
        head, sep, rest = item.partition(":")
        if sep and "=" not in head:
            if head not in stages:
                raise UsageError(
                    f"override '{item}' names no stage '{head}'", fix=f"the stages are {', '.join(sorted(stages))}"
                )
            per_stage.setdefault(head, []).append(rest)
        else:
            shared.append(item)
    return shared, per_stage


def freshness(plan: StagePlan) -> tuple[bool, str]:
    """(up to date, why): the output exists and was written from this config and these input versions."""
    job = plan.compiled.job
    for _, ref in plan.outputs.values():
        meta = read_artifact_metadata(Path(ref))
        if meta is None:
            return False, f"no output at {ref}"
        if meta.get("config_hash") != worker_config_hash(plan.step, job.config):
            return False, "the config changed"
        try:
            current = input_versions(job.config.get("inputs") or {})
        except FileNotFoundError:
            return False, "an input is not written yet"
        if meta.get("input_versions") != current:
            changed = sorted(
                k
                for k in {*current, *(meta.get("input_versions") or {})}
                if current.get(k) != (meta.get("input_versions") or {}).get(k)
            )
            return False, f"input changed: {', '.join(changed)}"
    return True, "output exists, same config and inputs"


def run_pipeline(catalog: Catalog, request: PipelineRequest, say: Callable[[str], None] = print) -> list[StageOutcome]:
    spec = load_pipeline(request.path)
    notes, live = previous_chain(spec.name)
    for line in notes:
        say(line)
    if live is not None:
        raise live
    plans = plan_pipeline(catalog, spec, request)
    batch = request.batch_profile is not None
    if batch and not getattr(get_launcher(plans[0].compiled.job.executor), "supports_dependencies", False):
        raise UsageError(
            f"a batch pipeline needs a launcher that chains jobs (slurm); '{plans[0].compiled.job.executor}' cannot",
            fix="run the pipeline attached (-r PROFILE) or here (no -r/-b), or use a Slurm profile",
        )
    chain_file(spec.name).unlink(missing_ok=True)  # every job it recorded has ended; this run's chain replaces it
    chain: list[ChainJob] = []
    submitted: dict[str, str] = {}  # stage -> batch job id
    outcomes = []
    for plan in plans:
        fresh, why = freshness(plan)
        fresh = fresh and not any(u in submitted for u in plan.upstream)
        if fresh:
            say(f"stage {plan.name}: skipped ({why})")
            outcomes.append(StageOutcome(plan.name, "skipped", why))
            continue
        _set_aside_stale_run(plan, why, say)
        say(f"stage {plan.name}: running {plan.step.id} ({why})")
        after = tuple(submitted[u] for u in plan.upstream if u in submitted)
        try:
            # run here, an upstream output exists by now and is checked as it is; in batch it is still a promise
            promised = plan.request.promised if batch else ()
            submission = execute(catalog, plan.compiled.after(after, promised), say=say)
        except RunFailed as failed:
            resume = "rerun the same command: finished stages are skipped and this one resumes from its last checkpoint"
            fix = f"{failed.fix}; {resume}" if failed.fix else f"fix the cause and {resume}"  # the stage's next action
            if submitted:  # the earlier stages' jobs go on, and a rerun is refused until they end
                fix = (
                    f"the jobs submitted for the earlier stages ({', '.join(submitted.values())}) go on: cancel them "
                    f"(`rlsteps jobs cancel ID`) or let them end, then {fix}"
                )
            raise type(failed)(  # the stage's own exit code (3 for an input its job refused)
                f"pipeline {spec.name} stopped at stage '{plan.name}': {failed.message}", fix=fix
            ) from failed
        if submission.exit_code is None:
            submitted[plan.name] = submission.job_id
            chain.append(_chain_job(plan, submission))
            write_chain(spec.name, chain)  # after each submission: a chain cut short is recorded as far as it got
            outcomes.append(
                StageOutcome(plan.name, "submitted", f"after {', '.join(after)}" if after else "", submission.job_id)
            )
            if plan.publish:
                say(
                    f"stage {plan.name}: when job {submission.job_id} ends, publish with "
                    f"`rlsteps artifacts publish {next(iter(plan.outputs.values()))[1]} {plan.publish}`"
                )
            continue
        outcomes.append(StageOutcome(plan.name, "ran", _publish(catalog, plan, say)))
    return outcomes


def _chain_job(plan: StagePlan, submission: Submission) -> ChainJob:
    try:
        record = JobRecord.load(submission.job_dir)
        launcher, submitted = record.launcher, record.submitted
    except (OSError, ValueError, TypeError):
        launcher, submitted = plan.compiled.job.executor, time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return ChainJob(plan.name, launcher, submission.job_id, str(submission.job_dir), submitted)


def _publish(catalog: Catalog, plan: StagePlan, say: Callable[[str], None]) -> str:
    if not plan.publish:
        return ""
    from rlsteps.artifacts.store import ArtifactStore, store_root

    version = ArtifactStore(store_root()).publish(catalog, next(iter(plan.outputs.values()))[1], plan.publish)
    say(f"stage {plan.name}: published {version.label} ({version.folder})")
    return f"published {version.label}"


def _set_aside_stale_run(plan: StagePlan, why: str, say: Callable[[str], None]) -> None:
    """The stage is about to run. A finished run in its directory (an output with metadata) came from another
    config, other inputs, or an upstream stage that runs again: resuming it would hand back its old weights, so
    move it aside. A failed run has no output yet and is resumed."""
    config = plan.compiled.job.config
    for spec in plan.step.produces:
        if read_artifact_metadata(Path(output_ref(config, spec))) is None:
            continue
        run_dir = Path(str(lookup(config, spec.key)))
        kept = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir.rename(kept)
        say(f"stage {plan.name}: {why}; the previous run is kept at {kept}")


def describe(plans: list[StagePlan]) -> list[dict[str, Any]]:
    """What a dry run shows per stage: would it run and why, step, config, inputs, outputs, launch."""
    rows, running = [], set()
    for p in plans:
        fresh, why = freshness(p)
        if fresh and running.intersection(p.upstream):
            fresh, why = False, "an upstream stage runs first"
        if not fresh:
            running.add(p.name)
        rows.append(
            {
                "stage": p.name,
                "action": "skip" if fresh else "run",
                "why": why,
                "step": p.step.id,
                "config": p.compiled.job.config_name,
                "after": list(p.upstream),
                "inputs": {i.name: f"{i.ref} ({i.status})" for i in p.compiled.inputs if i.ref},
                "outputs": {name: f"{ref} ({kind})" for name, (kind, ref) in p.outputs.items()},
                "publish": p.publish,
                "launch": p.compiled.plan.summary,
                "overrides": mask_argv(list(p.request.overrides)),
            }
        )
    return rows
