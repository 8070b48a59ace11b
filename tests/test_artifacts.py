import json

import pytest

from rlsteps.artifacts.detect import detect_types
from rlsteps.artifacts.inputs import check_input, raise_for, resolve_inputs
from rlsteps.catalog import load_catalog
from rlsteps.errors import ArtifactError

EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"  # a whole safetensors file that holds no tensor


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def _hf_dir(path, architecture, **config):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [architecture], **config}))
    (path / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
    return path


def test_detects_each_kind(catalog, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    lm = _hf_dir(tmp_path / "lm", "LlamaForCausalLM")
    rm = _hf_dir(tmp_path / "rm", "LlamaForSequenceClassification", num_labels=1)
    meg = tmp_path / "meg"
    meg.mkdir()
    (meg / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    assert detect_types(catalog, str(prompts)) == ["prompt_jsonl"]
    assert "checkpoint_hf" in detect_types(catalog, str(lm))
    assert "reward_model_hf" in detect_types(catalog, str(rm)) and "checkpoint_hf" not in detect_types(catalog, str(rm))
    assert detect_types(catalog, str(meg)) == ["checkpoint_megatron"]


@pytest.mark.parametrize("root", ["local", "memory"])
def test_a_megatron_root_is_found_through_its_tracker_file_or_its_newest_iter_folder(catalog, tmp_path, root):
    import fsspec

    base = str(tmp_path / "ckpt") if root == "local" else "memory://ckpt-detect"
    fs, _ = fsspec.core.url_to_fs(base)
    fs.makedirs(f"{base}/iter_0000007", exist_ok=True)
    fs.pipe(f"{base}/iter_0000007/metadata.json", json.dumps({"sharded_backend": "torch_dist"}).encode())
    assert detect_types(catalog, base) == ["checkpoint_megatron"]  # no tracker: the newest iter_* folder
    fs.pipe(f"{base}/latest_checkpointed_iteration.txt", b"7")
    assert detect_types(catalog, base) == ["checkpoint_megatron"]
    fs.pipe(f"{base}/latest_checkpointed_iteration.txt", b"9")  # points at nothing
    assert detect_types(catalog, base) == []
    fs.pipe(f"{base}/iter_0000007/metadata.json", json.dumps({"sharded_backend": "zarr"}).encode())
    fs.pipe(f"{base}/latest_checkpointed_iteration.txt", b"7")
    assert detect_types(catalog, base) == []  # only torch_dist is read here


def test_a_model_dir_without_weights_is_not_a_checkpoint(catalog, tmp_path):
    lm = _hf_dir(tmp_path / "lm", "LlamaForCausalLM")
    (lm / "model.safetensors").unlink()
    assert check_input(catalog, "policy", "inputs.policy", str(lm), "checkpoint_hf").status == "wrong_type"


def test_subtypes_satisfy_their_parents(catalog, tmp_path):
    lm = _hf_dir(tmp_path / "lm", "LlamaForCausalLM")
    assert check_input(catalog, "m", "k", str(lm), "checkpoint").status == "ok"
    rm = _hf_dir(tmp_path / "rm", "LlamaForSequenceClassification", num_labels=1)
    assert check_input(catalog, "m", "k", str(rm), "judge_model_hf").status == "ok"
    assert check_input(catalog, "m", "k", str(rm), "checkpoint_hf").status == "wrong_type"  # never a policy


def test_fsspec_urls_are_resolved(catalog, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    assert check_input(catalog, "p", "k", f"file://{prompts}", "prompt_jsonl").status == "ok"
    with pytest.raises(ArtifactError, match="cannot open"):
        check_input(catalog, "p", "k", "nosuchproto://x/p.jsonl", "prompt_jsonl")


def test_resolve_inputs_raises_exit_3_with_the_fix(catalog, tmp_path):
    step = catalog.find("rl/rs")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    with pytest.raises(ArtifactError) as err:
        resolve_inputs(
            catalog, step, {"inputs": {"prompts": str(prompts), "policy": str(tmp_path / "x")}, "rm": {"url": "u"}}
        )
    assert (
        err.value.exit_code == 3
        and err.value.fix == "pass inputs.policy=PATH to a checkpoint (checkpoint_hf or checkpoint_megatron)"
    )


def test_a_reward_model_is_refused_as_a_policy_without_advice_to_convert_it(catalog, tmp_path):
    rm = _hf_dir(tmp_path / "rm", "LlamaForSequenceClassification", num_labels=1)
    item = check_input(catalog, "policy", "inputs.policy", str(rm), "checkpoint")
    assert item.status == "wrong_type" and item.detected == ["reward_model_hf", "judge_model_hf"]
    with pytest.raises(ArtifactError) as refused:
        raise_for(catalog, True, item, allow_convert=True)
    assert "is reward_model_hf or judge_model_hf, but a checkpoint (checkpoint_hf or checkpoint_megatron)" in str(
        refused.value
    )
    assert "convert" not in str(refused.value) and "convert" not in (refused.value.fix or "")
