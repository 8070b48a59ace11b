"""Pipelines without training: planning, bindings, type checks before anything starts, conversion, Slurm chains."""

import json
import os
import shutil
import stat
import textwrap
from pathlib import Path

import pytest

from cli_helpers import REPO, invoke
from rlsteps.artifacts.inputs import Conversion
from rlsteps.catalog import load_catalog
from rlsteps.plan.pipeline import PipelineSpec, StageSpec, _with_conversion

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
    from rlsteps.engine.artifact import input_versions
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
