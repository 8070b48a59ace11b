"""Inputs on cluster paths: the submitting machine leaves them to the job, which checks them itself first,
with the messages and the exit code a check at submission gives. And the job's first question: can its
Python run the engine at all."""

import ast
import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from rlsteps.artifacts.inputs import Reach, check_inputs, inputs_in_job, raise_for
from rlsteps.catalog import load_catalog
from rlsteps.contract.input_check import InputProblem, check_inputs_in_job
from rlsteps.engine.run import preflight
from rlsteps.errors import ArtifactError, UsageError
from rlsteps.launch import code
from run_helpers import python_without_rlsteps, rlsteps
from test_launch_slurm import TINY_RUN, add_profile, compiled, needs_cluster, project  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[1]


def test_a_path_under_a_cluster_path_is_the_jobs_and_others_are_here_or_unreachable():
    slurm = Reach("slurm", sees_local_files=True, cluster_paths=("/lustre/data",))
    assert slurm.on_cluster("/lustre/data/p.jsonl") and slurm.on_cluster("/lustre/data")
    assert not slurm.on_cluster("/lustre/database/p.jsonl")  # a prefix of the name is not a folder
    assert not slurm.on_cluster("s3://bucket/lustre/data/p.jsonl")  # a remote URL is checked here
    assert not slurm.unreachable("/home/me/p.jsonl")  # Slurm shares this machine's files
    lepton = Reach("lepton", sees_local_files=False, cluster_paths=("/data/",))
    assert lepton.on_cluster("file:///data/p.jsonl") and not lepton.unreachable("/data/p.jsonl")
    assert lepton.unreachable("/home/me/p.jsonl") and not lepton.unreachable("s3://bucket/p.jsonl")


def in_job(tmp_path: Path, **refs: str):
    """The inputs_in_job records the submitting side writes for rl/rs with these inputs on a cluster path."""
    catalog = load_catalog()
    step = catalog.find("rs")
    config = {"inputs": refs}
    resolved = check_inputs(catalog, step, config, reach=Reach("slurm", True, (str(tmp_path),)))
    return catalog, step, config, resolved, [record.as_dict() for record in inputs_in_job(catalog, resolved)]


def test_the_job_says_what_the_submitting_machine_would_have_said(tmp_path, tiny_world):
    cluster_copy = tmp_path / "prompts.jsonl"
    cluster_copy.write_text(tiny_world.train_prompts.read_text())
    *_, resolved, records = in_job(tmp_path, prompts=str(cluster_copy), policy=str(tmp_path / "absent"))
    assert {item.name: item.status for item in resolved if item.ref} == {"prompts": "in_job", "policy": "in_job"}
    assert {r["name"]: r["accepted"] for r in records}["policy"] == [
        "checkpoint",
        "checkpoint_hf",
        "checkpoint_megatron",
    ]
    with pytest.raises(InputProblem) as absent:
        check_inputs_in_job(records)
    catalog = load_catalog()
    step = catalog.find("rs")
    here = check_inputs(catalog, step, {"inputs": {"policy": str(tmp_path / "absent")}})
    with pytest.raises(ArtifactError) as at_submission:
        raise_for(catalog, True, next(item for item in here if item.name == "policy"))
    assert str(absent.value) == str(at_submission.value)
    assert "input 'policy': " in str(absent.value) and "does not exist" in str(absent.value)


def test_a_mistyped_input_and_a_malformed_prompt_line_stop_the_job_check(tmp_path, tiny_world):
    cluster_copy = tmp_path / "prompts.jsonl"
    cluster_copy.write_text(tiny_world.train_prompts.read_text())
    *_, records = in_job(tmp_path, prompts=str(cluster_copy), policy=str(cluster_copy))
    with pytest.raises(
        InputProblem,
        match=r"prompts.jsonl is prompt_jsonl, but a checkpoint \(checkpoint_hf or checkpoint_megatron\) is",
    ):
        check_inputs_in_job(records)
    cluster_copy.write_text('{"prompt": "fine"}\n{"prompt": \n')
    *_, records = in_job(tmp_path, prompts=str(cluster_copy))
    with pytest.raises(InputProblem, match=rf"{cluster_copy}:2: ") as bad_line:
        check_inputs_in_job(records)
    assert "each line must be" in bad_line.value.fix


def test_inputs_of_the_right_types_pass_the_job_check(tmp_path, tiny_world):
    cluster_copy = tmp_path / "prompts.jsonl"
    cluster_copy.write_text(tiny_world.train_prompts.read_text())
    policy = tmp_path / "policy"
    policy.symlink_to(tiny_world.policy)
    *_, records = in_job(tmp_path, prompts=str(cluster_copy), policy=str(policy))
    assert [item.name for item in check_inputs_in_job(records)] == ["prompts", "policy"]


def test_a_slurm_dry_run_leaves_cluster_paths_to_the_job_and_records_them(project):  # noqa: F811
    add_profile(project, "  lustre:\n    extends: ci\n    cluster_paths: [/lustre/data]\n")
    job = compiled("lustre", overrides=("inputs.prompts=/lustre/data/p.jsonl",)).job
    [record] = job.inputs_in_job
    assert record["ref"] == "/lustre/data/p.jsonl" and record["required_type"] == "prompts"
    shown = rlsteps("run", "rs", "-c", "tiny", "-b", "lustre", "inputs.prompts=/lustre/data/p.jsonl", "--dry-run",
                    cwd=project, timeout=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "on a cluster path: checked in the job" in shown.stdout


def test_a_cluster_path_must_be_absolute(project):  # noqa: F811
    add_profile(project, "  relative:\n    extends: ci\n    cluster_paths: [data]\n")
    with pytest.raises(UsageError, match="must be absolute folders, not data"):
        compiled("relative")


@needs_cluster
@pytest.mark.slow
def test_a_slurm_job_checks_its_cluster_inputs_before_it_loads_anything(tiny_world, project, tmp_path):  # noqa: F811
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    add_profile(project, f"  mounted:\n    extends: ci\n    cluster_paths: [{cluster}, {tiny_world.root}]\n")
    bad = cluster / "prompts.jsonl"
    bad.write_text('{"prompt": "Describe the cat."}\n{"prompt": \n')
    done = rlsteps("run", "rs", *TINY_RUN, "-r", "mounted", f"inputs.prompts={bad}", cwd=project, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr  # the job's exit code, as at submission
    assert f"{bad}:2: " in done.stdout and "each line must be" in done.stdout
    assert "reward server" not in done.stdout and "run directory" not in done.stdout  # nothing started or loaded
    done = rlsteps("run", "rs", *TINY_RUN, "-r", "mounted", "train.max_steps=1", cwd=project, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = [line for line in done.stdout.splitlines() if line.endswith("(checked in the job)")]
    assert [line.split("'")[1] for line in checked] == ["prompts", "val_prompts", "policy", "reward_model"], checked


# The job's Python: asked before the worker imports anything but the standard library.


def test_a_python_without_the_engines_dependencies_is_one_line_naming_them(tmp_path):
    subprocess.run(["python", "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    wheel = tmp_path / code.wheel_name()
    wheel.write_bytes(code.build_wheel().content)
    done = subprocess.run(
        code.on_path(
            str(wheel), [str(tmp_path / "bare" / "bin" / "python"), "-m", "rlsteps.engine.run.worker", "c.yaml"]
        ),
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.splitlines()
    assert "lacks what the engine needs: omegaconf (not installed), pydantic (not installed)" in line
    assert "torch (not installed)" in line and "(fix: " in line


def test_a_python_with_them_passes(tmp_path):
    python = python_without_rlsteps(tmp_path / "env")  # torch and the rest, through this environment's packages
    wheel = tmp_path / code.wheel_name()
    wheel.write_bytes(code.build_wheel().content)
    probe = "from rlsteps.engine.run import preflight; print(preflight.problem())"
    done = subprocess.run(code.on_path(str(wheel), [str(python), "-c", probe]), capture_output=True, text=True)
    assert done.stdout.strip() == "None", done.stderr


def test_the_preflight_asks_for_what_pyproject_pins():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = declared["dependencies"] + declared["optional-dependencies"]["engine"]
    pinned = dict(requirement.split(">=") for requirement in requirements)
    assert {name: bound for name, (_, bound) in preflight.ENGINE_NEEDS.items()} == {
        name: pinned[name] for name in preflight.ENGINE_NEEDS
    }
    assert set(pinned) - set(preflight.ENGINE_NEEDS) == {"typer", "rich"}  # the CLI's alone
    assert declared["requires-python"] == ">={}.{}".format(*preflight.PYTHON)


def test_what_runs_before_the_preflight_parses_on_an_older_python():
    """So an old interpreter reaches the check and hears that it is too old, instead of a SyntaxError."""
    worker = ROOT / "src" / "rlsteps" / "engine" / "run" / "worker.py"
    tree = ast.parse(worker.read_text())
    top_level = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert top_level == {"__future__", "pathlib", "typing", "rlsteps.engine.run", "rlsteps.contract.worker_args"}
    for module in ("__init__.py", "engine/__init__.py", "engine/run/__init__.py", "engine/run/worker.py",
                   "engine/run/preflight.py", "contract/__init__.py", "contract/worker_args.py"):  # fmt: skip
        ast.parse((ROOT / "src" / "rlsteps" / module).read_text(), feature_version=(3, 8))


def test_versions_compare_by_release():
    assert preflight.release("2.13.0+cpu") == (2, 13, 0) and preflight.release("2024.12.0") > (2024, 2)
    assert preflight.release("4.51.0.dev0") >= preflight.release("4.51") and preflight.release("x") == ()


def test_json_is_what_records_hold():
    *_, records = in_job(Path("/cluster"), prompts="/cluster/p.jsonl")
    assert json.loads(json.dumps(records)) == records  # job.yaml and the Lepton entry script carry them as data
