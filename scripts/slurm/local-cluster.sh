#!/usr/bin/env bash
# A real Slurm on one box: slurmctld and two slurmd (virtual nodes n1 and n2 on this host,
# each on its own port) with a private munged, for iobench's tests and for trying the job
# templates in scripts/slurm/ (issue 14). Root, no systemd; Slurm 22.05 from the distribution.
#
#   eval "$(scripts/slurm/local-cluster.sh up)"   # idempotent; prints export SLURM_CONF=<conf>
#   scripts/slurm/local-cluster.sh status         # exit 0 when the controller and both nodes answer
#   scripts/slurm/local-cluster.sh down           # cancel jobs, stop the daemons, remove their files
#
# Everything lives under $IOBENCH_SLURM_DIR (default /var/tmp/iobench-slurm): slurm.conf,
# the controller's state, each node's spool, the logs, and munged's own key, socket and pid
# file (the system's munge key and /run/munge are left alone). Ports: $IOBENCH_SLURM_PORT
# (default 17817) for slurmctld, the next two for slurmd n1 and n2.
# MpiDefault=pmi2 (no PMIx in the distribution's build): `srun --mpi=pmi2` starts mpi4py
# ranks with MPICH from PyPI. MinJobAge is 2 s: `sbatch --wait` otherwise polls every 32 s.
# Exit codes: 0 done, 1 failed (or `status`: not up), 2 cannot run here (not root, packages
# missing: scripts/install-system-deps.sh installs them). Messages go to stderr; `up` prints
# only the export line on stdout.
set -uo pipefail

BASE=${IOBENCH_SLURM_DIR:-/var/tmp/iobench-slurm}
PORT=${IOBENCH_SLURM_PORT:-17817}
# the virtual nodes' address: a name of this host that resolves (NodeHostname)
HOST=${IOBENCH_SLURM_HOST:-$(hostname -s)}
NODES=(n1 n2)
CONF=$BASE/etc/slurm.conf
MUNGE=$BASE/munge
MUNGE_SOCKET=$MUNGE/munge.socket.2
MUNGE_PID=$MUNGE/munged.pid
CTLD_PID=$BASE/run/slurmctld.pid
export PATH=$PATH:/usr/sbin:/sbin
export SLURM_CONF=$CONF

say() { echo "local-cluster: $*" >&2; }
die() { say "$1"; exit "${2:-1}"; }

need_tools() {
  local missing=() t
  for t in slurmctld slurmd munged sbatch srun scontrol sinfo; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] || die "Slurm is not installed (${missing[*]} missing): run scripts/install-system-deps.sh as root (slurmctld, slurmd, slurm-client, munge)" 2
  [ "$(id -u)" = 0 ] || die "needs root (slurmd starts jobs as their users; munged runs as munge); run as root" 2
  id munge >/dev/null 2>&1 || die "no munge user: reinstall the munge package" 2
  getent hosts "$HOST" >/dev/null || die "host name $HOST does not resolve; set IOBENCH_SLURM_HOST to a name of this host" 2
}

# the pid in $1 if it names a live process whose command line holds $2 (else a stale file)
live_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null \
    | grep -q -- "$2" && echo "$pid"
}

munge_up() { munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; }

start_munged() {
  munge_up && return 0
  local pid
  if pid=$(live_pid "$MUNGE_PID" munged); then
    for _ in $(seq 25); do munge_up && return 0; sleep 0.2; done
    say "munged (pid $pid) does not answer on $MUNGE_SOCKET: restarting it"
    kill "$pid" 2>/dev/null; sleep 0.5
  fi
  # munged refuses a socket or pid file another (dead) munged left behind
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" "$MUNGE_PID"
  mkdir -p "$MUNGE"
  if [ ! -s "$MUNGE/munge.key" ]; then
    dd if=/dev/urandom of="$MUNGE/munge.key" bs=1024 count=1 status=none \
      || die "cannot write a munge key to $MUNGE/munge.key"
  fi
  chown -R munge:munge "$MUNGE" && chmod 0755 "$MUNGE" && chmod 0600 "$MUNGE/munge.key" \
    || die "cannot give $MUNGE to the munge user"
  runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE/munge.key" \
    --pid-file="$MUNGE_PID" --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed" \
    || die "munged failed to start (log: $MUNGE/munged.log)"
  for _ in $(seq 50); do munge_up && return 0; sleep 0.2; done
  die "munged started but does not answer on $MUNGE_SOCKET (log: $MUNGE/munged.log)"
}

write_conf() {
  local cpus mem tmp
  cpus=$(nproc --all)
  [ "$cpus" -ge 4 ] || cpus=4  # room for 2 ranks per virtual node on a small box
  mem=$(awk '/MemTotal/ {print int($2 / 1024 / 4)}' /proc/meminfo)
  mkdir -p "$BASE/etc" "$BASE/state" "$BASE/log" "$BASE/run" "$BASE/spool"
  tmp=$(mktemp "$BASE/etc/.slurm.conf.XXXXXX") || die "cannot write under $BASE/etc"
  cat >"$tmp" <<EOF
# written by scripts/slurm/local-cluster.sh: a one-box cluster for tests; not for production
ClusterName=iobench
SlurmctldHost=$HOST
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=pmi2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# the virtual nodes share this host's cores: trust the CPUs below, not the hardware
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=2
KillWait=5
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=${NODES[0]} NodeHostname=$HOST NodeAddr=$HOST Port=$((PORT + 1)) CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=$HOST NodeAddr=$HOST Port=$((PORT + 2)) CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  if cmp -s "$tmp" "$CONF"; then rm -f "$tmp"; return 1; fi
  mv "$tmp" "$CONF"
  return 0  # changed: running daemons must restart
}

ctld_up() { timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurmctld() {
  local changed=$1 pid
  if pid=$(live_pid "$CTLD_PID" slurmctld); then
    if [ "$changed" = 0 ]; then
      for _ in $(seq 25); do ctld_up && return 0; sleep 0.2; done
      say "slurmctld (pid $pid) does not answer: restarting it"
    fi
    stop_pid "$pid"
  fi
  rm -f "$CTLD_PID"
  # -i: ignore state a crashed earlier run may have left that no longer fits the config
  slurmctld -f "$CONF" -i || die "slurmctld failed to start (log: $BASE/log/slurmctld.log)"
  for _ in $(seq 100); do ctld_up && return 0; sleep 0.2; done
  die "slurmctld started but does not answer (log: $BASE/log/slurmctld.log)"
}

node_state() { sinfo -h -n "$1" -o %T 2>/dev/null | head -1; }
node_ok() { case "$(node_state "$1")" in idle|mixed|allocated|completing) return 0 ;; esac; return 1; }

start_slurmd() {
  local n=$1 changed=$2 pid pf=$BASE/run/slurmd-$1.pid
  if pid=$(live_pid "$pf" "slurmd.*-N $n"); then
    if [ "$changed" = 0 ] && node_ok "$n"; then return 0; fi
    stop_pid "$pid"
  fi
  rm -f "$pf"
  mkdir -p "$BASE/spool/$n"
  slurmd -f "$CONF" -N "$n" || die "slurmd -N $n failed to start (log: $BASE/log/slurmd-$n.log)"
}

stop_pid() {
  kill "$1" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$1" 2>/dev/null
}

wait_nodes() {
  local n s
  for _ in $(seq 150); do
    local all=1
    for n in "${NODES[@]}"; do
      node_ok "$n" && continue
      all=0
      s=$(node_state "$n")
      # a node a crash left down or drained: the daemon answers again, so take it back
      case "$s" in down*|drain*|fail*) scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 ;; esac
    done
    [ $all = 1 ] && return 0
    sleep 0.2
  done
  die "nodes not up after 30 s: $(sinfo -h -N -o '%N %T %E' 2>/dev/null | tr '\n' ';') (logs: $BASE/log/)"
}

cmd_up() {
  need_tools
  mkdir -p "$BASE" && chmod 0755 "$BASE" || die "cannot create $BASE"
  start_munged
  local changed=0 n
  write_conf && changed=1
  start_slurmctld $changed
  for n in "${NODES[@]}"; do start_slurmd "$n" $changed; done
  wait_nodes
  say "slurm up: controller $HOST:$PORT, nodes ${NODES[*]} ($HOST:$((PORT + 1))-$((PORT + 2))), files under $BASE"
  echo "export SLURM_CONF=$CONF"
}

cmd_status() {
  need_tools
  local ok=0 n pid
  if munge_up; then say "munged answers on $MUNGE_SOCKET"; else say "munged: not answering"; ok=1; fi
  if [ -f "$CONF" ] && ctld_up; then
    say "slurmctld answers ($HOST:$PORT)"
  else
    say "slurmctld: not answering"; ok=1
  fi
  for n in "${NODES[@]}"; do
    # the controller learns of a dead slurmd only after SlurmdTimeout: look at the process
    if ! pid=$(live_pid "$BASE/run/slurmd-$n.pid" "slurmd.*-N $n"); then
      say "node $n: no slurmd running"; ok=1
    elif node_ok "$n"; then
      say "node $n: $(node_state "$n") (slurmd pid $pid)"
    else
      local s; s=$(node_state "$n"); say "node $n: ${s:-unknown to the controller}"; ok=1
    fi
  done
  [ $ok = 0 ] && echo "export SLURM_CONF=$CONF"
  return $ok
}

cmd_down() {
  need_tools
  local pid n
  if [ -f "$CONF" ] && ctld_up; then
    scancel --full --cluster=iobench -u root >/dev/null 2>&1 || scancel -u root >/dev/null 2>&1
    # the steps' processes end with their jobs; give them KillWait
    for _ in $(seq 60); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for n in "${NODES[@]}"; do
    pid=$(live_pid "$BASE/run/slurmd-$n.pid" "slurmd.*-N $n") && stop_pid "$pid"
  done
  pid=$(live_pid "$CTLD_PID" slurmctld) && stop_pid "$pid"
  if pid=$(live_pid "$MUNGE_PID" munged); then stop_pid "$pid"; fi
  rm -rf "$BASE"
  say "slurm down, $BASE removed"
}

case "${1:-}" in
  up) cmd_up ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) echo "usage: $0 up|status|down" >&2; exit 64 ;;
esac
