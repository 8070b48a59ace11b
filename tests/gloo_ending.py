"""Why a process of a distributed run ends without the interpreter's teardown: rank 1 ends while its gloo worker
thread still has a collective's tensor to release.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/gloo_ending.py teardown|end_process

Rank 1 leaves an all-reduce to gloo's worker thread and ends at once; rank 0 joins the all-reduce while rank 1 runs
its exit handlers. Rank 1's worker thread then finishes the collective and releases its tensor, which has a Python
object: it waits for the GIL. The last exit handler (registered first, so it runs last) holds the GIL in C for a
few seconds, as any C code may. What happens next depends on the ending:
- `teardown` (falling off the end of the script): the teardown begins as the handler returns, and the thread that
  then takes the GIL is ended with pthread_exit; its unwinding through torch's noexcept release aborts the process,
  "terminate called without an active exception", as rank 1 of the distributed tests once did under load, when the
  thread happened to be late;
- `end_process` (the worker's way to end): no teardown; the process exits 0.
"""

from __future__ import annotations

import atexit
import ctypes
import sys
import time

HOLD_S = 3  # the GIL held in the last exit handler; rank 0 joins the all-reduce 0.5 s into it
hold_the_gil = ctypes.PyDLL(None).sleep  # PyDLL: the C call keeps the GIL
atexit.register(hold_the_gil, HOLD_S)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rlsteps.engine.run.worker import end_process  # noqa: E402

KEPT: list[torch.Tensor] = []  # the tensor's Python object outlives the collective


def main(ending: str) -> None:
    dist.init_process_group("gloo")
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        join_late(store)
    else:
        end_with_the_collective_in_flight(store, ending)


def join_late(store: dist.Store) -> None:
    """Rank 0: joins the all-reduce once rank 1 is in its exit handlers, and ends after it."""
    atexit.unregister(hold_the_gil)
    store.wait(["rank 1 ends"])
    time.sleep(0.5)
    dist.all_reduce(torch.ones(1024))
    time.sleep(HOLD_S + 1)
    end_process(0)


def end_with_the_collective_in_flight(store: dist.Store, ending: str) -> None:
    """Rank 1: leaves the all-reduce to gloo's worker thread and ends, by the teardown or by end_process."""
    tensor = torch.ones(1024)
    KEPT.append(tensor)
    dist.all_reduce(tensor, async_op=True)
    store.set("rank 1 ends", "1")
    if ending == "end_process":
        end_process(0)


if __name__ == "__main__":
    main(sys.argv[1])
