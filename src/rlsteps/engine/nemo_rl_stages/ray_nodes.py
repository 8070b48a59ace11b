"""The head's wait for Ray: connect to the local head, publish its address for the other nodes, then wait until
every node of the job has joined (or say which are missing when the time is up). And every node's clean-up before
it starts Ray: the processes an earlier try left running on it."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger("rlsteps")
POLL_S = 2.0
STATE_VAR = b"RLSTEPS_RAY_STATE="  # the node script exports it before `ray start`: every Ray process inherits it
STALE_GRACE_S = 5.0  # SIGTERM, then SIGKILL what is left after this long


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


def stop_stale(root: Path, state: Path, grace_s: float = STALE_GRACE_S, proc: Path = Path("/proc")) -> list[int]:
    """Stop the Ray processes an earlier try left on this node (a requeued or retried job lands on a node where the
    last try's Ray may still hold the ports): those of this run's other attempts (their state folder is under
    `root`, not `state`) and those of any rlsteps Ray job whose end marker is written. The processes of this attempt
    (another node of it on the same machine) and of other jobs still running are left alone, which `ray stop`,
    which stops every Ray on the machine, would not do. Returns the pids stopped."""
    mine = {os.getpid(), os.getppid()}
    stale = [pid for pid, owner in _ray_processes(proc) if pid not in mine and _is_stale(Path(owner), root, state)]
    for pid in stale:
        log.info("stopping pid %d, left by an earlier Ray job on this node", pid)
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(pid, proc) for pid in stale) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in stale:
        if _alive(pid, proc):
            _signal(pid, signal.SIGKILL)
    return stale


def _ray_processes(proc: Path) -> list[tuple[int, str]]:
    found = []
    for environ in proc.glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        owner = next((v[len(STATE_VAR) :] for v in variables if v.startswith(STATE_VAR)), None)
        if owner:
            found.append((int(environ.parent.name), owner.decode(errors="replace")))
    return found


def _is_stale(owner: Path, root: Path, state: Path) -> bool:
    if owner == state:
        return False
    return owner.parent == root or (owner / "ended").exists()


def _alive(pid: int, proc: Path) -> bool:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]  # a zombie is gone, only not yet reaped


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
