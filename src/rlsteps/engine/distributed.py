"""The processes of one run: which one this is, and the few collectives the loop needs.

Under torchrun every process reads RANK, WORLD_SIZE and LOCAL_RANK from its environment and joins one
process group (NCCL on GPUs, gloo on CPUs); started plainly, a run is the world of one process and every
collective below returns its input, with no process group at all. Rank 0 is the main process: it starts the
reward server, scores, logs to the terminal and writes the run's files. Torch is imported where a collective
runs: a one-process world (what finding checkpoints passes around) needs none.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.size > 1

    def mine(self, count: int) -> list[int]:
        """This process's share of `count` items (prompt positions): every size-th from its rank."""
        return list(range(self.rank, count, self.size))


SINGLE = World()


def world_from_env() -> World:
    """The world torchrun describes in the environment; one process when it describes none."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return SINGLE
    return World(rank=int(os.environ["RANK"]), size=size, local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def join(world: World, device: torch.device) -> torch.device:
    """Join the process group of a multi-process world; this process's device (cuda:LOCAL_RANK on GPUs)."""
    import torch
    import torch.distributed as dist

    if not world.is_distributed or dist.is_initialized():
        return device
    if device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    on_gpu = device.type == "cuda"
    dist.init_process_group("nccl" if on_gpu else "gloo", device_id=device if on_gpu else None)
    log.info("process %d of %d on %s", world.rank, world.size, device)
    return device


def leave(world: World) -> None:
    """Leave the process group once every process is done with it: the barrier keeps a process from tearing its
    group down while a peer still reads from it. The gloo group's threads outlive this (the model's FSDP state
    holds the group): the process must then end without the interpreter's teardown (engine.run.worker.end_process
    says why)."""
    if _active(world):
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def _active(world: World) -> bool:
    if not world.is_distributed:
        return False
    import torch.distributed as dist

    return dist.is_initialized()


def reduce_floats(world: World, values: list[float], op: str = "sum") -> list[float]:
    """Element-wise sum or max of `values` over the processes (the same list on every one)."""
    if not _active(world):
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor.tolist()


def reduce_sum(world: World, value: float) -> float:
    return reduce_floats(world, [value], "sum")[0]


def reduce_max(world: World, value: float) -> float:
    return reduce_floats(world, [value], "max")[0]


def gather_to_main(world: World, obj: T) -> list[T] | None:
    """Every process's `obj`, in rank order, on the main process; None elsewhere."""
    if not _active(world):
        return [obj]
    import torch.distributed as dist

    gathered: list[Any] | None = [None] * world.size if world.is_main else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def all_gather(world: World, obj: T) -> list[T]:
    """Every process's `obj`, in rank order, on every process."""
    if not _active(world):
        return [obj]
    import torch.distributed as dist

    gathered: list[Any] = [None] * world.size
    dist.all_gather_object(gathered, obj)
    return gathered


def row_weighted_mean(world: World, stats: dict[str, float], rows: int) -> dict[str, float]:
    """Per-process statistics (of `rows` rows each) over all processes, weighted by their rows. Every process
    calls it and gets the same result."""
    if not world.is_distributed:
        return stats
    return weighted_by_rows(all_gather(world, (stats, rows)))


def weighted_by_rows(parts: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """Each numeric statistic any part has, weighted by the rows of the parts that have it; a part of no rows counts
    for nothing. With no rows anywhere, the first part's statistics as they are."""
    counted = [(stats, rows) for stats, rows in parts if rows > 0]
    if not counted:
        return dict(parts[0][0]) if parts else {}
    keys = dict.fromkeys(k for stats, _ in counted for k, v in stats.items() if isinstance(v, int | float))
    means = {}
    for key in keys:
        having = [(stats[key], rows) for stats, rows in counted if isinstance(stats.get(key), int | float)]
        means[key] = sum(value * rows for value, rows in having) / sum(rows for _, rows in having)
    return means


def from_main(world: World, obj: T) -> T:
    """The main process's `obj` on every process (what the others pass is ignored)."""
    if not _active(world):
        return obj
    import torch.distributed as dist

    box = [obj if world.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(world: World) -> None:
    if _active(world):
        import torch.distributed as dist

        dist.barrier()


def _collective_device() -> torch.device:
    """Tensors for NCCL live on this process's GPU; gloo takes CPU tensors."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
