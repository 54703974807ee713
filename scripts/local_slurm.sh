#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for tests/launch/test_slurm.py.
#
#   scripts/local_slurm.sh up       start it (installs slurm-wlm and munge with apt-get when missing)
#   scripts/local_slurm.sh down     stop everything `up` started; safe to repeat, and after a failed `up`
#   scripts/local_slurm.sh status   sinfo, and the daemons and job processes that run
#
# Layout: the nodes rw-slurm0 (10.213.9.1) and rw-slurm1 (10.213.9.2) are two network namespaces, each with
# one veth into the bridge rw-slurmbr (10.213.9.254) of the root namespace, where munged and slurmctld run.
# Each node's slurmd runs in its network namespace, with the node's /etc/hosts (/etc/netns/<node>/hosts
# bind-mounted over /etc/hosts, as `ip netns exec` does: that is how the node names resolve on the nodes, and
# rankwise takes the first host of SLURM_JOB_NODELIST as the master address) and its own hostname (the node's
# name, as on a real cluster); job steps inherit all three.  The machine's own /etc/hosts is never edited.
# Everything else (munge key and socket, slurm.conf, spool, state, pid and log files) lives under
# $RANKWISE_SLURM_DIR (default /tmp/rankwise-slurm); clients find the cluster with
#   export SLURM_CONF=$RANKWISE_SLURM_DIR/slurm.conf
# Needs root.  Namespaces rw-node0/rw-node1 and 10.213.8.0/24 belong to other tests and are never touched.
set -euo pipefail

STATE=${RANKWISE_SLURM_DIR:-/tmp/rankwise-slurm}
NODES=(rw-slurm0 rw-slurm1)
ADDRS=(10.213.9.1 10.213.9.2)
BRIDGE=rw-slurmbr
BRIDGE_ADDR=10.213.9.254
# Not Slurm's default ports (6817/6818): a system slurmctld that the Debian package may have started keeps those.
CTLD_PORT=16817
SLURMD_PORT=16818
WAIT_S=${RANKWISE_SLURM_WAIT_S:-40}
export SLURM_CONF=$STATE/slurm.conf

log() { echo "local_slurm: $*" >&2; }

# --- packages ---------------------------------------------------------------------------------------------------

install_packages() {
    local missing=0 tool
    for tool in slurmctld slurmd munged mungekey sbatch srun sinfo scontrol ip nsenter unshare; do
        command -v "$tool" >/dev/null || missing=1
    done
    if [[ $missing == 1 ]]; then
        log "installing slurm-wlm, munge and iproute2 with apt-get"
        apt-get update -qq
        # policy-rc.d: the packages' own services stay stopped (on a systemd host apt would start munge.service,
        # a daemon `down` does not know); this script starts what it needs itself.
        local policy=/usr/sbin/policy-rc.d had_policy=0
        [[ -e $policy ]] && had_policy=1
        if [[ $had_policy == 0 ]]; then
            printf '#!/bin/sh\nexit 101\n' >"$policy"
            chmod +x "$policy"
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge iproute2 \
            util-linux >/dev/null
        [[ $had_policy == 1 ]] || rm -f "$policy"
    fi
}

# --- network: a bridge in the root namespace, one veth into each node's namespace ------------------------------

make_network() {
    ip link add "$BRIDGE" type bridge
    # Where Docker loaded br_netfilter with a FORWARD policy of DROP, bridged traffic between the nodes would be
    # filtered: this bridge's frames skip iptables (best effort: kernels without the option ignore it).
    ip link set "$BRIDGE" type bridge nf_call_iptables 0 2>/dev/null || true
    ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local i node hosts
    for i in "${!NODES[@]}"; do
        node=${NODES[$i]}
        ip netns add "$node"
        # rw-slurmh<i> stays in the root namespace (on the bridge), rw-slurmn<i> is the node's interface.
        ip link add "rw-slurmh$i" type veth peer name "rw-slurmn$i"
        ip link set "rw-slurmh$i" master "$BRIDGE" up
        ip link set "rw-slurmn$i" netns "$node"
        ip -n "$node" addr add "${ADDRS[$i]}/24" dev "rw-slurmn$i"
        ip -n "$node" link set "rw-slurmn$i" up
        ip -n "$node" link set lo up
        # The machine's hosts plus the cluster's names; the node's own name resolves to its veth address.
        mkdir -p "/etc/netns/$node"
        hosts=/etc/netns/$node/hosts
        cat /etc/hosts >"$hosts"
        printf '%s %s\n' "$BRIDGE_ADDR" rw-slurmctl "${ADDRS[0]}" "${NODES[0]}" "${ADDRS[1]}" "${NODES[1]}" >>"$hosts"
    done
}

# --- daemons ----------------------------------------------------------------------------------------------------

# start NAME CMD...: run CMD in the foreground mode of its daemon, detached from this shell (own session, no
# terminal, output to NAME.out), and record its pid ourselves, so `down` can stop it even if it died before
# writing a pid file of its own.  setsid, nsenter and unshare (without --fork) exec, so $! is the daemon's pid.
start() {
    local name=$1
    shift
    setsid "$@" </dev/null >"$STATE/$name.out" 2>&1 &
    echo $! >"$STATE/pids/$name.pid"
}

# pid_of NAME: the recorded pid of NAME if that process still runs (an empty answer otherwise).
pid_of() {
    local file=$STATE/pids/$1.pid pid
    [[ -f $file ]] || return 0
    pid=$(<"$file")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
}

start_munge() {
    mkdir -p -m 0711 "$STATE/munge"  # munged wants the socket directory searchable by all
    mungekey --create --keyfile="$STATE/munge/munge.key" --force
    chmod 0400 "$STATE/munge/munge.key"
    # munged refuses to run as root without --force.
    start munged munged --foreground --force --socket="$STATE/munge/munge.socket" \
        --key-file="$STATE/munge/munge.key" --log-file="$STATE/munge/munged.log" \
        --pid-file="$STATE/munge/munged.pid" --seed-file="$STATE/munge/munged.seed"
    local deadline=$((SECONDS + 10))
    until [[ -S $STATE/munge/munge.socket ]]; do
        ((SECONDS < deadline)) || { log "munged did not create its socket within 10 s"; return 1; }
        sleep 0.1
    done
}

write_slurm_conf() {
    local cpus
    cpus=$(nproc)
    # (Unquoted here-document: no backquotes in its comments.)
    cat >"$SLURM_CONF" <<EOF
# Generated by scripts/local_slurm.sh: two nodes (network namespaces) on one machine.
ClusterName=rankwise
# slurmctld compares the first name with this machine's hostname; the address is how the nodes reach it.
SlurmctldHost=$(hostname -s)($BRIDGE_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our munged's socket, not the system's /run/munge/munge.socket.2.
AuthInfo=socket=$STATE/munge/munge.socket
StateSaveLocation=$STATE/ctld
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmctldDebug=info
# %n: both slurmd run on one filesystem, each needs its own spool, pid and log file.
SlurmdSpoolDir=$STATE/spool/%n
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmdLogFile=$STATE/slurmd-%n.log
SlurmdDebug=info
# No cgroups: processes are tracked through their parents, tasks are not bound, nothing is accounted.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
PropagateResourceLimits=NONE
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Short timeouts: a dead node is noticed in seconds, a killed job is gone in seconds.
SlurmdTimeout=6
SlurmctldTimeout=6
MessageTimeout=4
TCPTimeout=2
KillWait=2
InactiveLimit=10
# sbatch --wait polls every 2 s only while MinJobAge/2 <= 2 (else after 2, 8 and 32 s: a 12 s job took 42 s);
# a finished job's record is then kept 5 s.
MinJobAge=5
# A job this cluster can never run (e.g. 16 CPUs a task) is refused at submission instead of pending forever.
EnforcePartLimits=ALL
# A node that was DOWN (e.g. not responding) becomes usable again as soon as its slurmd registers.
ReturnToService=2
NodeName=${NODES[0]} NodeAddr=${ADDRS[0]} CPUs=$cpus State=UNKNOWN
NodeName=${NODES[1]} NodeAddr=${ADDRS[1]} CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP
EOF
}

start_slurm() {
    mkdir -p "$STATE/ctld" "$STATE/spool/${NODES[0]}" "$STATE/spool/${NODES[1]}"
    start slurmctld slurmctld -D -c
    local i node
    for i in "${!NODES[@]}"; do
        node=${NODES[$i]}
        # Not `ip netns exec`: it mounts a fresh /sys, without /sys/fs/cgroup, and slurmd 22.05 refuses to start
        # ("No filesystem mounted on /sys/fs/cgroup", "Unable to initialize cgroup plugin"; CgroupPlugin has no
        # "disabled" before 23.02).  So: enter the node's network namespace, and do the rest of what
        # `ip netns exec` does in a mount namespace of our own (the node's /etc/hosts), plus a UTS namespace
        # whose hostname is the node's Slurm name (what a job's processes see, as on a real cluster).
        start "slurmd-$node" nsenter --net="/run/netns/$node" unshare --mount --uts -- sh -c \
            'mount --bind "/etc/netns/$1/hosts" /etc/hosts && hostname "$1" && exec slurmd -D -N "$1"' sh "$node"
    done
}

# The last lines of every log, for a failed `up`.
log_tails() {
    local file
    for file in "$STATE"/*.log "$STATE"/*.out "$STATE"/munge/munged.log; do
        [[ -s $file ]] || continue
        echo "==> $file <==" >&2
        tail -n 15 "$file" >&2
    done
}

wait_until_idle() {
    local deadline=$((SECONDS + WAIT_S)) states=""
    while ((SECONDS < deadline)); do
        local name
        for name in slurmctld "slurmd-${NODES[0]}" "slurmd-${NODES[1]}" munged; do
            [[ -n $(pid_of "$name") ]] || { log "$name exited during start-up"; return 1; }
        done
        states=$(sinfo -h -N -o '%N=%t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
        if [[ $states == "${NODES[0]}=idle ${NODES[1]}=idle " ]]; then
            return 0
        fi
        sleep 0.5
    done
    log "nodes not idle within $WAIT_S s (sinfo: ${states:-no answer})"
    return 1
}

# --- commands ---------------------------------------------------------------------------------------------------

cmd_up() {
    [[ $EUID == 0 ]] || { log "needs root (network namespaces, daemons)"; exit 1; }
    install_packages
    cmd_down 2>/dev/null  # leftovers of an earlier run
    rm -rf "$STATE"
    mkdir -p -m 0755 "$STATE/pids"
    # From here on, any failure undoes everything, then prints the logs (which stay).
    trap 'rc=$?; if ((rc != 0)); then cmd_down || true; log "up failed (exit $rc); logs:"; log_tails; fi' EXIT
    trap 'exit 130' INT TERM
    make_network
    start_munge
    write_slurm_conf
    start_slurm
    wait_until_idle
    trap - EXIT INT TERM
    sinfo
    echo "export SLURM_CONF=$SLURM_CONF"
}

# stop PID...: SIGTERM, up to 5 s to exit, then SIGKILL.
stop() {
    (($# > 0)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    local deadline=$((SECONDS + 5)) pid alive
    while ((SECONDS < deadline)); do
        alive=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || return 0
        sleep 0.1
    done
    kill -KILL "$@" 2>/dev/null || true
}

cmd_down() {
    local node i pids=() name
    # slurmctld stops itself and every slurmd in about a second (SIGTERM takes slurmctld 5 s).
    if [[ -n $(pid_of slurmctld) && -f $SLURM_CONF ]]; then
        timeout 5 scontrol shutdown >/dev/null 2>&1 || true
    fi
    # What is left, all at once: every process in a node's namespace is ours (slurmd, slurmstepd, job tasks),
    # and the root namespace's daemons are known by the pids `up` recorded (one that died already is skipped).
    for node in "${NODES[@]}"; do
        [[ -e /run/netns/$node ]] && mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$node")
    done
    for name in slurmctld munged; do
        mapfile -t -O "${#pids[@]}" pids < <(pid_of "$name")
    done
    stop "${pids[@]}"
    for node in "${NODES[@]}"; do
        [[ -e /run/netns/$node ]] && ip netns del "$node"
        rm -rf "/etc/netns/$node"
    done
    for i in "${!NODES[@]}"; do
        ip link del "rw-slurmh$i" 2>/dev/null || true  # gone with the namespace, unless that was never made
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -f "$STATE"/pids/*.pid "$STATE/munge/munge.socket"
    rmdir /etc/netns 2>/dev/null || true  # only if empty: other tools keep theirs there
}

cmd_status() {
    echo "SLURM_CONF=$SLURM_CONF"
    sinfo 2>&1 || true
    squeue 2>&1 || true
    local name pid node
    for name in munged slurmctld "slurmd-${NODES[0]}" "slurmd-${NODES[1]}"; do
        pid=$(pid_of "$name")
        echo "$name: ${pid:-not running}"
    done
    for node in "${NODES[@]}"; do
        if [[ -e /run/netns/$node ]]; then
            echo "processes in $node:"
            ip netns pids "$node" | xargs -r ps -o pid=,args= -p
        else
            echo "$node: no namespace"
        fi
    done
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
