"""The policy model: a Hugging Face causal LM and its tokenizer, loaded from checkpoint_hf or checkpoint_megatron
and saved as either; frozen copies (the reference policy) and eval mode.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

log = logging.getLogger(__name__)


def load_policy(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer from a Hugging Face model directory or a Megatron checkpoint (checkpoint_megatron).

    dtype "auto" keeps the dtype the checkpoint stores."""
    path = Path(path)
    if is_megatron_checkpoint(path):
        from rlsteps.engine.megatron.format import load_megatron_checkpoint

        model, tokenizer_dir = load_megatron_checkpoint(path, device, dtype)
        return model, load_tokenizer(tokenizer_dir)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"policy path {path} is neither a Hugging Face model directory (no config.json) nor a Megatron "
            "checkpoint (no metadata.json or latest_checkpointed_iteration.txt); pass a directory written by "
            "save_pretrained (config.json, weights, tokenizer files) or by convert/hf_to_megatron"
        )
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return model, tokenizer


def load_policy_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The policy's tokenizer alone (no weights read): what a run checks its prompts with before it loads anything."""
    path = Path(path)
    if is_megatron_checkpoint(path):
        from rlsteps.engine.megatron.format import TOKENIZER_DIR, resolve_checkpoint_dir

        return load_tokenizer(resolve_checkpoint_dir(path) / TOKENIZER_DIR)
    return load_tokenizer(path)


def is_megatron_checkpoint(path: Path) -> bool:
    """A checkpoint root or iter folder (a tracker file that points nowhere counts, so its error is the one shown)."""
    from fsspec.implementations.local import LocalFileSystem

    from rlsteps.contract.megatron_files import TRACKER_FILE, find_checkpoint_dir

    return (path / TRACKER_FILE).is_file() or find_checkpoint_dir(LocalFileSystem(), str(path.absolute()))[
        0
    ] is not None


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `path`, with its EOS token as pad when it has no pad token."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot load the tokenizer of {path}: {e}; save the tokenizer into the model directory"
        ) from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"the tokenizer of {path} has neither a pad nor an EOS token; give it a pad token")
        tokenizer.pad_token = tokenizer.eos_token
        log.info("the tokenizer of %s has no pad token; using its EOS token %r as pad", path, tokenizer.eos_token)
    return tokenizer


def save_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    form: str = "checkpoint_hf",
    iteration: int = 0,
) -> None:
    """The policy as checkpoint_hf (safetensors, config, tokenizer: what load_policy and HF read) or as
    checkpoint_megatron (a Megatron-Core distributed checkpoint at `iteration`)."""
    if form == "checkpoint_megatron":
        from rlsteps.engine.megatron.format import save_megatron_checkpoint

        save_megatron_checkpoint(model, tokenizer, out_dir, iteration=iteration)
    elif form == "checkpoint_hf":
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    else:
        raise ValueError(f"unknown checkpoint form {form!r}; choose checkpoint_hf or checkpoint_megatron")


def frozen_copy(model: nn.Module, device: str | torch.device | None = None) -> nn.Module:
    """A frozen deep copy in eval mode: the reference / initial policy (may live on the CPU)."""
    frozen = copy.deepcopy(model)
    if device is not None:
        frozen = frozen.to(device)
    frozen.eval()
    frozen.requires_grad_(False)
    return frozen


def underlying_model(model: nn.Module) -> nn.Module:
    """The model whose forward a wrapper passes its keyword arguments to: through torch.compile's module and peft's
    model (LoRA), whose own forwards take **kwargs and so name none of them."""
    while True:
        inner = getattr(model, "_orig_mod", None)  # torch.compile
        if inner is None:
            base = getattr(model, "get_base_model", None)  # peft
            inner = base() if callable(base) else None
        if inner is None or inner is model:
            return model
        model = inner


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode (no dropout) for the duration, then the model's previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
