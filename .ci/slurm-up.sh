#!/usr/bin/env bash
# Start a single-node Slurm cluster on this host (run as root; idempotent).
#
#   sudo .ci/slurm-up.sh            # install if missing, configure, start, wait for idle
#   CCBENCH_SLURM_CPUS=8 .ci/slurm-up.sh   # advertise this many CPUs (default max(nproc, 4))
#
# What it does: apt-get installs slurm-wlm and munge when missing, creates the munge key,
# starts munged, writes /etc/slurm/slurm.conf for this host (SlurmUser=root,
# proctrack/linuxproc, task/none, select/cons_tres, one partition "debug" with
# OverSubscribe=FORCE), starts slurmctld and slurmd without systemd, and waits until
# `sinfo` shows the node idle. A second run leaves a healthy cluster alone; a
# changed configuration is rewritten and the daemons restarted.
set -euo pipefail

TIMEOUT_S=${CCBENCH_SLURM_TIMEOUT:-60}
PARTITION=${CCBENCH_SLURM_PARTITION:-debug}
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
LOG_DIR=/var/log/slurm
STATE_DIR=/var/spool/slurmctld
SPOOL_DIR=/var/spool/slurmd

die() {
    echo "slurm-up: error: $*" >&2
    for log in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" /var/log/munge/munged.log; do
        if [[ -f $log ]]; then
            echo "---- last lines of $log ----" >&2
            tail -n 25 "$log" >&2
        fi
    done
    exit 1
}

if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n -E bash "$0" "$@"
fi
[[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts daemons)"

# ---- packages ----------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
    echo "slurm-up: installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q || die "apt-get update failed"
    # policy-rc.d 101: the packages must not try to start services through init scripts
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get install -y -q --no-install-recommends slurm-wlm munge slurm-client \
        || die "apt-get install slurm-wlm munge failed"
fi

# ---- munge -------------------------------------------------------------------------------
install -d -m 0700 -o munge -g munge /etc/munge /var/lib/munge
install -d -m 0711 -o munge -g munge /run/munge
install -d -m 0700 -o munge -g munge /var/log/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    echo "slurm-up: creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then
        mungekey --create --keyfile=/etc/munge/munge.key --force
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    echo "slurm-up: starting munged"
    munged_pid=$(cat /run/munge/munged.pid 2>/dev/null || true)
    if [[ -n $munged_pid ]] && kill -0 "$munged_pid" 2>/dev/null; then
        kill "$munged_pid" || true
        sleep 1
    fi
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    runuser -u munge -- /usr/sbin/munged --force || die "munged did not start"
    for _ in $(seq 1 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n </dev/null | unmunge >/dev/null 2>&1 || die "munge credential round trip failed"
fi

# ---- slurm.conf --------------------------------------------------------------------------
HOST=$(hostname -s)
# advertise at least 4 CPUs so 4-rank jobs fit on a 2-core runner (config_overrides below
# lets slurmd accept more CPUs than the hardware has; ranks then share cores)
NCPU=${CCBENCH_SLURM_CPUS:-$(( $(nproc) > 4 ? $(nproc) : 4 ))}
# leave ~10% and at least 512 MiB to the OS; slurmd refuses a RealMemory above what it sees
MEM_MB=$(awk '/MemTotal/ {printf "%d", $2 / 1024}' /proc/meminfo)
REAL_MB=$(( MEM_MB - (MEM_MB / 10 > 512 ? MEM_MB / 10 : 512) ))
(( REAL_MB > 256 )) || REAL_MB=256

install -d -m 0755 "$CONF_DIR" "$LOG_DIR" "$STATE_DIR" "$SPOOL_DIR"

NEW_CONF=$(cat <<EOF
# written by ccbench .ci/slurm-up.sh: single-node cluster on $HOST
ClusterName=ccbench
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MaxArraySize=10001
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
Waittime=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$NCPU RealMemory=$REAL_MB State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
)

conf_changed=0
if [[ ! -f $CONF ]] || [[ "$(cat "$CONF")" != "$NEW_CONF" ]]; then
    echo "slurm-up: writing $CONF (node $HOST, CPUs=$NCPU, RealMemory=$REAL_MB MiB)"
    printf '%s\n' "$NEW_CONF" >"$CONF"
    conf_changed=1
fi
# slurmd loads a cgroup plugin even with proctrack/linuxproc and task/none; "disabled" exists
# only from Slurm 23.02 on, older releases autodetect (v1 or v2) when cgroup.conf is absent
SLURM_VERSION=$(slurmd -V 2>/dev/null | awk '{print $2}')
CGROUP_CONF="# written by ccbench .ci/slurm-up.sh"
if printf '%s\n23.02\n' "$SLURM_VERSION" | sort -V -C 2>/dev/null \
        && [[ $SLURM_VERSION != 23.02* ]]; then
    CGROUP_CONF+=$'\nCgroupPlugin=autodetect'
else
    CGROUP_CONF+=$'\nCgroupPlugin=disabled'
fi
if [[ ! -f $CONF_DIR/cgroup.conf ]] || [[ "$(cat "$CONF_DIR/cgroup.conf")" != "$CGROUP_CONF" ]]; then
    printf '%s\n' "$CGROUP_CONF" >"$CONF_DIR/cgroup.conf"
    conf_changed=1
fi

# ---- daemons -----------------------------------------------------------------------------
running() {   # running NAME PIDFILE
    local pid
    pid=$(cat "$2" 2>/dev/null || true)
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && [[ $(cat /proc/"$pid"/comm 2>/dev/null) == "$1" ]]
}

stop() {      # stop NAME PIDFILE
    local pid
    if running "$1" "$2"; then
        pid=$(cat "$2")
        kill "$pid" || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
}

if (( conf_changed )); then
    stop slurmd /run/slurmd.pid
    stop slurmctld /run/slurmctld.pid
fi
if ! running slurmctld /run/slurmctld.pid; then
    echo "slurm-up: starting slurmctld"
    /usr/sbin/slurmctld -c || die "slurmctld did not start"
fi
if ! running slurmd /run/slurmd.pid; then
    echo "slurm-up: starting slurmd"
    /usr/sbin/slurmd || die "slurmd did not start"
fi

# ---- wait for the node ------------------------------------------------------------------
deadline=$(( SECONDS + TIMEOUT_S ))
state=""
while (( SECONDS < deadline )); do
    state=$(sinfo -h -n "$HOST" -o '%T' 2>/dev/null | head -n 1 || true)
    case $state in
        idle|mixed|allocated|completing) break ;;
        down*|drain*|fail*)
            # a node left down by an earlier, differently configured run
            scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
case $state in
    idle|mixed|allocated|completing) ;;
    *) die "node $HOST not idle after ${TIMEOUT_S}s (sinfo state: '${state:-no answer}')" ;;
esac
echo "slurm-up: ready: partition $PARTITION, node $HOST, $NCPU CPUs, state $state"
sinfo
