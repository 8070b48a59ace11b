"""Make tests/fixtures/megatron_bridge_checkpoint: a checkpoint that Megatron-Bridge 0.6.2's own import and save wrote.

Run once, by hand, under Python 3.12 with Megatron-Bridge 0.6.2 and megatron-core 0.19.2 installed:
tests/make_bridge_checkpoint.sh makes that environment and runs it (the fixture's README says with what). CI never
runs it: the tests read what it wrote.

It builds a tiny random Llama (2 layers, hidden 32, a 50-word vocabulary, float32) in Hugging Face form and imports
it with Bridge's own AutoBridge.import_ckpt, in a one-rank gloo group of Bridge's own temporary_distributed_context:
the GPTModel built through Bridge's provider with the Hugging Face weights, saved by Bridge's save_megatron_model
(its megatron.bridge.training.checkpointing.save_checkpoint, torch_dist format) with the tokenizer assets. Beside the
checkpoint it writes expected.safetensors: every tensor of the GPTModel as it was saved (its own state_dict names,
under `model/`), and the logits that GPTModel gave on a few tokens (`tokens`, `logits`).

What differs from a run on a GPU machine: how the model is built, as in the export of tests/megatron_bridge_oracle.py
(cpu_build): Bridge's local layer spec instead of Transformer Engine's, and the fusions that need CUDA kernels off
(neither changes which tensors the checkpoint holds or their names; run_config.yaml records them as the provider had
them); three CUDA calls of the save answered (no_cuda_for_the_save); and Bridge's unguarded imports of GPU-only
packages given the oracle's stand-ins.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("RLSTEPS_MEGATRON_BRIDGE_ROOTS", sysconfig.get_paths()["purelib"])  # Bridge as installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

import megatron_bridge_oracle as oracle  # noqa: E402
from random_weights import randomized  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "megatron_bridge_checkpoint"
WORDS = ("<pad> </s> <unk> the a cat dog sat ran on in mat park count why what is doing today because it 1 2 3 4 5 "
         "6 7 8 9 0 . ! ? : Q A yes no big small red blue one two three four five six seven").split()  # fmt: skip
TOKENS = [[5, 17, 42, 9, 3, 40, 7, 26], [12, 8, 8, 31, 11, 2, 27, 18]]
SEED = 3


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(WORDS)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def hf_model(folder: Path) -> Path:
    """A random Llama of order-one weights, its tokenizer beside it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    words = tokenizer()
    config = LlamaConfig(
        vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        pad_token_id=words.pad_token_id, eos_token_id=words.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    randomized(LlamaForCausalLM(config), SEED).save_pretrained(folder)
    words.save_pretrained(folder)
    return folder


def built_for_the_cpu(to_provider):
    """AutoBridge.to_megatron_provider, its provider changed as the oracle's cpu_build changes it."""
    from megatron.bridge.models.gpt_provider import local_layer_spec

    def provider(self, *args, **kwargs):
        made = to_provider(self, *args, **kwargs)
        made.transformer_layer_spec = local_layer_spec
        for name in oracle.CPU_BUILD_OFF:
            setattr(made, name, False)
        return made

    return provider


def recorded(save, expected: dict[str, torch.Tensor]):
    """AutoBridge.save_megatron_model, recording the model's tensors and its logits on TOKENS before Bridge saves
    it (its low-memory save empties the model)."""

    def save_and_record(self, model, *args, **kwargs):
        gpt = model[0]
        gpt.eval()
        for name, tensor in gpt.state_dict().items():
            if isinstance(tensor, torch.Tensor) and not name.endswith("_extra_state"):
                expected[f"model/{name}"] = tensor.detach().clone().contiguous()
        ids = torch.tensor(TOKENS)
        batch, length = ids.shape
        causal = torch.triu(torch.ones(1, 1, length, length, dtype=torch.bool), diagonal=1)  # True = masked
        with torch.no_grad(), oracle.cuda_calls_answered():
            logits = gpt(ids, torch.arange(length).expand(batch, length), attention_mask=causal)
        expected["tokens"], expected["logits"] = ids, logits.float().contiguous()
        return save(self, model, *args, **kwargs)

    return save_and_record


@contextlib.contextmanager
def no_cuda_for_the_save():
    """The CUDA calls of Bridge's save answered without CUDA: torch.cuda.get_rng_state (the save reads the RNG states
    and, with save_rng off, as its save_megatron_model sets it, drops them unsaved), and the two of megatron-core's
    writer that rlsteps' compat.py answers the same way: torch.cuda.synchronize (a no-op) and
    torch.cuda.current_device ("cpu", where it builds a small flag tensor)."""
    answers = {"get_rng_state": lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8),
               "synchronize": lambda *args, **kwargs: None, "current_device": lambda: "cpu"}  # fmt: skip
    originals = {name: getattr(torch.cuda, name) for name in answers}
    for name, answer in answers.items():
        setattr(torch.cuda, name, answer)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.cuda, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=FIXTURE, help=f"the fixture folder (default {FIXTURE})")
    out = parser.parse_args().out
    oracle.import_bridge()
    from megatron.bridge import AutoBridge
    from megatron.bridge.training.model_load_save import temporary_distributed_context
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    checkpoint = out / "checkpoint"
    shutil.rmtree(checkpoint, ignore_errors=True)
    expected: dict[str, torch.Tensor] = {}
    AutoBridge.to_megatron_provider = built_for_the_cpu(AutoBridge.to_megatron_provider)
    AutoBridge.save_megatron_model = recorded(AutoBridge.save_megatron_model, expected)
    source = Path(tempfile.gettempdir()) / "rlsteps_tiny_llama_hf"  # a fixed name: run_config.yaml records it
    shutil.rmtree(source, ignore_errors=True)
    with temporary_distributed_context(backend="gloo"), no_cuda_for_the_save():
        AutoBridge.import_ckpt(hf_model(source), checkpoint)
    shutil.rmtree(source)
    save_file(expected, out / "expected.safetensors")
    print(f"wrote {checkpoint} and {out / 'expected.safetensors'}")


if __name__ == "__main__":
    main()
