import pytest
from omegaconf import OmegaConf

from rlsteps.catalog import load_catalog
from rlsteps.errors import UsageError
from rlsteps.plan.compile import apply_overrides, compile_job, load_config_chain
from rlsteps.plan.profiles import resolve_profile
from rlsteps.secrets import MASK
from rlsteps.tiny.layout import TINY_WORLD_VERSION


@pytest.fixture(scope="module")
def rs():
    return load_catalog().find("rl/rs")


def test_defaults_chain_merges_bases_then_own_keys(tmp_path):
    (tmp_path / "base.yaml").write_text("a: 1\nb: {c: 2, d: 3}\n")
    (tmp_path / "mid.yaml").write_text("defaults: base.yaml\nb: {c: 20}\n")
    (tmp_path / "top.yaml").write_text("defaults: [mid.yaml]\nb: {d: 30}\ne: 5\n")
    cfg = OmegaConf.to_container(load_config_chain(tmp_path / "top.yaml"))
    assert cfg == {"a": 1, "b": {"c": 20, "d": 30}, "e": 5}


def test_defaults_cycle_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: b.yaml\nx: 1\n")
    (tmp_path / "b.yaml").write_text("defaults: a.yaml\ny: 1\n")
    with pytest.raises(UsageError, match="cycle"):
        load_config_chain(tmp_path / "a.yaml")


def test_override_of_unknown_key_names_the_closest():
    cfg = OmegaConf.create({"train": {"lr": 1.0, "max_steps": 3}})
    with pytest.raises(UsageError) as err:
        apply_overrides(cfg, ["train.lrr=2"])
    assert "unknown config key 'train.lrr'" in err.value.message and "train.lr" in err.value.fix


def test_override_with_right_leaf_under_wrong_section_points_at_it():
    cfg = OmegaConf.create({"train": {"micro_batch_size": 1}, "rollout": {}})
    with pytest.raises(UsageError) as err:
        apply_overrides(cfg, ["rollout.micro_batch_size=2"])
    assert "train.micro_batch_size" in err.value.fix


def test_plus_adds_a_key_on_purpose_and_values_are_typed():
    cfg = apply_overrides(OmegaConf.create({"a": {"b": 1}}), ["+a.new=3", "a.b=0.5", "+c=[1,2]"])
    assert OmegaConf.to_container(cfg) == {"a": {"b": 0.5, "new": 3}, "c": [1, 2]}


def test_override_of_a_missing_mandatory_value_is_allowed():
    cfg = apply_overrides(OmegaConf.create({"inputs": {"policy": "???"}}), ["inputs.policy=/x"])
    assert cfg.inputs.policy == "/x"


def test_malformed_override_is_an_error():
    with pytest.raises(UsageError, match="is not key=value"):
        apply_overrides(OmegaConf.create({}), ["=3"])


def test_compile_tiny_resolves_the_tiny_world_paths(rs, tmp_path, monkeypatch):
    monkeypatch.setenv("RLSTEPS_HOME", str(tmp_path))
    job = compile_job(rs, "tiny")
    assert job.config["inputs"]["policy"] == str(tmp_path / "tiny" / f"{TINY_WORLD_VERSION}-seed0" / "policy_megatron")
    assert job.config["algorithm"] == "rs" and job.config["rollout"]["top_n_rollouts"] == 1
    assert job.name.endswith("-rl_rs") and job.mode == "local" and job.executor == "local"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("rollout.top_n_rollouts=99", "rollout.top_n_rollouts (99) exceeds rollout.num_rollouts_per_prompt"),
        ("train.micro_batch_size=-1", "train.micro_batch_size: Input should be greater than 0"),
        ("train.lr=fast", "train.lr: Input should be a valid number"),
        ("train.micro_batch_size=3", "must be a multiple of train.micro_batch_size"),
        ("rollout.sampling.top_p=1.5", "rollout.sampling.top_p"),
        ("run.device=tpu", "run.device"),
        ("+train.bogus=1", "unknown key 'train.bogus'"),
    ],
)
def test_schema_errors_are_one_line_and_name_the_key(rs, override, fragment):
    with pytest.raises(UsageError) as err:
        compile_job(rs, "tiny", overrides=[override])
    assert fragment in err.value.message and "\n" not in err.value.message


def test_mandatory_keys_must_be_given_and_are_named_all_at_once(rs):
    with pytest.raises(UsageError) as refused:
        compile_job(rs, "default")
    assert refused.value.message == "required config keys without a value: inputs.policy, inputs.prompts"
    assert refused.value.fix == "pass inputs.policy=VALUE inputs.prompts=VALUE"
    job = compile_job(rs, "default", allow_unset=True)  # a dry run: they are what the run will need
    assert job.unset_keys == ["inputs.policy", "inputs.prompts"] and job.config["inputs"]["policy"] == "???"


def test_profile_overlay_then_cli_overrides_win(rs, tmp_path):
    profiles = tmp_path / "p.yaml"
    profiles.write_text(
        "profiles:\n  base: {executor: local, config: {train: {lr: 0.5, max_steps: 7}}}\n"
        "  child: {extends: base, config: {train: {lr: 0.25}}}\n"
    )
    profile = resolve_profile("child", [profiles])
    job = compile_job(rs, "tiny", mode="attached", profile=profile, overrides=["train.max_steps=3"])
    assert job.config["train"]["lr"] == 0.25 and job.config["train"]["max_steps"] == 3
    assert job.profile_name == "child" and job.mode == "attached"


def test_secrets_are_masked_in_public_views_and_carried_by_environment(rs):
    job = compile_job(
        rs,
        "tiny",
        overrides=["rm.token=s3cret", "rm.url=http://127.0.0.1:1"],
        argv=["rlsteps", "run", "rs", "rm.token=s3cret"],
    )
    assert job.public_config()["rm"]["token"] == MASK
    assert "s3cret" not in str(job.public_argv()) and "s3cret" not in str(job.worker_config())
    assert job.worker_config()["rm"]["token"] == "${oc.env:RLSTEPS_SECRET_RM_TOKEN}"
    assert job.secret_env() == {"RLSTEPS_SECRET_RM_TOKEN": "s3cret"}
    assert job.public_config()["rollout"]["sampling"]["max_new_tokens"] == 32  # not a secret


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("train.learning_rate=1e-5", "train.lr"),  # by spelling alone: train.min_lr_ratio
        ("rollout.num_generations=8", "rollout.num_rollouts_per_prompt"),
        ("max_completion_length=64", "rollout.sampling.max_new_tokens"),
        ("beta=0.1", "reinforce.initial_policy_kl_penalty"),  # no grpo section here: the key rl/reinforce has
        ("train.max_step=4", "train.max_steps"),  # not a counterpart's name: the closest spelling
    ],
)
def test_an_unknown_key_from_trl_or_nemo_rl_is_pointed_to_its_name_here(override, hint):
    step = load_catalog().find("rl/reinforce")
    with pytest.raises(UsageError) as refused:
        compile_job(step, "tiny", overrides=[override])
    assert refused.value.fix == f"did you mean '{hint}'?"


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("pretrained_checkpoint.restore_from_path=/ckpt/sft.nemo", "inputs.policy"),
        ("model.rs.num_rollouts_per_prompt=8", "rollout.num_rollouts_per_prompt"),
        ("model.rs.top_n_rollouts=2", "rollout.top_n_rollouts"),
        ("remote_rm.host=rm-node", "rm.url"),
        ("remote_rm.port=5555", "rm.url"),
        ("remote_rm.reward_model.name=reward_model", "rm.model"),
        ("trainer.rs.max_steps=10", "train.max_steps"),
        ("trainer.rs.val_check_interval=5", "validation.interval"),
        ("trainer.rs.gradient_clip_val=0.5", "train.max_grad_norm"),  # by spelling alone: train.max_steps
        ("trainer.rs.save_interval=5", "checkpoint.interval"),
    ],
)
def test_nemo_aligners_override_names_are_pointed_to_their_names_here(rs, override, hint):
    with pytest.raises(UsageError) as refused:
        compile_job(rs, "tiny", overrides=[override])
    url = " (host and port are one URL here: rm.url=http://HOST:PORT)" if hint == "rm.url" else ""
    assert refused.value.fix == f"did you mean '{hint}'?{url}"


def test_an_unknown_key_suggests_adding_it_only_where_the_schema_takes_new_keys(rs):
    with pytest.raises(UsageError) as section:
        compile_job(rs, "tiny", overrides=["train.lrr=1"])
    assert section.value.fix == "did you mean 'train.lr'?"  # +train.lrr would be refused by the schema
    with pytest.raises(UsageError) as inputs:
        compile_job(rs, "tiny", overrides=["inputs.extra_prompts=x.jsonl"])
    assert "(use +inputs.extra_prompts=... to add a new input)" in inputs.value.fix
    job = compile_job(rs, "tiny", overrides=["+inputs.extra_prompts=x.jsonl"])
    assert job.config["inputs"]["extra_prompts"] == "x.jsonl"


def test_a_key_the_schema_has_but_the_config_files_leave_out_is_an_override():
    """train.compile and train.lora.dim sit at their defaults in every shipped config: an override sets them; a key
    neither the config nor the schema has is still refused with the closest key."""
    from rlsteps.contract.config import STEP_SCHEMAS

    cfg = OmegaConf.create({"train": {"lr": 1.0}})
    merged = apply_overrides(cfg, ["train.compile=true", "train.lora.dim=4"], STEP_SCHEMAS["grpo"])
    assert merged.train.compile is True and merged.train.lora.dim == 4
    with pytest.raises(UsageError, match="unknown config key 'train.compiled'"):
        apply_overrides(cfg, ["train.compiled=true"], STEP_SCHEMAS["grpo"])
    with pytest.raises(UsageError, match="unknown config key 'train.compile'"):
        apply_overrides(cfg, ["train.compile=true"])  # no schema: the config's own keys only
