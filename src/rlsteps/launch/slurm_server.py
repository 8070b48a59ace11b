"""The batch-script lines that start a reward model or judge server on Slurm and wait for it to answer, shared by the
heterogeneous job (slurm_hetjob: the server beside a run) and the server's own batch job (shared_server).

The lines start the server with srun in the background (its pid in $server_pid, ended with the script), find where
it listens (the first node of the job's, or its group's, node list, at its NodeAddr as slurmctld reaches it: in
$server_node and $server_host) and export its URL in the variable the run's worker reads (server_alloc.URL_ENV).
The wait polls its health URL through bash's /dev/tcp, so the nodes need no HTTP client, saying at least every
WAIT_SAY_S seconds what it waits for and the time left, and stops the job if the server ends first or is not
answering within its ready_timeout_s.
"""

from __future__ import annotations

import shlex

from rlsteps.launch.server_alloc import ServerAllocation
from rlsteps.launch.slurm_script import Expansion, shell_join

WAIT_SAY_S = 30
POLL_S = 5

# The server's command starts with USR1 ignored (an ignored signal stays ignored across exec): the run's checkpoint
# signal (`--signal` before the time limit, `scancel --signal=USR1 JOB+1`) reaches every step of a heterogeneous
# job on Slurm, and would end a server that has no use for it.
IGNORING_USR1 = ["/bin/sh", "-c", 'trap "" USR1; exec "$@"', "sh"]
# One HTTP GET through bash's /dev/tcp: $0 host, $1 port, $2 path; prints the answer (status line first).
HTTP_GET = 'exec 3<>"/dev/tcp/$0/$1" && printf "GET %s HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n" "$2" "$0" >&3 && cat <&3'


def start_lines(
    server: ServerAllocation, srun: list[str], nodelist_var: str, log: str | None, label: str = "", on_exit: str = ""
) -> list[str]:
    """Start the server (`srun`, its words) in the background on the nodes of $nodelist_var. log: a shell word for
    the file its output goes to; None: the job's own log. label: what the start line says after the node. on_exit:
    shell text the script's exit runs after it stops the server (bash runs it on SIGTERM too: scancel)."""
    url = f"http://$server_host:{server.listen_port}{server.url_suffix}"
    where = f"its log: {'$server_log' if log else 'this one'}"
    redirect = ' > "$server_log" 2>&1' if log else ""
    return [
        *([f"server_log={log}"] if log else []),
        f'server_node=$(scontrol show hostnames "${nodelist_var}" | head -n 1)',
        'server_host=$(scontrol show node "$server_node" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
        'server_host="${server_host:-$server_node}"',
        f'export {server.url_env}="{url}"',
        f'echo "rlsteps: starting {server.describe()} on $server_node{label}; {where}"',
        f"{shell_join(srun)}{redirect} &",
        "server_pid=$!",
        f"trap 'kill \"$server_pid\" 2>/dev/null || true{on_exit}' EXIT  # the server ends with the script",
        "",
    ]


def wait_lines(server: ServerAllocation) -> list[str]:
    """Poll the server's health URL until it answers 200; say what it waits for at least every WAIT_SAY_S seconds;
    stop the job if the server ends first or is not answering within its ready_timeout_s. Defines server_get, which
    GETs a path of the server's."""
    get = shell_join(["timeout", "10", "bash", "-c", HTTP_GET, Expansion('"$server_host"'), str(server.listen_port)])
    health = f"http://$server_host:{server.listen_port}{server.health_path}"
    log = "${server_log:+: see $server_log}"  # the server's own log, where it has one
    return [
        f"server_get() {{ {get} \"$1\" 2>/dev/null; }}  # GET a path of the server's (bash's /dev/tcp)",
        f"deadline=$((SECONDS + {server.ready_timeout_s})); said=-{WAIT_SAY_S}",
        f'until [[ "$(server_get {shlex.quote(server.health_path)})" == "HTTP/"?.?" 200"* ]]; do',
        '    if ! kill -0 "$server_pid" 2>/dev/null; then',
        '        code=0; wait "$server_pid" || code=$?',
        f'        echo "rlsteps: {server.describe()} ended (exit $code) before it answered{log}"',
        "        exit 1",
        "    fi",
        '    if [ "$SECONDS" -ge "$deadline" ]; then',
        f'        echo "rlsteps: {server.describe()} did not answer {health} within {server.ready_timeout_s}s{log}"',
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
