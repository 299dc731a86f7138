#!/usr/bin/env bash
# Generation throughput for every dataset x format, next to the raw sequential
# write speed of the same disk measured in the same run (dd, O_DIRECT), and
# the JPEG size statistics. Prints a Markdown table for docs/results.md.
# The issue-20 limits, side by side and repeated, are measured by
# gen_encode.py (imagenet against JPEG encode alone), gen_disk.py (cosmoflow
# and cifar10 against fio with the same jobs) and gen_scale.py (mpiexec -n N).
#
#   scripts/bench/generate.sh [WORKDIR] [JOBS]
#
# Sizes: IOBENCH_BENCH_CIFAR (20000), IOBENCH_BENCH_IMAGENET (1000),
# IOBENCH_BENCH_COSMOFLOW (32) samples.
set -euo pipefail
work=${1:-/tmp/iobench-bench-generate}
jobs=${2:-$(getconf _NPROCESSORS_ONLN)}
cifar=${IOBENCH_BENCH_CIFAR:-20000}
imagenet=${IOBENCH_BENCH_IMAGENET:-1000}
cosmo=${IOBENCH_BENCH_COSMOFLOW:-32}
iob=${IOBENCH:-iobench}
rm -rf "$work" && mkdir -p "$work"

dd_write() {  # MB/s of a 1 GiB O_DIRECT sequential write to the work directory
  local out
  out=$(dd if=/dev/zero of="$work/dd.bin" bs=16M count=64 oflag=direct conv=fsync 2>&1 | tail -1)
  rm -f "$work/dd.bin"
  awk '{for (i=1;i<=NF;i++) if ($i ~ /^[0-9.]+$/) n=$i; print $0}' <<<"$out" \
    | sed -E 's/.*, ([0-9.]+) ([GM])B\/s.*/\1 \2/' | awk '{print ($2=="G") ? $1*1000 : $1}'
}

echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  host: $(hostname)  cores: $(getconf _NPROCESSORS_ONLN)  jobs: $jobs"
echo "disk: $(findmnt -no SOURCE,FSTYPE --target "$work")"
before=$(dd_write)
echo
echo "| dataset | format | samples | MB written | seconds | MB/s | % of dd |"
echo "|---|---|---:|---:|---:|---:|---:|"
rows=()
for ds in cifar10 imagenet cosmoflow; do
  case $ds in cifar10) n=$cifar ;; imagenet) n=$imagenet ;; cosmoflow) n=$cosmo ;; esac
  for fmt in hdf5 netcdf lmdb files; do
    log=$("$iob" generate --dataset "$ds" --format "$fmt" --samples "$n" --jobs "$jobs" \
          --storage "$work" 2>&1 >/dev/null)
    line=$(grep '^wrote' <<<"$log")
    mb=$(sed -E 's/^wrote ([0-9.]+) MB.*/\1/' <<<"$line")
    secs=$(sed -E 's/.* in ([0-9.]+) s \(.*/\1/' <<<"$line")
    rate=$(sed -E 's/.*\(([0-9.]+) MB\/s.*/\1/' <<<"$line")
    pct=$(awk -v r="$rate" -v d="$before" 'BEGIN{printf "%.0f", 100*r/d}')
    echo "| $ds | $fmt | $n | $mb | $secs | $rate | $pct |"
    if [ "$ds" = imagenet ] && [ "$fmt" = hdf5 ]; then jpeg=$(grep '^JPEG sizes' <<<"$log"); fi
    rm -rf "${work:?}/$ds-$fmt"
  done
done
after=$(dd_write)
echo
echo "dd if=/dev/zero bs=16M count=64 oflag=direct (1 GiB): before ${before} MB/s, after ${after} MB/s"
echo "imagenet ($imagenet samples): ${jpeg:-no JPEG statistics}"
