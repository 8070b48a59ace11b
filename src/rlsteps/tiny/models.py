"""Tiny randomly initialised causal LMs (Llama, Qwen2, GPT-2) and a reward model grown from a policy."""

from __future__ import annotations

import copy

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from rlsteps.tiny.hyperparameters import INIT_STD


def build_random_causal_lm(
    arch: str, tokenizer: PreTrainedTokenizerFast, seed: int, hidden: int = 64, layers: int = 2, heads: int = 4
) -> PreTrainedModel:
    """A randomly initialised causal LM for `tokenizer`: "llama", "qwen2" (grouped KV heads, qkv bias) or "gpt2".

    Qwen2 shares each KV head between two query heads (heads must be even for it).
    """
    special = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
        "tie_word_embeddings": True,
        "initializer_range": INIT_STD,
    }
    decoder = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=256)
    if arch == "llama":
        config = LlamaConfig(intermediate_size=4 * hidden, num_key_value_heads=heads, **decoder, **special)
    elif arch == "qwen2":
        config = Qwen2Config(intermediate_size=3 * hidden, num_key_value_heads=max(1, heads // 2), **decoder, **special)
    elif arch == "gpt2":
        config = GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=256, **special)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}: use one of 'llama', 'qwen2', 'gpt2'")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def reward_model_from_policy(policy: PreTrainedModel) -> PreTrainedModel:
    """A one-label sequence classifier whose backbone starts from the SFT policy (a fresh score head)."""
    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    reward_model = AutoModelForSequenceClassification.from_config(config)
    reward_model.base_model.load_state_dict(policy.base_model.state_dict())
    return reward_model
