"""rollout.max_age_steps on engine=nemo_rl: compiled to NeMo-RL's asynchronous GRPO with what its loop asserts
(vLLM's async engine, the importance-sampling correction, generation on GPUs of its own, counted as NeMo-RL's setup
counts them beside a reward model or a judge), each compiled config run by NeMo-RL v0.7.0's own asynchronous loop
(tests/nemo_rl_run.py). The embedded engine's own rollouts beside training: tests/test_rollouts_beside*.py."""

import pytest
import yaml

import upstream
from rlsteps.contract.nemo_rl_job import MASTER_CONFIG_FILE
from test_nemo_rl_runs import (
    GPU_PROFILES,
    REINFORCE_INPUTS,
    RLHF_INPUTS,
    compile_case,
    describe,
    project_with_profiles,
    runnable,
)

FEW = "rollout.prompts_per_step=8"  # the check does not depend on the rows a step makes: fewer, a shorter run
CASES = {  # name: (step, profile, overrides), what NeMo-RL's setup gives generation and the policy
    "rl/reinforce on two nodes, rollouts at most 1 step old": (
        "rl/reinforce", "two_nodes", (*REINFORCE_INPUTS, "rollout.max_age_steps=1", FEW)),
    "rl/rlhf on two nodes, at most 2 steps old": (
        "rl/rlhf", "two_nodes", (*RLHF_INPUTS, "rollout.max_age_steps=2", FEW)),
}  # fmt: skip
# (nodes, GPUs per node) generation gets: beside the reward model's whole node, half of the policy's node; beside the
# judge's node, half of the other
GENERATION = {
    "rl/reinforce on two nodes, rollouts at most 1 step old": {"num_nodes": 1, "gpus_per_node": 4},
    "rl/rlhf on two nodes, at most 2 steps old": {"num_nodes": 1, "gpus_per_node": 4},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    yield from project_with_profiles(tmp_path_factory.mktemp("nemo_rl_async"), GPU_PROFILES)


def compiled_case(name: str):
    step, profile, overrides = CASES[name]
    return compile_case(step, "default", profile, overrides)


def master_of(compiled) -> tuple[dict, str]:
    text = compiled.plan.files[MASTER_CONFIG_FILE]
    return yaml.safe_load(text), text


@pytest.mark.parametrize("name", sorted(CASES))
def test_rollouts_beside_training_compile_to_nemo_rl_s_asynchronous_grpo(project, name):
    master, text = master_of(compiled_case(name))
    age = int(CASES[name][2][-2].split("=")[1])
    assert master["grpo"]["async_grpo"]["enabled"] is True
    assert master["grpo"]["async_grpo"]["max_trajectory_age_steps"] == age
    assert master["policy"]["generation"]["vllm_cfg"]["async_engine"] is True
    assert master["loss_fn"]["use_importance_sampling_correction"] is True
    colocated = master["policy"]["generation"]["colocated"]
    assert colocated["enabled"] is False and colocated["resources"] == GENERATION[name]
    assert f"rollout.max_age_steps={age}: grpo.async_grpo.enabled=true" in text
    assert (
        "policy.generation.colocated.enabled: false, vLLM on 4 GPU(s) of the node of its own, the policy "
        "training on 4" in text
    )
    assert "NeMo-RL generates with vLLM beside training, on GPUs of its own" in text


def test_at_age_0_the_loop_stays_synchronous_and_colocated(project):
    step, profile, overrides = CASES["rl/reinforce on two nodes, rollouts at most 1 step old"]
    master, text = master_of(compile_case(step, "default", profile, tuple(o for o in overrides if "max_age" not in o)))
    assert master["grpo"]["async_grpo"]["enabled"] is False
    assert master["policy"]["generation"]["colocated"]["enabled"] is True
    notes = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "max_age_steps" not in notes and "NeMo-RL generates with vLLM colocated with training" in notes


@pytest.mark.slow  # NeMo-RL's own code, in a process of its own
def test_nemo_rl_s_asynchronous_loop_takes_a_step_of_each(project, tiny_world):
    cases = [
        {"name": name, **runnable(compiled_case(name), tiny_world, project / f"run{n}")}
        for n, name in enumerate(sorted(CASES))
    ]
    results = upstream.run_nemo_rl(cases, project)
    for name in CASES:
        result = results[name]
        assert result["ok"], describe(result)
        # NeMo-RL's asynchronous loop counts its steps in current_step only (its training_info keeps total_steps 0,
        # where the synchronous loop's says 1): the step ran in async_grpo_train
        assert result["steps"] == 0 and result["checkpoint"].endswith("step_1"), describe(result)
