"""Load a checkpoint_megatron into Megatron-Core's own GPTModel and compare its logits with the engine's model.

This is the proof that a checkpoint written here is a Megatron checkpoint and not only a file format:
GPTModel is built from the checkpoint's run_config.yaml, reads the weights through its own
sharded_state_dict, and must give the logits of the Hugging Face model the engine loads. It reads a
checkpoint Megatron-Bridge saved in the same way (on a later megatron-core, without common.pt: common_state.py).

    python -m rlsteps.engine.megatron.gpt_model CHECKPOINT [--device cuda] [--dtype bfloat16] [--spec te]

On the CPU it runs with the local layer spec (compat.py explains the patches); Transformer Engine
specs need a GPU and the transformer-engine package. It builds Llama, Mistral, Qwen2, Qwen3 (q/k norms) and
Qwen3-MoE (router and experts) models; not Gemma 3 (NOT_BUILT says why).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from rlsteps.contract.model_families import LayoutError
from rlsteps.engine.megatron.common_state import common_load_strategy
from rlsteps.engine.megatron.compat import gpt_model_runtime, import_megatron
from rlsteps.engine.megatron.format import RUN_CONFIG_FILE, read_model_section, resolve_checkpoint_dir
from rlsteps.engine.megatron.providers import activation_name, family_of
from rlsteps.errors import ArtifactError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
Logits = Callable[[torch.Tensor], torch.Tensor]  # tokens [B, T] -> logits [B, T, V] (fp32, on the CPU)


# Families whose GPTModel megatron-core's layer specs cannot build, and why (one line each).
NOT_BUILT = {
    "gemma3": "Gemma 3's layer spec is Megatron-Bridge's own (post-norms inside linear_proj and linear_fc2, "
    "per-layer sliding windows, a scaled embedding), not megatron-core's, and its zero-centred norms are refused by "
    "megatron-core's local (torch) norm",
}


def transformer_config(model: dict[str, Any], dtype: torch.dtype) -> Any:
    """A TransformerConfig from the `model:` section of run_config.yaml (ours, or Megatron-Bridge's GPTModelProvider
    fields); dropout off, no fused kernels, an MoE model's tokens dispatched by all-gather (no CUDA streams)."""
    config_module = import_megatron("megatron.core.transformer.transformer_config")
    return config_module.TransformerConfig(
        num_layers=model["num_layers"], hidden_size=model["hidden_size"], ffn_hidden_size=model["ffn_hidden_size"],
        num_attention_heads=model["num_attention_heads"], num_query_groups=model["num_query_groups"],
        kv_channels=model.get("kv_channels"), normalization=model["normalization"],
        layernorm_epsilon=model["layernorm_epsilon"], gated_linear_unit=model["gated_linear_unit"],
        activation_func=getattr(torch.nn.functional, activation_name(model["activation_func"])),
        add_bias_linear=model["add_bias_linear"], add_qkv_bias=model.get("add_qkv_bias", False),
        qk_layernorm=model.get("qk_layernorm", False),
        params_dtype=dtype, bf16=dtype == torch.bfloat16, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        **_moe_config(model),
    )  # fmt: skip


def _moe_config(model: dict[str, Any]) -> dict[str, Any]:
    if not model.get("num_moe_experts"):
        return {}
    return {
        "num_moe_experts": model["num_moe_experts"],
        "moe_ffn_hidden_size": model.get("moe_ffn_hidden_size"),
        "moe_router_topk": model.get("moe_router_topk", 2),
        "moe_router_pre_softmax": model.get("moe_router_pre_softmax", False),
        "moe_token_dispatcher_type": "allgather",
    }


def _layer_spec(spec: str, model: dict[str, Any]) -> Any:
    """megatron-core's layer spec of the model. Its local MoE spec renames pre_mlp_layernorm into mlp.linear_fc1 in
    the checkpoint, which an MoE layer's Transformer Engine spec (and Megatron-Bridge) keeps as pre_mlp_layernorm: that
    renaming is dropped, so both specs read the same checkpoint."""
    specs = import_megatron("megatron.core.models.gpt.gpt_layer_specs")
    options = {"num_experts": model.get("num_moe_experts"), "qk_layernorm": model.get("qk_layernorm", False)}
    if spec == "te":
        return specs.get_gpt_layer_with_transformer_engine_spec(
            **options, moe_grouped_gemm=bool(options["num_experts"])
        )
    local = specs.get_gpt_layer_local_spec(**options, normalization=model["normalization"])
    if not options["num_experts"]:
        return local
    keys = {k: v for k, v in local.submodules.sharded_state_dict_keys_map.items() if k != "pre_mlp_layernorm."}
    return dataclasses.replace(
        local, submodules=dataclasses.replace(local.submodules, sharded_state_dict_keys_map=keys)
    )


def _refuse_unbuildable(model: dict[str, Any], source: Path) -> None:
    family = family_of(model)
    if family in NOT_BUILT:
        raise LayoutError(
            f"{source}: megatron-core's GPTModel cannot be built for this {family} model: {NOT_BUILT[family]}"
        )


@contextlib.contextmanager
def megatron_gpt(
    ref: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32, spec: str = "local"
) -> Iterator[Logits]:
    """Yields logits(tokens) of a GPTModel that loaded the checkpoint through its own sharded_state_dict."""
    with loaded_gpt_model(ref, device, dtype, spec) as model:
        yield lambda tokens: _logits(model, tokens.to(device))


@contextlib.contextmanager
def loaded_gpt_model(
    ref: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32, spec: str = "local"
) -> Iterator[Any]:
    """Yields megatron-core's GPTModel, built from the checkpoint's run_config.yaml, with the weights it read through
    its own sharded_state_dict (dist_checkpointing.load; the common state from common.pt or, as later megatron-core
    releases and Megatron-Bridge write it, from inside the checkpoint), in eval mode on `device`."""
    checkpoint_dir = resolve_checkpoint_dir(ref)
    model_cfg = read_model_section(checkpoint_dir / RUN_CONFIG_FILE)
    _refuse_unbuildable(model_cfg, checkpoint_dir)
    dist_checkpointing = import_megatron()
    gpt = import_megatron("megatron.core.models.gpt")
    with gpt_model_runtime():
        model = gpt.GPTModel(
            transformer_config(model_cfg, dtype), _layer_spec(spec, model_cfg), vocab_size=model_cfg["vocab_size"],
            max_sequence_length=model_cfg["seq_length"], position_embedding_type="rope",
            rotary_base=int(model_cfg["rotary_base"]), rope_scaling=model_cfg.get("rope_scaling", False),
            rope_scaling_factor=model_cfg.get("rope_scaling_factor", 8.0),
            share_embeddings_and_output_weights=model_cfg["share_embeddings_and_output_weights"],
        )  # fmt: skip
        state = dist_checkpointing.load(
            {"model": model.sharded_state_dict()}, str(checkpoint_dir), common_strategy=common_load_strategy()
        )
        model.load_state_dict(state["model"])
        model.to(device).eval()
        yield model


@torch.no_grad()
def _logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    b, t = tokens.shape
    positions = torch.arange(t, device=tokens.device).expand(b, t)
    causal = torch.triu(torch.ones(1, 1, t, t, dtype=torch.bool, device=tokens.device), diagonal=1)  # True = masked
    return model(tokens, positions, attention_mask=causal).float().cpu()


def compare_with_engine(
    ref: str | Path,
    device: str = "cpu",
    dtype: str = "float32",
    spec: str = "local",
    tokens: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Max and mean |logit difference| between GPTModel and the engine's HF model, on the same tokens."""
    from rlsteps.engine.policy.model import load_policy

    torch_dtype = DTYPES[dtype]
    hf_model, tokenizer = load_policy(ref, device=device, dtype=torch_dtype)
    if tokens is None:
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, len(tokenizer), (2, 24), generator=generator)
    with torch.no_grad():
        expected = hf_model(input_ids=tokens.to(device)).logits.float().cpu()
    with megatron_gpt(ref, device, torch_dtype, spec) as gpt_logits:
        got = gpt_logits(tokens)
    diff = (got - expected).abs()
    return {
        "device": device,
        "dtype": dtype,
        "spec": spec,
        "tokens": list(tokens.shape),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "logit_scale": float(expected.abs().max()),
        "same_argmax": float((got.argmax(-1) == expected.argmax(-1)).float().mean()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rlsteps.engine.megatron.gpt_model", description=__doc__.splitlines()[0]
    )
    parser.add_argument("checkpoint", help="a checkpoint_megatron folder, or a torch_dist one Megatron-Bridge saved")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument(
        "--spec", default="local", choices=["local", "te"], help="layer spec (te needs transformer-engine)"
    )
    args = parser.parse_args(argv)
    try:
        report = compare_with_engine(args.checkpoint, args.device, args.dtype, args.spec)
    except ValueError as error:  # not a checkpoint it can read (LayoutError, CommonStateMissing): said in one line
        print(f"{parser.prog}: {error}", file=sys.stderr)
        raise SystemExit(ArtifactError.exit_code) from None
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
