"""A Slurm heterogeneous job: the reward model or judge server on nodes of its own (group 0), the run on the others
(group 1), in one sbatch script that the dry run prints verbatim.

The script runs on the server group's first node. It starts the server (`srun --het-group=0`, its output in a log of
its own in the job dir, one per try of the job), fills the worker's URL variable (server_alloc.URL_ENV) from the
first node of SLURM_JOB_NODELIST_HET_GROUP_0 (its NodeAddr, as slurmctld reaches it), and waits aloud for the
server's health URL: a line at least every WAIT_SAY_S seconds with what it waits for and the time left. Then it runs
the actor (`srun --het-group=1`, the same task as a one-group job) and waits for whichever side ends first:

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

from rlsteps.launch import code, containers, server_alloc
from rlsteps.launch.base import comment_safe
from rlsteps.launch.job import Job
from rlsteps.launch.server_alloc import ServerAllocation
from rlsteps.launch.slurm_script import (
    CHECKPOINTED_FILE,
    SCRIPT_FILE,
    SRUN_END,
    Expansion,
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
WAIT_SAY_S = 30
POLL_S = 5
JOB_WIDE = {"job-name", "output", "open-mode", "chdir", "export", "dependency", "kill-on-invalid-dep", "requeue"}
EVERY_GROUP = {"account", "partition", "time"}
RUN_NODES = "SLURM_JOB_NUM_NODES_HET_GROUP_1"

# The server's command starts with USR1 ignored (an ignored signal stays ignored across exec): the run's checkpoint
# signal (`--signal` before the time limit, `scancel --signal=USR1 JOB+1`) reaches every step of a heterogeneous
# job on Slurm, and would end a server that has no use for it.
IGNORING_USR1 = ["/bin/sh", "-c", 'trap "" USR1; exec "$@"', "sh"]
# One HTTP GET through bash's /dev/tcp: $0 host, $1 port, $2 path; prints the answer (status line first).
HTTP_GET = 'exec 3<>"/dev/tcp/$0/$1" && printf "GET %s HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n" "$2" "$0" >&3 && cat <&3'


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
        *_wait_lines(server),
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
    if server.kind == "rlsteps" and where.wheel:
        command = code.on_path(str(where.wheel), command)
    command = [*IGNORING_USR1, *command]
    pyxis = containers.pyxis_options(container, profile.container_mounts, where.workdir) if container else []
    srun = ["srun", "--het-group=0", f"--nodes={server.nodes}", "--ntasks-per-node=1", *SRUN_END, *pyxis, *command]
    url = f"http://$server_host:{server.listen_port}{server.url_suffix}"
    return [
        f"server_log={log}",
        'server_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | head -n 1)',
        'server_host=$(scontrol show node "$server_node" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
        'server_host="${server_host:-$server_node}"',
        f'export {server.url_env}="{url}"',
        f'echo "rlsteps: starting {server.describe()} on $server_node (group 0); its log: $server_log"',
        f'{shell_join(srun)} > "$server_log" 2>&1 &',
        "server_pid=$!",
        "trap 'kill \"$server_pid\" 2>/dev/null || true' EXIT  # the server ends with the script, whatever ends it",
        "",
    ]


def _wait_lines(server: ServerAllocation) -> list[str]:
    """Poll the server's health URL until it answers 200; say what it waits for at least every WAIT_SAY_S seconds;
    stop the job if the server ends first or is not answering within its ready_timeout_s."""
    get = shell_join(["timeout", "10", "bash", "-c", HTTP_GET, Expansion('"$server_host"'), str(server.listen_port)])
    health = f"http://$server_host:{server.listen_port}{server.health_path}"
    return [
        f"server_get() {{ {get} \"$1\" 2>/dev/null; }}  # GET a path of the server's (bash's /dev/tcp)",
        f"deadline=$((SECONDS + {server.ready_timeout_s})); said=-{WAIT_SAY_S}",
        f'until [[ "$(server_get {shlex.quote(server.health_path)})" == "HTTP/"?.?" 200"* ]]; do',
        '    if ! kill -0 "$server_pid" 2>/dev/null; then',
        '        code=0; wait "$server_pid" || code=$?',
        f'        echo "rlsteps: {server.describe()} ended (exit $code) before it answered: see $server_log"',
        "        exit 1",
        "    fi",
        '    if [ "$SECONDS" -ge "$deadline" ]; then',
        f'        echo "rlsteps: {server.describe()} did not answer {health} within {server.ready_timeout_s}s: '
        'see $server_log"',
        "        exit 1",
        "    fi",
        f"    if [ $((SECONDS - said)) -ge {WAIT_SAY_S} ]; then",
        f'        echo "rlsteps: waiting for {server.describe()} to answer {health} ($((deadline - SECONDS))s left)"',
        "        said=$SECONDS",
        "    fi",
        f"    sleep {POLL_S}",
        "done",
        f'echo "rlsteps: {server.describe()} answers at ${server.url_env}"',
        "",
    ]


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
