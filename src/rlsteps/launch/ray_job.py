"""A NeMo-RL job (engine=nemo_rl) on Ray: its compiled master config, and the script every node of it runs.

Each node runs NODE_SCRIPT_FILE once (one Slurm task or one Lepton replica per node). The job's first node
prepares the inputs (rlsteps converts a checkpoint_megatron policy to the HF form NeMo-RL loads, and writes the
prompts as NeMo-RL's rows), starts Ray's head, publishes its address on the shared filesystem once it answers,
waits for every node to join, runs NeMo-RL's driver in its checkout, and on success writes NeMo-RL's last
checkpoint back as the step's typed output artifact. The other nodes wait for the address, join with
`ray start --block`, and leave when the head marks the job ended. The head writes the job's exit code (the
driver's, or that of the stage that failed) into the attempt's state folder before it stops Ray; the launcher
reads it from there, since a node's own exit says less (a worker killed as Ray stops, say).
The same NeMo-RL cluster layout as NeMo-RL's own ray.sub: head on the first node, workers on the rest.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from omegaconf import OmegaConf

from rlsteps.engine.nemo_rl.layout import MASTER_CONFIG_FILE, NODE_SCRIPT_FILE, NemoRlPaths
from rlsteps.engine.nemo_rl.master_config import Cluster, MasterConfig, NemoRlConfigError, compile_master_config
from rlsteps.errors import UsageError
from rlsteps.launch.base import comment_safe
from rlsteps.launch.job import Job

EXIT_CODE_FILE = "exit_code"
# The node's index in the job: torchrun's, Slurm's or Lepton's, whichever launched it.
NODE_RANK = "${RLSTEPS_NODE_RANK:-${SLURM_NODEID:-${LEPTON_JOB_WORKER_INDEX:-0}}}"
DRIVERS = {  # NeMo-RL's training entry point per algorithm, relative to its checkout
    "grpo": "examples/nemo_gym/run_grpo_nemo_gym.py",  # rl/rlhf: GRPO with NeMo-Gym's environments (the judge)
    "reinforce": "examples/run_grpo.py",
}


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

    @property
    def paths(self) -> NemoRlPaths:
        return NemoRlPaths(self.run_dir)

    def state(self, attempt: str) -> PurePosixPath:
        return self.paths.ray_state(attempt)


def absolute_run_dir(job: Job, workdir: Path) -> PurePosixPath:
    """output.dir as the job's machines see it: relative paths resolve in the job's working directory."""
    out = PurePosixPath(job.config["output"]["dir"])
    return out if out.is_absolute() else PurePosixPath(workdir) / out


def master_config(job: Job, ray: RayJob) -> MasterConfig:
    if ray.gpus_per_node < 1 and not job.config["nemo_rl_job"].get("driver"):
        raise UsageError(
            "engine=nemo_rl needs GPUs: NeMo-RL trains and generates on them",
            fix="run on a profile with gpus_per_node of 1 or more (and NeMo-RL's container)",
        )
    from rlsteps.engine.config import STEP_SCHEMAS  # torch-free

    config = job.worker_config()  # secrets stay ${oc.env:...}: the job's environment carries them
    validated = STEP_SCHEMAS[config["algorithm"]].model_validate(config).model_dump(mode="json")
    try:
        return compile_master_config(validated, Cluster(ray.nodes, ray.gpus_per_node), ray.run_dir)
    except NemoRlConfigError as err:
        raise UsageError(str(err)) from None


def job_files(job: Job, ray: RayJob) -> dict[str, str]:
    """The job directory's NeMo-RL files: the master config (notes on top) and the node script."""
    compiled = master_config(job, ray)
    return {MASTER_CONFIG_FILE: master_config_yaml(compiled), NODE_SCRIPT_FILE: node_script(job, ray)}


def master_config_yaml(compiled: MasterConfig) -> str:
    from rlsteps.engine.nemo_rl import NEMO_RL_VERSION

    header = [f"# NeMo-RL GRPO master config compiled by rlsteps (NeMo-RL {NEMO_RL_VERSION})."]
    if compiled.notes:
        header.append("# Where NeMo-RL's semantics differ from the embedded engine's:")
        header += [f"#  - {comment_safe(note)}" for note in compiled.notes]
    body = OmegaConf.to_yaml(OmegaConf.create(compiled.config))
    return "\n".join(header) + "\n" + body


def node_command(ray: RayJob, attempt: str) -> list[str]:
    """What each node runs; `attempt` names this try of the job (a shell word the launcher expands)."""
    return ["/bin/bash", str(ray.job_dir / NODE_SCRIPT_FILE), attempt]


def driver_words(job: Job, ray: RayJob) -> list[str]:
    settings = job.config["nemo_rl_job"]
    master = str(ray.job_dir / MASTER_CONFIG_FILE)
    if settings.get("driver"):
        return [*shlex.split(settings["driver"]), "--config", master]
    return [*shlex.split(settings["python"]), DRIVERS[job.config["algorithm"]], "--config", master]


def node_script(job: Job, ray: RayJob) -> str:
    settings: dict[str, Any] = job.config["nemo_rl_job"]
    q = shlex.quote
    values = [
        f"nodes={ray.nodes}",
        f"gpus={ray.gpus_per_node}",
        f"port={int(settings['ray_port'])}",
        f"timeout={int(settings['nodes_timeout_s'])}",
        f"python={q(ray.python)}",
        f"config={q(str(ray.job_dir / 'config.yaml'))}",
        f"workdir={q(settings['workdir'])}",
        f'state={q(str(ray.paths.root / "ray"))}/"$attempt"',
        "driver=(" + " ".join(q(w) for w in driver_words(job, ray)) + ")",
    ]
    head = f"# rlsteps {comment_safe(job.step_id)} on NeMo-RL, job {comment_safe(job.name)}: one node's part"
    return "\n".join(["#!/bin/bash", head, *NODE_SCRIPT_HEAD, *values, *NODE_SCRIPT_BODY]) + "\n"


NODE_SCRIPT_HEAD = [
    "# Node 0: prepare the inputs, start Ray's head, wait for every node, run NeMo-RL's driver, write the output.",
    "# Other nodes: join the head's Ray until the job ends. See rlsteps.launch.ray_job.",
    "set -uo pipefail",
    'attempt=${1:?"usage: ray_node.sh ATTEMPT"}',
    f"rank={NODE_RANK}",
]
NODE_SCRIPT_BODY = r"""
LEAVE_S=6  # the other nodes look for the end marker every 2 s; their Ray drains in under one
say() { echo "rlsteps[node $rank]: $*" >&2; }
rlsteps() { "$python" -m rlsteps.engine.nemo_rl "$@"; }

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
    mkdir -p "$state" || exit 1
    trap 'end_job 143' TERM INT HUP
    rlsteps prepare "$config" || end_job $?
    # this node's first address other than loopback (`hostname --ip-address` may answer 127.0.1.1); a profile's
    # env_vars can name another (RLSTEPS_RAY_HEAD_IP), say the fabric's
    ip=${RLSTEPS_RAY_HEAD_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}
    ip=${ip:-$(hostname --ip-address | awk '{print $1}')}
    ray start --head --node-ip-address="$ip" --port="$port" --num-gpus="$gpus" \
        --include-dashboard=false --disable-usage-stats --block &
    ray_pid=$!
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
    until [ -s "$state/address" ]; do
        [ -e "$state/ended" ] && exit 0  # the head ended before Ray was up: its exit code is the job's
        if [ "$SECONDS" -ge "$deadline" ]; then say "no Ray head address in $state after ${timeout}s"; exit 1; fi
        sleep 2
    done
    ray start --address="$(cat "$state/address")" --num-gpus="$gpus" --disable-usage-stats --block &
    ray_pid=$!
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

if [ "$rank" -eq 0 ]; then run_head; else run_worker; fi""".splitlines()
