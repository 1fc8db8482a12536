#!/bin/sh
# A real one-node SLURM cluster on this machine, for the tests and for trying
# `python -m reproduce ... --launcher=slurm` (docs/cluster.md).
#
#   tools/local_slurm.sh start DIR   # prints `export SLURM_CONF=DIR/slurm.conf`
#   tools/local_slurm.sh stop DIR
#
# start: installs Debian's `slurm-wlm` and `munge` if they are missing (root
# and the Debian registry needed then), starts `munged` if no munge daemon
# answers, writes a one-node configuration under DIR (the node: this
# machine's hostname, CPUs and ~80 % of its memory; partition `debug`),
# starts `slurmctld` and `slurmd` and waits until the node is idle.
# stop: stops what start started, by the pids it recorded under DIR (never
# by name: another cluster on the machine is left alone).
# The configuration is ../shared/SLURM.md's: proctrack/linuxproc, no task
# plugin, cons_tres, no accounting (job states are read from `squeue` and
# the run directories, not `sacct`).
set -eu

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$2
case $dir in /*) ;; *) dir=$(pwd)/$dir;; esac

fail() { echo "error: local SLURM: $*" >&2; exit 1; }

stop_pid_file() {
  [ -f "$1" ] || return 0
  pid=$(cat "$1")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

if [ "$action" = stop ]; then
  stop_pid_file "$dir/d.pid"
  stop_pid_file "$dir/ctld.pid"
  stop_pid_file "$dir/munged.pid"
  # A short spool start made outside DIR (below): remove it with its link.
  if [ -L "$dir/spool" ]; then
    rm -rf "$(readlink "$dir/spool")"
    rm -f "$dir/spool"
  fi
  exit 0
fi
[ "$action" = start ] || usage

[ "$(id -u)" -eq 0 ] || fail "start needs root (slurmd runs jobs as their users; here, as root)"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
   ! command -v munged >/dev/null; then
  echo "installing slurm-wlm and munge (Debian's packages)..." >&2
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q slurm-wlm munge; } >"$dir.apt.log" 2>&1 ||
    fail "apt-get install slurm-wlm munge failed (log: $dir.apt.log)"
fi
node=$(hostname)
mkdir -p "$dir/state"
# slurmd makes each job step's Unix socket in its spool
# (`<spool>/<node>_<job>.<step>`, the two numbers up to 10 digits), and a
# socket's path holds at most 107 bytes: under a deep DIR (Bazel's test
# temporary directory) a job could not start. The spool then goes to a short
# directory of its own under /tmp, which DIR/spool links to.
spool="$dir/spool"
if [ $(( ${#spool} + ${#node} + 23 )) -gt 107 ]; then
  spool=$(mktemp -d /tmp/slurmd.XXXXXX)
  ln -sfn "$spool" "$dir/spool"
fi
mkdir -p "$spool"

# munge: one daemon per machine; start one if none answers.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  [ -f /etc/munge/munge.key ] || mungekey -c
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  su -s /bin/sh munge -c "/usr/sbin/munged --pid-file=/run/munge/munged.pid" ||
    fail "munged did not start"
  cp /run/munge/munged.pid "$dir/munged.pid" 2>/dev/null || true
  i=0
  until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 50 ] || fail "munged does not answer"; sleep 0.1
  done
fi

cpus=$(nproc)
mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
cat > "$dir/slurm.conf" <<EOF
ClusterName=local
SlurmctldHost=$node
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$spool
SlurmctldLogFile=$dir/ctld.log
SlurmdLogFile=$dir/d.log
SlurmctldPidFile=$dir/ctld.pid
SlurmdPidFile=$dir/d.pid
SlurmctldPort=$((6817 + $(echo "$dir" | cksum | cut -d' ' -f1) % 500 * 2))
SlurmdPort=$((6818 + $(echo "$dir" | cksum | cut -d' ' -f1) % 500 * 2))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=30
KillWait=10
NodeName=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start (log: $dir/ctld.log)"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start (log: $dir/d.log)"
i=0
until sinfo -h -o '%t' 2>/dev/null | grep -qx idle; do
  i=$((i + 1))
  if [ $i -ge 150 ]; then
    "$0" stop "$dir"
    fail "the node did not become idle in 30 s (logs: $dir/ctld.log, $dir/d.log)"
  fi
  sleep 0.2
done
echo "export SLURM_CONF=$SLURM_CONF"
