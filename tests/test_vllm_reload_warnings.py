"""vLLM's "Failed to load weights" warnings on a weight update: hidden for the layers a reload leaves alone by
design, shown for any other. No vLLM needed: the filter sits on a logger of vLLM's name, and the layers are found in
any torch model (test_vllm_rollouts.py checks both against the real vLLM)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from rlsteps.engine.generation.vllm_backend import (
    RELOAD_LOGGER,
    expected_reload_warnings_hidden,
    layers_reloaded_without_weights,
)


class RotaryEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.zeros(8, 2))  # computed from the config, never sent


class Llama3RotaryEmbedding(RotaryEmbedding):
    pass


class ParallelLMHead(nn.Linear):
    pass


class Model(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(10, 4)
        self.rotary_emb = RotaryEmbedding()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.ModuleDict({"rotary": Llama3RotaryEmbedding()})])
        self.lm_head = ParallelLMHead(4, 10, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight


def test_the_layers_without_weights_are_the_rotary_embeddings_and_a_tied_output_layer_only():
    assert layers_reloaded_without_weights(Model(tied=True)) == [
        "Llama3RotaryEmbedding", "ParallelLMHead", "RotaryEmbedding",
    ]  # fmt: skip
    assert layers_reloaded_without_weights(Model(tied=False)) == ["Llama3RotaryEmbedding", "RotaryEmbedding"]


def warn_as_vllm(layer: str) -> None:
    logging.getLogger(RELOAD_LOGGER).warning("%s: Failed to load weights", layer)  # vLLM's own call


def test_an_expected_warning_is_hidden_and_an_unexpected_one_shown(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger=RELOAD_LOGGER)
    with expected_reload_warnings_hidden(["ParallelLMHead", "RotaryEmbedding"]):
        warn_as_vllm("RotaryEmbedding")
        warn_as_vllm("ParallelLMHead")
        warn_as_vllm("RowParallelLinear")  # a layer the update should have reached: shown
        warn_as_vllm("VocabParallelEmbedding")
        logging.getLogger(RELOAD_LOGGER).warning("RotaryEmbedding: something else went wrong")
    shown = [record.getMessage() for record in caplog.records]
    assert shown == [
        "RowParallelLinear: Failed to load weights",
        "VocabParallelEmbedding: Failed to load weights",
        "RotaryEmbedding: something else went wrong",
    ]
    caplog.clear()
    warn_as_vllm("ParallelLMHead")  # outside an update's reload nothing is hidden
    assert [record.getMessage() for record in caplog.records] == ["ParallelLMHead: Failed to load weights"]
    assert logging.getLogger(RELOAD_LOGGER).filters == []
