#!/usr/bin/env bash
# Installs the optional OS tools iobench uses when they are present:
# fio (iobench probe), FUSE (iobench emulate-pfs), GlusterFS server and client
# (scripts/pfs/local-gluster.sh: a real network filesystem on one box for the
# tests and the real-tier benchmarks), and the formats' own command-line tools
# (h5ls, ncdump, mdb_stat) that tests check our files with, a headless Chromium
# (the HTML report is opened in a real browser by the tests), and Slurm with munge
# (scripts/slurm/local-cluster.sh: a one-box cluster the job templates are tested on). Needs root and apt;
# anywhere else it says what it skipped and succeeds, and the features fall
# back (probe uses its own measurement) or their tests skip with a reason.
set -u
need=()
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v h5ls >/dev/null 2>&1 || need+=(hdf5-tools)
command -v ncdump >/dev/null 2>&1 || need+=(netcdf-bin)
command -v mdb_stat >/dev/null 2>&1 || need+=(lmdb-utils)
command -v glusterd >/dev/null 2>&1 || need+=(glusterfs-server)
[ -x /sbin/mount.glusterfs ] || [ -x /usr/sbin/mount.glusterfs ] || need+=(glusterfs-client)
command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 \
  || [ -x /usr/lib/chromium/chromium-headless-shell ] || need+=(chromium-headless-shell)
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
command -v munged >/dev/null 2>&1 || need+=(munge)
[ -e /usr/lib/x86_64-linux-gnu/libfuse.so.2 ] || [ -e /lib/x86_64-linux-gnu/libfuse.so.2 ] || need+=(libfuse2)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "iobench: optional system packages not installed (${need[*]}): need root and apt; related tests will skip." >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/tmp/iobench-apt.log 2>&1; then
  echo "iobench: apt-get install ${need[*]} failed (see /tmp/iobench-apt.log); related tests will skip." >&2
fi
exit 0
