"""The step config compiled to NeMo-RL's GRPO master config, checked key by key against NeMo-RL's documented names
(examples/configs/grpo_math_1B.yaml and its config types at the pinned version) and the values they must hold."""

from pathlib import PurePosixPath

import pytest
import yaml

from rlsteps.catalog import load_catalog
from rlsteps.engine.config import STEP_SCHEMAS
from rlsteps.engine.nemo_rl.master_config import Cluster, NemoRlConfigError, compile_master_config
from rlsteps.errors import UsageError
from rlsteps.launch.ray_job import master_config_yaml
from rlsteps.plan.compile import compile_job

RUN = PurePosixPath("/lustre/runs/rlhf")
RLHF_INPUTS = ("inputs.prompts=/p.jsonl", "inputs.val_prompts=/v.jsonl", "inputs.policy=/sft", "inputs.judge_model=/j")
REINFORCE_INPUTS = ("inputs.prompts=/p.jsonl", "inputs.policy=/sft", "inputs.reward_model=/rm")


def validated(step: str, *overrides: str, config: str = "default") -> dict:
    job = compile_job(load_catalog().find(step), config, overrides=["engine=nemo_rl", *overrides])
    return STEP_SCHEMAS[job.algorithm].model_validate(job.config).model_dump(mode="json")


def master(step: str, *overrides: str, cluster=Cluster(2, 8)):
    return compile_master_config(validated(step, *overrides), cluster, RUN)


def test_the_seeds_parameters_land_on_nemo_rls_keys():
    compiled = master("rlhf", *RLHF_INPUTS, "rollout.num_rollouts_per_prompt=8").config
    assert compiled["grpo"]["num_generations_per_prompt"] == 8
    gym = compiled["env"]["nemo_gym"]
    assert gym["genrm_model"]["responses_api_models"]["vllm_model"]["model"] == "/j"
    assert gym["genrm_model"]["responses_api_models"]["vllm_model"]["spinup_server"] is True
    compare = gym["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"]
    assert compare["num_rollouts_per_prompt"] == 8  # genrm_compare buffers the whole group: must equal the group size
    assert compare["genrm_model_server"] == {"type": "responses_api_models", "name": "genrm_model"}


def test_rlhf_grpo_and_loss_keys_hold_the_step_values():
    compiled = master("rlhf", *RLHF_INPUTS, "grpo.eps_high=0.28", "grpo.kl_beta=0.001", "seed=7").config
    assert compiled["grpo"] == {
        "num_prompts_per_step": 32,
        "num_generations_per_prompt": 16,
        "max_rollout_turns": 1,
        "max_num_epochs": 1_000_000,
        "max_num_steps": 100,
        "normalize_rewards": True,
        "use_leave_one_out_baseline": False,
        "adv_estimator": {
            "name": "grpo",
            "normalize_rewards": True,
            "use_leave_one_out_baseline": False,
            "minus_baseline": True,
        },
        "val_period": 10,
        "val_at_start": False,
        "val_at_end": True,
        "max_val_samples": 64,
        "val_batch_size": 64,
        "val_num_generations_per_prompt": 1,
        "overlong_filtering": False,
        "use_dynamic_sampling": False,
        "seed": 7,
        "async_grpo": {"enabled": False},
    }
    loss = compiled["loss_fn"]
    assert (loss["ratio_clip_min"], loss["ratio_clip_max"], loss["ratio_clip_c"]) == (0.2, 0.28, None)
    assert (loss["reference_policy_kl_penalty"], loss["reference_policy_kl_type"]) == (0.001, "k3")
    assert (loss["kl_input_clamp_value"], loss["kl_output_clamp_value"]) == (20.0, 10.0)
    assert loss["token_level_loss"] is True and loss["disable_ppo_ratio"] is False
    assert loss["use_importance_sampling_correction"] is False and loss["use_kl_in_reward"] is False


def test_policy_data_checkpointing_logger_and_cluster_keys():
    compiled = master("rlhf", *RLHF_INPUTS, "run.dtype=bfloat16", "rollout.sampling.top_k=50").config
    policy = compiled["policy"]
    assert policy["model_name"] == policy["tokenizer"]["name"] == str(RUN / "nemo_rl/policy_hf")
    assert (policy["train_global_batch_size"], policy["train_micro_batch_size"]) == (512, 1)
    assert policy["max_total_sequence_length"] == 1024 + 512 and policy["precision"] == "bfloat16"
    assert policy["dtensor_cfg"]["enabled"] is True and policy["megatron_cfg"] == {"enabled": False}
    assert policy["optimizer"] == {
        "name": "torch.optim.AdamW",
        "kwargs": {"lr": 5e-6, "weight_decay": 0.01, "betas": [0.9, 0.98]},
    }
    generation = policy["generation"]
    assert (generation["backend"], generation["max_new_tokens"], generation["top_k"]) == ("vllm", 512, 50)
    vllm = generation["vllm_cfg"]
    assert vllm["max_model_len"] == 1536 and vllm["precision"] == "bfloat16" and vllm["expose_http_server"] is True
    assert generation["colocated"]["enabled"] is True
    data = compiled["data"]
    assert data["train"] == {"data_path": str(RUN / "nemo_rl/data/train.jsonl")}
    assert data["validation"] == {"data_path": str(RUN / "nemo_rl/data/validation.jsonl")}
    assert data["default"]["dataset_name"] == "NemoGymDataset" and data["default"]["env_name"] == "nemo_gym"
    checkpointing = compiled["checkpointing"]
    assert checkpointing["checkpoint_dir"] == str(RUN / "nemo_rl/checkpoints") and checkpointing["save_period"] == 10
    assert checkpointing["metric_name"] == "val:accuracy" and checkpointing["keep_top_k"] == 2
    assert compiled["logger"]["log_dir"] == str(RUN / "nemo_rl/logs")
    assert compiled["cluster"] == {"gpus_per_node": 8, "num_nodes": 2}


def test_reinforce_is_grpo_with_the_leave_one_out_baseline_no_std_and_the_reinforce_loss():
    compiled = master("reinforce", *REINFORCE_INPUTS, "reinforce.initial_policy_kl_penalty=0.05")
    grpo, loss = compiled.config["grpo"], compiled.config["loss_fn"]
    assert grpo["use_leave_one_out_baseline"] is True and grpo["normalize_rewards"] is False
    assert grpo["adv_estimator"]["use_leave_one_out_baseline"] is True
    assert loss["disable_ppo_ratio"] is True and loss["reference_policy_kl_penalty"] == 0.05
    env = compiled.config["env"]["reward_model"]
    assert env["model_name"] == "/rm" and env["reward_model_cfg"] == {
        "enabled": True,
        "reward_model_type": "bradley_terry",
    }
    assert compiled.config["data"]["default"]["env_name"] == "reward_model"
    assert compiled.config["data"]["validation"] is None and compiled.config["grpo"]["val_period"] == 0
    notes = "\n".join(compiled.notes)
    assert "folds beta * mean_t |logp - logp_init|" in notes and "NeMo-RL adds beta * k3 KL to the loss" in notes
    assert "only properly ended samples" in notes


def test_an_external_judge_is_reached_not_started():
    compiled = master("rlhf", *RLHF_INPUTS, "judge.url=http://judge:8000/v1", "judge.model=genrm")
    server = compiled.config["env"]["nemo_gym"]["genrm_model"]["responses_api_models"]["vllm_model"]
    assert (server["base_url"], server["model"], server["spinup_server"]) == ("http://judge:8000/v1", "genrm", False)
    with pytest.raises(NemoRlConfigError, match="judge.model"):
        master("rlhf", *RLHF_INPUTS, "judge.url=http://judge:8000/v1")


def test_what_nemo_rl_cannot_run_is_refused_with_the_key_to_change():
    with pytest.raises(NemoRlConfigError, match="inputs.reward_model"):
        master("reinforce", "inputs.prompts=/p.jsonl", "inputs.policy=/sft", "rm.url=http://rm:5555")
    with pytest.raises(UsageError, match="embedded engine only"):
        validated("rs", *REINFORCE_INPUTS)


def test_nemo_rl_keys_pass_through_over_the_compiled_ones_and_are_named_in_the_notes():
    compiled = master(
        "rlhf",
        *RLHF_INPUTS,
        "nemo_rl.policy.dtensor_cfg.tensor_parallel_size=2",  # no '+': any key under nemo_rl. is NeMo-RL's to judge
        "nemo_rl.loss_fn.use_on_policy_kl_approximation=true",
        "nemo_rl.grpo.async_grpo.enabled=true",
    )
    assert compiled.config["policy"]["dtensor_cfg"]["tensor_parallel_size"] == 2
    assert compiled.config["policy"]["dtensor_cfg"]["enabled"] is True  # its siblings stay
    assert compiled.config["loss_fn"]["use_on_policy_kl_approximation"] is True
    assert compiled.config["grpo"]["async_grpo"] == {"enabled": True}
    [said] = [note for note in compiled.notes if note.startswith("set as given")]
    assert "policy.dtensor_cfg.tensor_parallel_size" in said and "grpo.async_grpo.enabled" in said
    with pytest.raises(UsageError, match="unknown config key 'nemo_rll.grpo.x'"):
        validated("rlhf", *RLHF_INPUTS, "nemo_rll.grpo.x=1")


def test_the_megatron_backend_moves_optimizer_and_schedule_into_megatron_cfg():
    overrides = ("nemo_rl_job.policy_backend=megatron", "train.schedule=cosine", "train.warmup_steps=5")
    compiled = master("rlhf", *RLHF_INPUTS, *overrides).config["policy"]
    assert compiled["dtensor_cfg"]["enabled"] is False and "optimizer" not in compiled
    megatron = compiled["megatron_cfg"]
    assert megatron["enabled"] is True
    assert megatron["optimizer"]["lr"] == 5e-6 and megatron["optimizer"]["min_lr"] == pytest.approx(5e-7)
    assert (megatron["optimizer"]["adam_beta1"], megatron["optimizer"]["adam_beta2"]) == (0.9, 0.98)
    assert megatron["scheduler"]["lr_decay_style"] == "cosine"
    assert (megatron["scheduler"]["lr_warmup_iters"], megatron["scheduler"]["lr_decay_iters"]) == (5, 100)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_nemo_rls_torch_schedulers_give_rlsteps_learning_rate_at_every_optimizer_step(schedule):
    """The compiled policy.scheduler set up and stepped by NeMo-RL's own DTensor worker code (the pinned source, real
    torch, in a subprocess: tests/nemo_rl_schedule_check.py) against rlsteps's engine.policy.optim.lr_multiplier."""
    from test_nemo_rl_schedule import config, nemo_rl_rates, rlsteps_rates

    cfgs = [config(schedule, warmup) for warmup in (0, 1, 4)]
    compiled = [compile_master_config(cfg, Cluster(1, 8), RUN).config["policy"] for cfg in cfgs]
    for cfg, got in zip(cfgs, nemo_rl_rates(cfgs, policies=compiled), strict=True):
        assert got == pytest.approx(rlsteps_rates(cfg), rel=1e-6), (cfg["train"]["warmup_steps"], got)


def test_the_printed_yaml_reads_back_as_the_compiled_config_with_the_notes_on_top():
    compiled = master("rlhf", *RLHF_INPUTS)
    text = master_config_yaml(compiled)
    assert yaml.safe_load(text) == compiled.config
    assert text.startswith("# NeMo-RL GRPO master config compiled by rlsteps (NeMo-RL v0.7.0")
    assert "#  - grpo.std_floor: NeMo-RL divides by (std + 1e-6)" in text
