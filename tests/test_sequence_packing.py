"""train.sequence_packing: rollouts end to end in rows of the longest sequence a row can have, each attending only to
itself, against one padded row per rollout.

The bins, the micro-batch plan and the packed layout on hand-computed examples; then, on the small Qwen2 policy of
test_logprobs_from_update and on the tiny world's Llama shape, the packed log-probs equal the padded ones in value and
gradient, and the update gives the padded path's loss, statistics, gradient and weights, to float rounding, for GRPO
and REINFORCE. A model that attends across packed sequences is found by the probe and passed padded rows.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlsteps.contract.config import TrainConfig
from rlsteps.engine.batch import first_fit_bins
from rlsteps.engine.policy import logprobs as logprobs_module
from rlsteps.engine.policy.logprobs import (
    batched_token_logprobs,
    packed_token_logprobs,
    reads_packed_sequences,
    token_logprobs,
)
from rlsteps.engine.policy.packing import pack, pack_batch
from rlsteps.engine.run.update import micro_batch_plan
from test_dynamic_batching import lengths_batch, update_of
from test_logprobs_from_update import CASES, MAX_PROMPT, policy_model, policy_update, recipe, rollouts

CPU = torch.device("cpu")
MAX_NEW = 20  # rows of 5 + 20 = 25 tokens: the rollouts (6 to 11 tokens) pack two or three to a row


def test_first_fit_decreasing_bins():
    # longest first: 9 opens bin 0 (1 left), 8 bin 1 (2 left), 5 bin 2 (5 left), 5 into bin 2 (0 left), 3 bin 3,
    # 2 into bin 1 (0 left); a length over the capacity gets a bin of its own
    assert first_fit_bins([8, 3, 9, 2, 5, 5], 10) == [[2], [0, 3], [4, 5], [1]]
    assert first_fit_bins([12, 4, 4], 10) == [[0], [1, 2]]
    assert first_fit_bins([], 10) == []


def test_micro_batches_take_rows_while_they_pack_into_micro_batch_size_rows():
    batch = lengths_batch([8, 3, 9, 2, 5, 5], ["a", "a", "b", "b", "c", "c"])
    # longest first 9 8 5 5 3 2 into 2 bins of 10: 9 | 8 fill two bins; 5 needs a third: a new micro-batch
    assert batch.micro_batch_rows(2, bin_tokens=10) == [[2, 0], [4, 5, 1, 3]]
    # whole groups (b 9+2, a 8+3, c 5+5), two bins of 12: b then a pack as [9, 2] [8, 3]; c would need a third
    assert batch.micro_batch_rows(2, whole_groups=True, bin_tokens=12) == [[2, 3, 0, 1], [4, 5]]


def test_the_plan_packs_by_the_longest_row_a_step_can_have():
    batch = rollouts(False)  # lengths 7 5 10 8 | 8 11 6 9; rows of 5 + 20 = 25 tokens
    packed = recipe("grpo-k3", micro=2, packing=True, max_new=MAX_NEW)
    # longest first 11 10 9 8 8 7 6 5: [11, 10] [9, 8, 8]; then 7 6 5 would need a third row of 25: micro-batch 2
    assert micro_batch_plan(batch, packed.cfg.train, packed, packing=True) == [[5, 2, 7, 3, 4], [0, 6, 1]]
    assert micro_batch_plan(batch, packed.cfg.train, packed) == [[0, 1], [2, 3], [4, 5], [6, 7]]  # probe said no
    # whole groups where the loss reads them (REINFORCE, micro-batches of a multiple of 4 rows): b (longest 11) in
    # [11, 9] [8, 6], then a with it in [11, 10] [9, 8, 8] [7, 6, 5], within 4 rows
    groups = recipe("reinforce-tis", micro=4, packing=True, max_new=MAX_NEW)
    assert micro_batch_plan(batch, groups.cfg.train, groups, packing=True) == [[4, 5, 6, 7, 0, 1, 2, 3]]


def test_the_packed_layout():
    # rows of 3 and 2 tokens (the first scores both its entries, the second its one) in one bin
    tokens = torch.tensor([[11, 12, 13], [21, 22, 0]])
    wanted = torch.tensor([[True, True], [True, False]])
    packed = pack(tokens, [3, 2], wanted, [[0, 1]], pad_id=0)
    assert packed.tokens.tolist() == [[11, 12, 13, 21, 22]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    # entry 2 (13 -> 21) crosses from one sequence to the next: never scored
    assert packed.wanted.tolist() == [[True, True, False, True]]
    assert packed.source.tolist() == [0, 1, 2]  # flat indexes in the [2, 2] layout: (0, 0), (0, 1), (1, 0)
    assert packed.padding == 0
    two = pack(tokens, [3, 2], wanted, [[0], [1]], pad_id=0)  # a bin each: the second padded, its padding its own
    assert two.tokens.tolist() == [[11, 12, 13], [21, 22, 0]] and two.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert two.padding == 1


def tiny_world_llama() -> torch.nn.Module:
    """The tiny world's policy shape (one Llama layer of 128, 4 heads), random."""
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("build", [policy_model, tiny_world_llama], ids=["qwen2", "llama"])
def test_packed_log_probs_and_gradient_equal_the_padded(build):
    batch = rollouts(False)
    model = build()
    assert reads_packed_sequences(model, CPU)
    assert pack_batch(batch, 25).tokens.shape[0] == 3  # 8 rows in 3 packed rows
    padded = token_logprobs(model, batch.tokens, batch.attention_mask(), positions=batch.response_mask())
    padded_grads = torch.autograd.grad((padded * torch.linspace(-1, 1, padded.shape[1])).sum(), model.parameters())
    packed = packed_token_logprobs(model, batch, 25)
    packed_grads = torch.autograd.grad((packed * torch.linspace(-1, 1, packed.shape[1])).sum(), model.parameters())
    assert padded.abs().sum() > 0
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(packed_grads, padded_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)
    # the no-grad pass over micro-batches of packed rows (prepare's old and reference log-probs)
    torch.testing.assert_close(
        batched_token_logprobs(model, batch, 2, bin_tokens=25), padded.detach(), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("micro", [2, 4])
@pytest.mark.parametrize("name", CASES)
def test_sequence_packing_gives_the_padded_paths_gradient_and_step(name, micro):
    padded_grads, padded_stats, padded_weights = update_of(name, False, micro, max_new=MAX_NEW)
    grads, stats, weights = update_of(name, False, micro, packing=True, max_new=MAX_NEW)
    assert any(g.abs().max() > 0 for g in grads)
    for packed, padded in zip(grads, padded_grads):
        torch.testing.assert_close(packed, padded, rtol=1e-4, atol=1e-6)
    assert stats.keys() == padded_stats.keys()
    assert stats == pytest.approx(padded_stats, rel=1e-4, abs=1e-6)  # the loss among them
    for key, value in padded_weights.items():  # as in test_dynamic_batching: Adam's sign of a gradient about 0
        torch.testing.assert_close(weights[key], value, rtol=0, atol=2e-3)
        assert (weights[key] - value).abs().gt(1e-5).float().mean() < 0.01


class AttendsAcross(torch.nn.Module):
    """A causal LM that builds its own mask from the tokens alone, as custom model code may: packed sequences see
    each other."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, **kwargs)

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()


def test_a_model_that_attends_across_packed_sequences_is_passed_padded_rows(caplog):
    model = AttendsAcross(policy_model())
    with caplog.at_level(logging.WARNING, logger=logprobs_module.__name__):
        assert not reads_packed_sequences(model, CPU)
    assert "attends across packed sequences" in caplog.text and "passed padded" in caplog.text
    chosen = recipe("grpo-k3", micro=2, packing=True, max_new=MAX_NEW)
    assert not policy_update(model, chosen).packing  # the update plans and passes padded rows


@pytest.mark.slow  # dynamo traces the probe's two forwards: about 20 s on 2 cores
def test_a_compiled_forward_is_probed_as_it_runs_and_reads_packed_sequences(caplog):
    """train.compile: the compiled module's forward takes **kwargs, so the passes look through it for what the model
    takes (use_cache=False): without, transformers built a KV cache and read a packed row as one sequence (the
    compiled tiny policy's packed log-probs a nat off), and a compiled update was passed padded rows."""
    model = policy_model()
    chosen = recipe("grpo-k3", micro=2, packing=True, max_new=MAX_NEW)
    with caplog.at_level(logging.WARNING, logger=logprobs_module.__name__):
        update = policy_update(model, chosen, compile=True)
    assert update.forward._orig_mod is model and update.packing
    assert "train.sequence_packing" not in caplog.text


@pytest.mark.parametrize(("row", "reads"), [(0, True), (1, False), (2, False)])
def test_the_probe_judges_the_sequences_that_follow_another_in_the_packed_row(monkeypatch, row, reads):
    """Attention across sequences can only reach those after the row's first: a gap there is the model's, a gap on
    the first sequence alone (its kernels' rounding, the largest on trained models in half precision) is not."""

    def packed_off_by_half_a_nat_on(model, batch, capacity):
        logprobs = token_logprobs(model, batch.tokens, batch.attention_mask(), batch.response_mask())
        logprobs[row] += 0.5 * batch.response_mask()[row]
        return logprobs

    monkeypatch.setattr(logprobs_module, "packed_token_logprobs", packed_off_by_half_a_nat_on)
    assert reads_packed_sequences(policy_model(), CPU) is reads


def test_dynamic_batching_and_sequence_packing_are_one_or_the_other():
    assert TrainConfig().sequence_packing and not TrainConfig().dynamic_batching  # packing by default
    asked = TrainConfig(dynamic_batching=True)  # dynamic batching asked for, packing not: packing off
    assert asked.dynamic_batching and not asked.sequence_packing
    assert TrainConfig(**asked.model_dump()) == asked  # as a run's saved config reads back
    with pytest.raises(ValueError, match="two ways to batch by tokens"):
        TrainConfig(dynamic_batching=True, sequence_packing=True)


def test_the_packed_rows_pass_fewer_positions_than_the_padded():
    batch = rollouts(False)  # 8 rows of 5 to 11 tokens, 64 in all: padded, 8 x 11 = 88 positions (24 padding)
    packed = pack_batch(batch, MAX_PROMPT + MAX_NEW)  # [11, 10] [9, 8, 8] [7, 6, 5]: 3 x 25 positions
    assert packed.filled == int(batch.sequence_lengths.sum()) == 64
    assert packed.tokens.shape == (3, 25) and packed.padding == 11


def test_the_probe_allows_tf32s_rounding_where_fp32_matmuls_run_on_it():
    model = policy_model()
    assert logprobs_module._rounding(model, CPU) == logprobs_module.AGREEMENT[torch.float32]
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # fp32 matmuls on TF32 tensor cores, where CUDA has them
    try:
        assert logprobs_module._rounding(model, torch.device("cuda")) == logprobs_module.HALF_PRECISION_AGREEMENT
        assert logprobs_module._rounding(model, CPU) == logprobs_module.AGREEMENT[torch.float32]
    finally:
        torch.set_float32_matmul_precision(previous)
