"""Small random models and an in-thread server for the serving tests (the tiny world is for end-to-end runs)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import uvicorn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

from rlsteps.engine.rewards.process import free_port

LINES = ["the cat sat on the mat.", "a dog ran in the park!", "count: 1 2 3 4 5", "Q: why? A: because."] * 20
PROMPTS = ["Q: why?", "count:", "the cat", "a", "Q: what is the dog doing in the park today? A:", "1 2", "mat"]
RESPONSES = [" because.", " 1 2 3", " sat on the mat.", " dog", " it ran.", " 3 4 5 6 7 8", "!"]


def build_tokenizer(lines: list[str] = LINES, with_pad: bool = True, vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a few lines, with EOS and (optionally) a pad token."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(lines, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>", pad_token="<pad>" if with_pad else None)


def decoder_shape(hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2, positions: int = 64) -> dict:
    """The size fields of a small Llama-family config (Llama, Qwen2, Mistral): an MLP twice as wide."""
    return {
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": positions,
    }  # fmt: skip


def save_reward_model(path: Path, lines: list[str] = LINES, with_pad: bool = True, layers: int = 2) -> Path:
    """A random one-label Llama reward model and its tokenizer, saved in Hugging Face form."""
    tokenizer = build_tokenizer(lines, with_pad)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, num_labels=1,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForSequenceClassification(config)
        torch.nn.init.normal_(model.score.weight, std=1.0)  # rewards of order 1, so tolerances mean something
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@contextlib.contextmanager
def serving(app, path: str = "") -> Iterator[str]:
    """Run an ASGI app with uvicorn in a thread on a free loopback port; yields its URL (plus `path`)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        server.should_exit = True
        thread.join(10)
