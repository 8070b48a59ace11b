"""Tiny random instances of the model families users bring, each built offline from its own transformers config class:
Llama 3.x (llama3 RoPE scaling), Mistral, Qwen2.5, Qwen3 (q/k norms), Qwen3-MoE (experts and a router), Gemma 3
(text: its four norms, the scaled embedding, sliding-window layers beside global ones) and Nemotron-H (hybrid
Mamba). Each takes a tokenizer folder (the tiny world's policy, so a tiny run's prompts and reward model fit it) and
writes a Hugging Face folder: config.json, safetensors weights, the tokenizer.

    python tests/family_models.py FAMILY TOKENIZER_DIR OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

# The size fields every family shares: two layers (Gemma 3 gets its sliding and its global layer from them), four
# query heads over two KV groups, a head_dim of 16 (not hidden / heads: Qwen3 and Gemma 3 set it apart).
SHAPE = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
}  # fmt: skip

FAMILIES: dict[str, dict[str, Any]] = {
    "llama3": {
        "config": "LlamaConfig",
        "fields": {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "max_position_embeddings": 16384,
        },
    },  # fmt: skip
    "mistral": {"config": "MistralConfig", "fields": {"sliding_window": None, "tie_word_embeddings": False}},
    "qwen2.5": {"config": "Qwen2Config", "fields": {"tie_word_embeddings": True, "use_sliding_window": False}},
    "qwen3": {"config": "Qwen3Config", "fields": {"tie_word_embeddings": True}},
    "qwen3_moe": {
        "config": "Qwen3MoeConfig",
        "fields": {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 1,
            "norm_topk_prob": True,
            "tie_word_embeddings": False,
        },
    },  # fmt: skip
    "gemma3": {
        "config": "Gemma3TextConfig",
        "fields": {
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 16,
            "hidden_activation": "gelu_pytorch_tanh",
        },
    },  # fmt: skip
    "nemotron_h": {
        "config": "NemotronHConfig",
        "fields": {
            "hybrid_override_pattern": "M*-",
            "num_hidden_layers": 3,
            "mamba_num_heads": 4,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 1,
            "mamba_n_groups": 1,
            "tie_word_embeddings": False,
        },
    },  # fmt: skip
}


def family_config(family: str, tokenizer: Any) -> Any:
    """The family's transformers config at the tiny size, with the tokenizer's vocabulary and special tokens."""
    import transformers

    spec = FAMILIES[family]
    config_class = getattr(transformers, spec["config"])
    fields = {
        **SHAPE,
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        **spec["fields"],
    }
    return config_class(**fields)


def save_family_model(family: str, tokenizer_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    """A random `family` causal LM (seeded, fp32) with the tokenizer in `tokenizer_dir`, saved to `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = family_config(family, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


if __name__ == "__main__":
    print(save_family_model(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
