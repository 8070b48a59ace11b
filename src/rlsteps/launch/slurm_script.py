"""The sbatch script of a Slurm job, built from its profile: pure, deterministic, every value quoted.

The dry run prints exactly the file that is submitted. Secrets are never in it: sbatch passes the
submitting process's environment to the job (--export=ALL), and that is where they are put. Unless the
profile says the environment already has rlsteps (`code: installed`), the task runs with the job's own
wheel of rlsteps first on PYTHONPATH.

Processes: each node runs one Slurm task. With one process in all (nodes * nprocs_per_node == 1) the task
is the worker itself; otherwise it is a torchrun that starts nprocs_per_node workers on its node, alone
(--standalone) on one node, or meeting the other nodes' torchruns at the head node (c10d rendezvous).
srun ends every task 60 s after the first one ends, at once if that one failed (--kill-on-bad-exit=1
--wait=60), so a dead node or process never leaves the others waiting in a collective until the time limit;
with a single task the flags change nothing, and every srun line carries them.

Time limit: Slurm sends USR1 `checkpoint_before_limit_s` before it, to every process of the step; the
worker checkpoints after the step in progress and exits 75 (EXIT_CHECKPOINTED), and with `requeue: true`
the script requeues the job, which resumes from that checkpoint. Under torchrun two things change:
  - torchrun itself would die of USR1 (its default action), taking its workers down before they
    checkpoint: the task starts it with USR1 ignored. An ignored signal stays ignored across fork and exec,
    and each worker installs its own USR1 handler, which replaces the inherited ignore.
  - torchrun exits 1 whatever code its workers exit with (all of them exiting 75 included), so each worker
    runs under a small shell (torchrun --no-python) that writes CHECKPOINTED_FILE into the job dir when its
    worker exits 75. The script reads a failed task with that file as exit 75. One rank is enough: the
    checkpoint is written by all processes together before any of them exits 75, and srun or torchrun may
    stop the other ranks before they get to exit by themselves.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlsteps.contract.entry_points import EXIT_CHECKPOINTED
from rlsteps.contract.run_files import run_directory
from rlsteps.errors import UsageError
from rlsteps.launch import code, containers, ray_job
from rlsteps.launch.base import comment_safe, validated_profile, worker_command
from rlsteps.launch.job import Job
from rlsteps.launch.server_alloc import ServerAllocation
from rlsteps.secrets import is_secret

SCRIPT_FILE = "sbatch.sh"
LOG_NAME = "slurm-{job_id}.log"
RDZV_PORT = 29500
CHECKPOINTED_FILE = "checkpointed"  # in the job dir: some rank exited EXIT_CHECKPOINTED (torchrun exits 1)
SBATCH_BARE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")  # an #SBATCH value written without quotes
SRUN_END = ("--kill-on-bad-exit=1", "--wait=60")  # one task ending ends the others: no rank waits forever
# The task's first words under torchrun: torchrun, and every process it starts, ignore USR1 until the worker
# installs its own handler ($0 is only a name for the shell).
IGNORE_USR1 = 'trap "" USR1; exec "$@"'
# What torchrun starts for each rank: the worker, then the marker ($0) when it exits EXIT_CHECKPOINTED. The shell
# outlives torchrun's SIGTERM to its rank's process group (a trap, which the worker does not inherit), so torchrun
# waits for the worker itself to unwind.
RANK_WRAPPER = (
    f'trap : TERM INT HUP; marker=$0; "$@"; code=$?; if [ "$code" -eq {EXIT_CHECKPOINTED} ]; then : > "$marker"; fi; '
    'exit "$code"'
)


class SlurmProfile(BaseModel):
    """The launcher settings of a Slurm profile (everything in it but `config:` and `extends:`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executor: str = "slurm"
    account: str | None = None
    partition: str | None = None
    run_partition: str | None = None  # for -r (attached)
    batch_partition: str | None = None  # for -b (detached)
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    gpu_memory_gib: float | None = Field(None, gt=0)  # each GPU's memory: NeMo-RL jobs are checked against it
    nprocs_per_node: int | None = Field(None, ge=1)  # worker processes per node; default gpus_per_node, else 1
    ntasks_per_node: int = 1
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | int | None = None  # sbatch --mem: 0 is all of the node's memory
    time: str | int | None = None  # sbatch --time: minutes or [D-]HH:MM:SS
    exclusive: bool = False
    container_image: str | None = None  # an image reference (squashed once) or a .sqsh file
    container_mounts: list[str] = []
    env_vars: dict[str, str | int | float | bool] = {}
    setup_lines: list[str] = []  # shell lines run before srun, written as given (module load ...)
    job_dir: str | None = None  # job directories on the shared filesystem; default .rlsteps/jobs here
    squash_dir: str | None = None  # where squashed images are cached; default <job_dir>/../containers
    python: str | None = None  # the worker's python; default this one, or `python` inside a container
    code: Literal["ship", "installed"] = "ship"  # ship: the job runs its own wheel of rlsteps; installed: python has it
    checkpoint_before_limit_s: int | None = Field(300, ge=60)  # USR1 this long before `time` ends: checkpoint, stop
    requeue: bool = False  # requeue the job after that checkpoint (and on node failure): it resumes by itself
    squash_time: str | int = 60  # the time limit of the srun that squashes the image
    cluster_paths: list[str] = []  # folders only the compute nodes see: inputs there are checked in the job
    server: ServerAllocation | None = None  # the reward model or judge server on nodes of its own (slurm_hetjob)

    @field_validator("cluster_paths")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        relative = [path for path in value if not path.startswith("/")]
        if relative:
            raise ValueError(f"must be absolute folders, not {', '.join(relative)}")
        return value

    @field_validator("ntasks_per_node")
    @classmethod
    def _one_task_per_node(cls, value: int) -> int:
        if value != 1:
            raise ValueError(
                "must be 1: the job runs one task per node, and torchrun starts nprocs_per_node processes in it"
            )
        return value

    @field_validator("env_vars")
    @classmethod
    def _variable_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    def partition_for(self, mode: str) -> str | None:
        return (self.run_partition if mode == "attached" else self.batch_partition) or self.partition

    @property
    def nprocs(self) -> int:
        """Worker processes per node: nprocs_per_node, else one per GPU, else one."""
        return self.nprocs_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.nprocs


def load_profile(job: Job) -> SlurmProfile:
    return validated_profile(SlurmProfile, job, "Slurm")


@dataclass(frozen=True)
class Placement:
    """Where the job lives on the cluster and what runs it."""

    job_dir: Path  # the job directory the cluster sees (the profile's job_dir, else the local one)
    workdir: Path  # the job's working directory: relative output paths resolve here, as in a local run
    python: str
    container: containers.ContainerPlan | None
    wheel: Path | None  # the job's own rlsteps, put first on PYTHONPATH; None: the environment has it


def place(job: Job, profile: SlurmProfile, job_dir: Path) -> Placement:
    jobs_root = Path(profile.job_dir).expanduser().absolute() if profile.job_dir else job_dir.parent
    container = None
    if profile.container_image:
        cache = (
            Path(profile.squash_dir).expanduser().absolute() if profile.squash_dir else jobs_root.parent / "containers"
        )
        container = containers.plan_container(profile.container_image, cache, job.force_squash)
    python = profile.python or ("python" if container else sys.executable)
    cluster_job_dir = jobs_root / job_dir.name
    wheel = cluster_job_dir / code.wheel_name() if profile.code == "ship" else None
    return Placement(job_dir=cluster_job_dir, workdir=Path.cwd(), python=python, container=container, wheel=wheel)


class Expansion(str):
    """A shell word this module writes itself that must expand at run time, so it is not quoted."""


def shell_join(words: list[str]) -> str:
    return " ".join(w if isinstance(w, Expansion) else shlex.quote(w) for w in words)


def ray_job_of(job: Job, profile: SlurmProfile, where: Placement) -> ray_job.RayJob:
    """engine=nemo_rl: the job's nodes and paths as its node script sees them (rlsteps.launch.ray_job)."""
    return ray_job.RayJob(
        nodes=profile.nodes,
        gpus_per_node=profile.gpus_per_node,
        gpu_memory_gib=profile.gpu_memory_gib,
        job_dir=PurePosixPath(where.job_dir),
        run_dir=run_directory(job.config, where.workdir),
        python=where.python,
    )


def task_command(job: Job, profile: SlurmProfile, where: Placement, nodes_var: str = "SLURM_NNODES") -> list[str]:
    """What each Slurm task runs: the worker, a torchrun that starts the node's workers (module docstring), or
    with engine=nemo_rl the node's part of a Ray job."""
    if ray_job.uses_nemo_rl(job):
        node = ray_job.node_command(ray_job_of(job, profile, where), Expansion('"$attempt"'))
        return code.on_path(str(where.wheel), node) if where.wheel else node
    worker = worker_command(where.python, where.job_dir, job.passthrough)
    if profile.world_size == 1:
        return code.on_path(str(where.wheel), worker) if where.wheel else worker
    torchrun = [
        where.python,
        "-m",
        "torch.distributed.run",
        *rendezvous(profile, nodes_var),
        f"--nproc-per-node={profile.nprocs}",
        "--no-python",  # each rank is RANK_WRAPPER, which runs the worker
        "/bin/sh",
        "-c",
        RANK_WRAPPER,
        str(where.job_dir / CHECKPOINTED_FILE),
        *worker,
    ]
    task = code.on_path(str(where.wheel), torchrun) if where.wheel else torchrun
    return ["/bin/sh", "-c", IGNORE_USR1, "rlsteps-task", *task]


def rendezvous(profile: SlurmProfile, nodes_var: str = "SLURM_NNODES") -> list[str]:
    """How torchrun finds its peers: alone on one node (a free port of its own), else at the head node; nodes_var
    names the batch shell's variable that holds the node count."""
    if profile.nodes == 1:
        return ["--standalone"]
    return [
        Expansion(f'--nnodes="${nodes_var}"'),
        "--rdzv-backend=c10d",
        Expansion('--rdzv-id="$SLURM_JOB_ID"'),
        Expansion(f'--rdzv-endpoint="$head_node:{RDZV_PORT}"'),
    ]


def srun_words(job: Job, profile: SlurmProfile, where: Placement, nodes_var: str = "SLURM_NNODES") -> list[str]:
    container = (
        containers.pyxis_options(where.container, profile.container_mounts, where.workdir) if where.container else []
    )
    return [
        "srun",
        f"--nodes={profile.nodes}",
        "--ntasks-per-node=1",
        *SRUN_END,
        *container,
        *task_command(job, profile, where, nodes_var),
    ]


def directives(job: Job, profile: SlurmProfile, where: Placement) -> list[tuple[str, Any]]:
    wanted = [
        ("job-name", job.name),
        ("account", profile.account),
        ("partition", profile.partition_for(job.mode)),
        ("nodes", profile.nodes),
        ("ntasks-per-node", 1),
        ("gpus-per-node", profile.gpus_per_node or None),
        ("cpus-per-task", profile.cpus_per_task),
        ("mem", profile.mem),
        ("time", profile.time),
        ("exclusive", profile.exclusive or None),
        ("output", output_pattern(where.job_dir)),
        ("open-mode", "append"),
        ("chdir", where.workdir),
        ("export", "ALL"),
        ("dependency", "afterok:" + ":".join(job.depends_on) if job.depends_on else None),
        ("kill-on-invalid-dep", "yes" if job.depends_on else None),  # a failed stage cancels what waits on it
        ("signal", checkpoint_signal(job, profile)),
        ("requeue", profile.requeue or None),
    ]
    return [(flag, value) for flag, value in wanted if value is not None]


def sbatch_word(text: str) -> str:
    """A directive's value as sbatch reads it. sbatch parses #SBATCH lines itself, not through a shell: a word ends
    at unquoted whitespace, single and double quotes group, a backslash takes the next character as it is (inside
    quotes too, so shell quoting loses backslashes), an unquoted # starts a comment. Plain values stay bare; others
    go inside double quotes with \\ and \" escaped."""
    if SBATCH_BARE.fullmatch(text):
        return text
    return '"' + re.sub(r'(["\\])', r"\\\1", text) + '"'


def output_pattern(run_dir: Path) -> str:
    """--output: the job's log in its job dir. Slurm expands %-patterns in the whole path, so the dir's own % are
    written %%; a backslash in it makes Slurm drop every backslash and write the log elsewhere, so it is refused."""
    if "\\" in str(run_dir):
        raise UsageError(
            f"the job dir {run_dir} has a backslash, which Slurm drops from the log's path (--output)",
            fix="use a job dir without one (the profile's job_dir, or run from another folder)",
        )
    return str(run_dir).replace("%", "%%") + "/" + LOG_NAME.format(job_id="%j")


def sbatch_script(job: Job, profile: SlurmProfile, where: Placement) -> str:
    lines = [
        "#!/bin/bash",
        f"# rlsteps {comment_safe(job.step_id)} (config {comment_safe(job.config_name)}), "
        f"{job.mode} on profile {comment_safe(job.profile_name or '')}, job {job.name}",
    ]
    lines += directive_lines(directives(job, profile, where))
    lines += environment_lines(job, profile)
    srun = shell_join(srun_words(job, profile, where))
    if ray_job.uses_nemo_rl(job):
        lines += _ray_run_lines(srun, ray_job_of(job, profile, where))
    else:
        if profile.nodes > 1:
            lines.append('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
        lines += run_lines(srun, profile, where)
    return "\n".join(lines)


def directive_lines(wanted: list[tuple[str, Any]]) -> list[str]:
    lines = []
    for flag, value in wanted:
        text = str(value)
        if re.search(r"[\x00-\x1f\x7f]", text):
            raise UsageError(
                f"Slurm option --{flag} has a control character in {text!r}", fix="remove it from the profile"
            )
        lines.append(f"#SBATCH --{flag}" if value is True else f"#SBATCH --{flag}={sbatch_word(text)}")
    return lines


def environment_lines(job: Job, profile: SlurmProfile) -> list[str]:
    """After the directives: the shell's options, the names of the secrets it is handed, the profile's variables and
    setup lines."""
    secrets = sorted(job.secret_env())
    lines = ["", "set -eo pipefail"]
    if secrets:
        lines.append(
            "# Secrets are not in this file: they come from the submitting environment (--export=ALL): "
            + " ".join(secrets)
        )
    lines += [f"export {name}={shlex.quote(str(value))}" for name, value in public_env(profile).items()]
    if profile.setup_lines:
        lines += ["", "# setup_lines from the profile", *profile.setup_lines]
    return [*lines, ""]


def checkpoint_signal(job: Job, profile: SlurmProfile) -> str | None:
    """USR1 to the job's tasks (not the batch shell) this long before the time limit; not to NeMo-RL, which
    saves on its own schedule and resumes from its checkpoints by itself."""
    if ray_job.uses_nemo_rl(job) or not (profile.time and profile.checkpoint_before_limit_s):
        return None
    return f"USR1@{profile.checkpoint_before_limit_s}"


def _ray_run_lines(srun: str, ray: ray_job.RayJob) -> list[str]:
    """One task per node runs the node script; the job's exit code is what the head recorded (a worker node killed
    as Ray stops exits otherwise), else srun's when the head never got that far."""
    exit_file = shlex.quote(str(ray.paths.root / "ray")) + '/"$attempt"/' + ray_job.EXIT_CODE_FILE
    return [
        'attempt="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"  # this try of the job: its own Ray state folder',
        "set +e",
        srun,
        "code=$?",
        "set -e",
        f"if [ -s {exit_file} ]; then code=$(cat {exit_file}); fi",
        'exit "$code"',
        "",
    ]


def run_lines(srun: str, profile: SlurmProfile, where: Placement) -> list[str]:
    """The srun line, and what its exit code decides: under torchrun the marker file stands for exit
    EXIT_CHECKPOINTED, and with `requeue: true` that exit requeues the job. Without either, set -e passes the
    task's exit code on."""
    torchrun = profile.world_size > 1
    if not torchrun and not profile.requeue:
        return [srun, ""]
    marker = shlex.quote(str(where.job_dir / CHECKPOINTED_FILE))
    lines = [f"rm -f {marker}"] if torchrun else []
    return [*lines, "set +e", srun, "code=$?", "set -e", *exit_code_lines(profile, where)]


def exit_code_lines(profile: SlurmProfile, where: Placement) -> list[str]:
    """What the run's exit code ($code) decides: under torchrun the marker file stands for EXIT_CHECKPOINTED, and with
    `requeue: true` that exit requeues the job; then the script exits with it."""
    lines = []
    if profile.world_size > 1:
        marker = shlex.quote(str(where.job_dir / CHECKPOINTED_FILE))
        lines += [
            f"# torchrun exits 1 when its workers exit {EXIT_CHECKPOINTED}: a worker that did left {CHECKPOINTED_FILE}",
            f'if [ "$code" -ne 0 ] && [ -e {marker} ]; then code={EXIT_CHECKPOINTED}; fi',
        ]
    if profile.requeue:
        lines += [
            f'if [ "$code" -eq {EXIT_CHECKPOINTED} ]; then',
            '    echo "rlsteps: checkpointed before the time limit; requeueing job $SLURM_JOB_ID to resume from it"',
            '    scontrol requeue "$SLURM_JOB_ID"',
            "fi",
        ]
    return [*lines, 'exit "$code"', ""]


def public_env(profile: SlurmProfile) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1"}
    env |= {k: str(v) for k, v in profile.env_vars.items() if not is_secret(k, v)}
    return env
