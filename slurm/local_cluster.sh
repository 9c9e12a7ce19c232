#!/usr/bin/env bash
# A one-node SLURM cluster on localhost, for tests and demos (root, no systemd; apt-get install slurm-wlm).
#
#   eval "$(slurm/local_cluster.sh start)"    # prints `export SLURM_CONF=<dir>/slurm.conf`
#   sinfo; ragen2-train --multirun hydra/launcher=slurm hydra.launcher.partition=debug ...
#   slurm/local_cluster.sh stop               # the cluster of $SLURM_CONF (or: stop <dir>)
#
# Everything lives in one folder (default: a fresh /tmp/ragen2-slurm.XXXXXX; `start <dir>` picks it):
# slurm.conf, its own munge socket, state, spool, logs and the daemons' pid files. `stop` kills exactly
# the daemons whose pids it recorded, so other clusters and processes on the machine are left alone.
# Ports: RAGEN2_SLURM_PORT (slurmctld, default 6817) and RAGEN2_SLURMD_PORT (slurmd, default the next one), for
# two clusters side by side. A daemon that cannot start (its port taken) ends `start` at once, with its log's
# last line, so that a caller can retry on other ports.
set -euo pipefail

die() { echo "local_cluster.sh: $*" >&2; exit 1; }
log() { echo "local_cluster.sh: $*" >&2; }

start() {
  command -v slurmctld >/dev/null || die "slurmctld not found: apt-get install -y slurm-wlm"
  [[ $(id -u) == 0 ]] || die "run as root (slurmd and munged need it)"
  local dir=${1:-$(mktemp -d /tmp/ragen2-slurm.XXXXXX)}
  mkdir -p "$dir"/{state,spool,munge}
  dir=$(cd "$dir" && pwd)
  chmod 755 "$dir"                                  # munged runs as the munge user and must reach its socket
  chown munge:munge "$dir/munge"
  runuser -u munge -- test -w "$dir/munge" \
    || die "the munge user cannot reach $dir/munge: pick a folder whose parents are world-searchable (e.g. under /tmp)"
  [[ -f /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create

  local port=${RAGEN2_SLURM_PORT:-6817}
  local slurmd_port=${RAGEN2_SLURMD_PORT:-$((port + 1))}
  local cpus mem
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc counts OMP_NUM_THREADS, not the cores, when set
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  mem=$((mem * 8 / 10))                             # headroom: slurmd drains a node that reports less than this
  cat >"$dir/slurm.conf" <<EOF
ClusterName=ragen2local
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2,cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerParameters=sched_interval=2,bf_interval=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pidfile
SlurmdPidFile=$dir/slurmd.pidfile
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
NodeName=localhost CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

  runuser -u munge -- /usr/sbin/munged -F --socket="$dir/munge/munge.socket.2" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" --key-file=/etc/munge/munge.key \
    </dev/null >>"$dir/munge/munged.out" 2>&1 &
  for _ in $(seq 50); do [[ -S $dir/munge/munge.socket.2 && -s $dir/munge/munged.pid ]] && break; sleep 0.1; done
  [[ -S $dir/munge/munge.socket.2 ]] || die "munged did not start; see $dir/munge/munged.log"
  cp "$dir/munge/munged.pid" "$dir/munged.pid"     # munged's own pid (runuser forks it)

  export SLURM_CONF=$dir/slurm.conf
  # stdin from /dev/null and output to logs: the daemons must not hold the caller's pipes open
  slurmctld -D -f "$SLURM_CONF" </dev/null >>"$dir/slurmctld.out" 2>&1 &
  echo $! >"$dir/slurmctld.pid"
  slurmd -D -N localhost -f "$SLURM_CONF" </dev/null >>"$dir/slurmd.out" 2>&1 &
  echo $! >"$dir/slurmd.pid"

  local daemon
  for _ in $(seq 60); do
    for daemon in slurmctld slurmd; do
      if ! kill -0 "$(<"$dir/$daemon.pid")" 2>/dev/null; then
        stop "$dir" || true
        die "$daemon exited: $(tail -n 1 "$dir/$daemon.log" 2>/dev/null) (see $dir/$daemon.log)"
      fi
    done
    if [[ $(sinfo -h -N -n localhost -o %t 2>/dev/null) == idle ]]; then
      log "node idle ($dir)"
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.5
  done
  stop "$dir" || true
  die "node not idle after 30 s; see $dir/slurmctld.log and $dir/slurmd.log"
}

stop() {
  local dir=${1:-}
  [[ -n $dir ]] || { [[ -n ${SLURM_CONF:-} ]] || die "stop needs <dir> or SLURM_CONF"; dir=$(dirname "$SLURM_CONF"); }
  [[ -f $dir/slurm.conf ]] || die "$dir holds no local cluster"
  local name pid
  # let jobs end while slurmd can still hear from their slurmstepd, else those linger after it is gone
  if [[ -f $dir/slurmctld.pid ]] && kill -0 "$(<"$dir/slurmctld.pid")" 2>/dev/null; then
    SLURM_CONF=$dir/slurm.conf scancel --full --quiet --partition=debug 2>/dev/null || true
    for _ in $(seq 100); do
      [[ -z $(SLURM_CONF=$dir/slurm.conf squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
  for name in slurmd slurmctld munged; do
    [[ -f $dir/$name.pid ]] || continue
    pid=$(<"$dir/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$dir/$name.pid"
  done
  # a slurmstepd still left is one of this cluster's (it inherited SLURM_CONF from our slurmd)
  for pid in $(pgrep -x slurmstepd || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_CONF=$dir/slurm.conf"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  log "stopped ($dir)"
}

case ${1:-} in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) die "usage: $0 start [dir] | stop [dir]" ;;
esac
