import pytest

from rlsteps.catalog import load_catalog, project_root
from rlsteps.errors import UsageError


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_every_manifest_loads_with_known_types_unique_ids_and_existing_configs(catalog):
    assert {"rl/rs", "rl/reinforce", "rl/rlhf"} <= set(catalog.steps)
    for step in catalog.steps.values():
        assert step.consumes and step.produces
        for spec in step.consumes + step.produces:
            assert spec.type in catalog.types
        for name in step.configs:
            assert step.config_path(name).is_file()
        assert {"default", "tiny"} <= set(step.configs)
        assert step.resources.get("launch") and "gpus_per_node" in step.resources


def test_type_graph_follows_is_a_transitively(catalog):
    assert not catalog.is_a("reward_model_hf", "checkpoint_hf")  # a reward model is never a policy
    assert not catalog.is_a("reward_model_hf", "checkpoint")
    assert catalog.is_a("checkpoint_megatron", "checkpoint")
    assert not catalog.is_a("checkpoint_hf", "reward_model_hf")
    assert catalog.subtypes("checkpoint")[0] == "checkpoint"
    assert ("checkpoint_megatron", "convert/hf_to_megatron") in catalog.types["checkpoint_hf"].convert_to


def test_find_by_full_id_and_unique_suffix(catalog):
    assert catalog.find("rl/rs").id == "rl/rs"
    assert catalog.find("rs").id == "rl/rs"
    assert catalog.find("reinforce").id == "rl/reinforce"


def test_unknown_step_suggests_the_closest(catalog):
    with pytest.raises(UsageError) as err:
        catalog.find("rl/reinforc")
    assert "rl/reinforce" in err.value.fix


def test_filters(catalog):
    assert [s.id for s in catalog.filter(tag="grpo")] == ["rl/nemo_rl/rlhf", "rl/rlhf"]
    assert {s.id for s in catalog.filter(consumes="reward_model_hf")} == {"rl/rs", "rl/reinforce", "rl/rlhf"}
    assert {s.id for s in catalog.filter(produces="checkpoint_megatron")} == {
        "rl/rs",
        "rl/reinforce",
        "rl/rlhf",
        "rl/nemo_rl/rlhf",
        "convert/hf_to_megatron",
    }
    assert {s.id for s in catalog.filter(produces="checkpoint_hf")} == {"convert/megatron_to_hf"}
    assert {s.id for s in catalog.filter(consumes="checkpoint_megatron")} == {
        "convert/megatron_to_hf",
        "rl/nemo_rl/rlhf",
    }


def test_a_suffix_shared_by_several_steps_means_the_shallowest():
    catalog = load_catalog()
    assert catalog.find("rlhf").id == "rl/rlhf" and catalog.find("nemo_rl/rlhf").id == "rl/nemo_rl/rlhf"


def _write_root(tmp_path, types, step):
    (tmp_path / "manifests" / "x").mkdir(parents=True)
    (tmp_path / "steps" / "x" / "a").mkdir(parents=True)
    (tmp_path / "manifests" / "types.toml").write_text(types)
    (tmp_path / "manifests" / "x" / "a.toml").write_text(step)
    return tmp_path


STEP = """[step]
id = "x/a"
name = "a"
category = "x"
description = "d"
algorithm = "rs"
configs = ["default"]
[[consumes]]
name = "p"
type = "{type}"
key = "inputs.prompts"
[[produces]]
name = "o"
type = "prompt_jsonl"
key = "output.dir"
"""


def test_unknown_artifact_type_in_a_manifest_is_an_error(tmp_path):
    root = _write_root(tmp_path, '[types.prompt_jsonl]\ndescription = "p"\n', STEP.format(type="nope"))
    (root / "steps" / "x" / "a" / "default.yaml").write_text("a: 1\n")
    with pytest.raises(UsageError, match="unknown artifact type 'nope'"):
        load_catalog(root)


def test_missing_config_file_is_an_error(tmp_path):
    root = _write_root(tmp_path, '[types.prompt_jsonl]\ndescription = "p"\n', STEP.format(type="prompt_jsonl"))
    with pytest.raises(UsageError, match="config 'default' not found"):
        load_catalog(root)


def test_duplicate_ids_are_an_error(tmp_path):
    root = _write_root(tmp_path, '[types.prompt_jsonl]\ndescription = "p"\n', STEP.format(type="prompt_jsonl"))
    (root / "steps" / "x" / "a" / "default.yaml").write_text("a: 1\n")
    (root / "manifests" / "x" / "b.toml").write_text(STEP.format(type="prompt_jsonl"))
    with pytest.raises(UsageError, match="duplicate step id 'x/a'"):
        load_catalog(root)


def test_project_root_honours_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSTEPS_ROOT", str(tmp_path))
    assert project_root() == tmp_path.resolve()
