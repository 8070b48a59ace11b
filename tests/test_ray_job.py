"""The NeMo-RL job's node script (rlsteps.launch.ray_job) run for real on this machine, two nodes at once, with
stand-ins for `ray` (it logs how it was started) and for rlsteps's prepare, await-ray and finish stages (the clean-up
of stale Ray processes is the real one); and what a plan refuses for such a job.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import pytest
import yaml

import required
from rlsteps.catalog import load_catalog
from rlsteps.cli.app import main
from rlsteps.contract.nemo_rl_job import NODE_SCRIPT_FILE
from rlsteps.engine.nemo_rl_stages.ray_nodes import stop_stale
from rlsteps.errors import UsageError
from rlsteps.launch import ray_job, slurm
from rlsteps.plan.runner import RunRequest, compile_request
from upstream import unpacked

# Slow (starts Ray's node scripts and processes for each case): the fast tier, -m 'not slow', leaves it out
pytestmark = pytest.mark.slow

INPUTS = ("inputs.prompts=/lustre/p.jsonl", "inputs.policy=/lustre/sft", "inputs.judge_model=/lustre/judge")
PROFILES = """\
profiles:
  gpus:
    executor: slurm
    nodes: 2
    gpus_per_node: 8
    container_image: /images/nemo-rl.sqsh
    container_mounts: ["/lustre:/lustre", "/tmp:/tmp", "/home/me/data:/data"]
    python: python
    cluster_paths: [/lustre/datasets]
  one_node:
    extends: gpus
    nodes: 1
  lepton:
    executor: lepton
    node_group: group
    resource_shape: gpu.8xh100-80gb
    container_image: nvcr.io/nvidia/nemo-rl:v0.7.0
    nodes: 2
    gpus_per_node: 8
    mounts: [{path: /shared, mount_path: /data, from: "node-nfs:fs"}]
"""
FAKE_RAY = r"""#!/bin/bash
# ray, stood in for: one line per call, with what the call saw; `start --block` waits until it is stopped
stale=gone
if [ -n "${STALE_PID:-}" ] && [ -e "/proc/$STALE_PID" ] && [ "$(awk '{print $3}' "/proc/$STALE_PID/stat")" != Z ]; then
    stale=alive
fi
node=${RLSTEPS_NODE_RANK:-${LEPTON_JOB_WORKER_INDEX:-}}
echo "node=$node uv=${RAY_ENABLE_UV_RUN_RUNTIME_ENV:-unset} stale=$stale $*" >> "$RAY_LOG"
case " $* " in *" --block "*) sleep 600 & trap 'kill $!; exit 0' TERM; wait;; esac
"""
FAKE_PYTHON = r"""#!/bin/bash
# the node's python, stood in for in rlsteps's prepare, await-ray and finish stages; anything else is the real one
if [ "${1:-} ${2:-}" = "-m rlsteps.engine.nemo_rl_stages" ]; then
    case "$3" in
        prepare|finish) exit 0 ;;
        await-ray)  # the head's address published, as the real stage does once Ray's head answers
            shift 3
            while [ $# -gt 0 ]; do case "$1" in --address) address=$2 ;; --publish) publish=$2 ;; esac; shift 2; done
            echo "$address" > "$publish.partial" && mv "$publish.partial" "$publish"
            exit 0 ;;
    esac
fi
exec REAL "$@"
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlsteps.yaml").write_text(PROFILES)
    return tmp_path


def compiled(profile: str, *overrides: str, step: str = "rlhf"):
    request = RunRequest(step=step, config="default", overrides=("engine=nemo_rl", *overrides), batch_profile=profile)
    return compile_request(load_catalog(), request)


class Nodes:
    """A two-node job's node script on this machine: each node a process, `ray` and the stages stood in for."""

    def __init__(self, project: Path):
        self.bin = project / "bin"
        self.bin.mkdir()
        (self.bin / "ray").write_text(FAKE_RAY)
        (self.bin / "python").write_text(FAKE_PYTHON.replace("REAL", sys.executable))
        for tool in self.bin.iterdir():
            tool.chmod(0o755)
        self.log = project / "ray_calls.log"
        self.run_dir = project / "run"
        job = compiled(
            "gpus",
            *INPUTS,
            "nemo_rl_job.driver=/bin/bash -c 'sleep 4'",  # long enough for the worker to join
            f"nemo_rl_job.workdir={project}",
            "nemo_rl_job.nodes_timeout_s=60",
        ).job
        ray = ray_job.RayJob(
            2, 8, PurePosixPath(project / "job"), PurePosixPath(self.run_dir), str(self.bin / "python")
        )
        self.script = project / "job" / NODE_SCRIPT_FILE
        self.script.parent.mkdir()
        self.script.write_text(ray_job.node_script(job, ray))
        self.root = Path(ray.paths.root / "ray")

    def start(self, rank: int, command: str, **env: str) -> subprocess.Popen:
        """One node: `command` is the launcher's line that runs the node script (its path as NODE_SCRIPT)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LEPTON_", "RLSTEPS_NODE"))}
        env = {**base, "PATH": f"{self.bin}:{os.environ['PATH']}", "RAY_LOG": str(self.log), **env}
        env.setdefault("RLSTEPS_NODE_RANK", str(rank))
        return subprocess.Popen(
            ["/bin/bash", "-c", command.replace("NODE_SCRIPT", str(self.script))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, command: str, **env: str) -> list[tuple[int, str]]:
        nodes = [self.start(rank, command, **env) for rank in (0, 1)]
        return [(node.wait(timeout=120), node.stdout.read()) for node in nodes]

    def starts(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if " start " in f"{line} "]


def _ports(line: str) -> dict[str, int]:
    return {name: int(port) for name, port in re.findall(r"--([a-z-]*port)=(\d+)", line)}


def test_every_node_starts_ray_on_pinned_ports_clear_of_the_ephemeral_range_and_of_nemo_rls_ranges(project):
    nodes = Nodes(project)
    done = nodes.run("exec /bin/bash NODE_SCRIPT 42-0")
    assert [code for code, _ in done] == [0, 0], done
    head, worker = sorted(nodes.starts())
    assert "--head" in head and "--address=" in worker
    head_ports, worker_ports = _ports(head), _ports(worker)
    assert head_ports["port"] == 6379  # nemo_rl_job.ray_port: the GCS port
    for ports in (head_ports, worker_ports):
        assert {"node-manager-port", "object-manager-port", "runtime-env-agent-port", "dashboard-agent-grpc-port",
                "dashboard-agent-listen-port", "metrics-export-port"} <= set(ports)  # fmt: skip
        assert (ports["min-worker-port"], ports["max-worker-port"]) == (10002, 11000)
    assert {"ray-client-server-port", "dashboard-port"} <= set(head_ports)
    # a head and a worker on one machine (this one) collide on none of a node's own ports
    assert not {p for n, p in head_ports.items() if "worker-port" not in n} & set(worker_ports.values())
    # NeMo-RL's own example of the ranges its vLLM and NeMo-Gym servers take
    example = unpacked("nemo_rl") / "examples/nemo_gym/nemotron-3-super/stage3_rlhf.yaml"
    config = yaml.safe_load(example.read_text())
    taken = [
        (section["port_range_low"], section["port_range_high"])
        for section in (config["policy"]["generation"], config["env"]["nemo_gym"])
    ]
    assert taken == [(11001, 15000), (15001, 20000)]
    for port in [*head_ports.values(), *worker_ports.values()]:
        assert port < 32768  # below Linux's ephemeral range (32768-60999)
        assert not any(low <= port <= high for low, high in taken), port
    assert all(" uv=0 " in line for line in (head, worker))  # RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 before ray start


def test_a_ray_port_that_collides_is_refused(project):
    with pytest.raises(UsageError, match="nemo_rl_job.ray_port 10500 is taken by Ray's worker processes"):
        compiled("gpus", *INPUTS, "nemo_rl_job.ray_port=10500")
    with pytest.raises(UsageError, match="ephemeral"):
        compiled("gpus", *INPUTS, "nemo_rl_job.ray_port=40000")


def _process(state: Path) -> subprocess.Popen:
    """A process as a node's Ray leaves it: it carries its attempt's state folder in its environment."""
    return subprocess.Popen(["sleep", "300"], env={**os.environ, "RLSTEPS_RAY_STATE": str(state)})


def test_a_stale_ray_of_an_earlier_try_is_stopped_before_the_node_starts_ray_again(project):
    nodes = Nodes(project)
    stale = _process(nodes.root / "42-0")  # the requeued job's first try, still running on this machine
    other = _process(project / "other_run" / "nemo_rl" / "ray" / "7-0")  # another job's Ray, still going
    try:
        done = nodes.run("exec /bin/bash NODE_SCRIPT 42-1", STALE_PID=str(stale.pid))
        assert [code for code, _ in done] == [0, 0], done
        starts = nodes.starts()
        assert len(starts) == 2 and all(" stale=gone " in line for line in starts)
        assert stale.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for process in (stale, other):
            process.kill()
            process.wait()


def test_stop_stale_leaves_this_attempt_and_running_jobs_and_stops_ended_ones(tmp_path):
    root = tmp_path / "run" / "nemo_rl" / "ray"
    ended = tmp_path / "old_run" / "nemo_rl" / "ray" / "5-0"
    ended.mkdir(parents=True)
    (ended / "ended").touch()
    processes = {
        "this attempt": _process(root / "9-1"),
        "an earlier attempt": _process(root / "9-0"),
        "an ended job": _process(ended),
        "a running job": _process(tmp_path / "live_run" / "nemo_rl" / "ray" / "6-0"),
    }
    try:
        stopped = stop_stale(root, root / "9-1", grace_s=5)
        assert sorted(stopped) == sorted(processes[n].pid for n in ("an earlier attempt", "an ended job"))
        for name, process in processes.items():
            process.poll() if name in ("this attempt", "a running job") else process.wait(timeout=10)
            assert (process.returncode is None) == (name in ("this attempt", "a running job")), name
    finally:
        for process in processes.values():
            process.kill()
            process.wait()


def _lepton_node_line(project: Path) -> str:
    """The Lepton entry script's last line, the node script's path in it left to Nodes."""
    required.importorskip("leptonai", switch="LEPTON")
    plan = compiled("lepton", *INPUTS, "output.dir=/data/runs/rlhf").plan
    spec = yaml.safe_load(plan.files["lepton_job.json"])["spec"]
    line = spec["container"]["command"][-1].rstrip().splitlines()[-1]
    return re.sub(r"/\S*/" + re.escape(NODE_SCRIPT_FILE), "NODE_SCRIPT", line)


def test_a_lepton_retry_gets_its_own_ray_state_and_its_workers_do_not_leave_at_the_last_tries_end(project):
    line = _lepton_node_line(project)
    nodes = Nodes(project)

    def node(rank: int, failures: int) -> subprocess.Popen:  # the node rank: Lepton's worker index, as in the job
        lepton = {"LEPTON_JOB_NAME": "rlhf-job", "LEPTON_JOB_WORKER_INDEX": str(rank), "RLSTEPS_NODE_RANK": ""}
        return nodes.start(rank, line, **lepton, LEPTON_JOB_FAILURE_COUNT=str(failures))

    first = [node(rank, 0) for rank in (0, 1)]
    assert [n.wait(timeout=120) for n in first] == [0, 0], [n.stdout.read() for n in first]
    [first_attempt] = [p for p in nodes.root.iterdir() if p.is_dir()]
    assert (first_attempt / "ended").exists()  # the first try's state, end marker and all, stays where it was

    worker = node(1, 1)  # the retry's worker starts before its head
    time.sleep(6)
    assert worker.poll() is None, worker.stdout.read()  # it waits for the retry's attempt, not the last one's end
    head = node(0, 1)
    assert [head.wait(timeout=120), worker.wait(timeout=120)] == [0, 0], (head.stdout.read(), worker.stdout.read())
    attempts = sorted(p for p in nodes.root.iterdir() if p.is_dir())
    assert len(attempts) == 2 and all((a / "ended").exists() for a in attempts)
    second = next(a for a in attempts if a != first_attempt)
    assert (nodes.root / "rlhf-job-1.attempt").read_text().strip() == second.name
    joined = [line for line in nodes.starts() if "--address=" in line]
    assert len(joined) == 2  # the retry's worker joined Ray once, the retry's


def test_a_run_directory_the_nodes_do_not_share_is_refused_in_the_dry_run(project, capsys):
    code = main(["run", "rl/rlhf", "-c", "default", "-b", "gpus", "--dry-run", "engine=nemo_rl", *INPUTS,
                 "output.dir=/tmp/rlsteps-not-shared/run"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    problem, fix = err.strip().splitlines()
    assert problem.startswith("error: output.dir /tmp/rlsteps-not-shared/run is not on a filesystem the job's 2 nodes")
    assert fix.startswith("fix: set output.dir under") and "cluster_paths" in fix


@pytest.mark.parametrize(
    "run_dir",
    [
        "/lustre/datasets/runs/x",  # cluster_paths
        "/lustre/users/me/run",  # a container mount's host side
        "/home/me/data/run",
        ".rlsteps/runs/x",  # the working directory
    ],
)
def test_a_run_directory_in_a_shared_place_of_the_slurm_profile_is_taken(project, run_dir):
    assert compiled("gpus", *INPUTS, f"output.dir={run_dir}").plan.files[NODE_SCRIPT_FILE]


def test_the_slurm_profiles_shared_places(project, monkeypatch):
    monkeypatch.setattr(slurm, "_filesystem", lambda p: Path("/lustre") if str(p).startswith("/lustre") else Path("/"))
    job = compiled("gpus", *INPUTS).job
    profile = slurm.load_profile(job)
    where = slurm.place(job, profile, Path("/lustre/users/me/jobs/j1"))
    places = set(map(str, slurm.shared_places(profile, where)))
    assert {"/lustre", "/lustre/users/me/jobs", str(project), "/lustre/datasets", "/home/me/data"} <= places
    assert not any(p == "/" or p.startswith("/tmp") and not p.startswith(str(project)) for p in places)


def test_one_node_needs_no_shared_run_directory_and_a_container_mount_of_tmp_shares_nothing(project):
    # 7 policy GPUs + judge: 35 prompts x 16 generations = 560 rows a step, 2 optimizer steps of 280 over 7 ranks
    one_node = (
        *INPUTS,
        "output.dir=/tmp/rlsteps-one-node",
        "rollout.prompts_per_step=35",
        "train.global_batch_size=280",
    )
    assert compiled("one_node", *one_node).plan.files[NODE_SCRIPT_FILE]
    with pytest.raises(UsageError, match="output.dir /tmp/elsewhere is not on a filesystem"):
        compiled("gpus", *INPUTS, "output.dir=/tmp/elsewhere")


def test_on_lepton_the_run_directory_must_be_under_a_mount(project):
    required.importorskip("leptonai", switch="LEPTON")
    with pytest.raises(UsageError, match=r"output.dir /scratch/run is not on a filesystem") as refused:
        compiled("lepton", *INPUTS, "output.dir=/scratch/run")
    assert "mount_path (/data)" in refused.value.fix
    (project / "rlsteps.yaml").write_text(PROFILES.replace("    mounts:", "    workdir: /workspace\n    mounts:"))
    with pytest.raises(UsageError, match=r"output.dir /workspace/\S+ is not on a filesystem"):
        compiled("lepton", *INPUTS)


def test_without_the_leptonai_sdk_a_dry_run_compiles_and_a_submit_names_the_lepton_extra(project, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "leptonai", None)  # import leptonai... fails as if it were not installed
    on_the_mount = [i.replace("/lustre/", "/data/") for i in INPUTS]  # what the Lepton job sees
    argv = ["run", "rl/rlhf", "-c", "default", "-b", "lepton", "engine=nemo_rl", *on_the_mount, "output.dir=/data/run"]
    code = main([*argv, "--dry-run"])  # the spec is a plain dict: nothing to send, nothing of the SDK needed
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "resource_shape" in out
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "fix: pip install 'rlsteps[lepton]'" in err
