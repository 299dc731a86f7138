#!/usr/bin/env bash
# A real network filesystem on one box: a GlusterFS volume of two bricks on this host,
# FUSE-mounted, for iobench's tests and real-tier benchmarks (issue 19). Root, no systemd.
#
#   eval "$(scripts/pfs/local-gluster.sh up)"   # idempotent; prints export IOBENCH_PFS=<mount>
#   scripts/pfs/local-gluster.sh status         # exit 0 when mounted and answering
#   scripts/pfs/local-gluster.sh evict          # empty the bricks' page cache (server side)
#   scripts/pfs/local-gluster.sh down           # unmount, delete the volume, remove its files
#
# Everything lives under $IOBENCH_GLUSTER_DIR (default /var/tmp/iobench-gluster): the bricks
# (bricks/b1, bricks/b2), the mount (mnt), glusterd's state and log when this script starts
# glusterd itself (a glusterd already running is used as it is). The volume's client-side
# caching translators are off (quick-read, io-cache, read-ahead, readdir-ahead, open-behind,
# nl-cache): they keep file data in the FUSE client's memory, where no page-cache eviction
# reaches, so a tier with them on cannot be made cold (docs/pfs.md).
# Exit codes: 0 done, 1 failed (or `status`: not up), 2 cannot run here (not root, packages
# missing: scripts/install-system-deps.sh installs them). Messages go to stderr; `up` prints
# only the export line on stdout.
set -uo pipefail

BASE=${IOBENCH_GLUSTER_DIR:-/var/tmp/iobench-gluster}
VOL=${IOBENCH_GLUSTER_VOLUME:-iobench}
# glusterd refuses `localhost` in a brick path; the host name (even one resolving to
# 127.0.0.1) is accepted
HOST=${IOBENCH_GLUSTER_HOST:-$(hostname)}
MNT=$BASE/mnt
BRICKS=("$BASE/bricks/b1" "$BASE/bricks/b2")
STATE=$BASE/glusterd
PIDFILE=$BASE/glusterd.pid
OFF_OPTIONS=(performance.quick-read performance.io-cache performance.read-ahead
             performance.readdir-ahead performance.open-behind performance.nl-cache)
export PATH=$PATH:/usr/sbin:/sbin

say() { echo "local-gluster: $*" >&2; }
die() { say "$1"; exit "${2:-1}"; }
g() { timeout 60 gluster --mode=script "$@"; }

need_tools() {
  local missing=()
  for t in glusterd gluster glusterfsd mount.glusterfs; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] || die "GlusterFS is not installed (${missing[*]} missing): run scripts/install-system-deps.sh as root (glusterfs-server, glusterfs-client)" 2
  [ "$(id -u)" = 0 ] || die "needs root (glusterd, bricks and the FUSE mount); run as root" 2
  [ -e /dev/fuse ] || die "/dev/fuse is missing: the GlusterFS client needs FUSE" 2
  getent hosts "$HOST" >/dev/null || die "host name $HOST does not resolve; set IOBENCH_GLUSTER_HOST to a name of this host (not localhost)" 2
}

glusterd_up() { g volume list >/dev/null 2>&1; }

our_glusterd_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q glusterd "/proc/$pid/cmdline" 2>/dev/null \
    && echo "$pid"
}

start_glusterd() {
  glusterd_up && return 0
  if pgrep -x glusterd >/dev/null; then
    # a glusterd that does not answer yet (starting): give it time before starting another
    for _ in $(seq 50); do glusterd_up && return 0; sleep 0.2; done
    die "a glusterd runs but does not answer (\`gluster volume list\`); stop it or wait"
  fi
  mkdir -p "$STATE" "$BASE/log"
  # our own state directory, so `down` leaves nothing behind in /var/lib/glusterd
  sed "s#option working-directory .*#option working-directory $STATE#" \
    /etc/glusterfs/glusterd.vol >"$BASE/glusterd.vol"
  glusterd -f "$BASE/glusterd.vol" -p "$PIDFILE" -l "$BASE/log/glusterd.log" \
    || die "glusterd failed to start (log: $BASE/log/glusterd.log)"
  for _ in $(seq 100); do glusterd_up && return 0; sleep 0.2; done
  die "glusterd started but does not answer (log: $BASE/log/glusterd.log)"
}

vol_exists() { g volume info "$VOL" >/dev/null 2>&1; }
vol_field() { g volume info "$VOL" 2>/dev/null | sed -n "s/^$1: //p" | head -1; }
bricks_of_vol() { g volume info "$VOL" 2>/dev/null | sed -n 's/^Brick[0-9]*: [^:]*://p'; }
bricks_offline() { g volume status "$VOL" detail 2>/dev/null | grep -c '^Online *: N'; }
bricks_ok() { [ "$(bricks_offline)" = 0 ] && [ "$(brick_pids | wc -l)" = ${#BRICKS[@]} ]; }

create_volume() {
  local b spec=()
  for b in "${BRICKS[@]}"; do
    # a brick of a deleted volume keeps its volume-id: glusterd refuses to reuse it
    rm -rf "$b" && mkdir -p "$b" || die "cannot create brick directory $b"
    spec+=("$HOST:$b")
  done
  # force: the bricks sit on the root filesystem
  g volume create "$VOL" "${spec[@]}" force >&2 || die "gluster volume create $VOL failed"
}

ensure_volume() {
  if vol_exists; then
    local have want
    have=$(bricks_of_vol | sort | tr '\n' ' ')
    want=$(printf '%s\n' "${BRICKS[@]}" | sort | tr '\n' ' ')
    [ "$have" = "$want" ] || die "volume $VOL exists with other bricks ($have); not touching it: set IOBENCH_GLUSTER_VOLUME to another name"
    local b missing=0
    for b in "${BRICKS[@]}"; do [ -d "$b" ] || missing=1; done
    if [ $missing = 1 ]; then
      say "a brick directory of $VOL is gone: recreating the volume (empty)"
      g volume stop "$VOL" force >/dev/null 2>&1
      g volume delete "$VOL" >/dev/null 2>&1 || die "cannot delete the broken volume $VOL"
      create_volume
    fi
  else
    create_volume
  fi
  if [ "$(vol_field Status)" != Started ]; then
    g volume start "$VOL" >&2 || die "gluster volume start $VOL failed"
  fi
  # a brick killed a moment ago can still read as online in glusterd (its process being
  # gone is enough), and glusterd skips a brick whose stale pid file it takes for a running
  # one: remove those, start with force, and try again while glusterd catches up
  local attempt _t pf
  for attempt in 1 2 3 4; do
    bricks_ok && break
    say "restarting offline bricks of $VOL"
    for pf in /var/run/gluster/vols/"$VOL"/*.pid; do
      [ -f "$pf" ] && ! kill -0 "$(cat "$pf" 2>/dev/null)" 2>/dev/null && rm -f "$pf"
    done
    g volume start "$VOL" force >/dev/null || die "gluster volume start $VOL force failed"
    for _t in $(seq 15); do bricks_ok && break; sleep 0.2; done
  done
  bricks_ok || die "bricks of $VOL still offline after 4 starts (see: gluster volume status $VOL detail)"
  local o
  for o in "${OFF_OPTIONS[@]}"; do
    if [ "$(g volume get "$VOL" "$o" 2>/dev/null | awk -v o="$o" '$1 == o {print $2}')" != off ]; then
      g volume set "$VOL" "$o" off >/dev/null || die "gluster volume set $VOL $o off failed"
    fi
  done
}

is_mounted() { findmnt -n -t fuse.glusterfs --mountpoint "$MNT" >/dev/null 2>&1; }
mount_answers() { timeout 20 stat -f "$MNT" >/dev/null 2>&1 && timeout 20 ls "$MNT" >/dev/null 2>&1; }

ensure_mount() {
  mkdir -p "$MNT"
  if is_mounted; then
    mount_answers && return 0
    say "the mount at $MNT does not answer (stale): remounting"
    umount -l "$MNT" 2>/dev/null
  fi
  mount -t glusterfs "$HOST:/$VOL" "$MNT" || die "mount -t glusterfs $HOST:/$VOL $MNT failed"
  for _ in $(seq 50); do mount_answers && return 0; sleep 0.2; done
  die "mounted $MNT but it does not answer"
}

brick_pids() {
  # the brick daemons of our volume (their /proc/<pid>/io read_bytes count disk reads)
  local b
  for b in "${BRICKS[@]}"; do pgrep -f -- "--brick-name $b( |\$)"; done
}

cmd_up() {
  need_tools
  start_glusterd
  ensure_volume
  ensure_mount
  say "volume $VOL ($HOST, bricks ${BRICKS[*]}) mounted at $MNT"
  echo "export IOBENCH_PFS=$MNT"
}

cmd_status() {
  need_tools
  local ok=0
  if glusterd_up; then say "glusterd answers${PIDFILE:+ (ours: $(our_glusterd_pid || echo no))}"; else say "glusterd: not running"; ok=1; fi
  if [ $ok = 0 ] && vol_exists; then
    say "volume $VOL: $(vol_field Status), $(bricks_offline) brick(s) offline, brick pids: $(brick_pids | tr '\n' ' ')"
    [ "$(vol_field Status)" = Started ] && [ "$(bricks_offline)" = 0 ] || ok=1
  else
    say "volume $VOL: absent"; ok=1
  fi
  if is_mounted && mount_answers; then say "mounted at $MNT"; else say "not mounted at $MNT"; ok=1; fi
  [ $ok = 0 ] && echo "export IOBENCH_PFS=$MNT"
  return $ok
}

cmd_evict() {
  [ "$(id -u)" = 0 ] || die "needs root (the brick files belong to root)" 2
  local b present=()
  for b in "${BRICKS[@]}"; do [ -d "$b" ] && present+=("$b"); done
  [ ${#present[@]} -gt 0 ] || die "no bricks under $BASE/bricks: run \`$0 up\` first"
  # dirty pages survive POSIX_FADV_DONTNEED: write them back first
  sync -f "${present[0]}" 2>/dev/null || sync
  local py
  py=$(command -v python3 || true)
  if [ -z "$py" ]; then
    echo 1 >/proc/sys/vm/drop_caches || die "cannot drop caches"
    say "evicted: whole page cache dropped (no python3 for per-file eviction)"
    return 0
  fi
  "$py" - "${present[@]}" <<'PYEOF' || die "eviction of the brick files failed"
import os, sys
files = nbytes = 0
for brick in sys.argv[1:]:
    for root, dirs, names in os.walk(brick):
        if root == brick and ".glusterfs" in dirs:
            dirs.remove(".glusterfs")  # hard links to the same files, and gluster's own
        for n in names:
            try:
                fd = os.open(os.path.join(root, n), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                nbytes += os.fstat(fd).st_size
                files += 1
            finally:
                os.close(fd)
print(f"local-gluster: evicted {files} brick files ({nbytes / 1e6:.1f} MB) from the page cache",
      file=sys.stderr)
PYEOF
}

cmd_down() {
  need_tools
  if is_mounted; then
    umount "$MNT" 2>/dev/null || { say "$MNT is busy: detaching it lazily"; umount -l "$MNT"; }
  fi
  if glusterd_up && vol_exists; then
    g volume stop "$VOL" force >/dev/null 2>&1
    g volume delete "$VOL" >/dev/null || die "gluster volume delete $VOL failed"
  fi
  local pid
  if pid=$(our_glusterd_pid); then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  # brick daemons whose glusterd went away before the volume was stopped
  local p
  for p in $(brick_pids); do kill "$p" 2>/dev/null; done
  rm -rf "$BASE"
  say "volume $VOL deleted, $BASE removed"
}

case "${1:-}" in
  up) cmd_up ;;
  status) cmd_status ;;
  evict) cmd_evict ;;
  down) cmd_down ;;
  brick-pids) brick_pids ;;
  *) echo "usage: $0 up|status|evict|down|brick-pids" >&2; exit 64 ;;
esac
