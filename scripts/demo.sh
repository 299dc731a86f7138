#!/usr/bin/env bash
# `make demo`: the iobench quick start (about 2-3 minutes on 2 cores).
#
#   1. generate a small cifar10 dataset (HDF5) once, on storage location A;
#   2. stage (copy) it to storage location B;
#   3. train 3 epochs from each location: real model, cold page cache;
#   4. compare the two runs: stall time per epoch, table and plot.
#
# Both locations are local directories on this machine; on a cluster, make A
# the parallel filesystem (Lustre/GPFS) and B the node-local NVMe:
#   DEMO_A=/lustre/$USER/iobench DEMO_B=/local/nvme/$USER bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

WORK="${DEMO_WORK:-demo-work}"
A="${DEMO_A:-$WORK/storage-a}"   # e.g. the parallel filesystem
B="${DEMO_B:-$WORK/storage-b}"   # e.g. node-local NVMe
SAMPLES="${DEMO_SAMPLES:-4096}"
EPOCHS="${DEMO_EPOCHS:-3}"
RESULTS="$WORK/results"
COMMON=(--loader hdf5 --dataset cifar10 --model cnn --epochs "$EPOCHS" --batch-size 64
        --workers 1 --results "$RESULTS")

mkdir -p "$WORK"
iobench info "$WORK"

if [ ! -f "$A/cifar10-hdf5/iobench.json" ]; then
    echo "== generating $SAMPLES cifar10 samples (HDF5) in $A"
    iobench generate --dataset cifar10 --format hdf5 --samples "$SAMPLES" --storage "$A"
fi
if [ ! -f "$B/cifar10-hdf5/iobench.json" ]; then
    echo "== staging the dataset from $A to $B"
    iobench stage --dataset cifar10 --format hdf5 --from "$A" --to "$B" \
        --results "$WORK/staging"
fi

echo "== training from $A (cold cache every epoch)"
iobench train --storage "$A" "${COMMON[@]}"
first=$(ls -t "$RESULTS"/*.json | head -1)
echo "== training from $B (cold cache every epoch)"
iobench train --storage "$B" "${COMMON[@]}"
second=$(ls -t "$RESULTS"/*.json | head -1)

echo "== comparison (run 1 = $A, run 2 = $B)"
iobench compare "$first" "$second" --plot "$WORK/stall.png"
