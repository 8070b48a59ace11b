"""Model FLOPs, peak FLOP/s, MFU, peak memory and the phase meter of rlsteps.engine.records.throughput."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from rlsteps.engine.records import throughput
from rlsteps.engine.records.throughput import (
    PhaseMeter,
    attended_length,
    flops_per_token,
    mfu,
    model_flops,
    peak_flops,
    peak_flops_by_name,
    peak_memory_gb,
    peak_rss_gb,
    reset_peak_memory,
)


def tiny_config(**changes) -> SimpleNamespace:
    """A qwen2-style config: h 64, 2 layers, 4 heads of 16, 2 KV heads (GQA), gated MLP of 128, vocab 1000."""
    values = dict(
        model_type="qwen2",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1000,
    )
    return SimpleNamespace(**{**values, **changes})


@pytest.fixture(autouse=True)
def no_peak_override(monkeypatch):
    monkeypatch.delenv(throughput.PEAK_TFLOPS_ENV, raising=False)


def test_flops_per_token_by_hand():
    # q = 4 heads * 16 = 64, k = 2 KV heads * 16 = 32, s = 10 attended positions
    qkv = 2 * 64 * (64 + 2 * 32)  # 16384
    out = 2 * 64 * 64  # 8192
    mlp = 2 * 3 * 64 * 128  # 49152: gate, up, down
    attention = 4 * 64 * 10  # 2560: QK^T and AV
    per_layer = qkv + out + mlp + attention  # 76288
    lm_head = 2 * 64 * 1000  # 128000
    forward = 2 * per_layer + lm_head  # 280576
    assert forward == 280576
    assert flops_per_token(tiny_config(), seq_len=10, backward=False) == forward
    assert flops_per_token(tiny_config(), seq_len=10) == 3 * forward == 841728


def test_gqa_costs_less_than_mha_by_the_kv_projections():
    mha = flops_per_token(tiny_config(num_key_value_heads=4), seq_len=10)
    gqa = flops_per_token(tiny_config(), seq_len=10)
    # K and V shrink from 64 to 32 columns each: 2 * 64 * (2 * 32) per layer, 2 layers, times 3 for training
    assert mha - gqa == 3 * 2 * (2 * 64 * 2 * 32) == 49152


def test_attention_term_grows_with_the_attended_length():
    longer = flops_per_token(tiny_config(), seq_len=110) - flops_per_token(tiny_config(), seq_len=10)
    assert longer == 3 * 2 * 4 * 64 * 100  # 3x, 2 layers, 4 q s per layer


def test_gpt2_names_and_ungated_mlp():
    gpt2 = SimpleNamespace(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_inner=None, vocab_size=1000)
    # MHA: q = k = 64; MLP of two 64 x 256 matrices (n_inner unset: 4h)
    per_layer = 2 * 64 * (3 * 64) + 2 * 64 * 64 + 2 * 2 * 64 * 256 + 4 * 64 * 10
    assert flops_per_token(gpt2, seq_len=10, backward=False) == 2 * per_layer + 2 * 64 * 1000
    assert flops_per_token(SimpleNamespace(**{**vars(gpt2), "n_inner": 128}), 10) < flops_per_token(gpt2, 10)


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_matmul_flops_match_the_models_weights(family):
    """At seq_len 0 the forward count is 2 FLOPs per weight of every matrix a token meets: check on real models."""
    import transformers

    if family == "qwen2":
        shape = {k: v for k, v in vars(tiny_config(intermediate_size=96, vocab_size=300)).items() if k != "model_type"}
        config = transformers.Qwen2Config(**shape, tie_word_embeddings=False)
        model, embeddings = transformers.Qwen2ForCausalLM(config), ("embed_tokens",)
    else:
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=32)
        model, embeddings = transformers.GPT2LMHeadModel(config), ("wte", "wpe")
    matrices = sum(
        p.numel() for n, p in model.named_parameters() if p.ndim == 2 and not any(e in n for e in embeddings)
    )
    tied_head = 64 * 300 if config.tie_word_embeddings else 0  # a tied head is no parameter of its own
    assert flops_per_token(config, seq_len=0, backward=False) == 2 * (matrices + tied_head)


def test_mixture_of_experts_is_refused():
    with pytest.raises(ValueError, match="experts"):
        flops_per_token(tiny_config(num_experts=8), seq_len=10)


def test_model_flops_and_the_lm_head_on_fewer_tokens():
    per_token = flops_per_token(tiny_config(), seq_len=10)
    assert model_flops(tiny_config(), tokens=100, seq_len=10) == 100 * per_token
    head = 3 * 2 * 64 * 1000  # the LM head's training FLOPs per token
    assert model_flops(tiny_config(), tokens=100, seq_len=10, lm_head_tokens=40) == 100 * per_token - 60 * head


def test_attended_length_of_causal_rows():
    assert attended_length([4]) == (1 + 2 + 3 + 4) / 4
    assert attended_length(torch.tensor([1, 3])) == (1 + 1 + 2 + 3) / 4
    assert attended_length([]) == 0.0


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA A10G", None),  # not the A10
        ("Tesla V100-SXM2-16GB", None),
    ],
)
def test_peak_flops_by_device_name(name, expected):
    assert peak_flops_by_name(name, torch.bfloat16) == expected


def test_fp32_peak_follows_the_matmul_precision():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert peak_flops_by_name("NVIDIA A100-SXM4-80GB", torch.float32) == 19.5e12
        torch.set_float32_matmul_precision("high")
        assert peak_flops_by_name("NVIDIA A100-SXM4-80GB", torch.float32) == 156e12
    finally:
        torch.set_float32_matmul_precision(before)
    assert peak_flops_by_name("NVIDIA H100 PCIe", torch.float16) == 756e12
    assert peak_flops_by_name("NVIDIA H100 PCIe", torch.int8) is None


def test_cpu_has_no_peak_or_mfu_unless_given(monkeypatch):
    assert peak_flops("cpu") is None
    assert mfu(1e12, 1.0, "cpu", torch.float32) is None
    monkeypatch.setenv(throughput.PEAK_TFLOPS_ENV, "2.5")
    assert peak_flops("cpu") == 2.5e12
    assert peak_flops(torch.device("cpu"), torch.float32) == 2.5e12


@pytest.mark.parametrize("value", ["fast", "0", "-1"])
def test_a_bad_peak_override_is_refused(monkeypatch, value):
    monkeypatch.setenv(throughput.PEAK_TFLOPS_ENV, value)
    with pytest.raises(ValueError, match="TFLOP/s"):
        peak_flops("cpu")


def test_mfu_arithmetic(monkeypatch):
    monkeypatch.setenv(throughput.PEAK_TFLOPS_ENV, "100")
    assert mfu(50e12, 2.0, "cpu", torch.bfloat16) == pytest.approx(0.25)  # 25 TFLOP/s of 100
    assert mfu(50e12, 0.0, "cpu", torch.bfloat16) is None


def current_rss_gb() -> float:
    """The current RSS, from Linux's /proc (the project's CI and clusters run Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def test_peak_memory_on_cpu_is_the_process_rss():
    assert peak_memory_gb("cpu") is None
    reset_peak_memory("cpu")
    before = peak_rss_gb()
    block = torch.ones(50_000_000, dtype=torch.uint8)  # 50 MB, touched
    assert peak_rss_gb() >= max(before, current_rss_gb()) - 0.001  # the peak covers the RSS holding the block
    del block


def test_phase_meter_sums_tokens_and_seconds():
    meter = PhaseMeter("cpu")
    assert meter.tokens_per_s is None
    meter.add(100, 0.5)
    meter.add(300, 1.5)
    assert meter.tokens_per_s == 200.0
    with meter.measure(tokens=10):
        pass
    assert meter.tokens == 410 and meter.seconds >= 2.0
