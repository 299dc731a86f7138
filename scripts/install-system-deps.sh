#!/usr/bin/env bash
# Installs the optional OS tools iobench uses when they are present, in two groups:
#
#   demo  what `make demo` needs: FUSE (fuse3, libfuse2) for `iobench emulate-pfs`,
#         the emulated parallel filesystem the demo reads from.
#   all   the demo's, and what the test suite checks against (`make test`,
#         `make system-deps`): fio (iobench probe), GlusterFS server and client
#         (scripts/pfs/local-gluster.sh: a real network filesystem on one box), the
#         formats' own command-line tools (h5ls, ncdump, mdb_stat), a headless
#         Chromium (the HTML report is opened in a real browser), and Slurm with
#         munge (scripts/slurm/local-cluster.sh: a one-box cluster the job
#         templates are tested on).
#
# Usage: install-system-deps.sh [demo|all] [--list]
#   --list  print the group's packages, one per line, and install nothing.
# Needs root and apt; it says what it installs and why before it does. Anywhere
# else it says what it skipped and succeeds: the features fall back (probe uses
# its own measurement, the demo a plain directory) or their tests skip with a reason.
set -u
group="${1:-all}"
case "$group" in
  demo|all) ;;
  *) echo "install-system-deps.sh: unknown group '$group'; use demo or all" >&2; exit 2 ;;
esac
list=0
[ "${2:-}" = "--list" ] && list=1

need=()
want() {  # want PACKAGE PRESENT-TEST...: PACKAGE is needed unless the test succeeds
  local pkg="$1"; shift
  if [ "$list" = 1 ]; then echo "$pkg"; return; fi
  "$@" >/dev/null 2>&1 || need+=("$pkg")
}
have() { command -v "$1"; }
any_file() { local f; for f in "$@"; do [ -e "$f" ] && return 0; done; return 1; }

want fuse3 have fusermount3
want libfuse2 any_file /usr/lib/x86_64-linux-gnu/libfuse.so.2 /lib/x86_64-linux-gnu/libfuse.so.2
why="the demo's emulated parallel filesystem (FUSE)"
if [ "$group" = all ]; then
  want fio have fio
  want hdf5-tools have h5ls
  want netcdf-bin have ncdump
  want lmdb-utils have mdb_stat
  want glusterfs-server have glusterd
  want glusterfs-client any_file /sbin/mount.glusterfs /usr/sbin/mount.glusterfs
  want chromium-headless-shell any_file "$(command -v chromium-headless-shell || true)" \
    "$(command -v chromium || true)" /usr/lib/chromium/chromium-headless-shell
  want slurmctld have slurmctld
  want slurmd have slurmd
  want slurm-client have sbatch
  want munge have munged
  why="$why, and the tools the test suite checks against (fio, GlusterFS, the formats' CLIs, headless Chromium, Slurm)"
fi
[ "$list" = 1 ] && exit 0
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "iobench: optional system packages not installed (${need[*]}): need root and apt; related features fall back and their tests skip." >&2
  exit 0
fi
echo "iobench: installing ${#need[@]} system package(s) with apt-get as root, for $why: ${need[*]} (log: /tmp/iobench-apt.log)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/tmp/iobench-apt.log 2>&1; then
  echo "iobench: apt-get install ${need[*]} failed (see /tmp/iobench-apt.log); related features fall back and their tests skip." >&2
fi
exit 0
