"""On Lepton, the reward model or judge server of a profile's `server:` is a job of its own beside the run's.

The server's job is created first, named after the run's (`<run>-srv`), with the run's image, mounts and secrets
unless `server:` says otherwise; the run's entry script exports the URL variable (server_alloc.URL_ENV) with the
server's replica 0 address (`<job>-0.<job>-job-svc`, the name the platform gives a job's replica within the
workspace), waits aloud for its health URL, then starts the worker. rlsteps deletes the server's job once it sees the
run's end (an attached run's end, `rlsteps jobs list/status`, `rlsteps jobs cancel`), and the record notes it.
"""

from __future__ import annotations

import shlex
from typing import Any

from rlsteps.launch import code, server_alloc
from rlsteps.launch.job import Job
from rlsteps.launch.server_alloc import ServerAllocation

SERVER_SPEC_FILE = "lepton_server_job.json"
SERVER_SUFFIX = "-srv"
WAIT_SAY_S = 30
POLL_S = 5


class LeptonServer(ServerAllocation):
    """`server:` on a Lepton profile: ServerAllocation's keys and the server job's own resource shape."""

    resource_shape: str | None = None  # default: the run's


def server_job_name(run_job_name: str) -> str:
    """The server's job id: the run's, cut to leave room for the suffix (36 characters in all)."""
    return run_job_name[: 36 - len(SERVER_SUFFIX)].rstrip("-") + SERVER_SUFFIX


def server_host(server_job: str) -> str:
    return f"{server_job}-0.{server_job}-job-svc"


def wait_lines(server: ServerAllocation, server_job: str) -> list[str]:
    """The run's entry script, before its worker: the URL exported, the server's health URL polled (bash's
    /dev/tcp), a line at least every WAIT_SAY_S seconds, and a stop if it does not answer in ready_timeout_s."""
    host, port = server_host(server_job), server.listen_port
    get = (
        f'exec 3<>/dev/tcp/{host}/{port} && printf "GET {server.health_path} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n" '
        ">&3 && head -n 1 <&3"
    )
    health = f"http://{host}:{port}{server.health_path}"
    return [
        f"export {server.url_env}={shlex.quote(f'http://{host}:{port}{server.url_suffix}')}",
        f"deadline=$((SECONDS + {server.ready_timeout_s})); said=-{WAIT_SAY_S}",
        f'until [[ "$(timeout 10 bash -c {shlex.quote(get)} 2>/dev/null)" == "HTTP/"?.?" 200"* ]]; do',
        '    if [ "$SECONDS" -ge "$deadline" ]; then',
        f'        echo "rlsteps: {server.describe()} (Lepton job {server_job}) did not answer {health} within '
        f'{server.ready_timeout_s}s: see the log of Lepton job {server_job}"',
        "        exit 1",
        "    fi",
        f"    if [ $((SECONDS - said)) -ge {WAIT_SAY_S} ]; then",
        f'        echo "rlsteps: waiting for {server.describe()} (Lepton job {server_job}) to answer {health} '
        '($((deadline - SECONDS))s left)"',
        "        said=$SECONDS",
        "    fi",
        f"    sleep {POLL_S}",
        "done",
        f'echo "rlsteps: {server.describe()} answers at ${server.url_env}"',
    ]


def server_script(job: Job, server: ServerAllocation, shipped: dict[str, str], wheel_dir: str) -> str:
    """The server job's entry script: the run's wheel rebuilt where the server is rlsteps's own, then the server."""
    command = server_alloc.command(job, server, server.python or "python")
    lines = ["set -euo pipefail"]
    if server.kind == "rlsteps" and shipped:
        wheel = f"{wheel_dir}/{code.wheel_name()}"
        lines += [f"mkdir -p {shlex.quote(wheel_dir)}", *code.unpack_lines(wheel, shipped)]
    return "\n".join([*lines, f"exec {shlex.join(command)}"]) + "\n"


def server_body(job: Job, profile: Any, run_body: dict[str, Any], shipped: dict[str, str], wheel_dir: str) -> dict:
    """The server's LeptonJob as the job API takes it: the run's spec with the server's command, image and shape, one
    replica, reachable by name (intra-job communication gives it its address)."""
    server = profile.server
    name = server_job_name(run_body["metadata"]["id"])
    carries_code = server.kind == "rlsteps" and bool(shipped)
    envs = [e for e in run_body["spec"]["envs"] if carries_code or not e["name"].startswith(f"{code.ENV_PREFIX}_")]
    spec = {
        **run_body["spec"],
        "resource_shape": server.resource_shape or profile.resource_shape,
        "container": {
            "image": server.container_image or profile.container_image,
            "command": ["/bin/bash", "-c", server_script(job, server, shipped, wheel_dir)],
        },
        "completions": 1,
        "parallelism": 1,
        "intra_job_communication": True,
        "envs": envs,
    }
    labels = {**run_body["metadata"]["labels"], "rlsteps-server-of": run_body["metadata"]["id"]}
    return {"metadata": {**run_body["metadata"], "id": name, "name": name, "labels": labels}, "spec": spec}
