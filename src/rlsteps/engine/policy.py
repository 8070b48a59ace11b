"""The policy: a Hugging Face causal LM, its token log-probs, its optimiser and schedule, save/load.

Log-probs follow the RolloutBatch layout: a [B, T-1] tensor whose entry t is
log p(token t+1 | tokens <= t), always computed in fp32 whatever the model's dtype.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlsteps.engine.batch import RolloutBatch

log = logging.getLogger(__name__)

SCHEDULES = ("cosine", "linear", "constant")


# ---------------------------------------------------------------------------------------------
# Loading and saving


def load_policy(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer from a Hugging Face model directory or a Megatron checkpoint (checkpoint_megatron).

    dtype "auto" keeps the dtype the checkpoint stores."""
    path = Path(path)
    if is_megatron_checkpoint(path):
        from rlsteps.engine.megatron.checkpoint import load_megatron_checkpoint

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


def is_megatron_checkpoint(path: Path) -> bool:
    """A checkpoint root or iter folder (a tracker file that points nowhere counts, so its error is the one shown)."""
    from fsspec.implementations.local import LocalFileSystem

    from rlsteps.engine.megatron import TRACKER_FILE, find_checkpoint_dir

    return (path / TRACKER_FILE).is_file() or find_checkpoint_dir(LocalFileSystem(), str(path.absolute()))[0] is not None


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
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path,
    form: str = "checkpoint_hf", iteration: int = 0,
) -> None:
    """The policy as checkpoint_hf (safetensors, config, tokenizer: what load_policy and HF read) or as
    checkpoint_megatron (a Megatron-Core distributed checkpoint at `iteration`)."""
    if form == "checkpoint_megatron":
        from rlsteps.engine.megatron.checkpoint import save_megatron_checkpoint

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


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode (no dropout) for the duration, then the model's previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------
# Log-probs


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T]
    """Positions count real tokens only, so left or right padding never shifts them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model: nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for right-padded rows: [B, T] -> [B, T-1] fp32, 0 on padding."""
    logits = model(
        input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).logits  # [B, T, V]
    logprobs = logits[:, :-1].float().log_softmax(-1)  # [B, T-1, V]
    picked = logprobs.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [B, T-1]
    return torch.where(attention_mask[:, 1:].bool(), picked, 0.0)


def batched_token_logprobs(model: nn.Module, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
    """token_logprobs over micro-batches without gradients, at the batch's full width [B, T-1].

    Old, new and reference log-probs computed this way share one layout, so they subtract cleanly.
    """
    device = next(model.parameters()).device
    out = torch.zeros(len(batch), batch.tokens.shape[1] - 1)
    row = 0
    with torch.no_grad(), eval_mode(model):
        for micro in batch.micro_batches(micro_batch_size):
            logprobs = token_logprobs(model, micro.tokens.to(device), micro.attention_mask().to(device))
            out[row : row + len(micro), : logprobs.shape[1]] = logprobs.cpu()
            row += len(micro)
    return out.to(batch.tokens.device)


# ---------------------------------------------------------------------------------------------
# Optimisation


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW; matrices decay, 1-D parameters (biases, norm weights) do not."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str = "cosine", min_lr_ratio: float = 0.1
) -> float:
    """The factor on the peak lr for the update after `step` updates.

    Linear warmup reaches the peak on update warmup_steps (the first update already moves,
    at 1/warmup_steps); then cosine or linear decay to min_lr_ratio at total_steps, flat after.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:  # linear
        decay = 1.0 - progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps} and {total_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    multiplier = partial(
        lr_multiplier, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule, min_lr_ratio=min_lr_ratio
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
) -> float:
    """Clip, step, advance the schedule, zero the gradients; returns the pre-clip gradient norm.

    A non-finite norm (inf/nan gradients) skips the update and the schedule, and is returned
    as is: the caller sees `not math.isfinite(norm)` and can count or report the skipped step.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    clip_to = max_grad_norm if max_grad_norm is not None and max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip_to)) if params else 0.0
    if math.isfinite(grad_norm):
        optimizer.step()
        scheduler.step()
    else:
        log.warning("non-finite gradient norm %s: update skipped, weights unchanged", grad_norm)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm
