"""A NeMo-RL job (engine=nemo_rl) on Ray: its compiled master config, and the script every node of it runs.

Each node runs NODE_SCRIPT_FILE once (one Slurm task or one Lepton replica per node). The job's first node
prepares the inputs (rlsteps converts a checkpoint_megatron policy to the HF form NeMo-RL loads, and writes the
prompts as NeMo-RL's rows), starts Ray's head, publishes its address on the shared filesystem once it answers,
waits for every node to join, runs NeMo-RL's driver in its checkout, and on success writes NeMo-RL's last
checkpoint back as the step's typed output artifact. The other nodes wait for the address, join with
`ray start --block`, and leave when the head marks the job ended. The head writes the job's exit code (the
driver's, or that of the stage that failed) into the attempt's state folder before it stops Ray; the launcher
reads it from there, since a node's own exit says less (a worker killed as Ray stops, say).
The same NeMo-RL cluster layout as NeMo-RL's own ray.sub: head on the first node, workers on the rest, Ray's ports
pinned (RAY_PORTS), RAY_ENABLE_UV_RUN_RUNTIME_ENV=0.

Attempts: each try of the job has a state folder of its own, so a retry never reads an earlier try's address or
end marker. On Slurm every node knows the try's name (job id and restart count) and is given it. On Lepton the
nodes know the try (the job's name and LEPTON_JOB_FAILURE_COUNT) but not a name the first node may reuse (a
restarted first replica would find its last run's end marker): the first node names a fresh attempt and publishes
it as `<try>.attempt`, which the other nodes wait for. Before it starts Ray, every node stops what an earlier try
left running there (ray_nodes.stop_stale): the processes of this run's other attempts, and of any rlsteps Ray job
that has ended.

The run directory is where the nodes meet, so with more than one node it must be on a filesystem they share:
each launcher says which folders are (require_shared).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from omegaconf import OmegaConf

from rlsteps.contract.algorithms import nemo_rl_form
from rlsteps.contract.entry_points import NEMO_RL_STAGES_MODULE
from rlsteps.contract.nemo_rl_job import MASTER_CONFIG_FILE, NODE_SCRIPT_FILE, NemoRlPaths
from rlsteps.errors import UsageError
from rlsteps.launch.base import comment_safe
from rlsteps.launch.job import Job
from rlsteps.nemo_rl.master_config import Cluster, MasterConfig, NemoRlConfigError, compile_master_config

EXIT_CODE_FILE = "exit_code"
# The node's index in the job: torchrun's, Slurm's or Lepton's, whichever launched it.
NODE_RANK = "${RLSTEPS_NODE_RANK:-${SLURM_NODEID:-${LEPTON_JOB_WORKER_INDEX:-0}}}"
# Ray's ports, pinned on every node as NeMo-RL's ray.sub pins them, with other numbers: all below Linux's ephemeral
# range (32768-60999, where a port Ray probes and frees may go to an outgoing connection before Ray binds it) and
# clear of NeMo-RL's own ranges (NEMO_RL_PORTS). Each node's own ports are odd and the head takes each plus one, as
# in ray.sub, so a head and a worker on one machine do not collide. The GCS port is nemo_rl_job.ray_port.
NODE_PORTS = {
    "node-manager-port": 30001,
    "object-manager-port": 30003,
    "runtime-env-agent-port": 30005,
    "dashboard-agent-grpc-port": 30007,
    "dashboard-agent-listen-port": 30009,
    "metrics-export-port": 30011,
}
HEAD_PORTS = {"ray-client-server-port": 10001, "dashboard-port": 8265}  # the head's alone
WORKER_PORTS = (10002, 11000)  # --min-worker-port/--max-worker-port: Ray's worker processes, on every node
EPHEMERAL_PORTS = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range
NEMO_RL_PORTS = {  # NeMo-RL's defaults, which the master config keeps
    "vLLM's HTTP servers (policy.generation.port_range_low/high)": (11001, 15000),
    "NeMo-Gym's servers (env.nemo_gym.port_range_low/high)": (15001, 20000),
    "vLLM's TP/DP rendezvous (VLLM_PORT, from 20001)": (20001, 24999),
    "NeMo-RL's TCPStore (cluster.master_port_range_low/high)": (25000, 28000),
}
# Folders that are each machine's own even where a profile mounts them into the container.
NODE_LOCAL = tuple(PurePosixPath(p) for p in ("/tmp", "/var/tmp", "/dev/shm", "/run"))


def uses_nemo_rl(job: Job) -> bool:
    return job.config.get("engine") == "nemo_rl"


@dataclass(frozen=True)
class RayJob:
    """Where a NeMo-RL job runs: its nodes, and the paths its machines see."""

    nodes: int
    gpus_per_node: int
    job_dir: PurePosixPath  # the job directory on the cluster: config.yaml and the files below
    run_dir: PurePosixPath  # output.dir, absolute
    python: str  # the python that has rlsteps (its wheel on PYTHONPATH, or installed)
    gpu_memory_gib: float | None = None  # each GPU's, where the profile states it

    @property
    def paths(self) -> NemoRlPaths:
        return NemoRlPaths(self.run_dir)

    def state(self, attempt: str) -> PurePosixPath:
        return self.paths.ray_state(attempt)


def ray_ports(head: bool, gcs_port: int) -> dict[str, int]:
    """`ray start`'s port options on the head or on a worker node (the worker range is both's)."""
    ports = {"port": gcs_port, **HEAD_PORTS} if head else {}
    ports |= {name: port + 1 if head else port for name, port in NODE_PORTS.items()}
    return ports | {"min-worker-port": WORKER_PORTS[0], "max-worker-port": WORKER_PORTS[1]}


def check_gcs_port(port: int) -> None:
    """nemo_rl_job.ray_port clear of the other pinned ports, NeMo-RL's ranges and the ephemeral range."""
    taken = {
        **{f"Ray's --{name}": (p, p) for name, p in ray_ports(True, 0).items() if name != "port"},
        **{f"Ray's --{name} on workers": (p, p) for name, p in ray_ports(False, 0).items()},
        "Ray's worker processes": WORKER_PORTS,
        "Linux's ephemeral ports": EPHEMERAL_PORTS,
        **NEMO_RL_PORTS,
    }
    clash = next((what for what, (low, high) in taken.items() if low <= port <= high), None)
    if clash:
        raise UsageError(
            f"nemo_rl_job.ray_port {port} is taken by {clash}",
            fix="choose a port below 32768 outside 8265, 10001-28000 and 30001-30012 (the default is 6379)",
        )


def shared_folders(folders: Iterable[str | os.PathLike[str]]) -> tuple[PurePosixPath, ...]:
    """The absolute folders among those a profile names as shared, normalised; never the root."""
    kept = [PurePosixPath(os.path.normpath(str(folder))) for folder in folders]
    return tuple(dict.fromkeys(p for p in kept if p.is_absolute() and p != PurePosixPath("/")))


def machine_own(folder: str | os.PathLike[str]) -> bool:
    """A folder each machine has for itself (NODE_LOCAL), even where a profile mounts it into a container."""
    return _under(PurePosixPath(os.path.normpath(str(folder))), NODE_LOCAL)


def require_shared(ray: RayJob, shared: Iterable[PurePosixPath], fix: str) -> None:
    """With more than one node the run directory must be under a folder the nodes share: they meet through files
    there (the head's address, the end marker), and NeMo-RL's checkpoints and data are read on every node."""
    if ray.nodes < 2:
        return
    run_dir = PurePosixPath(os.path.normpath(str(ray.run_dir)))
    places = tuple(shared)
    if _under(run_dir, places):
        return
    named = ", ".join(map(str, places)) or "none"
    raise UsageError(
        f"output.dir {run_dir} is not on a filesystem the job's {ray.nodes} nodes share (shared: {named}); "
        "NeMo-RL's nodes meet through files under it",
        fix=fix,
    )


def _under(path: PurePosixPath, folders: Iterable[PurePosixPath]) -> bool:
    return any(path == folder or path.is_relative_to(folder) for folder in folders)


def master_config(job: Job, ray: RayJob) -> MasterConfig:
    if ray.gpus_per_node < 1 and not job.config["nemo_rl_job"].get("driver"):
        raise UsageError(
            "engine=nemo_rl needs GPUs: NeMo-RL trains and generates on them",
            fix="run on a profile with gpus_per_node of 1 or more (and NeMo-RL's container)",
        )
    from rlsteps.contract.config import STEP_SCHEMAS  # torch-free

    config = job.worker_config()  # secrets stay ${oc.env:...}: the job's environment carries them
    validated = STEP_SCHEMAS[config["algorithm"]].model_validate(config).model_dump(mode="json")
    try:
        cluster = Cluster(ray.nodes, ray.gpus_per_node, ray.gpu_memory_gib)
        compiled = compile_master_config(validated, cluster, ray.run_dir)
    except NemoRlConfigError as err:
        raise UsageError(str(err), fix=err.fix) from None
    refuse_cluster_overrides(job, compiled.config, ray)
    return compiled


CLUSTER_KEYS = ("cluster.num_nodes", "cluster.gpus_per_node")


def refuse_cluster_overrides(job: Job, master: dict[str, Any], ray: RayJob) -> None:
    """A cluster.* override the profile's GPUs overrule is refused, never dropped: rlsteps sets cluster.* to the
    policy's share of the job's nodes (the rest go to the judge or the reward model)."""
    from rlsteps.dotted import get

    for item in job.overrides:
        key, _, value = item.partition("=")
        key = key.strip().removeprefix("nemo_rl.")
        if key not in CLUSTER_KEYS or str(get(master, key)) == value.strip():
            continue
        judge = get(master, "env.nemo_gym.num_gpu_nodes") or 0
        policy = master["cluster"]
        raise UsageError(
            f"{key}={value.strip()} cannot be honoured: cluster.* is the policy's share of the profile's "
            f"{ray.nodes} node(s) x {ray.gpus_per_node} GPU(s) (here {policy['num_nodes']} node(s) x "
            f"{policy['gpus_per_node']} GPU(s) for the policy, {judge} node(s) for the judge)",
            fix=f"drop {key} and give the job the GPUs in the profile {job.profile_name or ''}: nodes and "
            "gpus_per_node (a profile may `extends:` another and change only those)".replace("  ", " "),
        )


def job_files(job: Job, ray: RayJob) -> dict[str, str]:
    """The job directory's NeMo-RL files: the master config (notes on top) and the node script."""
    compiled = master_config(job, ray)
    return {MASTER_CONFIG_FILE: master_config_yaml(compiled), NODE_SCRIPT_FILE: node_script(job, ray)}


def master_config_yaml(compiled: MasterConfig) -> str:
    from rlsteps.nemo_rl import NEMO_RL_VERSION

    header = [f"# NeMo-RL GRPO master config compiled by rlsteps (NeMo-RL {NEMO_RL_VERSION})."]
    if compiled.notes:
        header.append("# Where NeMo-RL's semantics differ from the embedded engine's:")
        header += [f"#  - {comment_safe(note)}" for note in compiled.notes]
    body = OmegaConf.to_yaml(OmegaConf.create(compiled.config))
    return "\n".join(header) + "\n" + body


def node_command(ray: RayJob, attempt: str) -> list[str]:
    """What each node runs; `attempt` names this try of the job, the same on every node (a shell word the launcher
    expands)."""
    return ["/bin/bash", str(ray.job_dir / NODE_SCRIPT_FILE), attempt]


def published_node_command(ray: RayJob, try_name: str) -> list[str]:
    """What each node runs where the first node names the attempt and publishes it; `try_name` names this try of
    the job, the same on every node of it and another on a retry (a shell word the launcher expands)."""
    return ["/bin/bash", str(ray.job_dir / NODE_SCRIPT_FILE), "--try", try_name]


def driver_words(job: Job, ray: RayJob) -> list[str]:
    settings = job.config["nemo_rl_job"]
    master = str(ray.job_dir / MASTER_CONFIG_FILE)
    if settings.get("driver"):
        return [*shlex.split(settings["driver"]), "--config", master]
    return [*shlex.split(settings["python"]), nemo_rl_form(job.config["algorithm"]).driver, "--config", master]


def node_script(job: Job, ray: RayJob) -> str:
    settings: dict[str, Any] = job.config["nemo_rl_job"]
    port = int(settings["ray_port"])
    check_gcs_port(port)
    q = shlex.quote
    values = [
        f"nodes={ray.nodes}",
        f"gpus={ray.gpus_per_node}",
        f"port={port}",
        f"timeout={int(settings['nodes_timeout_s'])}",
        f"python={q(ray.python)}",
        f"config={q(str(ray.job_dir / 'config.yaml'))}",
        f"workdir={q(settings['workdir'])}",
        f"root={q(str(ray.paths.root / 'ray'))}  # one state folder per attempt below it",
        "head_ports=(" + " ".join(f"--{name}={p}" for name, p in ray_ports(True, port).items()) + ")",
        "worker_ports=(" + " ".join(f"--{name}={p}" for name, p in ray_ports(False, port).items()) + ")",
        "driver=(" + " ".join(q(w) for w in driver_words(job, ray)) + ")",
    ]
    head = f"# rlsteps {comment_safe(job.step_id)} on NeMo-RL, job {comment_safe(job.name)}: one node's part"
    return "\n".join(["#!/bin/bash", head, *NODE_SCRIPT_HEAD, *values, *NODE_SCRIPT_BODY]) + "\n"


NODE_SCRIPT_HEAD = [
    "# Node 0: prepare the inputs, start Ray's head, wait for every node, run NeMo-RL's driver, write the output.",
    "# Other nodes: join the head's Ray until the job ends. See rlsteps.launch.ray_job.",
    "# ray_node.sh ATTEMPT: every node is given the attempt; ray_node.sh --try TRY: node 0 names it and publishes it",
    "set -uo pipefail",
    'if [ "${1:-}" = --try ]; then try=${2:?"usage: ray_node.sh --try TRY"}; attempt=""',
    'else try=""; attempt=${1:?"usage: ray_node.sh ATTEMPT | --try TRY"}; fi',
    f"rank={NODE_RANK}",
]
NODE_SCRIPT_BODY = r"""
LEAVE_S=6  # the other nodes look for the end marker every 2 s; their Ray drains in under one
say() { echo "rlsteps[node $rank]: $*" >&2; }
rlsteps() { "$python" -m @STAGES@ "$@"; }
# as NeMo-RL's ray.sub: NeMo-RL builds its workers' environments itself, once a node, not Ray's `uv run` per task
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0

start_ray() {  # this node's Ray in the background, once what an earlier try left running here is stopped
    export RLSTEPS_RAY_STATE="$state"  # every process of this Ray carries it: how a later try knows them
    rlsteps stop-stale-ray --root "$root" --state "$state" || say "some stale Ray processes could not be stopped"
    ray start "$@" --num-gpus="$gpus" --disable-usage-stats --block &
    ray_pid=$!
}

end_job() {  # the job's end, seen by every node: its exit code, the end marker; this node's Ray stops
    echo "$1" > "$state/exit_code.partial" && mv -f "$state/exit_code.partial" "$state/exit_code"
    : > "$state/ended"
    if [ -n "${ray_pid:-}" ]; then
        [ "$nodes" -gt 1 ] && sleep "$LEAVE_S"  # the other nodes leave first, while the head can still drain them
        kill "$ray_pid" 2>/dev/null; wait "$ray_pid" 2>/dev/null
    fi
    say "job ended with exit code $1"
    exit "$1"
}

run_head() {
    [ -n "$attempt" ] || attempt="$try-$(date -u +%Y%m%dT%H%M%SZ)-$RANDOM"  # a fresh one: no earlier run's state
    state="$root/$attempt"
    mkdir -p "$state" || exit 1
    if [ -n "$try" ]; then  # published for this try's other nodes
        echo "$attempt" > "$root/$try.attempt.partial" && mv -f "$root/$try.attempt.partial" "$root/$try.attempt" \
            || exit 1
    fi
    trap 'end_job 143' TERM INT HUP
    rlsteps prepare "$config" || end_job $?
    # this node's first address other than loopback (`hostname --ip-address` may answer 127.0.1.1); a profile's
    # env_vars can name another (RLSTEPS_RAY_HEAD_IP), say the fabric's
    ip=${RLSTEPS_RAY_HEAD_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}
    ip=${ip:-$(hostname --ip-address | awk '{print $1}')}
    start_ray --head --node-ip-address="$ip" "${head_ports[@]}" --include-dashboard=false
    rlsteps await-ray --address "$ip:$port" --nodes "$nodes" --publish "$state/address" --timeout "$timeout" \
        || end_job $?
    say "running NeMo-RL: ${driver[*]}"
    (cd "$workdir" && "${driver[@]}")
    code=$?
    [ "$code" -eq 0 ] || { say "NeMo-RL's driver failed (exit $code)"; end_job "$code"; }
    rlsteps finish "$config"
    end_job $?
}

run_worker() {
    local deadline=$((SECONDS + timeout))
    if [ -z "$attempt" ]; then  # the attempt node 0 names for this try: an earlier try's is never looked at
        until [ -s "$root/$try.attempt" ]; do
            [ "$SECONDS" -lt "$deadline" ] || { say "node 0 published no attempt of $try after ${timeout}s"; exit 1; }
            sleep 2
        done
        attempt=$(cat "$root/$try.attempt")
    fi
    state="$root/$attempt"
    until [ -s "$state/address" ]; do
        [ -e "$state/ended" ] && exit 0  # the head ended before Ray was up: its exit code is the job's
        if [ "$SECONDS" -ge "$deadline" ]; then say "no Ray head address in $state after ${timeout}s"; exit 1; fi
        sleep 2
    done
    start_ray --address="$(cat "$state/address")" "${worker_ports[@]}"
    trap 'kill "$ray_pid" 2>/dev/null; wait "$ray_pid"; exit 143' TERM INT HUP
    while kill -0 "$ray_pid" 2>/dev/null; do
        if [ -e "$state/ended" ]; then kill "$ray_pid"; wait "$ray_pid"; exit 0; fi
        sleep 2
    done
    wait "$ray_pid"
    code=$?
    [ -e "$state/ended" ] && exit 0
    say "Ray on this node stopped (exit $code) before the job ended"
    exit 1
}

if [ "$rank" -eq 0 ]; then run_head; else run_worker; fi""".replace("@STAGES@", NEMO_RL_STAGES_MODULE).splitlines()
