"""A real Ray cluster on this machine for NeMo-RL's driver (tests/nemo_rl_run.py --real-ray): one node with the case's
GPUs declared to Ray as logical resources (no GPU needs to exist), its processes those of `ray start --head --block`
in a session of their own, ended with it. The driver joins it as NeMo-RL's init_ray joins any running cluster
(RAY_ADDRESS); every process Ray starts for the job runs `worker_setup_hook` first (Ray's worker_process_setup_hook,
added to the runtime_env NeMo-RL's init_ray gives), which installs the GPU stand-ins before NeMo-RL's code runs there.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
CPUS = 8  # logical: NeMo-RL reserves a CPU per worker group and bundle; Ray starts processes as actors ask, not per CPU
OBJECT_STORE_BYTES = 300 * 1024**2  # the steps' batches are small
STARTED = "Ray runtime started."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_cluster(gpus: int, cpus: int = CPUS, start_timeout: float = 120.0) -> Iterator[str]:
    """A one-node Ray cluster with `gpus` logical GPUs; yields its address. Its processes end when the block does."""
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="rlray-", dir="/tmp")  # short: Ray's socket paths are bounded
    command = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
               f"--num-gpus={gpus}", f"--num-cpus={cpus}", f"--temp-dir={temp_dir}", "--include-dashboard=false",
               f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"]  # fmt: skip
    log = Path(temp_dir) / "ray_start.log"
    with log.open("w") as out:
        head = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_started(head, log, start_timeout)
        yield f"127.0.0.1:{port}"
    finally:
        _end(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_until_started(head: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while STARTED not in log.read_text():
        if head.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ray start did not start (exit {head.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _end(head: subprocess.Popen) -> None:
    """`ray start --block` ends the cluster's processes on SIGTERM; what is left of its session is then killed."""
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGKILL)
    head.wait()


def joined_with_setup_hook(hook: str) -> None:
    """ray.init, as NeMo-RL's init_ray calls it, with `hook` (module.function) as the job's worker setup hook."""
    import ray

    init = ray.init

    @functools.wraps(init)
    def init_with_hook(*args, runtime_env: dict | None = None, **kwargs):
        return init(*args, runtime_env={**(runtime_env or {}), "worker_process_setup_hook": hook}, **kwargs)

    ray.init = init_with_hook


def placement_groups() -> list[dict]:
    """The cluster's placement groups as Ray's table gives them (each bundle's resources and node, the group's
    strategy and state), with each bundle's GPU ids where the in-process Ray knows them."""
    import ray

    import standin_ray
    import standin_ray_cluster

    in_process = standin_ray_cluster.CLUSTER["groups"] + standin_ray_cluster.CLUSTER["removed"]
    known = {group.id: group for group in in_process} if standin_ray.in_process() else {}
    rows = []
    for group_id, entry in ray.util.placement_group_table().items():
        order = sorted(entry["bundles"], key=int)
        row = {
            "name": entry["name"],
            "strategy": entry["strategy"],
            "state": entry["state"],
            "bundles": [entry["bundles"][i] for i in order],
            "nodes": [entry["bundles_to_node_id"].get(i) for i in order],
        }
        if group_id in known:
            row["gpu_ids"] = standin_ray_cluster.gpu_ids(known[group_id])
        rows.append(row)
    return rows


def actor_processes() -> dict[str, list[int]]:
    """The process ids of the cluster's actors, by class name (a real Ray's; the in-process one has none)."""
    import ray

    import standin_ray

    if standin_ray.in_process():
        return {}
    processes: dict[str, list[int]] = {}
    for actor in ray._private.state.actors().values():
        processes.setdefault(actor["ActorClassName"].rsplit(".", 1)[-1], []).append(actor["Pid"])
    return processes
