"""A Slurm heterogeneous job: the reward model or judge server on nodes of its own (group 0), the run on the others
(group 1), in one sbatch script that the dry run prints verbatim.

The script runs on the server group's first node. It starts the server (`srun --het-group=0`, its output in a log of
its own in the job dir, one per try of the job), fills the worker's URL variable (server_alloc.URL_ENV) from the
first node of SLURM_JOB_NODELIST_HET_GROUP_0 (its NodeAddr, as slurmctld reaches it), and waits aloud for the
server's health URL (slurm_server: a line at least every WAIT_SAY_S seconds with what it waits for and the time
left). Then it runs the actor (`srun --het-group=1`, the same task as a one-group job) and waits for whichever side
ends first:

  - the run: its exit code is the job's (a checkpoint before the time limit requeues the job as in a one-group
    job, and a requeue restarts both groups); the server is stopped with the script, and Slurm ends every step of
    a job whose batch script has ended;
  - the server: one line naming its log, the run is stopped (SIGTERM: it checkpoints after the step in progress)
    and the job fails.

`scancel` ends both groups' steps together. Health checks use bash's /dev/tcp, so the nodes need no HTTP client.
USR1 before the time limit (`--signal`) is asked for the run's group only, and the server ignores it (Slurm
signals every step of a heterogeneous job): it would die of it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rlsteps.launch import code, containers, server_alloc, slurm_server
from rlsteps.launch.base import comment_safe
from rlsteps.launch.job import Job
from rlsteps.launch.server_alloc import ServerAllocation
from rlsteps.launch.slurm_script import (
    CHECKPOINTED_FILE,
    SCRIPT_FILE,
    SRUN_END,
    Placement,
    SlurmProfile,
    directive_lines,
    directives,
    environment_lines,
    exit_code_lines,
    shell_join,
    srun_words,
)

SERVER_LOG = "server-{attempt}.log"  # in the job dir, one per try of the job
SQUASH_SERVER_SCRIPT = "squash_server.sh"
JOB_WIDE = {"job-name", "output", "open-mode", "chdir", "export", "dependency", "kill-on-invalid-dep", "requeue"}
EVERY_GROUP = {"account", "partition", "time"}
RUN_NODES = "SLURM_JOB_NUM_NODES_HET_GROUP_1"


def server_container(profile: SlurmProfile, where: Placement, force: bool) -> containers.ContainerPlan | None:
    """The server's image: its own (squashed next to the run's), else the run's."""
    server = profile.server
    if server is None or not server.container_image:
        return where.container
    cache = where.container.sqsh.parent if where.container else where.job_dir.parent.parent / "containers"
    if profile.squash_dir:
        cache = Path(profile.squash_dir).expanduser().absolute()
    return containers.plan_container(server.container_image, cache, force)


def plan_parts(
    job: Job, profile: SlurmProfile, where: Placement, squash_options: list[str]
) -> tuple[dict[str, str], list[str], dict[str, Any]]:
    """The launch plan's server parts: the script (and the server image's squash script where it is another image
    to import), the summary's words, and the worker's config."""
    server = profile.server
    assert server is not None
    server_alloc.check(job, server)
    container = server_container(profile, where, job.force_squash)
    files = {SCRIPT_FILE: hetjob_script(job, profile, where, container)}
    if container and container.action == "import" and container.sqsh != getattr(where.container, "sqsh", None):
        files[SQUASH_SERVER_SCRIPT] = containers.squash_script(container, squash_options, f"{job.name}-server")
    return files, notes(profile, container), server_alloc.worker_config(job, server)


def hetjob_script(job: Job, profile: SlurmProfile, where: Placement, container: Any) -> str:
    server = profile.server
    assert server is not None
    lines = [
        "#!/bin/bash",
        f"# rlsteps {comment_safe(job.step_id)} (config {comment_safe(job.config_name)}), "
        f"{job.mode} on profile {comment_safe(job.profile_name or '')}, job {job.name}",
        f"# A heterogeneous job: group 0 runs {server.describe()}, group 1 the run.",
        *directive_lines(server_directives(job, profile, where)),
        "#SBATCH hetjob",
        *directive_lines(run_directives(job, profile, where)),
        *environment_lines(job, profile),
        'attempt="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"  # this try of the job: a server log of its own',
        *_server_lines(job, profile, where, container),
        *slurm_server.wait_lines(server),
        *_run_lines(job, profile, where),
    ]
    return "\n".join(lines)


def server_directives(job: Job, profile: SlurmProfile, where: Placement) -> list[tuple[str, Any]]:
    """Group 0: the job's own options (Slurm reads them from the first group) and the server's resources."""
    server = profile.server
    assert server is not None
    run = directives(job, profile, where)
    wanted = [(flag, value) for flag, value in run if flag in JOB_WIDE or flag in EVERY_GROUP]
    wanted += [
        ("nodes", server.nodes),
        ("ntasks-per-node", 1),
        ("gpus-per-node", server.gpus_per_node or None),
        ("cpus-per-task", server.cpus_per_task),
        ("mem", server.mem),
    ]
    return [(flag, value) for flag, value in wanted if value is not None]


def run_directives(job: Job, profile: SlurmProfile, where: Placement) -> list[tuple[str, Any]]:
    """Group 1: the run's resources, as a one-group job asks for them, and its signal before the time limit."""
    return [(flag, value) for flag, value in directives(job, profile, where) if flag not in JOB_WIDE]


def _server_lines(job: Job, profile: SlurmProfile, where: Placement, container: Any) -> list[str]:
    server = profile.server
    assert server is not None
    log = shlex.quote(str(where.job_dir)) + "/" + SERVER_LOG.format(attempt='"$attempt"')
    command = server_alloc.command(job, server, server.python or where.python)
    srun = server_srun(server, command, profile, where, container, ["--het-group=0"])
    return slurm_server.start_lines(server, srun, "SLURM_JOB_NODELIST_HET_GROUP_0", log, " (group 0)")


def server_srun(
    server: ServerAllocation,
    command: list[str],
    profile: SlurmProfile,
    where: Placement,
    container: Any,
    group: list[str],
) -> list[str]:
    """The srun that starts a server's command on its nodes, in its image, with USR1 ignored and (kind rlsteps) the
    job's own rlsteps first on the path. group: srun's options naming the job's group of nodes it runs on."""
    if server.kind == "rlsteps" and where.wheel:
        command = code.on_path(str(where.wheel), command)
    pyxis = containers.pyxis_options(container, profile.container_mounts, where.workdir) if container else []
    nodes = [f"--nodes={server.nodes}", "--ntasks-per-node=1"]
    return ["srun", *group, *nodes, *SRUN_END, *pyxis, *slurm_server.IGNORING_USR1, *command]


def _run_lines(job: Job, profile: SlurmProfile, where: Placement) -> list[str]:
    """The run in group 1, and whichever side ends first: the run's exit code is the job's; a server that ends first
    stops the run and fails the job, naming its log."""
    server = profile.server
    assert server is not None
    words = srun_words(job, profile, where, RUN_NODES)
    srun = shell_join([words[0], "--het-group=1", *words[1:]])
    lines = []
    if profile.nodes > 1:
        lines.append('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_1" | head -n 1)')
    if profile.world_size > 1:
        lines.append("rm -f " + shlex.quote(str(where.job_dir / CHECKPOINTED_FILE)))
    stats = shell_join(["server_get", server.health_path])
    return [
        *lines,
        f"{srun} &",
        "run_pid=$!",
        "set +e",
        "wait -n  # the run or the server, whichever ends first",
        'if kill -0 "$run_pid" 2>/dev/null; then',
        '    wait "$server_pid"; code=$?',
        f'    echo "rlsteps: {server.describe()} ended (exit $code) while the run was going: see $server_log"',
        '    kill -TERM "$run_pid"; wait "$run_pid"',
        "    exit 1",
        "fi",
        'wait "$run_pid"; code=$?',
        "set -e",
        f'echo "rlsteps: the run ended (exit $code); {server.describe()} said: $({stats} | tail -n 1)"',
        *exit_code_lines(profile, where),
    ]


def notes(profile: SlurmProfile, container: Any) -> list[str]:
    """The plan's summary words for the server group."""
    server = profile.server
    assert server is not None
    where = container.describe() if container else "no container"
    return [
        f"{server.describe()} on {server.nodes} node(s) x {server.gpus_per_node} GPU(s) of its own "
        f"(heterogeneous job, group 0; {where}), port {server.listen_port}; the run in group 1 reads "
        f"{server_alloc.URL_KEYS[server.serves]} from {server.url_env}",
    ]
