"""The head's wait for Ray: connect to the local head, publish its address for the other nodes, then wait until
every node of the job has joined (or say which are missing when the time is up)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger("rlsteps")
POLL_S = 2.0


class RayNotReady(RuntimeError):
    """Ray's head did not come up, or not every node joined it in time."""


def await_ray(address: str, nodes: int, publish: Path, timeout_s: float) -> None:
    """Block until the Ray cluster at `address` has `nodes` live nodes; the address is written to `publish`
    (atomically) as soon as the head answers, which is what the other nodes wait for before they join."""
    import ray

    deadline = time.monotonic() + timeout_s
    _connect(ray, address, deadline)
    try:
        _publish(address, publish)
        log.info("Ray head at %s; waiting for %d node(s)", address, nodes)
        alive = _wait_for_nodes(ray, nodes, deadline)
        log.info("Ray: %d of %d node(s) up, %s", alive, nodes, _resources(ray))
    finally:
        ray.shutdown()


def _connect(ray, address: str, deadline: float) -> None:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            return
        except (ConnectionError, RuntimeError) as err:  # the head's GCS is not listening yet
            last = err
            time.sleep(POLL_S)
    raise RayNotReady(f"Ray's head at {address} did not answer in time: {last}")


def _publish(address: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(address + "\n")
    os.replace(partial, path)


def _wait_for_nodes(ray, nodes: int, deadline: float) -> int:
    alive = 0
    while True:
        alive = sum(1 for node in ray.nodes() if node.get("Alive"))
        if alive >= nodes:
            return alive
        if time.monotonic() >= deadline:
            raise RayNotReady(
                f"only {alive} of the job's {nodes} nodes joined Ray in time; see the other nodes' lines in the log"
            )
        time.sleep(POLL_S)


def _resources(ray) -> str:
    total = ray.cluster_resources()
    return ", ".join(f"{name} {total[name]:g}" for name in ("CPU", "GPU") if name in total) or "no resources"
