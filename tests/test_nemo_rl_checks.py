"""What NeMo-RL's setup and loop assert beyond the batch split, checked when a job compiles (nemo_rl/policy_checks.py,
the judge's replicas in nemo_rl/placement.py): each config below is refused with NeMo-RL's reason and a key=value
fix, the fixed config runs NeMo-RL v0.7.0's own first GRPO step (tests/nemo_rl_run.py), and a control runs what was
refused through NeMo-RL, which stops where rlsteps says it would."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import upstream
from rlsteps.contract.nemo_rl_job import MASTER_CONFIG_FILE
from rlsteps.errors import UsageError
from test_nemo_rl_runs import (
    GPU_PROFILES,
    REINFORCE_INPUTS,
    RLHF_INPUTS,
    SEED,
    SEED_INPUTS,
    compile_case,
    control,
    describe,
    project_with_profiles,
    runnable,
)

pytestmark = pytest.mark.slow  # NeMo-RL's own code, in a process of its own

PROFILES = {
    **GPU_PROFILES,
    # the seed's two-node profile on nodes of 4 GPUs: the judge's 8 replicas it inherits take both nodes
    "two_by_four": {"extends": "slurm_rl_nemo_rl_rlhf", "gpus_per_node": 4},
}
TP4 = "nemo_rl.policy.dtensor_cfg.tensor_parallel_size=4"
FEW, FEWER = "rollout.prompts_per_step=4", "grpo.num_prompts_per_step=8"  # where the check does not depend on the
# rows a step makes, fewer of them: the runs are shorter
JUDGE_DP = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.vllm_serve_kwargs.data_parallel_size"
JUDGE_LEN = JUDGE_DP.replace("data_parallel_size", "max_model_len")
LONG = "rl/rlhf, answers of 4,096 tokens, a judge of 8,192"
SHAPE_PP = "seed page, a one-layer policy, Megatron pipeline parallel 2"
SHAPE_TP = "seed page, 4 key-value heads, tensor parallel 8"
CASES = {  # name: (step, config, profile, overrides, what the refusal says, its fix)
    "rl/rlhf, tensor parallel 4": ("rl/rlhf", "default", "two_nodes", (*RLHF_INPUTS, TP4, FEW),
                                   "known batch-variant accuracy issue", "rollout.logprob_micro_batch_size=1"),
    "rl/reinforce, tensor parallel 4": ("rl/reinforce", "default", "two_nodes", (*REINFORCE_INPUTS, TP4, FEW),
                                        "known batch-variant accuracy issue", "rollout.logprob_micro_batch_size=1"),
    "seed page, dynamic batching beside packing": (SEED, "default", "two_nodes",
        (*SEED_INPUTS, "policy.dynamic_batching.enabled=true"), "'Dynamic Batching is exclusive of Sequence Packing'",
        "policy.sequence_packing.enabled=false"),
    "seed page, one node, tensor parallel 2": (SEED, "default", "one_node",
        (*SEED_INPUTS, "policy.dtensor_cfg.tensor_parallel_size=2"),
        "the policy's 7 GPU(s) do not split into model-parallel groups of 2",
        f"{JUDGE_DP}=2 grpo.num_prompts_per_step=33 policy.train_global_batch_size=264"),
    "seed page, 2 x 4 GPUs, tensor parallel 4": (SEED, "default", "two_by_four",
        (*SEED_INPUTS, "policy.dtensor_cfg.tensor_parallel_size=4", "output.dir=/lustre/run", FEWER),
        "the judge takes 8 GPU(s) = 2 node(s) of 4", f"{JUDGE_DP}=4"),
    LONG: ("rl/rlhf", "default", "two_nodes", (*RLHF_INPUTS, FEW, "data.max_prompt_tokens=1024",
        "rollout.sampling.max_new_tokens=4096"), "the judge's max_model_len 8192 cannot hold what it is asked to "
        "compare: a 1024-token prompt + 2 answers of 4096 + the judge's answer of 256 + 512 for its template = 9984",
        f"nemo_rl.{JUDGE_LEN}=10240"),
    # the policy's own shapes (the tiny world's Llama: 1 layer, 4 attention heads, 4 key-value heads), read here
    SHAPE_PP: (SEED, "default", "two_nodes", ("data.train.data_path=/lustre/p.jsonl",
        "policy.megatron_cfg.enabled=true", "policy.model_name={policy_megatron}", "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.pipeline_model_parallel_size=2", FEWER),
        "'num_layers should be divisible by pipeline_model_parallel_size'",
        "policy.megatron_cfg.pipeline_model_parallel_size=1"),
    SHAPE_TP: (SEED, "default", "two_nodes", ("data.train.data_path=/lustre/p.jsonl", "policy.model_name={policy}",
        "policy.dtensor_cfg.tensor_parallel_size=8", FEWER), "4 attention heads and 4 key-value heads",
        "policy.dtensor_cfg.tensor_parallel_size=4"),
}  # fmt: skip
ASYNC = "seed page, asynchronous GRPO"
ASYNC_CASE = (SEED, "default", "two_nodes", (*SEED_INPUTS, "grpo.async_grpo.enabled=true"))
ASYNC_SAID = "NeMo-RL's asynchronous GRPO stops with 'Async GRPO requires an async vLLM"
ASYNC_FIX = (
    "policy.generation.vllm_cfg.async_engine=true loss_fn.use_importance_sampling_correction=true "
    "policy.generation.colocated.enabled=false policy.generation.colocated.resources.gpus_per_node=4 "
    "policy.generation.colocated.resources.num_nodes=1"
)
# what was refused, run through NeMo-RL: (the case whose fixed config it starts from, the change back, where NeMo-RL
# stops, what it says)
CONTROLS = {
    "control: tensor parallel 4, micro-batch 1 against logprob batch 8": (
        "rl/rlhf, tensor parallel 4", {"policy.logprob_batch_size": 8},
        "nemo_rl/models/policy/lm_policy.py:184", "known batch-variant accuracy issue with TP>=4"),
    "control: dynamic batching beside packing": (
        "seed page, dynamic batching beside packing", {"policy.sequence_packing.enabled": True},
        "nemo_rl/models/policy/lm_policy.py:295", "Dynamic Batching is exclusive of Sequence Packing"),
    "control: 7 policy GPUs at tensor parallel 2": (
        "seed page, one node, tensor parallel 2", {"cluster.gpus_per_node": 7},
        "nemo_rl/models/policy/lm_policy.py:", "World size (7) must be divisible by PP * CP * TP (2)"),
    "control: asynchronous GRPO without the importance-sampling correction": (
        ASYNC, {"loss_fn.use_importance_sampling_correction": False, "policy.generation.colocated.enabled": True},
        "nemo_rl/algorithms/grpo.py:3371", "Importance sampling correction must be enabled for async GRPO"),
    "control: asynchronous GRPO with colocated generation": (
        ASYNC, {"policy.generation.colocated.enabled": True},
        "nemo_rl/algorithms/grpo.py:3421", "Colocated inference is not supported for async GRPO"),
}  # fmt: skip


def _put(tree: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree[part]
    tree[leaf] = value


def _changed(changes: dict):
    def change(master: dict) -> None:
        for key, value in changes.items():
            _put(master, key, value)

    return change


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    yield from project_with_profiles(tmp_path_factory.mktemp("nemo_rl_checks"), PROFILES)


def with_world(case: tuple, world) -> tuple:
    """The case with the tiny world's paths where it names {policy} or {policy_megatron}."""
    step, config, profile, overrides = case[:4]
    paths = {"policy": world.policy, "policy_megatron": world.policy_megatron}
    return step, config, profile, tuple(item.format(**paths) for item in overrides)


def refusal(case: tuple) -> UsageError:
    with pytest.raises(UsageError) as caught:
        compile_case(*case)
    return caught.value


@pytest.fixture(scope="module")
def outcomes(project, tiny_world):
    """Each case refused, then compiled with its fix; the fixed ones and the controls run by NeMo-RL's code."""
    refused, cases = {}, {}
    for n, (name, case) in enumerate({**CASES, ASYNC: ASYNC_CASE}.items()):
        step, config, profile, overrides = case = with_world(case, tiny_world)
        refused[name] = error = refusal(case)
        fixed = compile_case(step, config, profile, (*overrides, *error.fix.split()))
        cases[name] = {"name": name, **runnable(fixed, tiny_world, project / f"run{n}")}
    runs = list(cases.values())
    for n, (name, (source, changes, _, _)) in enumerate(CONTROLS.items()):
        runs.append(control(cases[source], project / f"control{n}", name, _changed(changes)))
    results = upstream.run_nemo_rl(runs, project)
    yield refused, results
    for folder in project.glob("run*"):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("name", sorted({**CASES, ASYNC: None}))
def test_refused_with_nemo_rl_s_reason_and_a_fix_that_runs_its_first_step(outcomes, name):
    refused, results = outcomes
    *_, said, fix = CASES.get(name) or (ASYNC_SAID, ASYNC_FIX)
    assert said in refused[name].message, refused[name].message
    assert refused[name].fix == fix
    result = results[name]
    assert result["ok"], describe(result)
    assert Path(result["checkpoint"]).name == "step_1" and Path(result["checkpoint"]).is_dir()
    # NeMo-RL's asynchronous loop counts its steps in current_step only (its training_info keeps total_steps 0)
    assert result["steps"] == (0 if name == ASYNC else 1)


def test_asynchronous_grpo_is_refused_with_all_its_loop_asserts(outcomes):
    refused, _ = outcomes
    for words in ("async vLLM or Megatron generation engine", "Importance sampling correction", "Colocated inference"):
        assert words in refused[ASYNC].message


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_nemo_rl_itself_stops_on_what_was_refused(outcomes, name):
    _, results = outcomes
    *_, where, said = CONTROLS[name]
    result = results[name]
    assert not result["ok"]
    assert said in result["error"], describe(result)
    assert result["where"].startswith(where), describe(result)


def shape_checks(model_dir, *sizes: tuple[int, int, int]) -> list[dict]:
    """What NeMo-RL's DTensor worker and Megatron-Core say of the policy's shape at each (DTensor TP, Megatron TP,
    Megatron PP) (tests/nemo_rl_shape_check.py)."""
    upstream.unpacked("nemo_rl")
    script = Path(__file__).with_name("nemo_rl_shape_check.py")
    listed = [",".join(map(str, triple)) for triple in sizes]
    done = subprocess.run([sys.executable, str(script), str(model_dir), *listed], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_nemo_rl_and_megatron_core_refuse_the_sizes_rlsteps_refuses_of_the_policy_and_take_its_fixes(tiny_world):
    # the sizes refused and the fixes' (CASES; the fixed configs run NeMo-RL's first step above), by their own code
    asked, layers, fixed = shape_checks(tiny_world.policy, (8, 8, 1), (1, 1, 2), (4, 4, 1))
    assert asked["dtensor"] == "AssertionError: num_key_value_heads (4) must be divisible by TP size (8)"
    assert asked["megatron"].startswith("ValueError: num_attention_heads (4) must be a multiple of")
    assert layers["megatron"] == "AssertionError: num_layers should be divisible by pipeline_model_parallel_size"
    assert fixed == {"megatron": "ok", "dtensor": "ok"}


def test_megatron_tensor_parallel_beyond_the_heads_is_refused_with_the_largest_that_divides_them(project, tiny_world):
    error = refusal(with_world((SEED, "default", "two_nodes", ("data.train.data_path=/lustre/p.jsonl",
        "policy.megatron_cfg.enabled=true", "policy.model_name={policy_megatron}", "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.tensor_model_parallel_size=8")), tiny_world))  # fmt: skip
    assert "4 attention heads and 4 query groups" in error.message
    assert error.fix == "policy.megatron_cfg.tensor_model_parallel_size=4"


def test_a_policy_on_a_cluster_path_or_the_hub_says_its_shapes_are_not_checked(project):
    for policy, why in (("/lustre/sft", "not readable here"), ("org/some-model", "is a Hub id")):
        compiled = compile_case(SEED, "default", "two_nodes", ("data.train.data_path=/lustre/p.jsonl",
                                                               f"policy.model_name={policy}"))  # fmt: skip
        header = [line for line in compiled.plan.files[MASTER_CONFIG_FILE].splitlines() if line.startswith("#")]
        said = [line for line in header if "not checked here: the policy's heads, layers and experts" in line]
        assert len(said) == 1 and why in said[0], header


def test_answers_of_28672_tokens_need_a_judge_that_holds_a_prompt_and_two_of_them(project):
    with pytest.raises(UsageError) as caught:
        compile_case("rl/rlhf", "default", "two_nodes", (*RLHF_INPUTS, "data.max_prompt_tokens=4096",
                                                         "rollout.sampling.max_new_tokens=28672"))  # fmt: skip
    assert "a 4096-token prompt + 2 answers of 28672 + the judge's answer of 256 + 512 for its template = 62208 " in (
        caught.value.message
    )
    assert caught.value.fix == f"nemo_rl.{JUDGE_LEN}=62464"
    # the seed's own keys: answers up to policy.max_total_sequence_length less the prompt
    long = (*SEED_INPUTS, "policy.max_total_sequence_length=32768", "policy.generation.max_new_tokens=28672")
    with pytest.raises(UsageError) as caught:
        compile_case(SEED, "default", "two_nodes", long)
    assert "2 answers of 28672" in caught.value.message and caught.value.fix.startswith(f"{JUDGE_LEN}=")
    compile_case(SEED, "default", "two_nodes", (*long, caught.value.fix))


def test_nemo_gym_turns_a_judge_over_its_context_into_equal_rewards_and_zero_advantages(outcomes):
    """Control for the judge's context: what rlsteps refuses would not stop NeMo-RL; NeMo-Gym's genrm_compare (its own
    code, the judge's reply stood in as vLLM's error) scores every pair by default, and NeMo-RL's baseline leaves no
    advantage (tests/nemo_rl_genrm_check.py)."""
    refused, _ = outcomes
    requested = int(refused[LONG].message.split(" tokens;")[0].rsplit("= ", 1)[1])
    script = Path(__file__).with_name("nemo_rl_genrm_check.py")
    done = subprocess.run([sys.executable, str(script), "8192", str(requested)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["judge_calls"] >= 4 and said["rewards"] == [3.0] * 4  # genrm_compare's default_score, every answer
    assert said["advantages"] == [0.0] * 4
