"""Pipelines without training: planning, bindings, type checks before anything starts, conversion, Slurm chains.

The test on a real Slurm cluster needs one on this machine (CI: `bash .ci/slurm.sh up`) and is skipped without it.
"""

import json
import os
import shutil
import stat
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_helpers import REPO, Result, invoke
from rlsteps.artifacts.inputs import Conversion
from rlsteps.catalog import load_catalog
from rlsteps.cli.app import app
from rlsteps.errors import RlstepsError
from rlsteps.launch.base import JobRecord
from rlsteps.plan import submitted_jobs as jobs
from rlsteps.plan.pipeline import PipelineSpec, StageSpec, _with_conversion
from test_launch_slurm import needs_cluster

TINY = REPO / "examples" / "pipelines" / "tiny.yaml"


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def project(tmp_path, monkeypatch, tiny_world):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_example_dry_run_binds_each_policy_to_the_previous_stage_and_starts_nothing(project):
    shown = invoke("pipeline", "run", str(TINY), "--dry-run", "rlhf:train.lr=1e-5")
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    assert out.count(": run (no output at") == 3
    assert "in  policy: .rlsteps/pipelines/tiny/rs/policy (pending)" in out
    assert "in  policy: .rlsteps/pipelines/tiny/reinforce/policy (pending)" in out
    assert "train.lr=1e-5" in out.split("stage rlhf")[1] and "train.lr=1e-5" not in out.split("stage rlhf")[0]
    assert not (project / ".rlsteps").exists()


def test_a_bound_input_of_the_wrong_type_fails_with_exit_3_before_any_stage_runs(project):
    pipeline = write(
        project / "p.yaml",
        """
        name: bad
        stages:
          - {name: rs, step: rl/rs, config: tiny}
          - {name: reinforce, step: rl/reinforce, config: tiny, inputs: {reward_model: "stage:rs"}}
    """,
    )
    done = invoke("pipeline", "run", str(pipeline))
    assert done.exit_code == 3
    assert "is checkpoint_megatron, but a reward_model_hf is required" in done.stderr
    assert not (project / ".rlsteps").exists()  # the first stage never started


def test_a_path_input_of_the_wrong_type_fails_with_exit_3(project, tiny_world):
    pipeline = write(
        project / "p.yaml",
        f"""
        name: bad
        stages:
          - {{name: rs, step: rl/rs, config: tiny, inputs: {{policy: "{tiny_world.train_prompts}"}}}}
    """,
    )
    done = invoke("pipeline", "run", str(pipeline), "--dry-run")
    assert (
        done.exit_code == 3
        and "is prompt_jsonl, but a checkpoint (checkpoint_hf or checkpoint_megatron) is required" in done.stderr
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("{name: a, step: rl/rs, config: tiny, inputs: {policy: 'stage:b'}}", "which does not run before it"),
        ("{name: a, step: rl/rs, config: tiny, inputs: {polcy: x}}", "rl/rs has no input 'polcy'"),
        ("{name: a, step: rl/rs, config: tiny, colour: red}", "invalid pipeline: stages.0.colour"),
    ],
)
def test_pipeline_mistakes_are_usage_errors(project, text, message):
    pipeline = write(project / "p.yaml", f"name: x\nstages:\n  - {text}\n")
    done = invoke("pipeline", "run", str(pipeline), "--dry-run")
    assert done.exit_code == 2 and message in done.stderr


def test_an_override_for_an_unknown_stage_names_the_stages(project):
    done = invoke("pipeline", "run", str(TINY), "--dry-run", "rss:train.lr=1")
    assert done.exit_code == 2 and "the stages are reinforce, rlhf, rs" in done.stderr


@pytest.fixture
def megatron_catalog(tmp_path, monkeypatch):
    """The real catalog, except that rl/rs requires a checkpoint_megatron policy, its tiny config gives it the
    Hugging Face one, and there are no convert steps."""
    root = tmp_path / "catalog"
    shutil.copytree(REPO / "manifests", root / "manifests")
    shutil.copytree(REPO / "steps", root / "steps")
    rs = root / "manifests" / "rl" / "rs.toml"
    rs.write_text(
        rs.read_text()
        .replace('key = "inputs.policy"', 'key = "inputs.policy"', 1)
        .replace(
            'name = "policy"\ntype = "checkpoint"\nkey = "inputs.policy"',
            'name = "policy"\ntype = "checkpoint_megatron"\nkey = "inputs.policy"',
        )
    )
    tiny = root / "steps" / "rl" / "rs" / "tiny.yaml"
    tiny.write_text(tiny.read_text().replace("${tiny:policy_megatron}", "${tiny:policy}"))
    shutil.rmtree(root / "manifests" / "convert")
    monkeypatch.setenv("RLSTEPS_ROOT", str(root))
    assert load_catalog().find("rl/rs").consumes[2].type == "checkpoint_megatron"
    return root


def test_an_hf_policy_where_megatron_is_required_fails_and_names_the_converter(project, megatron_catalog):
    pipeline = write(project / "p.yaml", "name: m\nstages:\n  - {name: rs, step: rl/rs, config: tiny}\n")
    done = invoke("pipeline", "run", str(pipeline), "--dry-run")
    assert done.exit_code == 3
    assert "is checkpoint_hf or judge_model_hf, but a checkpoint_megatron is required" in done.stderr
    assert "convert/hf_to_megatron" in done.stderr and "convert: true" in done.stderr
    single = invoke("run", "rs", "-c", "tiny")  # a single run never converts
    assert single.exit_code == 3 and "convert/hf_to_megatron" in single.stderr


def test_conversion_allowed_but_no_converter_in_the_catalog_fails_with_exit_3(project, megatron_catalog):
    pipeline = write(project / "p.yaml", "name: m\nconvert: true\nstages:\n  - {name: rs, step: rl/rs, config: tiny}\n")
    done = invoke("pipeline", "run", str(pipeline), "--dry-run")
    assert done.exit_code == 3
    assert "needs the step convert/hf_to_megatron, which is not available in this catalog" in done.stderr


def test_an_allowed_conversion_becomes_a_stage_before_the_one_that_needs_it(megatron_catalog, tmp_path):
    convert = tmp_path / "catalog" / "manifests" / "convert" / "hf_to_megatron.toml"
    convert.parent.mkdir()
    convert.write_text(
        textwrap.dedent("""
        [step]
        id = "convert/hf_to_megatron"
        name = "HF to Megatron"
        category = "convert"
        description = "Convert."
        algorithm = "convert"
        [[consumes]]
        name = "checkpoint"
        type = "checkpoint_hf"
        key = "inputs.checkpoint"
        [[produces]]
        name = "checkpoint"
        type = "checkpoint_megatron"
        key = "output.dir"
    """)
    )
    catalog = load_catalog()
    stage = StageSpec(name="rs", step="rl/rs", config="tiny")
    spec = PipelineSpec(name="m", convert=True, stages=[stage])
    converted = _with_conversion(
        catalog,
        spec,
        stage,
        catalog.find("rl/rs").consumes[2],
        Conversion("convert/hf_to_megatron", "checkpoint_hf", "checkpoint_megatron"),
        "/sft",
    )
    assert [s.name for s in converted.stages] == ["rs-convert-policy", "rs"]
    assert converted.stages[0].step == "convert/hf_to_megatron" and converted.stages[0].inputs == {"checkpoint": "/sft"}
    assert converted.stages[1].inputs == {"policy": "stage:rs-convert-policy"}


def test_a_batch_pipeline_needs_a_launcher_that_chains_jobs(project):
    (project / "rlsteps.yaml").write_text("profiles:\n  here: {executor: local}\n")
    done = invoke("pipeline", "run", str(TINY), "-b", "here")
    assert done.exit_code == 2 and "needs a launcher that chains jobs" in done.stderr
    assert not (project / ".rlsteps" / "jobs").exists()


def fake_sbatch(folder: Path) -> Path:
    """An sbatch that records each script it is given and answers increasing job ids, as --parsable does."""
    folder.mkdir()
    script = folder / "sbatch"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        n=$(($(cat {folder}/count 2>/dev/null || echo 100) + 1)); echo $n > {folder}/count
        cp "$2" {folder}/script-$n.sh
        echo "$n"
    """)
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def test_a_slurm_batch_pipeline_submits_dependent_jobs_and_returns_at_once(project, monkeypatch):
    bin_dir = fake_sbatch(project / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (project / "rlsteps.yaml").write_text("profiles:\n  cluster: {executor: slurm, partition: cpu}\n")
    done = invoke("pipeline", "run", str(TINY), "-b", "cluster")
    assert done.exit_code == 0, done.output
    assert "rs: submitted (job 101)" in done.stdout and "rlhf: submitted (job 103) (after 102)" in done.stdout
    scripts = {n: (bin_dir / f"script-{n}.sh").read_text() for n in (101, 102, 103)}
    assert "--dependency" not in scripts[101]
    assert "#SBATCH --dependency=afterok:101" in scripts[102] and "#SBATCH --dependency=afterok:102" in scripts[103]
    assert "inputs.policy" not in scripts[102]  # the binding is in the stage's config, not the script
    job_dirs = {d.name.rsplit("-", 1)[-1]: d for d in (project / ".rlsteps" / "jobs").iterdir()}
    assert sorted(job_dirs) == ["rl_reinforce", "rl_rlhf", "rl_rs"]
    assert "policy: .rlsteps/pipelines/tiny/rs/policy" in (job_dirs["rl_reinforce"] / "config.yaml").read_text()


def test_a_stage_is_fresh_only_with_the_same_config_hash_and_input_versions(project):
    from rlsteps.contract.artifact import input_versions
    from rlsteps.plan.compile import worker_config_hash
    from rlsteps.plan.pipeline import PipelineRequest, _set_aside_stale_run, freshness, load_pipeline, plan_pipeline

    def plans(*overrides):
        request = PipelineRequest(path=TINY, overrides=overrides)
        return plan_pipeline(load_catalog(), load_pipeline(TINY), request)

    rs = plans()[0]
    output = project / ".rlsteps" / "pipelines" / "tiny" / "rs" / "policy"
    output.mkdir(parents=True)
    metadata = {
        "config_hash": worker_config_hash(rs.step, rs.compiled.job.config),
        "input_versions": input_versions(rs.compiled.job.config["inputs"]),
    }
    (output / "rlsteps_artifact.json").write_text(json.dumps(metadata))
    assert freshness(rs) == (True, "output exists, same config and inputs")
    assert freshness(plans("rs:train.lr=1e-5")[0]) == (False, "the config changed")
    prompts = project / "other.jsonl"
    prompts.write_text('{"prompt": "Describe the cat."}\n')
    moved = plans(f"rs:inputs.prompts={prompts}")[0]
    assert freshness(moved) == (False, "the config changed")  # the path is part of the config
    (output / "rlsteps_artifact.json").write_text(json.dumps({**metadata, "input_versions": {"policy": "x"}}))
    fresh, why = freshness(rs)
    assert not fresh and why.startswith("input changed: ") and "policy" in why
    _set_aside_stale_run(rs, why, say=lambda line: None)
    assert not output.parent.exists()
    assert len(list(output.parent.parent.glob("rs.replaced-*"))) == 1


def test_a_finished_run_is_set_aside_whatever_the_reason_but_a_failed_run_is_resumed(project):
    """In a batch pipeline an upstream stage that reruns leaves its downstream stage's input unwritten: the
    downstream's finished run must still be set aside, or its worker would resume it and hand back old weights."""
    from rlsteps.plan.pipeline import PipelineRequest, _set_aside_stale_run, load_pipeline, plan_pipeline

    reinforce = plan_pipeline(load_catalog(), load_pipeline(TINY), PipelineRequest(path=TINY))[1]
    run = project / ".rlsteps" / "pipelines" / "tiny" / reinforce.name
    (run / "checkpoints" / "step_2").mkdir(parents=True)  # a failed run: checkpoints, no output
    _set_aside_stale_run(reinforce, "an input is not written yet", say=lambda line: None)
    assert run.is_dir()
    (run / "policy").mkdir()
    (run / "policy" / "rlsteps_artifact.json").write_text("{}")  # a finished run
    _set_aside_stale_run(reinforce, "an input is not written yet", say=lambda line: None)
    assert not run.exists() and len(list(run.parent.glob(f"{reinforce.name}.replaced-*"))) == 1


def test_pipeline_wide_overrides_reach_the_stages_that_have_the_key_and_a_key_none_has_is_an_error(project):
    pipeline = write(
        project / "p.yaml",
        """
        name: mixed
        overrides: [train.max_steps=3, run.num_threads=1]
        stages:
          - {name: rs, step: rl/rs, config: tiny}
          - {name: to-hf, step: convert/megatron_to_hf, config: tiny, inputs: {checkpoint: "stage:rs"}}
    """,
    )
    shown = invoke("pipeline", "run", str(pipeline), "--dry-run", "--json")
    assert shown.exit_code == 0, shown.output
    stages = {s["stage"]: s for s in json.loads(shown.stdout)}
    assert "train.max_steps=3" in stages["rs"]["overrides"] and "run.num_threads=1" in stages["rs"]["overrides"]
    assert "run.num_threads=1" in stages["to-hf"]["overrides"]
    assert not any(o.startswith("train.") for o in stages["to-hf"]["overrides"])  # a convert step has no train section
    typo = invoke("pipeline", "run", str(pipeline), "--dry-run", "train.max_stepz=3")
    assert (
        typo.exit_code == 2
        and "unknown config key 'train.max_stepz'" in typo.stderr
        and "train.max_steps" in typo.stderr
    )


def invoke_with_stderr(*argv: str) -> Result:
    """invoke, keeping what the command printed to stderr (warnings, progress) before it returned or failed."""
    result = CliRunner().invoke(
        app,
        list(argv),
        obj={"passthrough": [], "argv": ["rlsteps", *argv]},
        standalone_mode=False,
        env={"COLUMNS": "200"},
    )
    if isinstance(result.exception, RlstepsError):
        return Result(result.exception.exit_code, result.stdout, result.stderr + str(result.exception))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Result(result.exit_code or 0, result.stdout, result.stderr)


def fake_slurm(folder: Path) -> Path:
    """fake_sbatch, with an scontrol that answers the state written in FOLDER/state-ID (none: it knows no such job)
    and an sacct without accounting."""
    fake_sbatch(folder)
    (folder / "scontrol").write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        # scontrol show job --oneliner ID
        [ -s {folder}/state-$4 ] || {{ echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }}
        echo "JobId=$4 JobState=$(cat {folder}/state-$4) Reason=None ExitCode=0:0"
    """)
    )
    (folder / "sacct").write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n")
    for tool in ("scontrol", "sacct"):
        (folder / tool).chmod(0o755)
    return folder


def set_states(folder: Path, **states: str) -> None:
    """set_states(folder, j101="RUNNING"): what the fake scontrol answers for job 101."""
    for job_id, state in states.items():
        (folder / f"state-{job_id.removeprefix('j')}").write_text(state)


def test_a_batch_chain_is_recorded_and_a_rerun_is_refused_until_every_job_of_it_ended(project, monkeypatch):
    bin_dir = fake_slurm(project / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (project / "rlsteps.yaml").write_text("profiles:\n  cluster: {executor: slurm, partition: cpu}\n")
    done = invoke("pipeline", "run", str(TINY), "-b", "cluster")
    assert done.exit_code == 0, done.output
    chain_file = project / ".rlsteps" / "pipelines" / "tiny" / "chain.json"
    chain = json.loads(chain_file.read_text())
    assert chain["pipeline"] == "tiny"
    assert [(j["stage"], j["launcher"], j["job_id"]) for j in chain["jobs"]] == [
        ("rs", "slurm", "101"),
        ("reinforce", "slurm", "102"),
        ("rlhf", "slurm", "103"),
    ]
    for job in chain["jobs"]:  # each names the job directory whose record `rlsteps jobs` reads
        record = JobRecord.load(Path(job["job_dir"]))
        assert (record.job_id, record.submitted) == (job["job_id"], job["submitted"]) and job["submitted"]
    assert sorted(p.name for p in chain_file.parent.iterdir()) == ["chain.json"]  # no temporary file left

    set_states(bin_dir, j101="RUNNING", j102="PENDING", j103="PENDING")
    shown = invoke_with_stderr("pipeline", "run", str(TINY), "--dry-run")
    assert shown.exit_code == 0 and shown.stdout.count(": run (no output at") == 3
    assert "warning: pipeline tiny: the chain submitted before has not ended: stage rs job 101 (running), " in (
        shown.stderr
    )
    assert "stage rlhf job 103 (pending)" in shown.stderr and "running it now is refused" in shown.stderr
    for mode in (["-b", "cluster"], []):  # batch or here: both would write the run directories the chain writes
        refused = invoke("pipeline", "run", str(TINY), *mode)
        assert refused.exit_code == 2
        assert (
            "the chain submitted before has not ended: stage rs job 101 (running), stage reinforce job 102 "
            "(pending), stage rlhf job 103 (pending)" in refused.stderr
        )
        assert "`rlsteps jobs logs -f 101`" in refused.stderr
        assert "`rlsteps jobs cancel 101; rlsteps jobs cancel 102; rlsteps jobs cancel 103`" in refused.stderr
    assert (bin_dir / "count").read_text().strip() == "103"  # nothing submitted
    assert len(list((project / ".rlsteps" / "jobs").iterdir())) == 3  # nor written
    assert json.loads(chain_file.read_text()) == chain

    set_states(bin_dir, j101="COMPLETED", j102="CANCELLED")
    (bin_dir / "state-103").unlink()  # Slurm forgot it: its state is unknown, and it counts as ended
    again = invoke_with_stderr("pipeline", "run", str(TINY), "-b", "cluster")
    assert again.exit_code == 0, again.output
    assert "stage rlhf: the state of slurm job 103, submitted " in again.stderr
    assert "is unknown (Slurm no longer knows job 103" in again.stderr and "it is counted as ended" in again.stderr
    assert "rs: submitted (job 104)" in again.stdout
    assert [j["job_id"] for j in json.loads(chain_file.read_text())["jobs"]] == ["104", "105", "106"]


@pytest.fixture
def slurm_project(project):
    """A project with a Slurm profile whose jobs sleep before they start their worker, so a chain stays live while
    the test looks at it; every job still live at the end is cancelled."""
    (project / "rlsteps.yaml").write_text(
        "profiles:\n"
        "  sleepy: {executor: slurm, cpus_per_task: 1, mem: 500M, time: '00:05:00', setup_lines: ['sleep 300']}\n"
    )
    yield project
    for record in jobs.find_records([project / ".rlsteps" / "jobs"]):
        jobs.cancel_job(record)


@needs_cluster
def test_on_slurm_a_rerun_is_refused_while_the_chain_is_live_and_accepted_once_it_is_cancelled(slurm_project):
    first = invoke("pipeline", "run", str(TINY), "-b", "sleepy")
    assert first.exit_code == 0, first.output
    chain = slurm_project / ".rlsteps" / "pipelines" / "tiny" / "chain.json"
    ids = [j["job_id"] for j in json.loads(chain.read_text())["jobs"]]
    assert len(ids) == 3 and all(f"(job {i})" in first.stdout for i in ids)

    refused = invoke("pipeline", "run", str(TINY), "-b", "sleepy")
    assert refused.exit_code == 2
    assert "the chain submitted before has not ended: stage rs job " in refused.stderr
    assert all(f" job {i} (pending)" in refused.stderr or f" job {i} (running)" in refused.stderr for i in ids)
    assert f"rlsteps jobs cancel {ids[0]}; rlsteps jobs cancel {ids[1]}" in refused.stderr
    assert len(jobs.find_records([slurm_project / ".rlsteps" / "jobs"])) == 3  # no second chain

    for job_id in ids:
        assert invoke("jobs", "cancel", job_id).exit_code == 0
    accepted = invoke("pipeline", "run", str(TINY), "-b", "sleepy")
    assert accepted.exit_code == 0, accepted.output
    again = [j["job_id"] for j in json.loads(chain.read_text())["jobs"]]
    assert len(again) == 3 and not set(again) & set(ids)
    assert all(f"(job {i})" in accepted.stdout for i in again)


def test_a_shipped_example_runs_by_name_from_any_folder_and_a_file_of_that_name_wins(project):
    shown = invoke("pipeline", "run", "tiny", "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.count(": run (no output at") == 3 and "stage rlhf" in shown.stdout
    rs_tiny = REPO / "steps" / "rl" / "rs" / "tiny.yaml"  # by path: a file named tiny here is no config name
    write(project / "tiny", f"name: mine\nstages:\n  - {{name: only, step: rl/rs, config: {rs_tiny}}}\n")
    mine = invoke("pipeline", "run", "tiny", "--dry-run")
    assert mine.exit_code == 0 and "stage only" in mine.stdout and "stage rlhf" not in mine.stdout, mine.output


def test_an_unknown_pipeline_names_the_shipped_examples_and_where_it_looked(project):
    done = invoke("pipeline", "run", "tinyy", "--dry-run")
    assert done.exit_code == 2
    assert f"pipeline file tinyy not found (in {project})" in done.stderr
    assert "shipped example's name: tiny, tiny_eval" in done.stderr and str(TINY.parent) in done.stderr
    assert invoke("pipeline", "run", "examples/pipelines/tiny.yaml", "--dry-run").exit_code == 2  # a path: no fallback


def test_pipeline_list_and_show_give_the_shipped_examples(project):
    listed = invoke("pipeline", "list")
    assert listed.exit_code == 0, listed.output
    assert "tiny: rs (rl/rs) -> reinforce (rl/reinforce) -> rlhf (rl/rlhf)" in listed.stdout
    assert "tiny_eval: reinforce (rl/reinforce) -> eval (eval/policy)" in listed.stdout
    shown = invoke("pipeline", "show", "tiny_eval")
    assert shown.exit_code == 0 and shown.stdout == (TINY.parent / "tiny_eval.yaml").read_text()
