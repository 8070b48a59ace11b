"""rl/rlhf's and rl/reinforce's configs compiled to NeMo-RL's GRPO master config: every shared key holding the
step's value, and the schedule as NeMo-RL's worker builds it (NeMo-RL's own code runs a step of each compiled
config in tests/test_nemo_rl_runs.py)."""

from pathlib import PurePosixPath

import pytest
import yaml

from rlsteps.catalog import load_catalog
from rlsteps.contract.config import STEP_SCHEMAS
from rlsteps.errors import UsageError
from rlsteps.launch.ray_job import master_config_yaml
from rlsteps.nemo_rl.key_map import get, pairs
from rlsteps.nemo_rl.master_config import Cluster, NemoRlConfigError, compile_master_config
from rlsteps.nemo_rl.schedule import megatron_scheduler
from rlsteps.plan.compile import compile_job

RUN = PurePosixPath("/lustre/runs/rlhf")
RLHF_INPUTS = ("inputs.prompts=/p.jsonl", "inputs.val_prompts=/v.jsonl", "inputs.policy=/sft", "inputs.judge_model=/j")
REINFORCE_INPUTS = ("inputs.prompts=/p.jsonl", "inputs.policy=/sft", "inputs.reward_model=/rm")


def validated(step: str, *overrides: str, config: str = "default") -> dict:
    job = compile_job(load_catalog().find(step), config, overrides=["engine=nemo_rl", *overrides])
    return STEP_SCHEMAS[job.algorithm].model_validate(job.config).model_dump(mode="json")


def master(step: str, *overrides: str, cluster=Cluster(2, 8)):
    return compile_master_config(validated(step, *overrides), cluster, RUN)


@pytest.mark.parametrize("step", ["rl/rlhf", "rl/reinforce"])
def test_every_shared_key_holds_the_steps_value(step):
    cfg = validated(step, *(RLHF_INPUTS if step == "rl/rlhf" else REINFORCE_INPUTS))
    compiled = compile_master_config(cfg, Cluster(2, 8), RUN).config
    for ours, theirs in pairs(cfg["algorithm"]):
        assert get(compiled, theirs) == get(cfg, ours), (ours, theirs)


def test_reinforce_is_grpo_with_the_leave_one_out_baseline_no_std_and_the_reinforce_loss():
    compiled = master("rl/reinforce", *REINFORCE_INPUTS).config
    assert compiled["grpo"]["use_leave_one_out_baseline"] is True and compiled["grpo"]["normalize_rewards"] is False
    assert compiled["grpo"]["adv_estimator"]["use_leave_one_out_baseline"] is True  # its interpolation follows
    assert compiled["loss_fn"]["disable_ppo_ratio"] is True
    assert (
        compiled["env"]["reward_model"]["model_name"] == "/rm" == compiled["env"]["reward_model"]["tokenizer"]["name"]
    )
    assert compiled["data"]["default"]["env_name"] == "reward_model"


@pytest.mark.parametrize("step, inputs, term", [("rl/reinforce", REINFORCE_INPUTS, "reward_model"),
                                                ("rl/rlhf", RLHF_INPUTS, "judge")])  # fmt: skip
def test_a_reward_terms_clip_and_scale_are_nemo_rls_reward_scaling(step, inputs, term):
    plain = master(step, *inputs).config["grpo"]["reward_scaling"]
    assert plain["enabled"] is False
    scaled = master(step, *inputs, f"rewards.{term}.clip=[-2,4]", f"rewards.{term}.scale=0.5").config
    assert scaled["grpo"]["reward_scaling"] == {
        "enabled": True, "source_min": -2.0, "source_max": 4.0, "target_min": -1.0, "target_max": 2.0,
    }  # fmt: skip
    clipped = master(step, *inputs, f"rewards.{term}.clip=[0,1]").config["grpo"]["reward_scaling"]
    assert clipped == {"enabled": True, "source_min": 0.0, "source_max": 1.0, "target_min": 0.0, "target_max": 1.0}
    with pytest.raises(NemoRlConfigError, match=f"rewards.{term}.scale without a clip") as refused:
        master(step, *inputs, f"rewards.{term}.scale=2")
    assert refused.value.fix == f"rewards.{term}.clip=[LOW,HIGH] (the rewards' range)"


def test_a_judge_already_served_is_refused_on_nemo_rl_with_the_reason():
    """The pinned Gym's genrm_compare.yaml declares a genrm_model server that starts vLLM: a vllm_model server beside
    it in that instance is what NeMo-Gym refuses (one server type per instance)."""
    with pytest.raises(NemoRlConfigError, match="second server type beside it is refused"):
        master("rl/rlhf", *RLHF_INPUTS, "judge.url=http://judge:8000/v1", "judge.model=genrm")


def test_what_nemo_rl_cannot_run_is_refused_with_the_key_to_change():
    with pytest.raises(NemoRlConfigError, match="inputs.reward_model"):
        master("rl/reinforce", "inputs.prompts=/p.jsonl", "inputs.policy=/sft", "rm.url=http://rm:5555")
    with pytest.raises(UsageError, match="embedded engine only"):
        validated("rl/rs", *REINFORCE_INPUTS)


def test_nemo_rl_keys_pass_through_over_the_compiled_ones_and_are_named_in_the_notes():
    compiled = master(
        "rl/rlhf",
        *RLHF_INPUTS,
        "nemo_rl.policy.dtensor_cfg.tensor_parallel_size=2",  # no '+': any key under nemo_rl. is NeMo-RL's to judge
        "nemo_rl.loss_fn.use_on_policy_kl_approximation=true",
        "nemo_rl.grpo.async_grpo.max_trajectory_age_steps=2",
    )
    assert compiled.config["policy"]["dtensor_cfg"]["tensor_parallel_size"] == 2
    assert compiled.config["policy"]["dtensor_cfg"]["enabled"] is True  # its siblings stay
    assert compiled.config["loss_fn"]["use_on_policy_kl_approximation"] is True
    assert compiled.config["grpo"]["async_grpo"]["max_trajectory_age_steps"] == 2
    [said] = [note for note in compiled.notes if note.startswith("set as given")]
    assert "policy.dtensor_cfg.tensor_parallel_size" in said and "grpo.async_grpo.max_trajectory_age_steps" in said
    with pytest.raises(UsageError, match="unknown config key 'nemo_rll.grpo.x'"):
        validated("rl/rlhf", *RLHF_INPUTS, "nemo_rll.grpo.x=1")
    with pytest.raises(UsageError, match="did you mean 'nemo_rl.grpo.max_num_steps'"):
        validated("rl/rlhf", *RLHF_INPUTS, "nemo_rl.grpo.max_num_step=1")


def test_the_megatron_backend_moves_optimizer_and_schedule_into_megatron_cfg():
    overrides = ("nemo_rl_job.policy_backend=megatron", "train.schedule=cosine", "train.warmup_steps=5")
    cfg = validated("rl/rlhf", *RLHF_INPUTS, *overrides)
    compiled = compile_master_config(cfg, Cluster(2, 8), RUN).config["policy"]
    assert compiled["dtensor_cfg"]["enabled"] is False and compiled["optimizer"] is None
    megatron = compiled["megatron_cfg"]
    assert megatron["enabled"] is True
    assert megatron["optimizer"]["lr"] == 5e-6 and megatron["optimizer"]["min_lr"] == pytest.approx(5e-7)
    assert (megatron["optimizer"]["adam_beta1"], megatron["optimizer"]["adam_beta2"]) == (0.9, 0.98)
    assert megatron["scheduler"] == {**megatron["scheduler"], **megatron_scheduler(cfg)}


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
@pytest.mark.slow  # NeMo-RL's schedulers, in a process of their own
def test_nemo_rls_torch_schedulers_give_rlsteps_learning_rate_at_every_optimizer_step(schedule):
    """The compiled policy.scheduler set up and stepped by NeMo-RL's own DTensor worker code (the pinned source, real
    torch, in a subprocess: tests/nemo_rl_schedule_check.py) against rlsteps's engine.policy.optim.lr_multiplier."""
    from test_nemo_rl_schedule import config, nemo_rl_rates, rlsteps_rates

    cfgs = [config(schedule, warmup) for warmup in (0, 1, 4)]
    compiled = [compile_master_config(cfg, Cluster(2, 8), RUN).config["policy"] for cfg in cfgs]
    for cfg, got in zip(cfgs, nemo_rl_rates(cfgs, policies=compiled), strict=True):
        assert got == pytest.approx(rlsteps_rates(cfg), rel=1e-6), (cfg["train"]["warmup_steps"], got)


def test_the_printed_yaml_reads_back_as_the_compiled_config_with_the_notes_on_top():
    compiled = master("rl/rlhf", *RLHF_INPUTS)
    text = master_config_yaml(compiled)
    assert yaml.safe_load(text) == compiled.config
    assert text.startswith("# NeMo-RL GRPO master config compiled by rlsteps (NeMo-RL v0.7.0")
    assert "#  - grpo.std_floor: NeMo-RL divides by (std + 1e-6)" in text


def test_overlong_filtering_and_dynamic_sampling_print_both_meanings():
    """Each compiles to NeMo-RL's key of the same name, which means something else: the printed config says both."""
    plain = master_config_yaml(master("rl/rlhf", *RLHF_INPUTS))
    assert "grpo.overlong_filtering:" not in plain and "grpo.dynamic_sampling:" not in plain
    text = master_config_yaml(
        master("rl/rlhf", *RLHF_INPUTS, "grpo.overlong_filtering=true", "grpo.dynamic_sampling=true")
    )
    assert "#  - grpo.overlong_filtering: rlsteps leaves a truncated sample out of its group's baseline" in text
    assert "only zeroes its loss" in text
    assert "#  - grpo.dynamic_sampling: both engines sample more prompts until the batch is full" in text
    assert "NeMo-RL those of all its rows" in text


def test_a_kl_under_top_k_or_top_p_prints_no_difference():
    """Both engines' KL reads the policy's log-probs without the filters (tests/test_oracle_filtered_kl.py): no note."""
    filtered = master_config_yaml(master("rl/rlhf", *RLHF_INPUTS, "rollout.sampling.top_p=0.9", "grpo.kl_beta=0.05"))
    assert "top-k/top-p" not in filtered and "#  - grpo.kl_beta" not in filtered


def test_train_lora_compiles_into_nemo_rls_lora_cfg_on_its_dtensor_v2_worker():
    lora = ("train.lora.enabled=true", "train.lora.dim=16", "train.lora.alpha=64", "train.lora.dropout=0.05")
    named = master("rl/rlhf", *RLHF_INPUTS, *lora, "train.lora.target_modules=[q_proj,v_proj]").config
    dtensor = named["policy"]["dtensor_cfg"]
    assert dtensor["_v2"] is True
    assert {k: dtensor["lora_cfg"][k] for k in ("enabled", "dim", "alpha", "dropout", "dropout_position")} == {
        "enabled": True, "dim": 16, "alpha": 64, "dropout": 0.05, "dropout_position": "pre"
    }  # fmt: skip
    # Automodel matches whole dotted names with wildcards; peft matches a name's end
    assert dtensor["lora_cfg"]["target_modules"] == ["*.q_proj", "*.v_proj"]
    assert dtensor["lora_cfg"]["match_all_linear"] is False and dtensor["lora_cfg"]["exclude_modules"] == []
    every = master("rl/reinforce", *REINFORCE_INPUTS, "train.lora.enabled=true")
    lora_cfg = every.config["policy"]["dtensor_cfg"]["lora_cfg"]  # every linear layer but the output layer, as peft
    assert (lora_cfg["target_modules"], lora_cfg["exclude_modules"], lora_cfg["match_all_linear"]) == (
        [], ["*lm_head"], False
    )  # fmt: skip
    assert any(note.startswith("train.lora: NeMo-RL draws") for note in every.notes)
    off = master("rl/rlhf", *RLHF_INPUTS).config["policy"]["dtensor_cfg"]["lora_cfg"]
    assert off["enabled"] is False and off["match_all_linear"] is True  # the shipped template's, untouched


def test_the_adapters_own_rate_is_nemo_rls_one_optimizer_rate_and_its_schedules():
    """train.lora.lr, where LoRA trains, is the rate NeMo-RL's optimizer and its schedule's floor take; without LoRA,
    or unset, train.lr is."""
    rate = ("train.lr=2e-6", "train.lora.lr=7e-4", "train.schedule=cosine", "train.min_lr_ratio=0.1")
    adapted = master("rl/reinforce", *REINFORCE_INPUTS, *rate, "train.lora.enabled=true").config["policy"]
    assert adapted["optimizer"]["kwargs"]["lr"] == 7e-4
    decay = next(s for s in adapted["scheduler"] if s.get("name", "").endswith("CosineAnnealingLR"))
    assert decay["kwargs"]["eta_min"] == pytest.approx(7e-5)
    whole = master("rl/reinforce", *REINFORCE_INPUTS, *rate).config["policy"]  # LoRA off: the adapters' rate unused
    assert whole["optimizer"]["kwargs"]["lr"] == 2e-6


def test_what_nemo_rls_lora_cannot_run_is_refused_or_set_with_a_note():
    with pytest.raises(NemoRlConfigError, match="DTensor policy, not its Megatron one") as refused:
        master("rl/rlhf", *RLHF_INPUTS, "train.lora.enabled=true", "nemo_rl_job.policy_backend=megatron")
    assert refused.value.fix == "nemo_rl_job.policy_backend=dtensor"
    with pytest.raises(NemoRlConfigError, match="DTensor v2 worker only") as v1:
        master("rl/rlhf", *RLHF_INPUTS, "train.lora.enabled=true", "nemo_rl.policy.dtensor_cfg._v2=false")
    assert v1.value.fix == "nemo_rl.policy.dtensor_cfg._v2=true"
    split = master(
        "rl/rlhf", *RLHF_INPUTS, "train.lora.enabled=true", "nemo_rl.policy.dtensor_cfg.tensor_parallel_size=2"
    )
    assert split.config["policy"]["dtensor_cfg"]["lora_cfg"]["use_triton"] is False
    assert any("use_triton false" in note for note in split.notes)


def test_rl_nemo_rl_rlhfs_lora_cfg_runs_as_train_lora_on_the_embedded_engine():
    from rlsteps.nemo_rl.embedded import to_embedded

    base = compile_job(load_catalog().find("rl/rlhf"), "tiny").config
    seed = {"policy": {"dtensor_cfg": {"lora_cfg": {"enabled": True, "dim": 4, "alpha": 16, "dropout": 0.0,
            "target_modules": ["*.q_proj", "*.v_proj"], "exclude_modules": [], "match_all_linear": False}},
            "optimizer": {"kwargs": {"lr": 2.0e-4}}},
            "grpo": {"max_num_epochs": 1, "val_period": 0}, "checkpointing": {"save_period": 1},
            "output": {"dir": "/run"}}  # fmt: skip
    recipe, notes = to_embedded(seed, base, ["policy.dtensor_cfg.lora_cfg.enabled"])
    assert recipe["train"]["lora"] == {"enabled": True, "dim": 4, "alpha": 16, "dropout": 0.0,
                                       "target_modules": ["q_proj", "v_proj"], "lr": None}  # fmt: skip
    # NeMo-RL's one optimizer rate moves the adapters: train.lr, not the tiny base's train.lora.lr
    assert recipe["train"]["lr"] == 2.0e-4
    assert not [note for note in notes if "lora_cfg" in note]
    seed["policy"]["dtensor_cfg"]["lora_cfg"].update(target_modules=[], match_all_linear=True)
    recipe, notes = to_embedded(seed, base, [])
    assert recipe["train"]["lora"]["target_modules"] == [] and any("match_all_linear" in note for note in notes)


def test_batching_by_tokens_compiles_to_one_of_nemo_rls_two_ways():
    # packing by default, as in NeMo-RL's GRPO configs; dynamic batching asked for turns it off, as NeMo-RL's policy
    # asserts the two exclusive ("Dynamic Batching is exclusive of Sequence Packing")
    for step, inputs in (("rl/rlhf", RLHF_INPUTS), ("rl/reinforce", REINFORCE_INPUTS)):
        policy = master(step, *inputs).config["policy"]
        assert policy["sequence_packing"]["enabled"] is True and policy["dynamic_batching"]["enabled"] is False
        policy = master(step, *inputs, "train.dynamic_batching=true").config["policy"]
        assert policy["sequence_packing"]["enabled"] is False and policy["dynamic_batching"]["enabled"] is True
    with pytest.raises(UsageError, match="two ways to batch by tokens"):
        validated("rl/rlhf", *RLHF_INPUTS, "train.dynamic_batching=true", "train.sequence_packing=true")


def test_context_parallelism_takes_the_batching_each_nemo_rl_policy_needs_or_is_refused_with_it():
    """NeMo-RL's DTensor workers refuse sequence packing with context parallelism; its Megatron setup asserts it
    (tests/test_nemo_rl_runs.py runs both refused configs through NeMo-RL's own worker checks). DTensor's model setup
    (Automodel's, not run off a GPU) refuses it beside tensor and sequence parallelism."""
    cp2 = "nemo_rl.policy.dtensor_cfg.context_parallel_size=2"
    with pytest.raises(NemoRlConfigError, match="DTensor workers stop") as packed:
        master("rl/rlhf", *RLHF_INPUTS, cp2)
    assert packed.value.fix == "train.sequence_packing=false"
    unpacked = master("rl/rlhf", *RLHF_INPUTS, cp2, "train.dynamic_batching=true").config["policy"]
    assert unpacked["dtensor_cfg"]["context_parallel_size"] == 2 and not unpacked["sequence_packing"]["enabled"]
    megatron = ("nemo_rl_job.policy_backend=megatron", "nemo_rl.policy.megatron_cfg.context_parallel_size=2")
    with pytest.raises(NemoRlConfigError, match="needs sequence packing") as batched:
        master("rl/reinforce", *REINFORCE_INPUTS, *megatron, "train.dynamic_batching=true")
    assert batched.value.fix == "train.sequence_packing=true train.dynamic_batching=false"
    assert master("rl/reinforce", *REINFORCE_INPUTS, *megatron).config["policy"]["sequence_packing"]["enabled"]
    parallel = (cp2, "nemo_rl.policy.dtensor_cfg.tensor_parallel_size=2", "train.sequence_packing=false")
    with pytest.raises(NemoRlConfigError, match="together with sequence parallel") as sequence_parallel:
        master("rl/rlhf", *RLHF_INPUTS, *parallel, "nemo_rl.policy.dtensor_cfg.sequence_parallel=true")
    assert sequence_parallel.value.fix == "nemo_rl.policy.dtensor_cfg.sequence_parallel=false"
    assert master("rl/rlhf", *RLHF_INPUTS, *parallel).config["policy"]["dtensor_cfg"]["sequence_parallel"] is False


def test_a_refusal_of_nemo_rls_own_keys_says_the_fix_in_them():
    seed = validated("rl/nemo_rl/rlhf", "data.train.data_path=/p.jsonl", "policy.model_name=/sft",
                     "policy.dtensor_cfg.context_parallel_size=2")  # fmt: skip
    with pytest.raises(NemoRlConfigError) as refused:
        compile_master_config(seed, Cluster(2, 8), RUN)
    assert refused.value.fix == "policy.sequence_packing.enabled=false"


def test_the_runs_trackers_compile_to_nemo_rls_logger():
    """TensorBoard, W&B and MLflow as NeMo-RL's LoggerConfig has them (its tensorboard_enabled, mlflow_enabled and
    mlflow section), none dropped without a word."""
    trackers = (
        "logging.tensorboard=true",
        "logging.mlflow_experiment=rl",
        "logging.mlflow_tracking_uri=sqlite:///m.db",
    )
    logger = master("rl/rlhf", *RLHF_INPUTS, *trackers).config["logger"]
    assert logger["tensorboard_enabled"] is True and logger["mlflow_enabled"] is True
    assert logger["mlflow"]["experiment_name"] == "rl" and logger["mlflow"]["tracking_uri"] == "sqlite:///m.db"
    plain = master("rl/rlhf", *RLHF_INPUTS).config["logger"]
    assert (plain["tensorboard_enabled"], plain["mlflow_enabled"], plain["wandb_enabled"]) == (False, False, False)


def test_a_function_reward_on_nemo_rl_is_refused_with_the_keys_that_fix_it():
    with pytest.raises(UsageError, match=r"fix: engine=embedded, or rewards\.short=null\)"):
        validated(
            "rl/reinforce", *REINFORCE_INPUTS, "rewards.short.function=rlsteps.engine.rewards.verifiable:one_word"
        )
    validated("rl/reinforce", *REINFORCE_INPUTS, "rewards.short.function=m:f", "rewards.short=null")  # the fix runs
