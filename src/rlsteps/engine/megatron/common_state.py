"""The common state of a torch_dist checkpoint (checkpoint_version, iteration, content metadata), wherever the
megatron-core that wrote it keeps it.

megatron-core 0.16 writes it to common.pt beside the tensors. Later releases (0.19.2, on which Megatron-Bridge 0.6.2
saves) write no common.pt: they keep it inside the torch.distributed.checkpoint files, as one ShardedObject named
`common_state`. megatron-core 0.16.1's dist_checkpointing.load looks for common.pt alone and stops without it
("Common file .../common.pt does not exist", or an AttributeError where its message lists a folder given as a str).
`common_load_strategy()` is its own common strategy, reading the state from the checkpoint where common.pt is absent.
"""

from __future__ import annotations

import functools
import io
import warnings
from pathlib import Path
from typing import Any

from rlsteps.engine.megatron.compat import import_megatron

COMMON_FILE = "common.pt"
# ShardedObject("common_state", None, (1,), (0,)).unique_key: the one shard later megatron-core releases write
COMMON_STATE_KEY = "common_state/shard_0_1"


class CommonStateMissing(ValueError):
    """A torch_dist folder with neither common.pt nor a common_state object: not a whole Megatron checkpoint."""


def read_common_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The common state a later megatron-core keeps inside the checkpoint (saved as a one-element list), read as that
    megatron-core reads it (load_common_state_dict): unpickled by torch.distributed.checkpoint, as the same load
    unpickles the checkpoint's other objects (the layers' _extra_state), and as Megatron-LM's args need."""
    from torch.distributed.checkpoint import FileSystemReader, TensorStorageMetadata

    stored = FileSystemReader(str(checkpoint_dir)).read_metadata().state_dict_metadata
    if COMMON_STATE_KEY not in stored or isinstance(stored[COMMON_STATE_KEY], TensorStorageMetadata):
        raise CommonStateMissing(
            f"{checkpoint_dir} has neither {COMMON_FILE} (megatron-core 0.16 and older) nor the {COMMON_STATE_KEY} "
            "object later releases keep inside the checkpoint: its save did not finish, or another program wrote it"
        )
    holder: dict[str, Any] = {COMMON_STATE_KEY: io.BytesIO()}
    load_in_this_process(holder, checkpoint_dir)
    (state,) = holder[COMMON_STATE_KEY]
    return state


def load_in_this_process(items: dict[str, Any], checkpoint_dir: Path) -> None:
    """torch.distributed.checkpoint.load of `items` (in place) from a torch_dist folder, by this process alone,
    whether or not a process group exists (without one, torch warns that it assumes so: it is meant)."""
    from torch.distributed.checkpoint import FileSystemReader, load

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        load(items, storage_reader=FileSystemReader(str(checkpoint_dir)), no_dist=True)


def common_load_strategy() -> Any:
    """megatron-core's own common load strategy (common.pt, and its ShardedObject files) for a checkpoint that has
    common.pt, else the same with the common state read from inside the checkpoint."""
    return _common_strategy_class()()


@functools.cache
def _common_strategy_class() -> type:
    common = import_megatron("megatron.core.dist_checkpointing.strategies.common")

    class CommonStateWhereverKept(common.TorchCommonLoadStrategy):
        def load_common(self, checkpoint_dir: str | Path) -> dict[str, Any]:
            if (Path(checkpoint_dir) / COMMON_FILE).is_file():
                return super().load_common(checkpoint_dir)
            return read_common_state(Path(checkpoint_dir))

    return CommonStateWhereverKept
