"""Token log-probs on wanted positions only, scored over vocabulary chunks: values and gradients equal the full
log_softmax, in fp32 and bf16, through the chunked head and through the full-logits fallback."""

import logging
import math

import pytest
import torch
from torch import nn
from transformers import Gemma2Config, Gemma2ForCausalLM

from model_fixtures import build_tokenizer
from rlsteps.engine.batch import RolloutBatch
from rlsteps.engine.policy import logprobs as logprobs_module
from rlsteps.engine.policy.logprobs import (
    batched_token_logprobs,
    full_logits_reason,
    linear_head_logprobs,
    position_ids_from_mask,
    token_logprobs,
)
from rlsteps.engine.policy.sampled_distribution import SampledDistribution
from rlsteps.tiny.models import build_random_causal_lm
from test_policy import rollout_batch as policy_rollout_batch

ARCHS = ["llama", "qwen2", "gpt2"]
CHUNK = 7  # divides no vocabulary size used here, so the last chunk is a short one
ROWS = [[5, 9, 3, 7, 2, 40, 41], [4, 4, 8, 11, 12, 13, 30, 2, 6, 1, 77, 290], [17, 3], [21, 22, 23, 24, 25, 26]]
PROMPT_LENGTHS = [2, 5, 2, 3]  # row 2 has no response: none of its entries is wanted


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def tiny(arch: str, tokenizer, seed: int = 0) -> nn.Module:
    return build_random_causal_lm(arch, tokenizer, seed=seed).eval()  # eval: GPT-2's dropout off


def tiny_gemma2(vocab: int, softcap: float | None) -> Gemma2ForCausalLM:
    """A Gemma-2, whose forward softcaps its logits after the head (final_logit_softcapping)."""
    config = Gemma2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=1, final_logit_softcapping=softcap,
    )  # fmt: skip
    torch.manual_seed(0)
    return Gemma2ForCausalLM(config).eval()


def rollout_batch(rows: list[list[int]] = ROWS, prompt_lengths: list[int] = PROMPT_LENGTHS) -> RolloutBatch:
    return policy_rollout_batch(rows, prompt_lengths)


def reference_logprobs(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor, wanted: torch.Tensor):
    """The full computation: every position's logits, log_softmax over the whole vocabulary, 0 where not wanted."""
    logits = model(input_ids=tokens, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    picked = logits[:, :-1].float().log_softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return torch.where(wanted.bool() & mask[:, 1:].bool(), picked, 0.0)


def value_and_grads(model: nn.Module, compute, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """compute() [B, T-1], and the gradients of sum(weights * compute()) for every parameter."""
    model.zero_grad(set_to_none=True)
    values = compute()
    (values * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return values.detach(), grads


def assert_grads_close(got: dict, expected: dict, **tolerance) -> None:
    assert got.keys() == expected.keys() and got
    for name in expected:
        assert got[name].dtype == expected[name].dtype, name
        torch.testing.assert_close(got[name], expected[name], msg=name, **tolerance)


def worst_relative_error(got: dict, expected: dict) -> float:
    """max over parameters of |got - expected| / |expected| (Frobenius norms): bf16 rounding spreads over every
    entry, so a whole-tensor measure says more than an element-wise tolerance."""
    assert got.keys() == expected.keys() and got
    return max(float((got[k].float() - expected[k].float()).norm() / expected[k].float().norm()) for k in expected)


# ---------------------------------------------------------------------------------------------
# The chunked head on its own


@pytest.mark.parametrize("vocab_chunk", [1, 2, 3, 8192])
def test_linear_head_logprobs_by_hand(vocab_chunk):
    hidden = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # [N=2, H=2]
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # [V=3, H]: logits [1, 0, 1] and [0, 2, 2]
    targets = torch.tensor([0, 1])
    got = linear_head_logprobs(hidden, weight, targets, vocab_chunk)
    expected = torch.tensor([1 - math.log(2 * math.e + 1), 2 - math.log(1 + 2 * math.e**2)])
    torch.testing.assert_close(got, expected)


def test_linear_head_logprobs_passes_gradcheck():
    torch.manual_seed(0)
    hidden = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(10, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 9, 3, 3, 7])
    assert torch.autograd.gradcheck(lambda h, w: linear_head_logprobs(h, w, targets, 3), (hidden, weight))


def test_linear_head_logprobs_of_no_entries_is_empty():
    hidden = torch.zeros(0, 4, requires_grad=True)
    got = linear_head_logprobs(hidden, torch.randn(10, 4), torch.zeros(0, dtype=torch.long), 3)
    assert got.shape == (0,)
    got.sum().backward()
    assert hidden.grad.shape == (0, 4)


# ---------------------------------------------------------------------------------------------
# Through the model: chunked head against the full log_softmax


@pytest.mark.parametrize("arch", ARCHS)
def test_values_and_gradients_equal_the_full_log_softmax_on_the_wanted_positions(tokenizer, arch):
    model = tiny(arch, tokenizer)
    assert full_logits_reason(model) is None
    batch = rollout_batch()
    tokens, mask, wanted = batch.tokens, batch.attention_mask(), batch.response_mask()
    weights = torch.randn(wanted.shape, generator=torch.Generator().manual_seed(1))
    got, got_grads = value_and_grads(
        model, lambda: token_logprobs(model, tokens, mask, positions=wanted, vocab_chunk=CHUNK), weights
    )
    expected, expected_grads = value_and_grads(model, lambda: reference_logprobs(model, tokens, mask, wanted), weights)
    assert got.shape == wanted.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got[wanted == 0].eq(0).all() and got[wanted == 1].ne(0).all()
    assert_grads_close(got_grads, expected_grads, atol=1e-5, rtol=1e-4)


SAMPLED = [SampledDistribution(0.7), SampledDistribution(1.3), SampledDistribution(0.7, top_k=12, top_p=0.9)]


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("distribution", SAMPLED, ids=["T0.7", "T1.3", "T0.7-k12-p0.9"])
def test_under_the_sampled_distribution_values_and_gradients_equal_its_full_computation(tokenizer, arch, distribution):
    """The chunked head (temperature: h / T), the filtered head (top-k/top-p: whole rows, position-chunked) and the
    full path (Gemma-2's softcapped logits) each give the sampled distribution's log-probs of the full logits, in
    value and gradient, and not the raw ones."""
    model = tiny(arch, tokenizer) if arch != "gemma2" else tiny_gemma2(len(tokenizer), softcap=30.0)
    batch = rollout_batch()
    tokens, mask, wanted = batch.tokens, batch.attention_mask(), batch.response_mask()
    weights = torch.randn(wanted.shape, generator=torch.Generator().manual_seed(1))

    def full() -> torch.Tensor:
        logits = model(input_ids=tokens, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        picked = distribution.logprobs(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        return torch.where(wanted.bool(), picked.view(wanted.shape), 0.0)

    scored = lambda: token_logprobs(model, tokens, mask, positions=wanted, vocab_chunk=CHUNK, distribution=distribution)  # noqa: E731
    got, got_grads = value_and_grads(model, scored, weights)
    expected, expected_grads = value_and_grads(model, full, weights)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert_grads_close(got_grads, expected_grads, atol=1e-5, rtol=1e-4)
    raw = token_logprobs(model, tokens, mask, positions=wanted).detach()
    assert (raw - got.detach())[wanted == 1].abs().max() > 1e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_without_positions_every_real_prediction_is_scored_and_padding_is_zero(tokenizer, arch):
    model = tiny(arch, tokenizer)
    batch = rollout_batch()
    tokens, mask = batch.tokens, batch.attention_mask()
    with torch.no_grad():
        got = token_logprobs(model, tokens, mask, vocab_chunk=CHUNK)
        expected = reference_logprobs(model, tokens, mask, mask[:, 1:])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got[mask[:, 1:] == 0].eq(0).all()
    assert got[mask[:, 1:] == 1].ne(0).all()


def test_wanted_positions_on_padding_stay_zero(tokenizer):
    model = tiny("llama", tokenizer)
    batch = rollout_batch()
    everywhere = torch.ones(batch.tokens.shape[0], batch.tokens.shape[1] - 1)
    with torch.no_grad():
        got = token_logprobs(model, batch.tokens, batch.attention_mask(), positions=everywhere, vocab_chunk=CHUNK)
    assert got[batch.attention_mask()[:, 1:] == 0].eq(0).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_autocast_stays_within_bf16_tolerance_of_fp32(tokenizer, arch):
    model = tiny(arch, tokenizer)
    batch = rollout_batch()
    tokens, mask, wanted = batch.tokens, batch.attention_mask(), batch.response_mask()
    weights = torch.randn(wanted.shape, generator=torch.Generator().manual_seed(1))

    def under_autocast(compute):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return compute()

        return run

    chunked = lambda: token_logprobs(model, tokens, mask, positions=wanted, vocab_chunk=CHUNK)  # noqa: E731
    full = lambda: reference_logprobs(model, tokens, mask, wanted)  # noqa: E731
    fp32, fp32_grads = value_and_grads(model, chunked, weights)
    bf16, bf16_grads = value_and_grads(model, under_autocast(chunked), weights)
    full_bf16, full_bf16_grads = value_and_grads(model, under_autocast(full), weights)
    assert bf16.dtype == torch.float32 and all(g.dtype == torch.float32 for g in bf16_grads.values())
    torch.testing.assert_close(bf16, fp32, atol=0.05, rtol=0.02)
    torch.testing.assert_close(bf16, full_bf16, atol=1e-3, rtol=1e-3)  # the same bf16 logits, chunk by chunk
    assert worst_relative_error(bf16_grads, fp32_grads) < 0.05
    assert worst_relative_error(bf16_grads, full_bf16_grads) < 0.03  # measured near 0.01


def test_bf16_weights_get_bf16_gradients_close_to_fp32(tokenizer):
    model = tiny("qwen2", tokenizer)
    half = tiny("qwen2", tokenizer).to(torch.bfloat16)
    batch = rollout_batch()
    tokens, mask, wanted = batch.tokens, batch.attention_mask(), batch.response_mask()
    weights = torch.ones(wanted.shape)
    fp32, fp32_grads = value_and_grads(model, lambda: token_logprobs(model, tokens, mask, wanted, CHUNK), weights)
    bf16, bf16_grads = value_and_grads(half, lambda: token_logprobs(half, tokens, mask, wanted, CHUNK), weights)
    assert bf16.dtype == torch.float32 and all(g.dtype == torch.bfloat16 for g in bf16_grads.values())
    torch.testing.assert_close(bf16, fp32, atol=0.05, rtol=0.02)
    assert worst_relative_error(bf16_grads, fp32_grads) < 0.1


# ---------------------------------------------------------------------------------------------
# The full-logits fallback


def with_head_bias(model: nn.Module) -> nn.Module:
    head = model.get_output_embeddings()
    head.bias = nn.Parameter(torch.randn(head.out_features, generator=torch.Generator().manual_seed(2)))
    return model


def test_full_logits_reasons(tokenizer):
    assert "bias" in full_logits_reason(with_head_bias(tiny("llama", tokenizer)))
    assert "final_logit_softcapping" in full_logits_reason(tiny_gemma2(len(tokenizer), softcap=2.0))
    assert full_logits_reason(tiny_gemma2(len(tokenizer), softcap=None)) is None
    no_head = tiny("gpt2", tokenizer)
    no_head.get_output_embeddings = lambda: None
    assert "not an nn.Linear" in full_logits_reason(no_head)


@pytest.mark.parametrize(
    "make_model",
    [lambda tok: with_head_bias(tiny("llama", tok)), lambda tok: tiny_gemma2(len(tok), softcap=2.0)],
    ids=["head-bias", "softcapped-gemma2"],
)
def test_the_fallback_equals_the_full_log_softmax_and_warns_once(tokenizer, make_model, caplog, monkeypatch):
    monkeypatch.setattr(logprobs_module, "_warned", set())
    model = make_model(tokenizer)
    batch = rollout_batch()
    tokens, mask, wanted = batch.tokens, batch.attention_mask(), batch.response_mask()
    weights = torch.randn(wanted.shape, generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.WARNING, logger=logprobs_module.__name__):
        got, got_grads = value_and_grads(model, lambda: token_logprobs(model, tokens, mask, wanted, CHUNK), weights)
        token_logprobs(model, tokens, mask, wanted, CHUNK)
    expected, expected_grads = value_and_grads(model, lambda: reference_logprobs(model, tokens, mask, wanted), weights)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert_grads_close(got_grads, expected_grads, atol=1e-5, rtol=1e-4)
    warnings = [r for r in caplog.records if "full [B, T, V] logits" in r.getMessage()]
    assert len(warnings) == 1 and full_logits_reason(model) in warnings[0].getMessage()


# ---------------------------------------------------------------------------------------------
# Memory: what backward keeps


def saved_shapes(compute) -> list[torch.Size]:
    """The shapes of every tensor autograd saves for backward while `compute()` runs."""
    shapes = []

    def pack(tensor):
        shapes.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        compute()
    return shapes


@pytest.mark.parametrize("arch", ARCHS)
def test_backward_saves_no_tensor_with_a_vocabulary_wide_dimension(tokenizer, arch):
    model = tiny(arch, tokenizer)
    vocab = model.get_output_embeddings().out_features
    batch = rollout_batch()
    tokens, mask, wanted = batch.tokens, batch.attention_mask(), batch.response_mask()
    chunked = saved_shapes(lambda: token_logprobs(model, tokens, mask, wanted, CHUNK))
    assert (vocab, model.config.hidden_size) in chunked  # W itself, saved to recompute the chunks
    assert not [shape for shape in chunked if shape[-1] == vocab]
    full = saved_shapes(lambda: token_logprobs(with_head_bias(model), tokens, mask, wanted, CHUNK))
    assert [shape for shape in full if shape[-1] == vocab]  # the check sees [.., V] logits when they are kept


def test_backward_recomputes_the_logits_chunk_by_chunk(monkeypatch):
    chunks = []
    real = logprobs_module._logit_chunks

    def counted(h, weight, vocab_chunk):
        for start, w, logits in real(h, weight, vocab_chunk):
            chunks.append(tuple(logits.shape))
            yield start, w, logits

    monkeypatch.setattr(logprobs_module, "_logit_chunks", counted)
    hidden = torch.randn(6, 4, requires_grad=True)
    out = linear_head_logprobs(hidden, torch.randn(20, 4), torch.arange(6), vocab_chunk=7)
    assert chunks == [(6, 7), (6, 7), (6, 6)]
    out.sum().backward()
    assert chunks == [(6, 7), (6, 7), (6, 6)] * 2


# ---------------------------------------------------------------------------------------------
# The head swap and batched_token_logprobs


@pytest.mark.parametrize("arch", ARCHS)
def test_the_output_embedding_is_restored_after_a_call_and_after_a_failure(tokenizer, arch, monkeypatch):
    model = tiny(arch, tokenizer)
    head = model.get_output_embeddings()
    batch = rollout_batch()
    token_logprobs(model, batch.tokens, batch.attention_mask(), vocab_chunk=CHUNK)
    assert "forward" not in head.__dict__
    assert model(batch.tokens).logits.shape == (*batch.tokens.shape, head.out_features)

    def broken(*args, **kwargs):
        raise RuntimeError("decoder failed")

    monkeypatch.setattr(model.base_model, "forward", broken)
    with pytest.raises(RuntimeError, match="decoder failed"):
        token_logprobs(model, batch.tokens, batch.attention_mask(), vocab_chunk=CHUNK)
    assert "forward" not in head.__dict__


def test_an_instance_level_head_forward_comes_back(tokenizer):
    model = tiny("llama", tokenizer)
    head = model.get_output_embeddings()
    own = head.forward  # the bound method, set on the instance as wrappers do
    head.forward = own
    batch = rollout_batch()
    token_logprobs(model, batch.tokens, batch.attention_mask(), vocab_chunk=CHUNK)
    assert head.__dict__["forward"] is own


def test_batched_token_logprobs_scores_response_positions_only(tokenizer):
    model = tiny("llama", tokenizer)
    model.train()
    batch = rollout_batch()
    with torch.no_grad():
        model.eval()
        expected = reference_logprobs(model, batch.tokens, batch.attention_mask(), batch.response_mask())
        model.train()
    for micro_batch_size in (1, 3, 8):
        got = batched_token_logprobs(model, batch, micro_batch_size)
        assert got.shape == (len(ROWS), batch.tokens.shape[1] - 1) and not got.requires_grad
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert got[batch.response_mask() == 0].eq(0).all()
    assert model.training


def test_unusable_arguments_are_clear_errors(tokenizer):
    model = tiny("llama", tokenizer)
    batch = rollout_batch()
    tokens, mask = batch.tokens, batch.attention_mask()
    with pytest.raises(ValueError, match=r"positions must be a \[B, T-1\] mask"):
        token_logprobs(model, tokens, mask, positions=torch.ones(tokens.shape))
    with pytest.raises(ValueError, match="vocab_chunk must be a positive"):
        token_logprobs(model, tokens, mask, vocab_chunk=0)
