#!/usr/bin/env bash
# A throw-away one-node SLURM for the cluster tests (tests/cluster, `make test-cluster`).
#
# usage: bash jobs/ci/slurm.sh up          start it; prints its folder DIR (last line of stdout)
#        bash jobs/ci/slurm.sh down DIR    stop exactly the daemons `up` started, remove DIR
#        bash jobs/ci/slurm.sh check       exit 0 when `up` can work here, else say why (exit 1)
#        bash jobs/ci/slurm.sh install     only install the packages (when absent and allowed)
#
# `up` installs slurmctld, slurmd, slurm-client and munge with apt when they are absent and it
# may (root, or password-less sudo, and the package mirror answers), writes DIR/slurm.conf for
# this one node from its real cores and memory, starts a private munged (own key and socket in
# DIR), slurmctld and slurmd on free ports, and waits until the node is idle. Clients need
# SLURM_CONF=DIR/slurm.conf. Works as root and as an ordinary user (then the daemons and jobs run
# as that user). Nothing outside DIR is touched, apart from the packages. Messages go to stderr.
set -Eeuo pipefail

SBIN=/usr/sbin
PACKAGES=(slurmctld slurmd slurm-client munge)
NEEDED=("$SBIN/slurmctld" "$SBIN/slurmd" "$SBIN/munged" "$SBIN/mungekey" /usr/bin/sinfo /usr/bin/sbatch)

say() { echo "slurm.sh: $*" >&2; }
die() { say "$*"; exit 1; }

installed() {
    local f
    for f in "${NEEDED[@]}"; do [ -x "$f" ] || return 1; done
}

as_root() {   # run a command as root: directly, or through password-less sudo
    if [ "$(id -u)" = 0 ]; then "$@"; elif sudo -n true 2> /dev/null; then sudo -n "$@"; else return 1; fi
}

can_install() {   # why not, on stdout, when the packages cannot be installed here
    if [ "$(id -u)" != 0 ] && ! sudo -n true 2> /dev/null; then
        echo "SLURM is not installed and this user ($(id -un)) is neither root nor has password-less sudo"
    elif ! command -v apt-get > /dev/null; then
        echo "SLURM is not installed and there is no apt-get to install it"
    fi
}

install() {
    installed && return 0
    local why
    why=$(can_install)
    [ -z "$why" ] || die "$why; install: apt-get install ${PACKAGES[*]}"
    say "installing ${PACKAGES[*]} with apt-get"
    local t0=$SECONDS
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq > /dev/null 2>&1 \
        || die "apt-get update failed: no package mirror reachable?"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" \
        > /dev/null 2>&1 || die "apt-get install ${PACKAGES[*]} failed"
    installed || die "installed ${PACKAGES[*]}, but ${NEEDED[*]} are still not all there"
    say "installed in $((SECONDS - t0)) s: $("$SBIN/slurmctld" -V)"
}

free_ports() {   # two TCP ports nobody listens on (the kernel picks them)
    python3 - << 'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
}

# pid from a pid file, only when that process is still the daemon we started (not a reused pid)
live_pid() {   # live_pid PIDFILE NAME
    local pid
    [ -s "$1" ] || return 1
    pid=$(tr -dc 0-9 < "$1")
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = "$2" ] && echo "$pid"
}

stop_daemons() {   # stop_daemons DIR: TERM, then KILL after 10 s, each daemon of DIR
    local dir=$1 name pid pids=() i
    for name in slurmd slurmctld munged; do
        pid=$(live_pid "$dir/$name.pid" "$name") || continue
        kill -TERM "$pid" 2> /dev/null && pids+=("$pid")
    done
    for i in $(seq 100); do
        local alive=()
        for pid in "${pids[@]}"; do kill -0 "$pid" 2> /dev/null && alive+=("$pid"); done
        [ ${#alive[@]} -eq 0 ] && return 0
        [ "$i" -eq 100 ] && { say "killing ${alive[*]} after 10 s"; kill -KILL "${alive[@]}" 2> /dev/null || true; }
        sleep 0.1
    done
}

up() {
    install
    local dir host cpus mem user ports ctld_port slurmd_port
    dir=$(mktemp -d "${TMPDIR:-/tmp}/fednest-slurm.XXXXXX")
    # on any failure from here on: stop what was started, remove the folder, show the logs
    trap 'say "start failed; logs:"; tail -n 5 "$dir"/*.log "$dir"/munge/*.log >&2 2> /dev/null; stop_daemons "$dir"; rm -rf "$dir"' ERR
    chmod 755 "$dir"   # munged runs as the munge user when we are root: it must reach DIR/munge
    host=$(hostname -s)
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)   # nproc obeys OMP_NUM_THREADS (1 under make)
    mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)   # MiB, a margin below the total
    user=$(id -un)
    read -r ctld_port slurmd_port < <(free_ports)
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool/slurmd-$host"   # slurmd does not create its spool's parent
    local munge_user=$user
    if [ "$(id -u)" = 0 ]; then munge_user=munge; chown munge:munge "$dir/munge"; fi
    chmod 755 "$dir/munge"
    runuser_munge() { if [ "$munge_user" = "$user" ]; then "$@"; else runuser -u "$munge_user" -- "$@"; fi; }
    runuser_munge "$SBIN/mungekey" --create --keyfile="$dir/munge/munge.key"
    runuser_munge "$SBIN/munged" --socket="$dir/munge/munge.socket.2" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
    ln -s munge/munged.pid "$dir/munged.pid"
    cat > "$dir/slurm.conf" << EOF
# written by jobs/ci/slurm.sh for a throw-away one-node test cluster
ClusterName=fednestci
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits for the job credential to expire (default 120 s): 5 s restarts it in ~10 s
AuthInfo=socket=$dir/munge/munge.socket.2,cred_expire=5
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=600
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF=$dir/slurm.conf
    "$SBIN/slurmctld" -i    # -i: ignore any saved state (there is none); both daemonise
    "$SBIN/slurmd"
    local i
    for i in $(seq 150); do
        if [ "$(sinfo -h -o %T 2> /dev/null)" = idle ]; then
            say "up in $dir: node $host, $cpus CPUs, $mem MiB, $(sinfo -V); export SLURM_CONF=$dir/slurm.conf"
            trap - ERR
            echo "$dir"
            return 0
        fi
        sleep 0.2
    done
    say "the node did not become idle within 30 s: $(sinfo -h -o '%T %E' 2> /dev/null || true)"
    false
}

down() {
    local dir=${1:?usage: slurm.sh down DIR}
    [ -f "$dir/slurm.conf" ] || die "$dir is not a folder made by slurm.sh up (no slurm.conf)"
    export SLURM_CONF=$dir/slurm.conf
    # jobs first, so that no job step outlives the daemons
    if live_pid "$dir/slurmctld.pid" slurmctld > /dev/null; then
        local jobs i
        jobs=$(squeue -h -o %A 2> /dev/null | tr '\n' ' ')
        if [ -n "${jobs// /}" ]; then
            say "cancelling jobs $jobs"
            # shellcheck disable=SC2086  # one word per job id
            scancel $jobs 2> /dev/null || true
            for i in $(seq 100); do [ -z "$(squeue -h -o %A 2> /dev/null)" ] && break; sleep 0.1; done
        fi
    fi
    stop_daemons "$dir"
    rm -rf "$dir"
    say "down: stopped the daemons of $dir and removed it"
}

case ${1:-} in
    up) up ;;
    install) install ;;
    down) down "${2:-}" ;;
    check)
        installed && exit 0
        why=$(can_install)
        [ -z "$why" ] && exit 0
        echo "$why"; exit 1 ;;
    *) sed -n '2,/^set -e/{/^set -e/d;s/^# \{0,1\}//p}' "$0" >&2; exit 2 ;;
esac
