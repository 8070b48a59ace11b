"""A run's prompts and their order: the run's prompt files or datasets read (rlsteps.contract.prompts), and a data
order that is a pure function of (seed, epoch, consumed_samples), so a resumed run sees exactly the prompts it would
have seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlsteps.contract.prompt_tokenizer import unread_kwargs_note
from rlsteps.contract.prompts import Prompt, PromptFileError, load_prompts, prompt_options

if TYPE_CHECKING:
    from rlsteps.contract.config import RecipeConfig


@dataclass(frozen=True)
class RunPrompts:
    """The prompts a run trains on and the ones it validates on, each file read whole and every prompt measured."""

    train: list[Prompt]
    validation: list[Prompt]


def load_run_prompts(cfg: RecipeConfig, tokenizer: Any, say: Callable[[str], None] | None = None) -> RunPrompts:
    """The run's prompt files (or datasets, read with its data.* keys) rendered with the policy's tokenizer and
    measured against max_prompt_tokens; a bad row raises PromptFileError naming the input (`input 'prompts':
    path:line: ...`). say: a large file's progress."""
    note = unread_kwargs_note(getattr(tokenizer, "chat_template", None), cfg.data.chat_template_kwargs)
    if note is not None and say is not None:
        say(note)
    files = {"prompts": cfg.inputs.prompts}
    if cfg.inputs.val_prompts and cfg.validation.interval:
        files["val_prompts"] = cfg.inputs.val_prompts
    loaded = {}
    for name, path in files.items():
        try:
            options = prompt_options(cfg.data.model_dump(), name)
            loaded[name] = load_prompts(path, tokenizer, cfg.data.max_prompt_tokens, say, options)
        except PromptFileError as error:
            raise PromptFileError(f"input '{name}': {error}", fix=error.fix) from None
    return RunPrompts(loaded["prompts"], loaded.get("val_prompts", [])[: cfg.validation.num_prompts])


# ---------------------------------------------------------------------------------------------
# Data order


def steps_per_epoch(num_prompts: int, prompts_per_step: int) -> int:
    """Full steps in one pass over the prompts; the last partial batch is dropped."""
    if prompts_per_step < 1:
        raise ValueError(f"prompts_per_step must be at least 1, got {prompts_per_step}")
    steps = num_prompts // prompts_per_step
    if steps == 0:
        raise ValueError(
            f"{num_prompts} prompts cannot fill one step of prompts_per_step={prompts_per_step}; "
            "add prompts or lower prompts_per_step"
        )
    return steps


def prompt_indices(seed: int, consumed_samples: int, prompts_per_step: int, num_prompts: int) -> tuple[list[int], int]:
    """The prompt indices of the step that starts after `consumed_samples` prompts, and its epoch.

    Each epoch is a fresh permutation drawn from a generator seeded with (seed, epoch) only,
    never the global RNG, so the order survives restarts and does not depend on other sampling.
    """
    if consumed_samples < 0:
        raise ValueError(f"consumed_samples must be >= 0, got {consumed_samples}")
    per_epoch = steps_per_epoch(num_prompts, prompts_per_step)
    step = consumed_samples // prompts_per_step
    epoch, position = divmod(step, per_epoch)
    generator = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
    order = torch.randperm(num_prompts, generator=generator)
    start = position * prompts_per_step
    return order[start : start + prompts_per_step].tolist(), epoch


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % 2**63
