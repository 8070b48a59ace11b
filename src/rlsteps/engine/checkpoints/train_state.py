"""The policy's weights and the optimizer's state in a checkpoint: one torch.distributed.checkpoint (DCP) folder.

Each process writes its own shards and the main process the metadata; the state is keyed by parameter name
(the same with and without FSDP2), so a run resumes on any number of processes: DCP reads each process's new
shards out of whatever the writers held. A plain one-process run writes and reads the same folder.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def write_train_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every process calls it (a collective under torchrun)."""
    import torch.distributed.checkpoint as dcp

    with _one_process_is_fine():
        dcp.save(_state(model, optimizer), checkpoint_id=str(folder))


def read_train_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load the weights and optimizer state in place (every process; resharded to this run's processes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer)
    with _one_process_is_fine():
        dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


@contextlib.contextmanager
def _one_process_is_fine() -> Iterator[None]:
    """DCP warns that it assumes one process when no process group exists: here that is the plan."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
