"""`rlsteps run`: compile the job, check its inputs, and hand it to its launcher (or only show it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlsteps.artifacts.inputs import (
    Reach,
    ResolvedInput,
    check_inputs,
    inputs_in_job,
    lookup,
    refusal,
    required_here,
    resolve_inputs,
    type_phrase,
    with_value,
)
from rlsteps.artifacts.store import SCHEME, resolve_reference
from rlsteps.catalog import Catalog, Step
from rlsteps.contract.run_files import rerun_starts, run_directory
from rlsteps.contract.run_lock import holder  # standard library only
from rlsteps.errors import ArtifactError, Interrupted, RlstepsError, RunFailed, Terminated, UsageError
from rlsteps.examples import build_example_models
from rlsteps.launch.base import Launcher, LaunchPlan, Submission, get_launcher
from rlsteps.launch.job import Job, Mode
from rlsteps.plan.compile import compile_job
from rlsteps.plan.job_dir import create_job_dir, planned_job_dir, write_job_files
from rlsteps.plan.output_form import output_form_problem
from rlsteps.plan.profiles import resolve_profile
from rlsteps.plan.prompt_check import (
    checked_prompt_files,
    measure_of,
    refuse_bad_prompt_files,
    with_policy_tokenizer,
)
from rlsteps.plan.reward_functions import reward_function_problem
from rlsteps.plan.server_urls import with_shared_servers
from rlsteps.plan.worker_exit import worker_failure
from rlsteps.plan.worker_extras import missing_extra_problem


@dataclass(frozen=True)
class RunRequest:
    step: str
    config: str = "default"
    run_profile: str | None = None
    batch_profile: str | None = None
    dry_run: bool = False
    force_squash: bool = False
    overrides: tuple[str, ...] = ()
    passthrough: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    after: tuple[str, ...] = ()  # batch job ids this job waits for (a pipeline on Slurm)
    promised: tuple[tuple[str, str], ...] = ()  # (input name, type) an earlier pipeline stage will write


@dataclass(frozen=True)
class Compiled:
    """A request compiled once: what a dry run shows, and what execute() submits (it compiles nothing again)."""

    job: Job
    launcher: Launcher
    plan: LaunchPlan  # against the job directory the job would get (planned_job_dir); execute plans the real one
    job_dir: Path
    inputs: list[ResolvedInput]
    needs: list[str]  # what the run needs that the config does not give yet (key=VALUE lines)
    refused: list[ArtifactError] = field(default_factory=list)  # given inputs the run would refuse (exit 3)
    output_problem: RlstepsError | None = None  # what stops the run from writing into output.dir (exit 2, or 1)
    promised: tuple[tuple[str, str], ...] = ()  # (input name, type) an earlier pipeline stage will write

    def after(self, job_ids: tuple[str, ...], promised: tuple[tuple[str, str], ...]) -> Compiled:
        """This compile for a pipeline stage submitted once its upstream stages are: waiting for their batch jobs,
        and with their outputs promised (batch) or on disk by now (here: checked as they are)."""
        job = self.job.model_copy(update={"depends_on": list(job_ids)})
        return replace(self, job=job, promised=promised)


def compile_request(catalog: Catalog, request: RunRequest, say: Callable[[str], None] | None = None) -> Compiled:
    """Everything a dry run shows; touches nothing (no job dir, no network, no world build). A dry run also reads
    every prompt file the run would, and measures it with the policy's tokenizer (a real run does it once its inputs
    are final), so that `refused` holds every given input the run would stop on. say: the progress of a large
    prompt file, and what could not be measured here."""
    if request.run_profile and request.batch_profile:
        raise UsageError(
            "-r and -b are exclusive", fix="use -r PROFILE to run attached or -b PROFILE to submit a batch job"
        )
    step = catalog.find(request.step)
    _check_worker_arguments(list(request.passthrough))
    profile_name = request.run_profile or request.batch_profile
    profile = resolve_profile(profile_name) if profile_name else None
    mode: Mode = "batch" if request.batch_profile else "attached" if request.run_profile else "local"
    job = compile_job(
        step,
        request.config,
        mode=mode,
        profile=profile,
        overrides=list(request.overrides),
        passthrough=list(request.passthrough),
        force_squash=request.force_squash,
        argv=list(request.argv),
        depends_on=list(request.after),
        allow_unset=request.dry_run,
    )
    job = with_shared_servers(_with_store_references(step, job))  # rm.url=job:ID, judge.url=job:ID
    launcher = get_launcher(job.executor)
    check_processes(launcher, job)
    if _runs_here(launcher):  # its worker imports them here, with this Python and its path
        cannot_load = reward_function_problem(job.config) or missing_extra_problem(job.config)
        if cannot_load is not None:
            raise cannot_load
    config = job.config
    for key in job.unset_keys:  # an unset input is "not set" in the dry run's table, not a path named ???
        config = with_value(config, key, None)
    built_before_run = _built_before_run(launcher, job)
    reach = reach_of(launcher, job)
    step = input_step(catalog, step, job)
    inputs = check_inputs(catalog, step, config, dict(request.promised), built_before_run, reach)
    if launcher.sees_local_files:  # a policy without a tokenizer: the run and its dry run alike
        inputs = with_policy_tokenizer(inputs)
    if request.dry_run and launcher.sees_local_files:  # as execute, and measured as the run will measure them
        inputs = checked_prompt_files(inputs, measure_of(job.config, say), say)
    job = job.model_copy(update={"inputs_in_job": [i.as_dict() for i in inputs_in_job(catalog, inputs)]})
    job_dir = planned_job_dir(job)
    plan = launcher.plan(job, job_dir)
    needs = _needs(catalog, step, config, inputs, job.unset_keys)
    if job.algorithm != catalog.find(job.step_id).algorithm:  # said with the keys the user sets (NeMo-RL's)
        from rlsteps.nemo_rl.embedded import nemo_rl_key  # torch-free

        needs = [nemo_rl_key(key) + sep + rest for key, sep, rest in (line.partition("=") for line in needs)]
    refused = [error for item in inputs if (error := refusal(catalog, item, reach)) is not None]
    return Compiled(
        job=job,
        launcher=launcher,
        plan=plan,
        job_dir=job_dir,
        inputs=inputs,
        needs=needs,
        refused=refused,
        output_problem=(run_directory_in_use(job) if launcher.sees_local_files else None)
        or output_form_problem(catalog, step, config, inputs, _runs_here(launcher))
        or output_dir_problem(job, reach),
        promised=request.promised,
    )


def input_step(catalog: Catalog, step: Step, job: Job) -> Step:
    """The step whose manifest says where the job's config keeps its inputs: the step itself, or the one whose
    recipe it runs (rl/nemo_rl/rlhf on the embedded engine runs rl/rlhf's, with rl/rlhf's keys)."""
    if job.algorithm == step.algorithm:
        return step
    from rlsteps.nemo_rl.embedded import EMBEDDED_STEP  # torch-free

    return catalog.find(EMBEDDED_STEP)


def check_processes(launcher: Launcher, job: Job) -> None:
    """Refuse a config the profile's processes cannot split, with every problem at once, before anything is
    written or submitted (the dry run says it too)."""
    from rlsteps.contract.world_check import world_size_problems  # torch-free

    nodes, per_node = launcher.processes(job)
    problems = world_size_problems(job.config, nodes * per_node)
    if problems:
        where = f"profile {job.profile_name or job.executor}: {nodes} node(s) x {per_node} process(es)"
        raise UsageError(
            f"the step cannot run on {nodes * per_node} processes ({where}): " + "; ".join(problems),
            fix="change the config as each problem says (key=value on the command line, or the profile's config:), "
            "or run on a number of processes that fits it",
        )


def _runs_here(launcher: Launcher) -> bool:
    """Whether the job's worker runs on this machine in this environment (attached or detached), not in a container."""
    return launcher.name == "local"


def reach_of(launcher: Launcher, job: Job) -> Reach:
    return Reach(launcher.name, launcher.sees_local_files, launcher.cluster_paths(job))


def _needs(catalog: Catalog, step: Step, config: dict, inputs: list[ResolvedInput], unset: list[str]) -> list[str]:
    """Every required input not given and every other required key without a value, as the lines that set them."""
    needs, input_keys = [], set()
    for spec, item in zip(step.consumes, inputs):
        if item.status == "absent" and required_here(spec, config):
            alternative = f" (or {spec.required_unless}=VALUE)" if spec.required_unless else ""
            needs.append(f"{spec.key}=PATH   a {type_phrase(catalog, spec.type)}{alternative}")
            input_keys.add(spec.key)
    return needs + [f"{key}=VALUE" for key in unset if key not in input_keys]


def _built_before_run(launcher: Launcher, job: Job) -> str | None:
    """The tiny world's folder when this run builds it before it starts (here, or on Slurm's shared filesystem), else
    an example model's folder the run builds first (its inputs are pending until then, not missing)."""
    from rlsteps.examples import unbuilt_example_models  # torch-free
    from rlsteps.tiny.layout import tiny_world_dir

    if not launcher.sees_local_files:  # built here, where the job can see it
        return None
    world = job.config.get("tiny_world")
    if world is not None:
        return str(tiny_world_dir(int(world.get("seed", 0))))
    models = unbuilt_example_models(_input_refs(job))
    return str(models[0]) if models else None


def _input_refs(job: Job) -> list[str]:
    return [str(ref) for ref in (job.config.get("inputs") or {}).values() if ref is not None]


def _with_store_references(step: Step, job: Job) -> Job:
    """Each input given as artifact:NAME[:vN|:latest] replaced by the URL of that version in the store."""
    config = job.config
    for spec in step.consumes:
        ref = lookup(config, spec.key)
        if isinstance(ref, str) and ref.startswith(SCHEME):
            config = with_value(config, spec.key, resolve_reference(ref))
    return job if config is job.config else job.model_copy(update={"config": config})


def prepare(catalog: Catalog, compiled: Compiled, say: Callable[[str], None] = print) -> tuple[Path, LaunchPlan]:
    """Everything before the launcher starts the job: the refusals asked again, what the run builds first (the tiny
    world, an example model), the inputs confirmed, and the job directory written. (job directory, launch plan)."""
    job, launcher = compiled.job, compiled.launcher
    launcher.check(job)  # a refusal writes nothing
    in_use = run_directory_in_use(job) if launcher.sees_local_files else None
    if in_use is not None:  # before anything starts: one run per output.dir
        raise in_use
    reach = reach_of(launcher, job)
    output_problem = output_dir_problem(job, reach)
    if output_problem is not None:
        raise output_problem
    step = input_step(catalog, catalog.find(job.step_id), job)
    if _built_before_run(launcher, job) is not None:
        if job.config.get("tiny_world") is not None:
            _ensure_tiny_world(int(job.config["tiny_world"].get("seed", 0)), say)
        build_example_models(_input_refs(job), say)
    inputs = resolve_inputs(catalog, step, job.config, dict(compiled.promised), reach, checked=compiled.inputs)
    form_problem = output_form_problem(catalog, step, job.config, inputs, _runs_here(launcher))
    if form_problem is not None:
        raise form_problem
    if launcher.sees_local_files:  # the job reads this machine's files: check them before it starts
        refuse_bad_prompt_files(inputs)
    job_dir = create_job_dir(job)
    plan = launcher.plan(job, job_dir)
    write_job_files(job_dir, job, plan, inputs)
    say(f"job {job_dir.name}: {plan.summary}")
    for note in job.notes:
        say(f"  {note}")
    return job_dir, plan


def execute(catalog: Catalog, compiled: Compiled, say: Callable[[str], None] = print) -> Submission:
    """Submit a compiled request: the inputs prepared and confirmed, the job directory written. Only what may have
    changed since the compile is asked again: output.dir (a pipeline sets a stale run aside), and the inputs the
    compile could not see yet (the tiny world, built here first; an earlier stage's output)."""
    job, launcher = compiled.job, compiled.launcher
    job_dir, plan = prepare(catalog, compiled, say)
    submission = launcher.submit(job, plan, job_dir)
    record = launcher.record(job, submission)
    for directory in dict.fromkeys([job_dir, submission.job_dir]):  # the launcher may run it from a shared job dir
        record.save(directory)
    if submission.exit_code in (Interrupted.exit_code, Terminated.exit_code):  # Ctrl-C; SIGTERM or SIGHUP
        stopped = Interrupted if submission.exit_code == Interrupted.exit_code else Terminated
        how = "interrupted" if stopped is Interrupted else "terminated"
        raise stopped(f"{job.step_id} was {how}", fix=f"rerun the same command: {rerun_starts(_local_run_dir(job))}")
    if submission.exit_code not in (None, 0):
        where = submission.job_dir or job_dir
        raise worker_failure(job.step_id, submission.exit_code, where, _local_run_dir(job), job.public_argv())
    return submission


def output_dir_problem(job: Job, reach: Reach) -> RlstepsError | None:
    """What would stop the run from writing into its output.dir, asked on this machine when the job's machines see
    its files (not under the profile's cluster paths); None when nothing would, or where it cannot be asked."""
    from rlsteps.contract.disk import first_checkpoint_bytes  # torch-free
    from rlsteps.contract.output_dir import output_dir_problem as problem_of
    from rlsteps.contract.run_files import CHECKPOINTS_DIR, next_checkpoint_bytes

    run_dir = _local_run_dir(job)
    if run_dir is None or not reach.sees_local_files or any(_under(run_dir, p) for p in reach.cluster_paths):
        return None
    policy = lookup(job.config, "inputs.policy")
    hint = first_checkpoint_bytes(Path(str(policy))) if policy else None
    return (
        problem_of(run_dir, next_checkpoint_bytes(run_dir / CHECKPOINTS_DIR, hint))
        or _damaged_run(job, run_dir)
        or _another_run(job, run_dir)
    )


def _damaged_run(job: Job, run_dir: Path) -> RlstepsError | None:
    """A run directory whose checkpoints are all damaged: the worker would refuse to resume or start over (exit 1)."""
    from rlsteps.contract.checkpoint_damage import START_OVER_KEY, no_intact_checkpoint
    from rlsteps.contract.run_files import CHECKPOINTS_DIR

    if lookup(job.config, START_OVER_KEY):
        return None
    problem = no_intact_checkpoint(run_dir / CHECKPOINTS_DIR)
    if problem is None:
        return None
    fix = f"rerun with {START_OVER_KEY}=true to start over (the damaged ones kept), or put back an intact copy"
    return RunFailed(problem, fix=fix)


def _another_run(job: Job, run_dir: Path) -> RlstepsError | None:
    """A run directory holding checkpoints of a run with another config: the worker would refuse to resume it (exit
    2). The inputs the job resolves itself (a Hub id, a path not here) are left to the worker to compare."""
    from rlsteps.contract.config import STEP_SCHEMAS  # torch-free
    from rlsteps.contract.run_files import CHECKPOINTS_DIR, complete_checkpoints
    from rlsteps.contract.run_identity import another_run_problem

    schema = STEP_SCHEMAS.get(job.algorithm)
    if schema is None or job.unset_keys or not complete_checkpoints(run_dir / CHECKPOINTS_DIR):
        return None
    try:
        config = schema.model_validate(job.config).model_dump(mode="json")  # as the worker reads its config.yaml
    except ValueError:  # a config only its worker reads whole: the worker's own claim decides
        return None
    return another_run_problem(run_dir, config, has_checkpoints=True, ignored=lambda key: _resolved_in_job(job, key))


def _resolved_in_job(job: Job, key: str) -> bool:
    """Whether the worker's value of a config key may differ from the compiled one: an input that is not a path
    here (the worker puts a Hub id's snapshot in its place)."""
    value = lookup(job.config, key) if key.startswith("inputs.") else None
    return value is not None and not Path(str(value)).exists()


def _local_run_dir(job: Job) -> Path | None:
    """output.dir on this machine (a relative one under the directory rlsteps runs in); None while unset."""
    run_dir = run_directory(job.config, Path.cwd())
    return None if run_dir is None else Path(run_dir)


def _under(path: Path, folder: str) -> bool:
    return path == Path(folder) or Path(folder) in path.parents


def run_directory_in_use(job: Job) -> UsageError | None:
    """A run directory whose lock a live run holds, refused in seconds, naming that run and how to stop it (the
    worker's own claim of the lock is what counts; this is the early answer, the dry run's too)."""
    run_dir = _local_run_dir(job)
    found = holder(run_dir) if run_dir is not None else None
    if found is None:
        return None
    problem = f"output.dir {job.config['output']['dir']} is in use by {found.describe()}: one run per output.dir"
    return UsageError(problem, fix=found.fix())


def _ensure_tiny_world(seed: int, say: Callable[[str], None]) -> None:
    from rlsteps.tiny.layout import load_tiny_world  # torch-free: a built world costs no torch import here

    if load_tiny_world(seed) is not None:
        return
    try:
        from rlsteps.tiny.build import ensure_tiny_world  # imports torch (and megatron-core): only to build it
    except ImportError as missing:
        raise RunFailed(
            f"the tiny world cannot be built: {missing}",
            fix="pip install torch first (the build for this machine), then pip install 'rlsteps[engine,megatron]'",
        ) from None
    ensure_tiny_world(seed=seed, log=say)


def _check_worker_arguments(passthrough: list[str]) -> None:
    from rlsteps.contract.worker_args import build_parser, unknown_worker_arguments  # torch-free

    unknown = unknown_worker_arguments(passthrough)
    if unknown:
        parser = build_parser()
        options = " ".join(parser.format_usage().removeprefix(f"usage: {parser.prog}").replace(" config", "").split())
        raise UsageError(
            f"the worker does not accept {' '.join(unknown)!r}", fix=f"after -- the worker takes: {options}"
        )
