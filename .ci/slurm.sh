#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine, for the launcher tests: two slurmd daemons, nodes "node1"
# and "node2", each with all of this machine's CPUs and memory (multi-node jobs, such as a Ray job's head
# and worker, run for real; single-node jobs land on either).
#
#   bash .ci/slurm.sh up       install Debian's slurm-wlm and munge if needed, configure, start, wait until idle
#   bash .ci/slurm.sh down     stop the daemons this script started (by their pid files)
#   bash .ci/slurm.sh status   print sinfo
#
# Both are idempotent. Runs as root on Debian 12. One partition "debug" over both nodes. No accounting daemon: finished jobs stay visible to
# `scontrol show job` for MinJobAge seconds, which is how rlsteps reads their final state.
#
# Each node has 8 stand-in GPUs: character devices like /dev/null, so that Slurm counts them, checks GPU requests
# (sbatch --test-only) and sets CUDA_VISIBLE_DEVICES, while no GPU exists. A requeued job may start again after
# cred_expire + 1 seconds: 30 here rather than Slurm's 120, for the time-limit test's checkpoint and requeue.
set -euo pipefail

CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
GRES_CONF="$CONF_DIR/gres.conf"
RUN_DIR=/run/rlsteps-slurm
LOG_DIR=/var/log/slurm
MUNGE_PID=/run/munge/munged.pid
CTLD_PID="$RUN_DIR/slurmctld.pid"
NODES=(node1 node2)
GPUS=8  # stand-in GPUs per node
slurmd_pid() { echo "$RUN_DIR/slurmd-$1.pid"; }
PACKAGES=(slurm-wlm munge)

say() { echo "slurm.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts the Slurm daemons)"
}

alive() {  # alive PIDFILE: the process named in the file is running
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

fake_gpus() {  # the stand-in GPU devices, in RUN_DIR (a tmpfs: made again after a reboot)
    local i
    mkdir -p "$RUN_DIR"
    for i in $(seq 0 $((GPUS - 1))); do
        [ -c "$RUN_DIR/gpu$i" ] || mknod "$RUN_DIR/gpu$i" c 1 3
    done
}

write_config() {
    local cpus mem_mb conf_tmp gres_tmp changed=1
    cpus=$(nproc)
    mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
    mem_mb=$(( mem_mb > 2048 ? mem_mb - 1024 : mem_mb * 3 / 4 ))  # leave a margin for the daemons
    mkdir -p "$CONF_DIR" "$RUN_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd/node1 /var/spool/slurmd/node2
    conf_tmp=$(mktemp)
    cat >"$conf_tmp" <<EOF
# Written by .ci/slurm.sh: a two-node cluster on this machine (two slurmd, one per node name).
ClusterName=rlsteps-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=30
CredType=cred/munge
GresTypes=gpu
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Keep finished jobs in slurmctld's memory for a day: job states come from scontrol, not sacct.
MinJobAge=86400
DefMemPerCPU=1024
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=node1 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=6818 CPUs=$cpus Gres=gpu:$GPUS RealMemory=$mem_mb State=UNKNOWN
NodeName=node2 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=6819 CPUs=$cpus Gres=gpu:$GPUS RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
EOF
    gres_tmp=$(mktemp)
    echo "NodeName=node[1-2] Name=gpu File=$RUN_DIR/gpu[0-$((GPUS - 1))]" >"$gres_tmp"
    if ! cmp -s "$gres_tmp" "$GRES_CONF"; then
        install -m 0644 "$gres_tmp" "$GRES_CONF"
        changed=0
    fi
    rm -f "$gres_tmp"
    if cmp -s "$conf_tmp" "$CONF"; then
        rm -f "$conf_tmp"
        return $changed
    fi
    install -m 0644 "$conf_tmp" "$CONF"
    rm -f "$conf_tmp"
    say "wrote $CONF (CPUs=$cpus RealMemory=${mem_mb}MB, $GPUS stand-in GPUs per node)"
    return 0
}

start_munge() {
    alive "$MUNGE_PID" && return
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0600 /etc/munge/munge.key
    fi
    runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID"
    say "munged started"
}

start_slurm() {
    alive "$CTLD_PID" || { /usr/sbin/slurmctld -f "$CONF"; say "slurmctld started"; }
    local node
    for node in "${NODES[@]}"; do
        alive "$(slurmd_pid "$node")" || { /usr/sbin/slurmd -f "$CONF" -N "$node"; say "slurmd $node started"; }
    done
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE: TERM, wait, then KILL
    local name=$1 file=$2 pid
    alive "$file" || { rm -f "$file"; return 0; }
    pid=$(cat "$file")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$file"
    say "$name stopped"
}

wait_idle() {  # wait_idle NODE
    local node=$1 state=""
    for _ in $(seq 120); do
        state=$(sinfo -h -n "$node" -o %T 2>/dev/null | head -n 1 || true)
        case "$state" in
            idle|mixed|allocated) say "node $node is $state"; return 0 ;;
            down*|drain*|fail*) scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    die "node $node did not become idle (last state: '${state:-no answer}'); see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmd-$node.log"
}

stop_slurmds() {
    local node
    for node in "${NODES[@]}"; do stop_pidfile "slurmd $node" "$(slurmd_pid "$node")"; done
    stop_pidfile slurmd "$RUN_DIR/slurmd.pid"  # the single node of an older configuration
}

up() {
    need_root
    install_packages
    fake_gpus
    if write_config && alive "$CTLD_PID"; then
        say "configuration changed: restarting the daemons"
        stop_slurmds
        stop_pidfile slurmctld "$CTLD_PID"
    fi
    start_munge
    start_slurm
    local node
    for node in "${NODES[@]}"; do wait_idle "$node"; done
}

down() {
    need_root
    stop_slurmds
    stop_pidfile slurmctld "$CTLD_PID"
    stop_pidfile munged "$MUNGE_PID"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) sinfo ;;
    *) echo "usage: bash .ci/slurm.sh up|down|status" >&2; exit 2 ;;
esac
