"""checkpoint_megatron for the model families users bring (tests/family_models.py: tiny random instances built offline
from each family's transformers config), both ways, judged by rlsteps's reader, megatron-core's GPTModel and
Megatron-Bridge 0.6.2's own code (tests/megatron_bridge.py).

For each family rlsteps writes (Llama 3.x, Mistral, Qwen2.5, Qwen3, Qwen3-MoE, Gemma 3):
  - rlsteps reads its checkpoint back to the very HF state dict, bit for bit, with and without hf_config/ (the model
    rebuilt from run_config.yaml alone);
  - megatron-core 0.16.1's GPTModel (local spec, CPU) gives the HF logits, where its layer specs can build the family
    (not Gemma 3: gpt_model.NOT_BUILT);
  - Bridge builds from run_config.yaml, with both its loaders, the provider it builds from the HF config, field for
    field (Gemma 3: but for interleaved_attn_pattern, see its test);
  - Bridge's mapping registry maps every tensor of the checkpoint to the family's HF names, each HF tensor once;
  - Bridge's export (export_cpu: its model built for a CPU) turns the checkpoint back into the original HF weights bit
    for bit, its GPTModel giving the HF logits. Not Gemma 3, which Bridge cannot build on a CPU (its test says why).
Nemotron-H is refused in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import required  # noqa: E402

required.importorskip("megatron.core", switch="MEGATRON")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from family_models import save_family_model  # noqa: E402
from model_fixtures import build_tokenizer  # noqa: E402
from random_weights import randomized  # noqa: E402
from rlsteps.contract.model_families import LayoutError, gpt_shape, megatron_form_refusal  # noqa: E402
from rlsteps.engine.megatron.families import layer_tensors  # noqa: E402
from rlsteps.engine.megatron.format import (  # noqa: E402
    load_megatron_checkpoint,
    read_hf_config,
    save_megatron_checkpoint,
)
from rlsteps.engine.megatron.gpt_model import compare_with_engine  # noqa: E402
from rlsteps.engine.megatron.layout import LAYER_PREFIX, expected_shapes  # noqa: E402
from test_megatron_format import MEGATRON_CORE_WARNINGS  # noqa: E402

pytestmark = [MEGATRON_CORE_WARNINGS]

FAMILIES = ["llama3", "mistral", "qwen2.5", "qwen3", "qwen3_moe", "gemma3"]
GPT_MODEL_BUILDS = [f for f in FAMILIES if f != "gemma3"]
BRIDGE_EXPORTS_ON_A_CPU = [f for f in FAMILIES if f != "gemma3"]
EXPERTS = "mlp.experts.experts."
TOKENS = torch.tensor(
    [[5, 17, 42, 99, 3, 250, 7, 64, 120, 8, 8, 301, 11, 2, 77, 180]]
)  # past Gemma 3's window (8)  # checkpoint keys of the experts: [layers, experts, ...]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, tuple[Path, Path, dict[str, torch.Tensor]]]:
    """family -> (its HF folder, the iter folder rlsteps wrote from it, the HF model's state dict). Every weight is
    random (norm scales too: transformers starts them all equal, where swapping two would not show)."""
    folder = tmp_path_factory.mktemp("families")
    tokenizer_dir = folder / "tokenizer"
    build_tokenizer().save_pretrained(tokenizer_dir)
    out = {}
    for family in FAMILIES:
        hf_dir = save_family_model(family, tokenizer_dir, folder / family)
        model = randomized(AutoModelForCausalLM.from_pretrained(hf_dir), seed=len(out))
        model.save_pretrained(hf_dir)
        iter_dir = save_megatron_checkpoint(model, AutoTokenizer.from_pretrained(hf_dir), folder / f"{family}_megatron")
        out[family] = (hf_dir, iter_dir, {k: t.clone() for k, t in model.state_dict().items()})
    return out


def stored_shapes(iter_dir: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of a torch_dist folder, at its global shape."""
    from torch.distributed.checkpoint import FileSystemReader, TensorStorageMetadata

    stored = FileSystemReader(str(iter_dir)).read_metadata().state_dict_metadata
    return {k: tuple(item.size) for k, item in stored.items() if isinstance(item, TensorStorageMetadata)}


def assert_same_state(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


# ---------------------------------------------------------------------------------------------
# rlsteps and megatron-core


@pytest.mark.parametrize("family", FAMILIES)
def test_rlsteps_reads_the_checkpoint_back_bit_for_bit(written, family, tmp_path):
    hf_dir, iter_dir, state = written[family]
    assert stored_shapes(iter_dir) == expected_shapes(gpt_shape(json.loads((hf_dir / "config.json").read_text())))
    model, _ = load_megatron_checkpoint(iter_dir.parent)
    assert_same_state(model.state_dict(), state)

    copy = tmp_path / "without_hf_config"
    shutil.copytree(iter_dir.parent, copy)
    shutil.rmtree(copy / iter_dir.name / "hf_config")  # as Bridge writes it: the model from run_config.yaml alone
    rebuilt, _ = load_megatron_checkpoint(copy)
    assert type(rebuilt).__name__ == type(model).__name__
    assert_same_state(rebuilt.state_dict(), state)
    with torch.no_grad():
        assert torch.equal(rebuilt(TOKENS).logits, model(TOKENS).logits)
    hf = json.loads((hf_dir / "config.json").read_text())
    config = read_hf_config(copy / iter_dir.name)
    assert gpt_shape(config) == gpt_shape(hf)


@pytest.mark.parametrize("family", GPT_MODEL_BUILDS)
def test_megatron_core_gpt_model_gives_the_hf_logits(written, family):
    """megatron-core's own GPTModel, built from run_config.yaml with the local spec, reads the checkpoint through its
    sharded_state_dict (q/k norms, router and experts included) and computes the HF model's logits."""
    report = compare_with_engine(written[family][1], tokens=TOKENS)
    assert report["max_abs_diff"] < 1e-5 and report["same_argmax"] == 1.0, report


def test_gemma3_gpt_model_is_refused_naming_why(written):
    with pytest.raises(LayoutError, match="cannot be built for this gemma3 model: Gemma 3's layer spec is Megatron-"):
        compare_with_engine(written["gemma3"][1])


def test_nemotron_h_is_refused_in_one_line_naming_the_fix(tmp_path):
    hf_dir = save_family_model("nemotron_h", _tokenizer_dir(tmp_path), tmp_path / "nemotron_h")
    hf = json.loads((hf_dir / "config.json").read_text())
    why = megatron_form_refusal(hf)
    assert why is not None and "\n" not in why
    assert why.startswith("NemotronHForCausalLM cannot be a checkpoint_megatron: a hybrid Mamba model"), why
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    with pytest.raises(LayoutError, match="NemotronHForCausalLM cannot be a checkpoint_megatron"):
        save_megatron_checkpoint(model, AutoTokenizer.from_pretrained(hf_dir), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _tokenizer_dir(folder: Path) -> Path:
    build_tokenizer().save_pretrained(folder / "tokenizer")
    return folder / "tokenizer"


@pytest.mark.parametrize(
    ("family", "changes", "message"),
    [
        ("qwen3_moe", {"decoder_sparse_step": 2}, "experts in every layer"),
        ("gemma3", {"final_logit_softcapping": 30.0}, "no soft-capping"),
        ("gemma3", {"tie_word_embeddings": False}, "no output_layer"),
        ("gemma3", {"layer_types": ["full_attention", "sliding_attention"]}, "every n-th layer global"),
        ("gemma3", {"hidden_activation": "gelu"}, "gelu_pytorch_tanh"),
    ],
)
def test_options_a_family_cannot_carry_are_refused_in_one_line(written, family, changes, message):
    hf = json.loads((written[family][0] / "config.json").read_text())
    why = megatron_form_refusal({**hf, **changes})
    assert why is not None and message in why and "\n" not in why


# ---------------------------------------------------------------------------------------------
# Megatron-Bridge 0.6.2's own code


def bridge_parameters(hf_dir: Path) -> dict[str, list[str]]:
    """Each parameter of the GPTModel Bridge builds for the family -> the HF tensors (as saved) rlsteps's layout puts
    in it: a layer tensor per layer, and the experts as TEGroupedMLP's parameters (Bridge's Qwen3-MoE provider sets
    moe_grouped_gemm), weight0, weight1, ..., each one expert's (transformers saves experts one by one)."""
    shape = gpt_shape(json.loads((hf_dir / "config.json").read_text()))
    out = {"embedding.word_embeddings.weight": ["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": ["model.norm.weight"]}  # fmt: skip
    if not shape.tied_embeddings:
        out["output_layer.weight"] = ["lm_head.weight"]
    for tensor in layer_tensors(shape):
        for i in range(shape.num_layers):
            if not tensor.megatron.startswith(EXPERTS):
                out[f"{LAYER_PREFIX}{i}.{tensor.megatron}"] = sorted(f"model.layers.{i}.{h}" for h in tensor.hf)
                continue
            (fused,) = tensor.hf  # mlp.experts.gate_up_proj or mlp.experts.down_proj: [experts, ...]
            parts = ("gate_proj", "up_proj") if fused.endswith("gate_up_proj") else ("down_proj",)
            name = "mlp.experts." + tensor.megatron.removeprefix(EXPERTS)
            for e in range(shape.num_experts):
                out[f"{LAYER_PREFIX}{i}.{name}{e}"] = sorted(
                    f"model.layers.{i}.mlp.experts.{e}.{p}.weight" for p in parts
                )
    return out


@pytest.fixture(scope="module")
def judged(written, tmp_path_factory) -> dict[str, dict]:
    """Bridge's answers for each family, in one process: its provider from the HF config, its loaders on rlsteps's
    checkpoint, its mapping registry on the checkpoint's names, and its export built for a CPU."""
    from megatron_bridge import EXPORT_TOKENS, bridge_batch, config_only

    exports = tmp_path_factory.mktemp("family_exports")
    calls, asked = [], []
    for family, (hf_dir, iter_dir, _) in written.items():
        config = config_only(hf_dir, exports / f"{family}_config")
        names = json.dumps(sorted(bridge_parameters(hf_dir)))
        calls += [("provider", hf_dir), ("load", iter_dir), ("names", hf_dir, names),
                  ("export_cpu", iter_dir.parent, config, exports / family, json.dumps(EXPORT_TOKENS))]  # fmt: skip
        asked += [(family, what) for what in ("provider", "load", "names", "export")]
    out: dict[str, dict] = {family: {} for family in written}
    for (family, what), answer in zip(asked, bridge_batch(*calls), strict=True):
        out[family][what] = answer
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_megatron_bridge_builds_from_our_run_config_the_provider_it_imports(judged, family):
    """Gemma 3: Bridge's provider fixes interleaved_attn_pattern at (5, 1), the pattern of every released Gemma 3,
    whatever the HF config's layer_types; rlsteps writes the model's own (here sliding, global: (1, 1)), so that a
    Megatron model built from the checkpoint is the HF model. Every other field is Bridge's."""
    from megatron_bridge import provider_differences

    differences = provider_differences(judged[family]["provider"], judged[family]["load"])
    expected = {"interleaved_attn_pattern": ([1, 1], [5, 1])} if family == "gemma3" else {}
    assert differences == {"strict": expected, "load_model_config": expected}
    loaded = judged[family]["load"]["ok"]
    assert loaded["tp_pp"] == [1, 1] and loaded["checkpoint_format"] == "torch_dist"


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_megatron_bridge_maps_every_tensor_to_the_family_hf_names(written, judged, family):
    """Bridge's mapping registry for the family (its bridge's mapping_registry) maps each tensor of the checkpoint to
    the HF tensors rlsteps put in it (q_layernorm to q_norm, the router to mlp.gate, ...), and these are every tensor
    of the HF model as saved, each once; tied embeddings have no output_layer and so no lm_head of their own."""
    from megatron_bridge import safetensors_of

    hf_dir, iter_dir, _ = written[family]
    ours = bridge_parameters(hf_dir)
    stacked = {key.removeprefix(LAYER_PREFIX) for key in stored_shapes(iter_dir) if key.startswith(LAYER_PREFIX)}
    assert stacked == {t.megatron for t in layer_tensors(gpt_shape(json.loads((hf_dir / "config.json").read_text())))}
    answer = judged[family]["names"]
    assert "ok" in answer, answer.get("error")
    assert answer["ok"] == ours
    assert sorted(hf for names in ours.values() for hf in names) == sorted(safetensors_of(hf_dir))


@pytest.mark.slow
@pytest.mark.parametrize("family", BRIDGE_EXPORTS_ON_A_CPU)
def test_megatron_bridge_exports_our_checkpoint_to_the_hf_weights_it_came_from(written, judged, family):
    from megatron_bridge import assert_exported_as_it_came

    answer = assert_exported_as_it_came(written[family][0], judged[family]["export"], family)
    assert answer["cpu_build"]["transformer_layer_spec"][1] == "__main__.cpu_layer_spec"


@pytest.mark.slow
def test_megatron_bridge_cannot_build_gemma3_on_a_cpu(judged):
    """Why Gemma 3 has no export check: Bridge's Gemma 3 model exists only with Transformer Engine. Its own layer spec
    (gemma3_layer_spec) is built of Transformer Engine modules (q/k TENorm, Gemma3TEDotProductAttention, the
    post-norms in TERowParallelLinearLayerNorm) with no local counterpart, its provider asks for the flash attention
    backend, and megatron-core's local spec, which the CPU build takes, refuses its zero-centred norms. What Bridge
    checks of it here: its provider, its loaders and its mapping registry (the tests above)."""
    answer = judged["gemma3"]["export"]
    assert "error" in answer and "zero_centered_gamma not supported by torch LayerNorm" in answer["error"], answer
