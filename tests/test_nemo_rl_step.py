"""rl/nemo_rl/rlhf, the seed's step: its manifest, its NeMo-RL-language config and overrides, the seed page's commands,
the embedded engine where no NeMo-RL runs, and the GPUs a NeMo-RL job splits between policy and judge."""

import shutil
from pathlib import Path

import pytest
import yaml

from rlsteps.catalog import load_catalog
from rlsteps.contract.nemo_rl_job import MASTER_CONFIG_FILE
from rlsteps.errors import UsageError
from rlsteps.plan.runner import RunRequest, compile_request
from run_helpers import rlsteps
from seed_commands import JUDGE, SEED_COMMANDS, STEP

REPO = Path(__file__).resolve().parent.parent
GPU_PROFILES = """\
profiles:
  one_node:
    executor: slurm
    nodes: 1
    gpus_per_node: 8
    container_image: /images/nemo-rl.sqsh
    job_dir: /lustre/jobs
    cluster_paths: [/lustre]
  two_nodes:
    extends: one_node
    nodes: 2
"""
CLUSTER_INPUTS = ("data.train.data_path=/lustre/p.jsonl", "policy.model_name=/lustre/sft", "output.dir=/lustre/run")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with the shipped example profiles copied into rlsteps.yaml, as the docs say."""
    monkeypatch.chdir(tmp_path)
    shipped = [
        yaml.safe_load((REPO / "profiles" / name).read_text())["profiles"] for name in ("slurm.yaml", "lepton.yaml")
    ]
    profiles = {**shipped[0], **shipped[1], **yaml.safe_load(GPU_PROFILES)["profiles"]}
    (tmp_path / "rlsteps.yaml").write_text(yaml.safe_dump({"profiles": profiles}))
    return tmp_path


def compiled(*overrides, config="default", batch=None, run=None):
    request = RunRequest(STEP, config, run_profile=run, batch_profile=batch, dry_run=True, overrides=tuple(overrides))
    return compile_request(load_catalog(), request)


def master(*overrides, profile="two_nodes", config="default"):
    given = {item.partition("=")[0] for item in overrides}
    defaults = [item for item in CLUSTER_INPUTS if item.partition("=")[0] not in given]
    plan = compiled(*defaults, *overrides, config=config, batch=profile).plan
    return yaml.safe_load(plan.files[MASTER_CONFIG_FILE])


def test_the_manifest_is_the_seeds():
    step = load_catalog().find(STEP)
    consumed = {spec.name: (spec.type, spec.key, spec.required) for spec in step.consumes}
    assert consumed == {
        "prompts": ("prompt_jsonl", "data.train.data_path", True),
        "val_prompts": ("prompt_jsonl", "data.validation.data_path", False),
        "policy": ("checkpoint_megatron", "policy.model_name", True),
        "judge_model": ("judge_model_hf", JUDGE, True),
    }
    assert [(spec.type, spec.key) for spec in step.produces] == [("checkpoint_megatron", "output.dir")]
    assert {p.name: p.default for p in step.parameters}["grpo.num_generations_per_prompt"] == 8
    assert [p.name for p in step.parameters] == ["grpo.num_generations_per_prompt", JUDGE]
    assert step.configs == ("default", "tiny") and len(step.strategies) == 2


def test_the_judge_defaults_to_the_seeds_model_or_rl_reward_model(project, monkeypatch):
    monkeypatch.delenv("RL_REWARD_MODEL", raising=False)
    assert compiled().job.config["inputs"]["judge_model"] == "meta-llama/Llama-3.2-1B-Instruct"
    monkeypatch.setenv("RL_REWARD_MODEL", "/lustre/genrm")
    assert compiled(batch="two_nodes").job.config["inputs"]["judge_model"] == "/lustre/genrm"


def test_any_nemo_rl_key_is_an_override_and_a_typo_gets_the_closest_schema_key(project):
    job = compiled(*CLUSTER_INPUTS, "grpo.num_generations_per_prompt=16", "grpo.calculate_advantages_on_gpu=true",
                   batch="two_nodes").job  # fmt: skip
    assert job.config["grpo"]["num_generations_per_prompt"] == 16
    assert job.config["grpo"]["calculate_advantages_on_gpu"] is True  # in NeMo-RL's schema, not in the file
    with pytest.raises(UsageError) as refused:
        compiled("grpo.num_generation_per_prompt=16")
    assert "grpo.num_generations_per_prompt" in str(refused.value.fix)
    with pytest.raises(UsageError) as refused:
        compiled("policy.dtensor_cfg.tensor_paralel_size=2")
    assert "policy.dtensor_cfg.tensor_parallel_size" in str(refused.value.fix)


@pytest.mark.slow  # the seed page's commands through the CLI, with NeMo-RL's code judging them
def test_the_seed_pages_commands_work_as_written(project, monkeypatch):
    """Command Examples of the seed page (dry runs where they would submit); the profiles are the shipped ones. Online,
    as a user reads the page: the Hub ids of the default config are the job's to fetch (a dry run never does)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    commands = SEED_COMMANDS
    for command in commands:
        result = rlsteps(*command, cwd=project)
        assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    default = rlsteps(*commands[0], cwd=project).stdout  # here: the embedded engine, asking in NeMo-RL's keys
    assert "data.train.data_path=PATH" in default and "policy.model_name=PATH" in default
    lepton = rlsteps(*commands[1], cwd=project).stdout
    assert "nvidia/Nemotron-Reward-Model" in lepton and "num_rollouts_per_prompt: 16" in lepton


def test_tiny_here_runs_rl_rlhfs_recipe_on_the_embedded_engine_and_names_what_it_cannot_honour(project):
    job = compiled("policy.dtensor_cfg.sequence_parallel=true", "grpo.max_num_steps=3", config="tiny").job
    assert job.algorithm == "grpo" and job.step_id == STEP and job.config["engine"] == "embedded"
    config = job.config
    assert (config["rollout"]["prompts_per_step"], config["rollout"]["num_rollouts_per_prompt"]) == (16, 4)
    assert config["train"]["max_steps"] == 3 and config["train"]["lr"] == 3.0e-4
    assert (config["train"]["schedule"], config["train"]["warmup_steps"]) == ("constant", 2)
    assert config["validation"]["interval"] == 4 and config["checkpoint"]["interval"] == 4
    assert config["inputs"]["judge_model"].endswith("reward_model") and config["judge"]["model"] == "tiny-judge"
    assert job.notes[0].startswith("engine: embedded")
    assert any("policy.dtensor_cfg.sequence_parallel" in note for note in job.notes)


def test_on_a_gpu_profile_the_step_compiles_for_nemo_rl(project):
    job = compiled(*CLUSTER_INPUTS, batch="two_nodes").job
    assert job.algorithm == "nemo_rl_grpo" and job.config["engine"] == "nemo_rl"
    assert job.config["inputs"]["policy"] == "/lustre/sft"  # where the job's stages read the inputs
    config = master()
    assert config["policy"]["model_name"].endswith("nemo_rl/policy_hf")
    assert config["data"]["train"]["data_path"].endswith("nemo_rl/data/train.jsonl")


def test_the_judge_is_compiled_to_the_gym_server_that_starts_vllm(project):
    servers = master()["env"]["nemo_gym"]["genrm_model"]["responses_api_models"]
    assert list(servers) == ["genrm_model"]
    assert servers["genrm_model"]["model"] == "meta-llama/Llama-3.2-1B-Instruct"
    with pytest.raises(UsageError, match="a judge already served"):
        master(f"{JUDGE.removesuffix('.model')}.base_url=http://judge:8000/v1")


def test_genrm_compares_whole_groups_of_grpos_size(project):
    config = master("grpo.num_generations_per_prompt=16")
    compare = config["env"]["nemo_gym"]["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"]
    assert compare["num_rollouts_per_prompt"] == 16


SERVE = f"{JUDGE.removesuffix('.model')}.vllm_serve_kwargs"


@pytest.mark.parametrize(
    ("profile", "judge_gpus", "cluster", "gym_nodes"),
    [("one_node", 4, (1, 4), 0), ("two_nodes", 1, (1, 8), 1), ("two_nodes", 8, (1, 8), 1)],
)
def test_the_judge_gets_gpus_of_its_own(project, profile, judge_gpus, cluster, gym_nodes):
    config = master(f"{SERVE}.data_parallel_size={judge_gpus}", profile=profile)
    assert (config["cluster"]["num_nodes"], config["cluster"]["gpus_per_node"]) == cluster
    assert config["env"]["nemo_gym"]["num_gpu_nodes"] == gym_nodes


def test_a_profile_that_cannot_hold_policy_and_judge_is_refused_with_the_arithmetic(project):
    with pytest.raises(UsageError, match=r"node has 8 GPU\(s\) and the judge takes 8"):
        master(f"{SERVE}.tensor_parallel_size=8", profile="one_node")
    with pytest.raises(UsageError, match=r"judge takes 16 GPU\(s\) = 2 node\(s\)"):
        master(f"{SERVE}.data_parallel_size=16")
    with pytest.raises(UsageError, match=r"Batch size \(256\) is not a multiple of shards \(7\)") as refused:
        master(profile="one_node")  # a one-GPU judge leaves 7
    assert refused.value.fix == "grpo.num_prompts_per_step=35 policy.train_global_batch_size=280"


def test_sequence_lengths_divide_by_tensor_parallelism(project):
    assert master("policy.dtensor_cfg.tensor_parallel_size=2")["policy"]["make_sequence_length_divisible_by"] == 2


def test_the_reward_model_of_rl_reinforce_idles_no_node(project):
    inputs = ("inputs.prompts=/lustre/p.jsonl", "inputs.policy=/lustre/sft", "inputs.reward_model=/lustre/rm")
    request = RunRequest(
        "rl/reinforce", "default", batch_profile="two_nodes", dry_run=True,
        overrides=(*inputs, "engine=nemo_rl", "output.dir=/lustre/run"),
    )  # fmt: skip
    config = yaml.safe_load(compile_request(load_catalog(), request).plan.files[MASTER_CONFIG_FILE])
    assert config["env"]["reward_model"]["resources"] == {"gpus_per_node": 8, "num_nodes": 1}
    assert config["cluster"]["num_nodes"] == 2  # NeMo-RL takes the reward model's node out of these itself


@pytest.mark.slow
def test_tiny_runs_here_end_to_end_on_the_embedded_engine(project, tiny_world):
    out = project / "run"
    result = rlsteps("run", STEP, "-c", "tiny", "grpo.max_num_steps=2", "grpo.val_period=2", f"output.dir={out}",
                     cwd=project, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "engine: embedded" in result.stdout + result.stderr
    artifact = (out / "policy" / "rlsteps_artifact.json").read_text()
    assert '"checkpoint_megatron"' in artifact and STEP in artifact
    shutil.rmtree(out)


def test_a_profiles_config_run_stays_out_of_nemo_rls_master_config(project):
    """slurm_rl_nemo_rl_rlhf extends my_slurm, whose config.run sets the embedded engine's device and dtype."""
    job = compiled(*CLUSTER_INPUTS, batch="slurm_rl_nemo_rl_rlhf")
    assert job.job.config["run"] == {"device": "cuda", "dtype": "bfloat16"}
    text = job.plan.files[MASTER_CONFIG_FILE]
    assert "run" not in yaml.safe_load(text)
    assert "run.* (the embedded engine's device and dtype) does not apply" in text


@pytest.mark.parametrize("key", ["cluster.num_nodes=4", "cluster.gpus_per_node=4"])
def test_a_cluster_override_the_profile_overrules_is_refused_with_why(project, key):
    with pytest.raises(UsageError, match=rf"{key} cannot be honoured: cluster.\* is the policy's share") as refused:
        master(key)
    assert "2 node(s) x 8 GPU(s)" in refused.value.message and "nodes and gpus_per_node" in refused.value.fix
    assert master("cluster.num_nodes=1")["cluster"]["num_nodes"] == 1  # what the profile gives: honoured
