#!/usr/bin/env bash
# `make demo`: the iobench quick start (a few minutes on 2 cores).
#
#   1. generate a small cifar10 dataset (HDF5) once on the local disk;
#   2. serve it through an EMULATED parallel filesystem ("pfs": FUSE with
#      Lustre-like metadata latency, request latency and a bandwidth cap),
#      when FUSE is usable here (root and /dev/fuse); otherwise say so and
#      use a plain local directory in its place;
#   3. "would this storage keep up with a GPU?": 2 epochs, repeated 3 times,
#      with an emulated accelerator that needs 0.02 s per step of 64 samples
#      (DLIO-style), cold cache, from
#      "pfs" in place, then again with --stage-to: copy to a local "nvme"
#      directory first (iobench stage, checksummed), then train from the copy;
#   4. compare stall time per epoch, with the break-even of staging;
#   5. train a real model (cnn) for 2 epochs from the staged copy: accuracy
#      rising far above chance proves samples and labels arrive intact.
#
# On a cluster, point it at the real tiers instead of the emulation:
#   DEMO_PFS=/lustre/$USER/iobench DEMO_NVME=/tmp/nvme bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

WORK="${DEMO_WORK:-$PWD/demo-work}"
SAMPLES="${DEMO_SAMPLES:-8192}"
EPOCHS="${DEMO_EPOCHS:-2}"
REPEAT="${DEMO_REPEAT:-3}"
PROFILE="${DEMO_PROFILE:-lustre-busy}"
RESULTS="$WORK/results"
NVME="${DEMO_NVME:-$WORK/nvme}"
STEP_S="${DEMO_STEP_S:-0.02}"
COMMON=(--loader hdf5 --dataset cifar10 --batch-size 64 --workers 1)
mkdir -p "$WORK"
rm -rf "$RESULTS" "$NVME"

if [ -n "${DEMO_PFS:-}" ]; then
    PFS="$DEMO_PFS"
    [ -f "$PFS/cifar10-hdf5/iobench.json" ] ||
        iobench generate --dataset cifar10 --format hdf5 --samples "$SAMPLES" --storage "$PFS"
else
    BACKING="$WORK/pfs-backing"
    echo "== generating $SAMPLES cifar10 samples (HDF5) on the local disk: $BACKING"
    iobench generate --dataset cifar10 --format hdf5 --samples "$SAMPLES" --storage "$BACKING"
    if why=$(iobench emulate-pfs --check 2>&1); then
        PFS="$WORK/pfs"
        mkdir -p "$PFS"
        iobench emulate-pfs --unmount "$PFS" >/dev/null 2>&1 || true   # a leftover from a killed demo
        echo "== serving it through an emulated parallel filesystem ($PROFILE) at $PFS"
        iobench emulate-pfs --backing "$BACKING" --mount "$PFS" --profile "$PROFILE"
        trap 'iobench emulate-pfs --unmount "$PFS" >/dev/null 2>&1 || iobench emulate-pfs --unmount "$PFS" --lazy >/dev/null 2>&1 || true' EXIT
    else
        echo "== no emulated parallel filesystem here ($why); comparing two local directories instead"
        PFS="$BACKING"
    fi
fi

iobench info "$PFS"

EMU=(--compute-time "$STEP_S" --epochs "$EPOCHS" --repeat "$REPEAT" --results "$RESULTS/gpu")
echo "== 1. emulated accelerator ($STEP_S s/step), in place on $PFS (cold cache every epoch)"
iobench train --storage "$PFS" "${COMMON[@]}" "${EMU[@]}"
echo "== 2. the same after staging to $NVME (iobench stage), training from the copy"
iobench train --storage "$PFS" --stage-to "$NVME" "${COMMON[@]}" "${EMU[@]}"

echo "== 3. a real model (cnn) on the staged copy: does it learn?"
iobench train --storage "$NVME" "${COMMON[@]}" --model cnn --epochs 2 --results "$RESULTS/model"

echo "== comparison: stall time per epoch (run 1: in place on $PFS; run 2: staged to $NVME)"
mapfile -t runs < <(ls -tr "$RESULTS"/gpu/*.json)
iobench compare "${runs[@]}" --plot "$WORK/stall.png"
