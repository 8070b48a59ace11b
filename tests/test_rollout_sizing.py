"""How long a rollout may be and how many rows the built-in sampler batches: checked at a run's start."""

import pytest
from transformers import GPT2Config, LlamaConfig

from rlsteps.engine.generation.sizing import (
    CPU_BATCH,
    RolloutShape,
    auto_generation_batch_size,
    check_rollout_fits,
    context_length,
    kv_cache_bytes_per_token,
)
from run_helpers import FAST, rlsteps, run_dir

TINY_LLAMA = LlamaConfig(
    vocab_size=579, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
    max_position_embeddings=256,
)  # fmt: skip


def test_a_rollout_longer_than_the_context_is_refused_with_the_keys_to_change():
    check_rollout_fits(RolloutShape(128, 128), TINY_LLAMA)  # 256 of 256: fits exactly
    with pytest.raises(ValueError) as refused:
        check_rollout_fits(RolloutShape(200, 100), TINY_LLAMA)
    message = str(refused.value)
    assert "a rollout can be 300 tokens" in message and "context of 256 positions" in message
    assert "data.max_prompt_tokens" in message and "rollout.sampling.max_new_tokens" in message


def test_context_length_reads_gpt2_and_llama_names_and_none_when_unnamed():
    assert context_length(TINY_LLAMA) == 256
    assert context_length(GPT2Config(n_positions=64)) == 64
    check_rollout_fits(RolloutShape(10**6, 10**6), object())  # no limit named: nothing to refuse


def test_kv_cache_bytes_per_token_counts_keys_and_values_of_every_layer():
    # 2 (K and V) x 2 layers x 2 KV heads x head_dim 32 x 4 bytes
    assert kv_cache_bytes_per_token(TINY_LLAMA, 4) == 1024
    grouped = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1)
    assert kv_cache_bytes_per_token(grouped, 2) == 2 * 2 * 1 * 16 * 2


def test_the_auto_batch_fills_half_the_free_gpu_memory_and_is_fixed_on_a_cpu():
    shape = RolloutShape(64, 32)
    assert auto_generation_batch_size(TINY_LLAMA, shape, None, 4) == CPU_BATCH
    per_row = 1024 * 96 + 4 * 579  # the KV cache at full length and one row of fp32 logits
    assert auto_generation_batch_size(TINY_LLAMA, shape, 10 * per_row, 4) == 5
    assert auto_generation_batch_size(TINY_LLAMA, shape, 10, 4) == 1  # never none
    assert auto_generation_batch_size(TINY_LLAMA, shape, 10**15, 4) == 512  # capped


def test_a_run_whose_rollouts_cannot_fit_stops_before_its_first_step(tiny_world, tmp_path):
    done = rlsteps("run", "rl/rs", "-c", "tiny", "rollout.sampling.max_new_tokens=250", *FAST, cwd=tmp_path)
    assert done.returncode == 1
    assert "a rollout can be 314 tokens (data.max_prompt_tokens=64 + max_new_tokens=250)" in done.stderr
    assert "Traceback" not in done.stderr and "step 1/" not in done.stderr
    assert not (run_dir(tmp_path, "rl_rs") / "checkpoints").exists()
