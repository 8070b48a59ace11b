"""checkpoint_megatron: the HF <-> Megatron-Core layout, the folder, bit-exact round trips, megatron-core's own
GPTModel reading what we write (and we reading what it writes), the errors, and a kill in the middle of a write."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import required

required.importorskip("megatron.core", switch="MEGATRON")
MEGATRON_CORE_WARNINGS = pytest.mark.filterwarnings(  # megatron-core's own deprecations, not ours
    "ignore:.*ShardedTensor:FutureWarning",
    "ignore:`load_state_dict` is deprecated:FutureWarning",
    "ignore:.*tp_group is None:DeprecationWarning",
    "ignore:MLP requires ffn_hidden_size:DeprecationWarning",
    "ignore:full scope is deprecated:UserWarning",
)
pytestmark = MEGATRON_CORE_WARNINGS

from omegaconf import OmegaConf
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
)

from model_fixtures import build_tokenizer, decoder_shape
from random_weights import randomized
from rlsteps.contract.artifact import METADATA_FILE, read_artifact_metadata
from rlsteps.contract.model_families import GPTShape, LayoutError, gpt_shape
from rlsteps.engine.megatron.compat import gpt_model_runtime
from rlsteps.engine.megatron.format import (
    load_megatron_checkpoint,
    resolve_checkpoint_dir,
    save_megatron_checkpoint,
    vocab_divisor,
)  # fmt: skip
from rlsteps.engine.megatron.gpt_model import (
    compare_with_engine,
    megatron_gpt,
)
from rlsteps.engine.megatron.layout import expected_shapes, fuse_qkv, split_qkv, to_megatron
from rlsteps.engine.policy.model import load_policy, save_policy

ITERATION = 7  # the llama_tied checkpoint's iteration, to see it in the folder names


# ---------------------------------------------------------------------------------------------
# Tiny models


def tiny_model(kind: str, tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32,
               **overrides) -> torch.nn.Module:  # fmt: skip
    """A random 2-layer GQA model (4 heads, 2 KV heads) built in `dtype` as from_pretrained builds it (RoPE
    frequencies stay fp32, where model.to(bf16) would round them), with `architectures` set as it sets it."""
    fields = {"vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id, **decoder_shape()}  # fmt: skip
    if kind == "qwen2":
        fields["tie_word_embeddings"] = False
        config = Qwen2Config(architectures=["Qwen2ForCausalLM"], **{**fields, **overrides})
    else:
        config = LlamaConfig(architectures=["LlamaForCausalLM"], **{**fields, **overrides})
    return randomized(AutoModelForCausalLM.from_config(config, dtype=dtype), seed)


CASES = {  # name -> (kind, config overrides, dtype)
    "llama_tied": ("llama", {"tie_word_embeddings": True}, torch.float32),
    "llama_untied": ("llama", {"tie_word_embeddings": False, "rope_theta": 1000.0}, torch.float32),
    "qwen2": ("qwen2", {}, torch.float32),
    "llama_bf16": ("llama", {"tie_word_embeddings": False}, torch.bfloat16),
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def tokens(tokenizer) -> torch.Tensor:  # [2, 12]
    return torch.randint(0, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer) -> dict[str, tuple[torch.nn.Module, Path]]:
    """name -> (the HF model, the checkpoint_megatron root it was saved to); written once per module."""
    out = {}
    for seed, (name, (kind, overrides, dtype)) in enumerate(CASES.items()):
        model = tiny_model(kind, tokenizer, seed, dtype, **overrides)
        root = tmp_path_factory.mktemp(name) / "ckpt"
        save_megatron_checkpoint(model, tokenizer, root, iteration=ITERATION if name == "llama_tied" else 0)
        out[name] = (model, root)
    return out


def hf_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits


def iter_dir(root: Path) -> Path:
    (only,) = root.glob("iter_*")
    return only


def edited_copy(root: Path, tmp_path: Path, **config_changes) -> Path:
    """A copy of a checkpoint whose hf_config/config.json says something else than its tensors."""
    copy = tmp_path / "edited"
    shutil.copytree(root, copy)
    config_file = iter_dir(copy) / "hf_config" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **config_changes}))
    return copy


# ---------------------------------------------------------------------------------------------
# 1. The layout, by hand


def labelled_shape(heads: int, groups: int, head_dim: int) -> GPTShape:
    return GPTShape(architecture="LlamaForCausalLM", num_layers=1, hidden_size=1, ffn_hidden_size=1,
                    num_attention_heads=heads, num_query_groups=groups, kv_channels=head_dim, vocab_size=1,
                    qkv_bias=True, tied_embeddings=False)  # fmt: skip


def test_fuse_qkv_groups_each_kv_head_after_its_query_heads():
    shape = labelled_shape(heads=4, groups=2, head_dim=1)
    q, k, v = torch.tensor([10.0, 11, 12, 13]), torch.tensor([20.0, 21]), torch.tensor([30.0, 31])
    expected = [10.0, 11, 20, 30, 12, 13, 21, 31]  # [q0, q1, k0, v0, q2, q3, k1, v1]

    assert fuse_qkv(shape, q, k, v).tolist() == expected  # a bias: 1-D
    fused_weight = fuse_qkv(shape, q[:, None], k[:, None], v[:, None])  # a weight: [rows, hidden=1]
    assert fused_weight.shape == (8, 1) and fused_weight[:, 0].tolist() == expected
    for part, original in zip(split_qkv(shape, fused_weight), (q, k, v)):
        assert torch.equal(part[:, 0], original)


def test_fuse_qkv_keeps_the_rows_of_a_head_together():
    shape = labelled_shape(heads=4, groups=2, head_dim=2)
    q = torch.tensor([100.0, 101, 110, 111, 120, 121, 130, 131])  # head h, row r -> 100 + 10h + r
    k, v = torch.tensor([200.0, 201, 210, 211]), torch.tensor([300.0, 301, 310, 311])
    assert fuse_qkv(shape, q, k, v).tolist() == [
        100, 101, 110, 111, 200, 201, 300, 301,  # group 0: q heads 0-1, k head 0, v head 0
        120, 121, 130, 131, 210, 211, 310, 311,  # group 1: q heads 2-3, k head 1, v head 1
    ]  # fmt: skip


def test_split_qkv_inverts_fuse_qkv_for_weights_and_biases():
    shape = labelled_shape(heads=6, groups=2, head_dim=4)
    q, k, v = torch.randn(24, 5), torch.randn(8, 5), torch.randn(8, 5)
    for parts in ((q, k, v), (q[:, 0], k[:, 0], v[:, 0])):
        fused = fuse_qkv(shape, *parts)
        assert fused.shape[0] == shape.qkv_rows
        assert all(torch.equal(a, b) for a, b in zip(split_qkv(shape, fused), parts))


def test_to_megatron_places_every_layer_tensor(tokenizer):
    model = tiny_model("qwen2", tokenizer)
    shape = gpt_shape(model.config.to_dict())
    hf = model.state_dict()
    out = to_megatron(shape, hf)

    assert {key: tuple(t.shape) for key, t in out.items()} == expected_shapes(shape)
    attn, mlp = "decoder.layers.self_attention.", "decoder.layers.mlp."
    for i in range(2):
        layer = {name.removeprefix(f"model.layers.{i}."): t for name, t in hf.items()}
        expected = {
            f"{attn}linear_qkv.layer_norm_weight": layer["input_layernorm.weight"],
            f"{attn}linear_qkv.weight": fuse_qkv(shape, *(layer[f"self_attn.{p}_proj.weight"] for p in "qkv")),
            f"{attn}linear_qkv.bias": fuse_qkv(shape, *(layer[f"self_attn.{p}_proj.bias"] for p in "qkv")),
            f"{attn}linear_proj.weight": layer["self_attn.o_proj.weight"],
            f"{mlp}linear_fc1.layer_norm_weight": layer["post_attention_layernorm.weight"],
            f"{mlp}linear_fc1.weight": torch.cat([layer["mlp.gate_proj.weight"], layer["mlp.up_proj.weight"]]),
            f"{mlp}linear_fc2.weight": layer["mlp.down_proj.weight"],
        }
        for key, tensor in expected.items():
            assert torch.equal(out[key][i], tensor), f"{key}[{i}]"
    assert torch.equal(out["output_layer.weight"], hf["lm_head.weight"])


def test_vocab_divisor_is_the_largest_power_of_two_up_to_128_that_divides():
    assert [vocab_divisor(v) for v in (32000, 151936, 302, 301, 96)] == [128, 128, 2, 1, 32]


# ---------------------------------------------------------------------------------------------
# 2. HF -> checkpoint_megatron -> HF


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_is_bit_identical(saved, tokens, name):
    original, root = saved[name]
    loaded, _ = load_policy(root, dtype=original.dtype)

    assert type(loaded) is type(original)
    before, after = original.state_dict(), loaded.state_dict()
    assert after.keys() == before.keys()
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype == CASES[name][2], key
        assert torch.equal(after[key], tensor), key
    tied = loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert tied == loaded.config.tie_word_embeddings == original.config.tie_word_embeddings
    assert torch.equal(hf_logits(loaded, tokens), hf_logits(original, tokens))


def test_config_generation_config_and_tokenizer_survive(saved, tokenizer):
    original, root = saved["llama_tied"]
    loaded, loaded_tokenizer = load_policy(root)

    def fields(config) -> dict:  # but where it was read from and the dtype it was loaded in
        return {k: v for k, v in config.to_dict().items() if k not in {"_name_or_path", "dtype"}}

    assert fields(loaded.config) == fields(original.config)
    assert loaded.generation_config.eos_token_id == original.generation_config.eos_token_id == tokenizer.eos_token_id
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    text = "Q: why did the cat sit on the mat? A: because."
    assert loaded_tokenizer.encode(text) == tokenizer.encode(text)
    assert (loaded_tokenizer.eos_token, loaded_tokenizer.pad_token) == ("</s>", "<pad>")


# ---------------------------------------------------------------------------------------------
# 3. The folder


def test_folder_is_laid_out_as_megatron_writes_it(saved):
    original, root = saved["llama_tied"]
    checkpoint = root / f"iter_{ITERATION:07d}"

    assert sorted(p.name for p in root.iterdir()) == [
        checkpoint.name, "latest_checkpointed_iteration.txt", "latest_train_state.pt"
    ]  # fmt: skip
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERATION)
    for train_state in (checkpoint / "train_state.pt", root / "latest_train_state.pt"):  # Megatron-Bridge's TrainState
        assert torch.load(train_state, weights_only=True)["step"].item() == ITERATION
    assert json.loads((checkpoint / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert any(checkpoint.glob("*.distcp")) and (checkpoint / ".metadata").is_file()
    common = torch.load(checkpoint / "common.pt", weights_only=False)
    assert (common["checkpoint_version"], common["iteration"]) == (3.0, ITERATION)
    model = OmegaConf.to_container(OmegaConf.load(checkpoint / "run_config.yaml"))["model"]
    assert {k: model[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                  "num_query_groups", "kv_channels", "vocab_size")} == {
        "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64, "num_attention_heads": 4,
        "num_query_groups": 2, "kv_channels": 8, "vocab_size": original.config.vocab_size,
    }  # fmt: skip
    assert model["share_embeddings_and_output_weights"] is True and model["add_qkv_bias"] is False
    assert (checkpoint / "tokenizer" / "tokenizer.json").is_file()
    assert json.loads((checkpoint / "hf_config" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_run_config_records_dtype_bias_and_rope_base(saved):
    def model_section(name: str) -> dict:
        return OmegaConf.to_container(OmegaConf.load(iter_dir(saved[name][1]) / "run_config.yaml"))["model"]

    assert model_section("llama_bf16")["params_dtype"] == {"_target_": "torch.bfloat16", "_call_": False}
    assert model_section("qwen2")["add_qkv_bias"] is True
    assert model_section("qwen2")["_target_"] == "megatron.bridge.models.gpt_provider.GPTModelProvider"
    assert model_section("llama_untied")["rotary_base"] == 1000.0
    assert model_section("llama_untied")["share_embeddings_and_output_weights"] is False


def test_resolve_checkpoint_dir_accepts_root_iter_dir_and_untracked_root(saved, tmp_path):
    root = saved["llama_tied"][1]
    checkpoint = root / f"iter_{ITERATION:07d}"
    assert resolve_checkpoint_dir(root) == checkpoint
    assert resolve_checkpoint_dir(checkpoint) == checkpoint

    untracked = tmp_path / "untracked"
    for iteration in (2, 10):  # the newest wins, not the lexically smallest
        shutil.copytree(checkpoint, untracked / f"iter_{iteration:07d}")
    assert resolve_checkpoint_dir(untracked) == untracked / "iter_0000010"
    shutil.rmtree(untracked / "iter_0000010")
    assert resolve_checkpoint_dir(untracked) == untracked / "iter_0000002"

    (untracked / "latest_checkpointed_iteration.txt").write_text("5")
    with pytest.raises(ValueError, match="iter_0000005"):
        resolve_checkpoint_dir(untracked)
    (untracked / "latest_checkpointed_iteration.txt").write_text("latest")
    with pytest.raises(ValueError, match="'latest'"):
        resolve_checkpoint_dir(untracked)


def test_a_folder_that_is_not_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "iter_notes.txt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=f"{re.escape(str(tmp_path))} is not a Megatron checkpoint"):
        resolve_checkpoint_dir(tmp_path)
    with pytest.raises(ValueError, match="neither a Hugging Face model directory"):
        load_policy(tmp_path)


# ---------------------------------------------------------------------------------------------
# 4. megatron-core's GPTModel reads what we write


@pytest.mark.parametrize("name", ["llama_tied", "llama_untied", "qwen2"])
def test_megatron_gpt_model_loads_our_checkpoint_with_the_hf_logits(saved, tokens, name):
    original, root = saved[name]
    expected = hf_logits(original, tokens)
    assert expected.abs().max() > 1.0  # logits of order one: the tolerance below means something

    with megatron_gpt(root) as gpt_logits:
        got = gpt_logits(tokens)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-4
    assert torch.equal(got.argmax(-1), expected.argmax(-1))

    report = compare_with_engine(root, tokens=tokens)
    assert report["max_abs_diff"] < 1e-4 and report["same_argmax"] == 1.0 and report["tokens"] == [2, 12]


def test_gpt_model_runtime_seeds_the_tracker_on_cuda_and_forks_plainly_without(monkeypatch):
    """On a GPU, GPTModel's dropout forks the 'model-parallel-rng' state, which exists only once Megatron's
    seeding ran after model-parallel init; without CUDA there is nothing to seed and fork() is a plain context."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as megatron_random

    tracker = megatron_random.get_cuda_rng_tracker()
    real_fork = tracker.fork
    with gpt_model_runtime():
        assert parallel_state.model_parallel_is_initialized()
        with tracker.fork():  # would raise "cuda rng state model-parallel-rng is not added" unpatched
            pass
    assert tracker.fork == real_fork and not parallel_state.model_parallel_is_initialized()

    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("rlsteps.engine.megatron.compat._single_rank_group", contextlib.nullcontext)  # no NCCL here
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", lambda *args, **kwargs: events.append("init"))
    monkeypatch.setattr(parallel_state, "destroy_model_parallel", lambda: events.append("destroy"))
    monkeypatch.setattr(
        megatron_random, "model_parallel_cuda_manual_seed", lambda seed, **options: events.append(("seed", seed))
    )
    with gpt_model_runtime(seed=7):
        assert tracker.fork == real_fork  # CUDA: the real fork, over the seeded states
    assert events == ["init", ("seed", 7), "destroy"]  # seeded after model-parallel init (it needs the TP rank)


# ---------------------------------------------------------------------------------------------
# 5. We read what megatron-core's GPTModel writes with Megatron-Bridge's run_config.yaml: tests/test_megatron_bridge.py,
#    where Bridge's own serialiser writes that file


# ---------------------------------------------------------------------------------------------
# 6. Errors name the offending thing


def test_gpt2_is_refused_naming_the_architecture(tokenizer, tmp_path):
    config = GPT2Config(architectures=["GPT2LMHeadModel"], vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4)
    with pytest.raises(LayoutError, match="GPT2LMHeadModel is not supported"):
        save_policy(GPT2LMHeadModel(config), tokenizer, tmp_path / "ckpt", form="checkpoint_megatron")
    assert not (tmp_path / "ckpt").exists()


def test_llama_with_attention_bias_is_refused(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, attention_bias=True)
    with pytest.raises(LayoutError, match="LlamaForCausalLM with attention_bias"):
        save_megatron_checkpoint(model, tokenizer, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_to_megatron_names_an_extra_or_a_missing_tensor(tokenizer):
    model = tiny_model("llama", tokenizer)
    shape = gpt_shape(model.config.to_dict())
    extra = {**model.state_dict(), "model.layers.1.self_attn.q_norm.weight": torch.ones(8)}
    with pytest.raises(LayoutError, match=r"no place for: model\.layers\.1\.self_attn\.q_norm\.weight"):
        to_megatron(shape, extra)
    missing = {k: v for k, v in model.state_dict().items() if k != "model.layers.1.mlp.down_proj.weight"}
    with pytest.raises(LayoutError, match=r"has no tensor model\.layers\.1\.mlp\.down_proj\.weight"):
        to_megatron(shape, missing)


@pytest.mark.parametrize(
    ("name", "config_changes", "expected_in_message"),
    [
        ("llama_tied", {"hidden_size": 64},
         ["tensor embedding.word_embeddings.weight", "shape (302, 32)", "expects (302, 64)"]),
        ("llama_tied", {"num_hidden_layers": 3},
         ["tensor decoder.layers.self_attention.linear_qkv.layer_norm_weight", "shape (2, 32)", "expects (3, 32)"]),
        ("llama_tied", {"tie_word_embeddings": False}, ["tensor output_layer.weight is missing"]),
        ("llama_untied", {"tie_word_embeddings": True}, ["tensor output_layer.weight has no place"]),
        ("qwen2", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
         ["tensor decoder.layers.self_attention.linear_qkv.bias has no place"]),
    ],
    ids=["hidden-size", "layer-count", "missing-output-layer", "unplaced-output-layer", "unplaced-qkv-bias"],
)  # fmt: skip
def test_a_config_that_disagrees_with_the_tensors_names_the_tensor(
    saved, tmp_path, name, config_changes, expected_in_message
):
    assert saved[name][0].config.vocab_size == 302  # as the expected messages say
    checkpoint = edited_copy(saved[name][1], tmp_path, **config_changes)
    with pytest.raises(LayoutError) as error:
        load_policy(checkpoint)
    for text in expected_in_message:
        assert text in str(error.value)


def test_a_checkpoint_without_any_model_config_is_refused(saved, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(saved["llama_tied"][1], copy)
    shutil.rmtree(iter_dir(copy) / "hf_config")
    (iter_dir(copy) / "run_config.yaml").unlink()
    with pytest.raises(ValueError, match="neither hf_config/config.json nor run_config.yaml"):
        load_megatron_checkpoint(copy)


# ---------------------------------------------------------------------------------------------
# Configs the layout must carry or refuse


def test_a_model_built_from_its_config_saves_and_loads(tokenizer, tmp_path, tokens):
    config = LlamaConfig(vocab_size=len(tokenizer), **decoder_shape())
    model = randomized(LlamaForCausalLM(config), seed=3)
    save_policy(model, tokenizer, tmp_path / "ckpt", form="checkpoint_megatron")
    assert torch.equal(hf_logits(load_policy(tmp_path / "ckpt")[0], tokens), hf_logits(model, tokens))


def test_a_save_starts_no_process_and_leaves_megatron_core_as_it_was(tokenizer, tmp_path, monkeypatch):
    """megatron-core would spawn a multiprocessing Manager (a new Python) for the write results of every
    process's first save; a synchronous save keeps them in this process."""
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    monkeypatch.setattr(filesystem_async, "_results_queue", None)  # as in a fresh process (other tests save too)
    model = randomized(LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), **decoder_shape())), seed=4)
    before = set(multiprocessing.active_children())
    save_policy(model, tokenizer, tmp_path / "ckpt", form="checkpoint_megatron")
    assert set(multiprocessing.active_children()) == before and filesystem_async._results_queue is None


def test_llama3_rope_scaling_is_kept_for_gpt_model_and_for_a_checkpoint_without_hf_config(tokenizer, tmp_path, tokens):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }  # Llama 3.1's values
    model = tiny_model("llama", tokenizer, rope_parameters=rope)
    iter_dir = save_megatron_checkpoint(model, tokenizer, tmp_path / "ckpt")
    with megatron_gpt(tmp_path / "ckpt") as gpt_logits:
        assert (gpt_logits(tokens) - hf_logits(model, tokens)).abs().max() < 1e-4
    shutil.rmtree(iter_dir / "hf_config")  # as Megatron-LM writes it: only run_config.yaml says what the model is
    rebuilt = load_policy(tmp_path / "ckpt")[0]
    assert rebuilt.config.rope_parameters["rope_type"] == "llama3"
    assert (hf_logits(rebuilt, tokens) - hf_logits(model, tokens)).abs().max() < 1e-5


@pytest.mark.parametrize(
    "options, message",
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}}, "rope_type='yarn'"),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 2.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                }
            },
            "Llama 3.1 RoPE scaling",
        ),
    ],
)
def test_rope_variants_megatron_would_run_differently_are_refused(tokenizer, tmp_path, options, message):
    model = tiny_model("llama", tokenizer, **options)
    with pytest.raises(LayoutError, match=re.escape(message)):
        save_megatron_checkpoint(model, tokenizer, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_a_sliding_window_shorter_than_the_context_is_refused(tokenizer, tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=len(tokenizer), sliding_window=8, **decoder_shape())
    with pytest.raises(LayoutError, match="sliding_window=8"):
        save_megatron_checkpoint(MistralForCausalLM(config), tokenizer, tmp_path / "ckpt")


# ---------------------------------------------------------------------------------------------
# 7. A kill in the middle of a write leaves the previous checkpoint


WRITER_SCRIPT = """
import sys
import time
from pathlib import Path


def write(target, model_dir, ready=None):
    from rlsteps.contract.artifact import write_artifact
    from rlsteps.engine.policy.model import load_policy, save_policy

    model, tokenizer = load_policy(model_dir)

    def contents(staging):
        save_policy(model, tokenizer, staging, form="checkpoint_megatron")
        if ready:  # the checkpoint is on disk in the staging folder; the artifact is not finished
            Path(ready).touch()
            time.sleep(300)

    write_artifact(Path(target), contents, {"type": "checkpoint_megatron", "source": model_dir})


if __name__ == "__main__":  # megatron's checkpoint writer starts a spawn-context process
    target, first, second, ready = sys.argv[1:]
    write(target, first)
    write(target, second, ready)
"""


def test_a_kill_during_a_write_leaves_the_previous_checkpoint(tmp_path, tokenizer, tokens):
    models = {}
    for name, seed in (("first", 10), ("second", 11)):
        models[name] = tiny_model("llama", tokenizer, seed)
        models[name].save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    target, ready = tmp_path / "policy", tmp_path / "ready"
    script = tmp_path / "writer.py"
    script.write_text(WRITER_SCRIPT)
    args = [sys.executable, str(script), str(target), str(tmp_path / "first"), str(tmp_path / "second"), str(ready)]
    with open(tmp_path / "writer.log", "w") as log:
        writer = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert writer.poll() is None, f"the writer exited early:\n{(tmp_path / 'writer.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the writer never reached the second save"
            time.sleep(0.1)
    finally:
        os.killpg(writer.pid, signal.SIGKILL)  # the writer and the process megatron's checkpointing started
        writer.wait()
    assert writer.returncode == -signal.SIGKILL

    assert (read_artifact_metadata(target) or {}).get("source") == str(tmp_path / "first")
    loaded, _ = load_policy(target)
    first = models["first"].state_dict()
    assert loaded.state_dict().keys() == first.keys()
    assert all(torch.equal(tensor, first[key]) for key, tensor in loaded.state_dict().items())
    assert torch.equal(hf_logits(loaded, tokens), hf_logits(models["first"], tokens))
    assert not torch.equal(hf_logits(loaded, tokens), hf_logits(models["second"], tokens))
    # the kill came after the second checkpoint was complete on disk, in staging, before the artifact was finished
    staging = tmp_path / f".tmp-policy-{writer.pid}"
    assert any(staging.glob("iter_*/metadata.json")) and not (staging / METADATA_FILE).exists()


def test_a_checkpoint_without_its_tokenizer_folder_names_the_folder_to_fill(tokenizer, tmp_path):
    iter_dir = save_megatron_checkpoint(tiny_model("llama", tokenizer), tokenizer, tmp_path / "ckpt")
    shutil.rmtree(iter_dir / "tokenizer")
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"copy the model's Hugging Face tokenizer files (tokenizer.json, "
            f"tokenizer_config.json) into {iter_dir / 'tokenizer'}"
        ),
    ):
        load_policy(tmp_path / "ckpt")
