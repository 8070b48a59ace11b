import os

import pytest

from rlsteps.catalog import catalog_roots, load_catalog
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
    assert {s.id for s in catalog.filter(consumes="reward_model_hf")} == {
        "rl/rs",
        "rl/reinforce",
        "rl/rlhf",
        "eval/policy",
    }
    assert {s.id for s in catalog.filter(produces="checkpoint_megatron")} == {
        "rl/rs",
        "rl/reinforce",
        "rl/rlhf",
        "rl/nemo_rl/rlhf",
        "convert/hf_to_megatron",
    }
    assert {s.id for s in catalog.filter(produces="checkpoint_hf")} == {"convert/megatron_to_hf"}
    # a step that consumes any checkpoint (or any prompts) takes a checkpoint_megatron (a prompt JSONL file)
    assert {s.id for s in catalog.filter(consumes="checkpoint_megatron")} == {
        "convert/megatron_to_hf",
        "rl/nemo_rl/rlhf",
        "rl/rs",
        "rl/reinforce",
        "rl/rlhf",
        "eval/policy",
    }
    assert {"rl/rs", "rl/reinforce", "rl/rlhf", "rl/nemo_rl/rlhf"} <= {
        s.id for s in catalog.filter(consumes="prompt_jsonl")
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


def test_rlsteps_root_replaces_the_shipped_catalog(tmp_path, monkeypatch):
    root = _write_root(tmp_path, '[types.prompt_jsonl]\ndescription = "p"\n', STEP.format(type="prompt_jsonl"))
    (root / "steps" / "x" / "a" / "default.yaml").write_text("a: 1\n")
    monkeypatch.setenv("RLSTEPS_ROOT", str(root))
    assert catalog_roots() == [root.resolve()] and set(load_catalog().steps) == {"x/a"}


def _user_folder(folder, step_id, name):
    """A users' step folder: one manifest (types from the shipped catalog) and its default config."""
    (folder / "manifests" / step_id).parent.mkdir(parents=True, exist_ok=True)
    (folder / "steps" / step_id).mkdir(parents=True, exist_ok=True)
    manifest = STEP.replace('id = "x/a"', f'id = "{step_id}"').replace('name = "a"', f'name = "{name}"')
    (folder / "manifests" / f"{step_id}.toml").write_text(manifest.format(type="prompt_jsonl"))
    (folder / "steps" / step_id / "default.yaml").write_text("a: 1\n")
    return folder


def test_users_steps_come_first_from_the_project_then_rlsteps_path_in_order_then_the_shipped(tmp_path, monkeypatch):
    """Like PATH: the first folder to define an id wins; the shipped catalog's other steps stay."""
    project, first, second = tmp_path / "project", tmp_path / "first", tmp_path / "second"
    _user_folder(project, "mine/a", "from the project")
    _user_folder(first, "mine/a", "from the first path folder")
    _user_folder(first, "mine/b", "from the first path folder")
    _user_folder(second, "mine/b", "from the second path folder")
    _user_folder(second, "rl/rs", "my own rejection sampling")
    monkeypatch.setenv("RLSTEPS_PATH", os.pathsep.join([str(first), str(second)]))
    monkeypatch.chdir(project)
    catalog = load_catalog()
    assert catalog.find("mine/a").name == "from the first path folder"  # no rlsteps.yaml: not a project folder
    (project / "rlsteps.yaml").write_text("profiles: {}\n")
    catalog = load_catalog()
    assert catalog.roots[:3] == (project.resolve(), first.resolve(), second.resolve())
    assert catalog.find("mine/a").name == "from the project"
    assert catalog.find("mine/b").name == "from the first path folder"
    assert catalog.find("rl/rs").name == "my own rejection sampling"
    assert catalog.find("rl/rs").config_path("default") == second.resolve() / "steps" / "rl" / "rs" / "default.yaml"
    assert catalog.find("rl/reinforce").manifest_path.is_relative_to(catalog.roots[-1])  # the shipped one


def test_a_path_folder_without_manifests_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSTEPS_PATH", str(tmp_path / "nothing"))
    with pytest.raises(UsageError, match="has no manifests/ folder") as refused:
        load_catalog()
    assert "steps/" in refused.value.fix


GOOD_TYPES = '[types.prompt_jsonl]\ndescription = "p"\n'
BROKEN_MANIFESTS = {  # what is wrong with manifests/x/a.toml -> the words of its one-line refusal
    "an unknown key in [[consumes]]": (
        STEP.format(type="prompt_jsonl").replace('key = "inputs.prompts"', 'key = "inputs.prompts"\nrequird = true'),
        "unknown key 'consumes[0].requird' (did you mean 'required'?)",
    ),
    "a misspelt key in [step]": (
        STEP.format(type="prompt_jsonl").replace('category = "x"', 'category = "x"\ndescripton = "d2"'),
        "unknown key 'step.descripton' (did you mean 'description'?)",
    ),
    "a description that is a number": (
        STEP.format(type="prompt_jsonl").replace('description = "d"', "description = 3"),
        "'step.description': input should be a valid string, got 3",
    ),
    "a top-level consumes that is a string": (
        'consumes = "prompts"\n' + STEP.format(type="prompt_jsonl").split("[[consumes]]")[0],
        "'consumes': input should be a valid list, got 'prompts'",
    ),
    "a non-UTF-8 byte": (STEP.format(type="prompt_jsonl").replace("d", "d\xe9"), "not UTF-8 text"),
    "no [step] table": ('[[consumes]]\nname = "p"\ntype = "prompt_jsonl"\nkey = "k"\n', "'step' is missing"),
}


@pytest.mark.parametrize("case", list(BROKEN_MANIFESTS))
def test_a_broken_manifest_is_refused_in_one_line_naming_the_file_and_the_key(tmp_path, case):
    text, words = BROKEN_MANIFESTS[case]
    root = _write_root(tmp_path, GOOD_TYPES, "")
    (root / "steps" / "x" / "a" / "default.yaml").write_text("a: 1\n")
    manifest = root / "manifests" / "x" / "a.toml"
    manifest.write_bytes(text.encode("latin-1") if case == "a non-UTF-8 byte" else text.encode())
    with pytest.raises(UsageError) as refused:
        load_catalog(root)
    assert str(refused.value).startswith(f"{manifest}: ") and words in str(refused.value), str(refused.value)
    assert "\n" not in refused.value.message


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_special_file_named_toml_is_refused_without_blocking(tmp_path, kind):
    root = _write_root(tmp_path, GOOD_TYPES, STEP.format(type="prompt_jsonl"))
    (root / "steps" / "x" / "a" / "default.yaml").write_text("a: 1\n")
    special = root / "manifests" / "x" / "b.toml"
    os.mkfifo(special) if kind == "fifo" else special.mkdir()
    with pytest.raises(UsageError, match=r"b\.toml: (not a regular file|a folder), not a TOML file"):
        load_catalog(root)


def test_a_broken_types_file_is_refused_naming_the_type_and_key(tmp_path):
    root = _write_root(tmp_path, '[types.prompt_jsonl]\ndescription = "p"\nis_a = "checkpoint"\n', "")
    (root / "manifests" / "x" / "a.toml").unlink()
    with pytest.raises(UsageError, match=r"types\.toml: 'types\.prompt_jsonl\.is_a': input should be a valid list"):
        load_catalog(root)
