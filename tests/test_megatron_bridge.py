"""checkpoint_megatron judged by Megatron-Bridge 0.6.2's own code (tests/megatron_bridge.py): its loaders accept the
run_config.yaml and train state rlsteps writes and build the model the Hugging Face config describes, Bridge's
export (AutoBridge.export_ckpt, its model built for a CPU) turns the checkpoint back into the very Hugging Face
weights it came from, and rlsteps reads the run_config.yaml Bridge's serialiser writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import required  # noqa: E402

required.importorskip("megatron.core", switch="MEGATRON")

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from megatron_bridge import (  # noqa: E402
    EXPORT_TOKENS,
    assert_exported_as_it_came,
    bridge_batch,
    config_only,
    provider_differences,
)
from model_fixtures import build_tokenizer  # noqa: E402
from rlsteps.engine.megatron.format import read_hf_config, save_megatron_checkpoint  # noqa: E402
from rlsteps.engine.megatron.gpt_model import megatron_gpt  # noqa: E402
from rlsteps.engine.policy.model import load_policy  # noqa: E402
from test_megatron_format import MEGATRON_CORE_WARNINGS, hf_logits, randomized, tiny_model  # noqa: E402

# Slow (runs Megatron-Bridge's own code in a process of its own): the fast tier, -m 'not slow', leaves it out
pytestmark = [pytest.mark.slow, MEGATRON_CORE_WARNINGS]

TOKEN_IDS = ("pad_token_id", "unk_token_id", "bos_token_id", "eos_token_id")


def written(hf_dir: Path, root: Path) -> Path:
    """The HF folder `hf_dir` saved as a checkpoint_megatron by rlsteps; its iter folder."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype="auto")
    return save_megatron_checkpoint(model, AutoTokenizer.from_pretrained(hf_dir), root)


def hf_folder(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def assert_bridge_loads_it_as_it_imports_it(hf_dir: Path, iter_dir: Path, provider: dict, loaded: dict) -> None:
    """Bridge's loaders accept the checkpoint, and what they build from it is the provider Bridge builds from the
    Hugging Face config itself, field for field, and what the HF config says."""
    differences = provider_differences(provider, loaded)
    assert differences == {"strict": {}, "load_model_config": {}}, f"(checkpoint, Bridge's import) {differences}"
    loaded = loaded["ok"]
    assert loaded["container"] == "megatron.bridge.training.config.ConfigContainer"
    assert loaded["tp_pp"] == [1, 1] and loaded["checkpoint_format"] == "torch_dist"
    assert loaded["checkpoint"] == {"save_rng": False, "save_optim": False, "fully_parallel_save": True}
    iteration = int(iter_dir.name.removeprefix("iter_"))
    assert {name: state["step"] for name, state in loaded["train_states"].items()} == {
        "train_state": iteration, "latest_train_state": iteration
    }  # fmt: skip
    hf = json.loads((hf_dir / "config.json").read_text())
    built = loaded["strict"]
    assert built["_class_"] == "megatron.bridge.models.gpt_provider.GPTModelProvider"
    assert {k: built[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                                  "ffn_hidden_size", "vocab_size", "kv_channels", "seq_length")} == {
        # kv_channels: None where the HF config has no head_dim (Qwen2): TransformerConfig derives hidden / heads
        "num_layers": hf["num_hidden_layers"], "hidden_size": hf["hidden_size"],
        "num_attention_heads": hf["num_attention_heads"], "num_query_groups": hf["num_key_value_heads"],
        "ffn_hidden_size": hf["intermediate_size"], "vocab_size": hf["vocab_size"],
        "kv_channels": hf.get("head_dim"), "seq_length": hf["max_position_embeddings"],
    }  # fmt: skip
    rope_theta = hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"]
    assert built["rotary_base"] == rope_theta and built["layernorm_epsilon"] == hf["rms_norm_eps"]
    assert built["share_embeddings_and_output_weights"] == hf["tie_word_embeddings"]
    assert built["activation_func"] == "torch.nn.functional.silu" and hf["hidden_act"] == "silu"
    assert built["normalization"] == "RMSNorm" and built["gated_linear_unit"] is True
    assert built["params_dtype"] == f"torch.{hf['dtype']}"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def cases(tiny_world, tmp_path_factory, tokenizer) -> dict[str, tuple[Path, Path]]:
    """name -> (HF folder, the iter folder rlsteps wrote from it): the tiny policy, a Qwen2 and a bf16 Llama."""
    folder = tmp_path_factory.mktemp("bridge_cases")
    hf_dirs = {
        "tiny_policy": Path(tiny_world.policy),
        "qwen2": hf_folder(tiny_model("qwen2", tokenizer, seed=1), tokenizer, folder / "qwen2_hf"),
        "llama_bf16": hf_folder(
            tiny_model("llama", tokenizer, seed=2, dtype=torch.bfloat16, tie_word_embeddings=False),
            tokenizer, folder / "llama_bf16_hf",
        ),
    }  # fmt: skip
    return {name: (hf_dir, written(hf_dir, folder / name)) for name, hf_dir in hf_dirs.items()}


@pytest.fixture(scope="module")
def gpt_model_written(tmp_path_factory, tokenizer) -> dict[str, tuple[Path, torch.Tensor]]:
    """name -> (an iter folder megatron-core's GPTModel saved, with no hf_config/, its logits); run_config.yaml is
    added by Bridge's serialiser in `judged` (from the HF config of the same shape)."""
    tokens = torch.randint(0, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(1))
    out = {}
    for name, kind, overrides, extra_vocab in (("llama", "llama", {"tie_word_embeddings": True}, 0),
                                               ("qwen2_padded", "qwen2", {}, 18)):  # fmt: skip
        folder = tmp_path_factory.mktemp(f"gpt_{name}")
        hf_dir = hf_folder(tiny_model(kind, tokenizer, **overrides), tokenizer, folder / "hf")
        iter_dir = folder / "ckpt" / "iter_0000000"
        logits = gpt_model_checkpoint(hf_dir, iter_dir, tokens, extra_vocab)
        out[name] = (hf_dir, iter_dir, tokens, logits)
    return out


def gpt_model_checkpoint(hf_dir: Path, iter_dir: Path, tokens: torch.Tensor, extra_vocab: int) -> torch.Tensor:
    """A random GPTModel of the HF config's shape (vocab padded by `extra_vocab`), saved by dist_checkpointing from
    its own sharded_state_dict, with the tokenizer beside it as Bridge saves its assets; its logits on `tokens`."""
    from megatron.core import dist_checkpointing
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from rlsteps.contract.model_families import gpt_shape
    from rlsteps.engine.megatron.compat import gpt_model_runtime
    from rlsteps.engine.megatron.format import megatron_model_config
    from rlsteps.engine.megatron.gpt_model import transformer_config

    hf = AutoConfig.from_pretrained(hf_dir).to_dict()
    shape = gpt_shape(hf)
    model_cfg = megatron_model_config(shape, hf, torch.float32)  # only to size GPTModel: the file is Bridge's
    iter_dir.mkdir(parents=True)
    with gpt_model_runtime():
        model = GPTModel(
            transformer_config(model_cfg, torch.float32), get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=shape.vocab_size + extra_vocab, max_sequence_length=model_cfg["seq_length"],
            position_embedding_type="rope", rotary_base=int(model_cfg["rotary_base"]),
            share_embeddings_and_output_weights=shape.tied_embeddings,
        )  # fmt: skip
        randomized(model, seed=5)
        b, t = tokens.shape
        causal = torch.triu(torch.ones(1, 1, t, t, dtype=torch.bool), diagonal=1)  # True = masked
        with torch.no_grad():
            logits = model(tokens, torch.arange(t).expand(b, t), attention_mask=causal)
        state = {"model": model.sharded_state_dict(), "checkpoint_version": 3.0, "iteration": 0}
        dist_checkpointing.save(state, str(iter_dir))
    shutil.copytree(
        hf_dir,
        iter_dir / "tokenizer",
        ignore=shutil.ignore_patterns("*.safetensors", "config.json", "generation_config.json"),
    )
    return logits


# How the export built for a CPU builds Bridge's model (what the checkpoint's provider asks for is recorded beside it).
CPU_BUILD = {
    "transformer_layer_spec": "__main__.cpu_layer_spec",  # Bridge's local_layer_spec (see the oracle)
    "apply_rope_fusion": False,
    "persist_layer_norm": False,
    "gradient_accumulation_fusion": False,
}
AS_IS = {  # checkpoint -> why Bridge's export, as Bridge runs it, stops on a machine without Transformer Engine
    "tiny_policy": "ValueError: apply_rope_fusion is not available. Please install TE >= 1.4.",
    "qwen2": "TypeError: 'NoneType' object is not callable",
}


@pytest.fixture(scope="module")
def judged(cases, gpt_model_written, tmp_path_factory) -> dict[str, dict]:
    """Bridge's answers, in one process: its provider from each HF config and its loaders on rlsteps's checkpoint;
    run_config.yaml, by Bridge's serialiser, into each GPTModel-written checkpoint; and Bridge's export of each of
    rlsteps's checkpoints to a Hugging Face folder, built for a CPU, and of the tiny policy's as Bridge runs it."""
    exports = tmp_path_factory.mktemp("bridge_exports")
    calls = []
    for hf_dir, iter_dir in cases.values():
        calls += [("provider", hf_dir), ("load", iter_dir)]
    for hf_dir, iter_dir, _, _ in gpt_model_written.values():
        calls += [("write", hf_dir, iter_dir / "run_config.yaml")]
    for name, (hf_dir, iter_dir) in cases.items():
        config = config_only(hf_dir, exports / f"{name}_config")
        calls += [("export_cpu", iter_dir.parent, config, exports / name, json.dumps(EXPORT_TOKENS))]
    for name in AS_IS:
        calls += [("export", cases[name][1].parent, exports / f"{name}_config", exports / f"{name}_as_is")]
    answers = iter(bridge_batch(*calls))
    out = {name: {"provider": next(answers), "load": next(answers)} for name in cases}
    for name in gpt_model_written:
        out[f"write:{name}"] = next(answers)
    for name in cases:
        out[name]["export"] = next(answers)
    for name in AS_IS:
        out[f"export_as_is:{name}"] = next(answers)
    return out


@pytest.mark.parametrize("name", ["tiny_policy", "qwen2", "llama_bf16"])
def test_megatron_bridge_loads_our_checkpoint_as_it_imports_the_hf_model(cases, judged, name):
    hf_dir, iter_dir = cases[name]
    assert_bridge_loads_it_as_it_imports_it(hf_dir, iter_dir, judged[name]["provider"], judged[name]["load"])


@pytest.mark.parametrize("name", ["tiny_policy", "qwen2", "llama_bf16"])
def test_megatron_bridge_exports_our_checkpoint_to_the_hf_weights_it_came_from(cases, judged, name):
    """AutoBridge.export_ckpt loads rlsteps's checkpoint_megatron and writes every tensor of the original HF model,
    bit for bit (a tied output layer also as lm_head.weight, equal to the embedding), with a config from which
    transformers builds a model of the same logits; the GPTModel Bridge loaded computes them too."""
    hf_dir, _ = cases[name]
    answer = assert_exported_as_it_came(hf_dir, judged[name]["export"], name)
    assert {field: built for field, (_, built) in answer["cpu_build"].items()} == CPU_BUILD


def test_megatron_bridge_export_as_it_runs_needs_transformer_engine(judged):
    """Why the export above builds Bridge's model for a CPU: as Bridge runs it, it stops where it builds the model,
    on Transformer Engine's fused RoPE where the provider asks for it (Bridge's Llama bridge sets apply_rope_fusion),
    else on Transformer Engine's layer spec, the provider's default (megatron-core's TESpecProvider is None)."""
    for name, reason in AS_IS.items():
        answer = judged[f"export_as_is:{name}"]
        assert "error" in answer and reason in answer["error"], (name, answer)


def test_megatron_bridge_refuses_the_flat_model_section_rlsteps_used_to_write(cases, tmp_path):
    """The oracle tells: the run_config.yaml rlsteps wrote before (a flat `model:` dict) is refused."""
    from omegaconf import OmegaConf

    copy = tmp_path / "old"
    shutil.copytree(cases["tiny_policy"][1].parent, copy)
    run_config = next(copy.glob("iter_*")) / "run_config.yaml"
    model = OmegaConf.to_container(OmegaConf.load(run_config))["model"]
    model = {k: v for k, v in model.items() if k != "_target_"} | {"activation_func": "silu"}
    OmegaConf.save({"model": model}, run_config)
    (answer,) = bridge_batch(("load", run_config.parent))
    assert "error" in answer


@pytest.mark.parametrize("name", ["llama", "qwen2_padded"])
def test_rlsteps_reads_the_run_config_megatron_bridge_writes(gpt_model_written, judged, name):
    hf_dir, iter_dir, tokens, expected = gpt_model_written[name]
    assert "ok" in judged[f"write:{name}"], judged[f"write:{name}"]
    model_section = (iter_dir / "run_config.yaml").read_text()
    assert "_target_: megatron.bridge.models.gpt_provider.GPTModelProvider" in model_section
    assert "_target_: torch.nn.functional.silu" in model_section  # Bridge's activation: not a plain string
    assert not (iter_dir / "hf_config").exists()

    hf = AutoConfig.from_pretrained(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(iter_dir / "tokenizer")
    rebuilt = read_hf_config(iter_dir)
    for key in TOKEN_IDS:  # not in Bridge's config: from the tokenizer beside it
        assert rebuilt.get(key) == getattr(tokenizer, key), key
    assert rebuilt["pad_token_id"] == hf.pad_token_id is not None

    loaded, _ = load_policy(iter_dir)
    assert type(loaded).__name__ == hf.architectures[0]
    assert loaded.config.pad_token_id == hf.pad_token_id and loaded.config.eos_token_id == hf.eos_token_id
    vocab = hf.vocab_size
    assert loaded.model.embed_tokens.weight.shape[0] == vocab  # Megatron's padding rows dropped
    got = hf_logits(loaded, tokens)
    assert (got - expected[..., :vocab]).abs().max() < 1e-4
    assert torch.equal(got.argmax(-1), expected[..., :vocab].argmax(-1))

    if expected.shape[-1] == vocab:  # (a padded vocab is Megatron-LM's, not what Bridge's file sizes GPTModel to)
        with megatron_gpt(iter_dir) as gpt_logits:  # GPTModel built from Bridge's file (its _target_ entries)
            assert (gpt_logits(tokens) - expected).abs().max() < 1e-4


def test_smollm2_checkpoint_loads_in_megatron_bridge_as_it_imports_smollm2(tmp_path):
    from vllm_judge import smollm2_hf

    hf_dir = smollm2_hf()
    iter_dir = written(hf_dir, tmp_path / "smollm2")
    provider, loaded = bridge_batch(("provider", hf_dir), ("load", iter_dir))
    assert_bridge_loads_it_as_it_imports_it(hf_dir, iter_dir, provider, loaded)

    shutil.rmtree(iter_dir / "hf_config")  # as Bridge writes it: token ids from the tokenizer beside it
    rebuilt, hf = read_hf_config(iter_dir), json.loads((hf_dir / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    for key in TOKEN_IDS:
        assert rebuilt.get(key) == getattr(tokenizer, key), key
    assert rebuilt["eos_token_id"] == hf["eos_token_id"] and rebuilt["bos_token_id"] == hf["bos_token_id"]
