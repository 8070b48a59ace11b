"""The artifact store: publishing (local and through fsspec's memory filesystem), versions, references, lineage."""

import json
import uuid

import fsspec
import pytest

from cli_helpers import invoke
from rlsteps.artifacts.store import ArtifactStore, parse_reference, resolve_reference, store_root
from rlsteps.catalog import load_catalog
from rlsteps.contract.artifact import METADATA_FILE, fingerprint
from rlsteps.errors import ArtifactError, UsageError


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def run_output(path, producer_job, inputs=None, weights=b"w1", created="2026-01-01T00:00:00"):
    """A finished run's output artifact as the worker writes it: HF files and its metadata file."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (path / "model.safetensors").write_bytes(weights)
    inputs = inputs or {}
    (path / METADATA_FILE).write_text(
        json.dumps(
            {
                "type": "checkpoint_hf",
                "producer": {"step": "rl/rs", "job": producer_job},
                "config_hash": "abc",
                "inputs": inputs,
                "input_versions": {k: fingerprint(v) for k, v in inputs.items()},
                "created": created,
            }
        )
    )
    return path


def test_publish_copies_files_numbers_versions_and_writes_metadata(catalog, tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    source = run_output(tmp_path / "run" / "policy", "job-1")
    first = store.publish(catalog, str(source), "sft")
    second = store.publish(catalog, str(source), "sft")
    assert [v.label for v in store.versions("sft")] == ["sft:v1", "sft:v2"]
    assert (tmp_path / "store" / "sft" / "v1" / "model.safetensors").read_bytes() == b"w1"
    meta = first.metadata
    assert meta["type"] == "checkpoint_hf" and meta["producer"]["job"] == "job-1" and meta["config_hash"] == "abc"
    assert meta["size_bytes"] == len(b"w1") + len((source / "config.json").read_bytes())
    assert meta["content_hash"].startswith("sha256:") and meta["content_hash"] == second.metadata["content_hash"]
    assert meta["source"]["fingerprint"] == "job-1@2026-01-01T00:00:00"


def test_a_half_copied_version_is_never_listed_and_its_number_is_not_reused(catalog, tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    (tmp_path / "store" / "sft" / "v1.tmp-dead").mkdir(parents=True)  # a publish cut short while copying
    (tmp_path / "store" / "sft" / "v2").mkdir()  # renamed, but killed before its metadata was written
    assert store.versions("sft") == [] and store.names() == []
    version = store.publish(catalog, str(run_output(tmp_path / "p", "j")), "sft")
    assert version.label == "sft:v3" and [v.number for v in store.versions("sft")] == [3]


def test_references_resolve_to_the_right_version(catalog, tmp_path, monkeypatch):
    store = ArtifactStore(str(tmp_path / "store"))
    for i in (1, 2, 3):
        store.publish(catalog, str(run_output(tmp_path / f"r{i}", f"job-{i}", weights=bytes([i]))), "policy")
    assert store.resolve("artifact:policy:v2").metadata["producer"]["job"] == "job-2"
    assert store.resolve("artifact:policy:latest").number == 3 and store.resolve("artifact:policy").number == 3
    with pytest.raises(ArtifactError, match="no version v7") as err:
        store.resolve("artifact:policy:v7")
    assert err.value.exit_code == 3 and "v1, v2, v3" in err.value.fix
    with pytest.raises(ArtifactError, match="no artifact named 'nope'"):
        store.resolve("artifact:nope")
    with pytest.raises(UsageError, match="not an artifact reference"):
        parse_reference("artifact:policy:7")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text("artifacts:\n  root: store\n")
    assert store_root() == str(tmp_path / "store")
    assert resolve_reference("artifact:policy:v1") == str(tmp_path / "store" / "policy" / "v1")
    assert resolve_reference("/some/path") == "/some/path"


def test_with_no_store_configured_the_project_state_directory_holds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLSTEPS_ARTIFACTS", raising=False)
    assert store_root() == str(tmp_path / ".rlsteps" / "artifacts")


def test_a_remote_store_through_fsspec_memory_filesystem(catalog, tmp_path):
    root = f"memory://store-{uuid.uuid4().hex[:8]}"
    store = ArtifactStore(root)
    prompts = tmp_path / "train.jsonl"
    prompts.write_text('{"prompt": "Describe the cat."}\n')
    version = store.publish(catalog, str(prompts), "prompts")
    whole = (2).to_bytes(8, "little") + b"{}"  # a safetensors file that holds no tensor, whole: checked as an input
    policy = store.publish(catalog, str(run_output(tmp_path / "policy", "job-1", weights=whole)), "policy")
    assert version.url == f"{root}/prompts/v1/train.jsonl"  # a single-file artifact resolves to its file
    with fsspec.open(version.url, "rt") as f:
        assert f.read() == prompts.read_text()
    assert ArtifactStore(root).names() == ["policy", "prompts"]
    assert policy.metadata["type"] == "checkpoint_hf" and version.metadata["type"] == "prompt_jsonl"
    from rlsteps.artifacts.inputs import check_input

    assert check_input(catalog, "policy", "inputs.policy", policy.url, "checkpoint_hf").status == "ok"
    assert check_input(catalog, "prompts", "inputs.prompts", version.url, "prompt_jsonl").status == "ok"
    from_remote = ArtifactStore(str(tmp_path / "local")).publish(catalog, policy.url, "copy")  # remote -> local
    assert from_remote.metadata["content_hash"] == policy.metadata["content_hash"]


def test_lineage_follows_published_inputs_through_the_chain(catalog, tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    prompts = tmp_path / "train.jsonl"
    prompts.write_text("{}\n")
    rs = run_output(tmp_path / "runs" / "rs" / "policy", "job-rs", {"prompts": str(prompts)})
    store.publish(catalog, str(rs), "rs-policy")
    # the next stage read the run's output path (not the store copy): linked through the version it read
    reinforce = run_output(
        tmp_path / "runs" / "reinforce" / "policy", "job-reinforce", {"policy": str(rs), "prompts": str(prompts)}
    )
    store.publish(catalog, str(reinforce), "reinforce-policy")
    # a step that read a store version directly, by its path
    rlhf = run_output(
        tmp_path / "runs" / "rlhf" / "policy",
        "job-rlhf",
        {"policy": resolve_reference_in(store, "artifact:reinforce-policy:v1")},
    )
    final = store.publish(catalog, str(rlhf), "rlhf-policy")
    assert final.metadata["inputs"]["policy"]["artifact"] == "reinforce-policy:v1"
    lines = [("  " * depth) + text for depth, text in store.lineage(final)]
    text = "\n".join(lines)
    assert lines[0].startswith("rlhf-policy:v1 (checkpoint_hf) from rl/rs job job-rlhf")
    assert "  policy <- reinforce-policy:v1" in text and "      policy <- rs-policy:v1" in text
    assert f"prompts <- {prompts}" in text
    assert text.index("reinforce-policy:v1 (checkpoint_hf)") < text.index("rs-policy:v1 (checkpoint_hf)")


def resolve_reference_in(store, ref):
    return store.resolve(ref).url


def test_artifact_references_in_overrides_resolve_in_a_dry_run(catalog, tmp_path, monkeypatch, tiny_world):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text("artifacts:\n  root: store\n")
    store = ArtifactStore(str(tmp_path / "store"))
    store.publish(catalog, str(tiny_world.policy), "sft")
    store.publish(catalog, str(tiny_world.policy), "sft")
    shown = invoke("run", "rs", "-c", "tiny", "inputs.policy=artifact:sft:v1", "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert str(tmp_path / "store" / "sft" / "v1") in shown.stdout
    missing = invoke("run", "rs", "-c", "tiny", "inputs.policy=artifact:sft:v9", "--dry-run")
    assert missing.exit_code == 3 and "no version v9" in missing.stderr


def test_artifacts_cli_lists_shows_and_publishes(catalog, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSTEPS_ARTIFACTS", str(tmp_path / "store"))
    source = run_output(tmp_path / "run" / "policy", "job-1")
    published = invoke("artifacts", "publish", str(source), "sft")
    assert published.exit_code == 0 and "published sft:v1" in published.stdout
    listed = invoke("artifacts", "list")
    assert "sft:v1" in listed.stdout and "checkpoint_hf" in listed.stdout
    shown = invoke("artifacts", "show", "sft:v1")
    assert json.loads(shown.stdout)["producer"]["job"] == "job-1"
    lineage = invoke("artifacts", "lineage", "sft")
    assert lineage.stdout.startswith("sft:v1 (checkpoint_hf) from rl/rs job job-1")
    bad = invoke("artifacts", "publish", str(tmp_path / "nothing"), "sft")
    assert bad.exit_code == 3 and "does not exist" in bad.stderr
