"""Where each weight of a Hugging Face causal LM lives in a Megatron-Core GPT checkpoint, and back.

The names are the ones Megatron-Core's GPTModel writes into a distributed checkpoint and that
Megatron-Bridge maps for each family (families.py holds the layer tensors of each):

    model.embed_tokens.weight                    embedding.word_embeddings.weight
    model.layers.{i}.*                           decoder.layers.* (families.py)
    model.norm.weight                            decoder.final_layernorm.weight
    lm_head.weight                               output_layer.weight (absent when tied)

Layer tensors are stacked: checkpoint key `decoder.layers.X` holds all layers, layer i at index i of
a leading axis (GPTModel's sharded_state_dict prepends that axis so pipeline stages can reshard).

Fused QKV follows Megatron's grouped layout: for each of the G query groups, that group's H/G query
heads, then its key head, then its value head, each head_dim rows. Fused fc1 is gate then up.

Torch only: nothing here imports megatron-core. Which architectures fit, and their shapes:
rlsteps.contract.model_families.
"""

from __future__ import annotations

import torch

from rlsteps.contract.model_families import GPTShape, LayoutError
from rlsteps.engine.megatron.families import extra_state_keys, fuse_qkv, layer_tensors, split_qkv

__all__ = ["LAYER_PREFIX", "expected_shapes", "extra_state_keys", "fuse_qkv", "split_qkv", "to_hf", "to_megatron"]

LAYER_PREFIX = "decoder.layers."
HF_LAYER = "model.layers.{i}."


def _top_level(shape: GPTShape) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Megatron key -> (HF name, shape) of the tensors outside the layers."""
    v, h = shape.vocab_size, shape.hidden_size
    top = {
        "embedding.word_embeddings.weight": ("model.embed_tokens.weight", (v, h)),
        "decoder.final_layernorm.weight": ("model.norm.weight", (h,)),
    }
    if not shape.tied_embeddings:
        top["output_layer.weight"] = ("lm_head.weight", (v, h))
    return top


# ---------------------------------------------------------------------------------------------
# Hugging Face -> Megatron


def to_megatron(shape: GPTShape, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron checkpoint key -> tensor (layer tensors stacked on a leading axis) from an HF state dict.

    Every HF tensor must be used: one the layout has no place for raises LayoutError naming it.
    """
    unused = set(hf_state)
    if shape.tied_embeddings:
        unused.discard("lm_head.weight")  # the same tensor as the embeddings

    def take(name: str) -> torch.Tensor:
        if name not in hf_state:
            raise LayoutError(f"the {shape.architecture} model has no tensor {name}")
        unused.discard(name)
        return hf_state[name]

    out = {key: take(name) for key, (name, _) in _top_level(shape).items()}
    for tensor in layer_tensors(shape):
        per_layer = [
            tensor.fuse(*(take(HF_LAYER.format(i=i) + name) for name in tensor.hf)) for i in range(shape.num_layers)
        ]
        out[LAYER_PREFIX + tensor.megatron] = torch.stack(per_layer)
    if unused:
        raise LayoutError(
            f"the {shape.architecture} model has tensors the Megatron GPT layout has no place for: "
            f"{', '.join(sorted(unused))}"
        )
    return out


# ---------------------------------------------------------------------------------------------
# Megatron -> Hugging Face


def expected_shapes(shape: GPTShape) -> dict[str, tuple[int, ...]]:
    """Megatron checkpoint key -> global shape, for every tensor a model of this shape reads."""
    shapes = {key: size for key, (_, size) in _top_level(shape).items()}
    for tensor in layer_tensors(shape):
        shapes[LAYER_PREFIX + tensor.megatron] = (shape.num_layers, *tensor.shape)
    return shapes


def to_hf(shape: GPTShape, megatron: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF state dict from Megatron checkpoint tensors (as to_megatron writes them)."""
    out = {name: megatron[key] for key, (name, _) in _top_level(shape).items()}
    for tensor in layer_tensors(shape):
        stacked = megatron[LAYER_PREFIX + tensor.megatron]
        for i in range(shape.num_layers):
            out.update(zip((HF_LAYER.format(i=i) + name for name in tensor.hf), tensor.split(stacked[i])))
    return {name: t.contiguous() for name, t in out.items()}
