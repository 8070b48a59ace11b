"""The policy's weights and the optimizer's state in a checkpoint: one torch.distributed.checkpoint (DCP) folder.

Each process writes its own shards and the main process the metadata; the state is keyed by parameter name
(the same with and without FSDP2), so a run resumes on any number of processes: DCP reads each process's new
shards out of whatever the writers held. A plain one-process run writes and reads the same folder. Frozen
parameters (a LoRA run's base weights) stay out: the checkpoint holds the adapters and their optimizer state.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn


def _frozen(model: nn.Module) -> set[str]:
    """The names of the parameters that never change (a LoRA run's base weights), a tied one under each of its
    names: the input policy holds them, so a checkpoint leaves them out."""
    return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    frozen = _frozen(model)
    options = StateDictOptions(ignore_frozen_params=bool(frozen))
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    model_state = {name: value for name, value in model_state.items() if name not in frozen}
    return {"model": model_state, "optimizer": optimizer_state}


def write_train_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every process calls it (a collective under torchrun)."""
    import torch.distributed.checkpoint as dcp

    with _one_process_is_fine():
        dcp.save(_state(model, optimizer), checkpoint_id=str(folder))


def read_train_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load the weights and optimizer state in place (every process; resharded to this run's processes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = _state(model, optimizer)
    with _one_process_is_fine():
        dcp.load(state, checkpoint_id=str(folder))
    frozen = _frozen(model)
    result = set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(strict=not frozen),
    )
    unread = [name for name in result.missing_keys if name not in frozen]
    if unread or result.unexpected_keys:
        raise ValueError(
            f"the checkpoint does not fit the policy (missing {unread[:5]}, unexpected {result.unexpected_keys[:5]})"
        )


@contextlib.contextmanager
def _one_process_is_fine() -> Iterator[None]:
    """DCP warns that it assumes one process when no process group exists: here that is the plan."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
