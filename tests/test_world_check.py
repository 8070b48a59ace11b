"""The rules for a step's config on several processes: each one's message names its keys, values and fix."""

import subprocess
import sys

import pytest

from rlsteps.contract.world_check import world_size_problems


def rl_config(prompts: int = 16, rows: int = 64, micro: int = 4, algorithm: str = "rs") -> dict:
    return {
        "algorithm": algorithm,
        "run": {"device": "cuda"},
        "rollout": {"prompts_per_step": prompts},
        "train": {"global_batch_size": rows, "micro_batch_size": micro},
    }


def test_a_config_that_fits_the_world_size_has_no_problem():
    assert world_size_problems(rl_config(), 1) == []
    assert world_size_problems(rl_config(prompts=16, rows=64, micro=4), 8) == []  # 16 / 8 groups, 64 / 8 = 2 x 4 rows
    assert world_size_problems(rl_config(prompts=3, rows=5, micro=2), 1) == []  # one process takes any batch


def test_prompts_per_step_must_be_a_multiple_of_the_world_size():
    [problem] = world_size_problems(rl_config(prompts=10, rows=48, micro=2), 4)
    assert problem.startswith("rollout.prompts_per_step=10 is not a multiple of the world size 4")
    assert "a group never spans processes" in problem
    assert problem.endswith("set rollout.prompts_per_step=12")  # the nearest multiple, the larger on a tie


def test_the_global_batch_must_be_a_multiple_of_world_size_times_micro_batch():
    [problem] = world_size_problems(rl_config(prompts=16, rows=16, micro=16), 2)
    assert problem.startswith(
        "train.global_batch_size=16 is not a multiple of world size 2 x train.micro_batch_size=16 = 32"
    )
    assert "each process trains global_batch_size / 2 rows per optimizer step" in problem
    assert problem.endswith("set train.global_batch_size=32 or train.micro_batch_size=8")
    [problem] = world_size_problems(rl_config(prompts=16, rows=18, micro=1), 8)  # 18 rows do not split in 8
    assert problem.endswith("set train.global_batch_size=16")  # no micro batch size helps


def test_convert_runs_in_one_process():
    config = {"algorithm": "convert", "run": {"dtype": "auto"}}
    assert world_size_problems(config, 1) == []
    [problem] = world_size_problems(config, 2)
    assert problem.startswith("the convert step runs in one process, not 2")
    assert "nodes: 1" in problem


def test_keys_left_to_the_configs_own_validation_are_no_problem_here():
    assert world_size_problems({"algorithm": "rs"}, 4) == []  # missing: the defaults are the schema's to apply
    assert world_size_problems(rl_config(prompts="???", rows=True, micro=0), 4) == []  # type: ignore[arg-type]


def test_the_refusal_names_the_profiles_processes_and_every_problem_at_once(tiny_world, tmp_path, monkeypatch):
    from rlsteps.catalog import load_catalog
    from rlsteps.errors import UsageError
    from rlsteps.plan.runner import RunRequest, compile_request

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text("profiles:\n  three: {executor: local, nprocs_per_node: 3}\n")
    request = RunRequest(step="rs", config="tiny", batch_profile="three", dry_run=True)
    with pytest.raises(UsageError) as err:
        compile_request(load_catalog(), request)
    message = err.value.message
    assert message.startswith("the step cannot run on 3 processes (profile three: 1 node(s) x 3 process(es)): ")
    assert "rollout.prompts_per_step=16" in message and "train.global_batch_size=16" in message
    assert "key=value" in err.value.fix and err.value.exit_code == 2
    assert not (tmp_path / ".rlsteps").exists()


def test_the_module_imports_without_torch_or_pydantic():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['pydantic'] = None\n"
        "import rlsteps.contract.world_check as w\n"
        "print(w.world_size_problems({'algorithm': 'convert'}, 2)[0][:11])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "the convert", done.stderr
