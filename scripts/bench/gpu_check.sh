#!/usr/bin/env bash
# One prepared check on a GPU machine (issue 33): the GPU and DALI tests, iobench's DALI loader
# against DALI's own pipeline (with and without decode), and three short training runs; ONE
# table at the end. Every step is bounded (`timeout`), a failed or hung step is recorded and
# the next one runs, and the steps together stay inside BUDGET_S (default 340 s: under 6
# minutes on one H200 with 16 cores). Nothing is written outside WORKDIR: datasets, results,
# logs, temporary files, pytest's and CUDA's caches and Python's bytecode all go there.
#
#   scripts/bench/gpu_check.sh WORKDIR            # on the GPU machine
#   scripts/bench/gpu_check.sh WORKDIR --cpu-smoke  # here: everything shrunk, GPU parts skipped
#
# PYTHON picks the interpreter (default: python3); iobench, DALI and torch must import there.
# Run it from a checkout (the tests come from its tests/ folder).
set -u

if [ $# -lt 1 ]; then
    echo "usage: $0 WORKDIR [--cpu-smoke]" >&2
    exit 2
fi
WORK=$(mkdir -p "$1" && cd "$1" && pwd)
SMOKE=0
[ "${2:-}" = "--cpu-smoke" ] && SMOKE=1
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
T0=$(date +%s)

mkdir -p "$WORK"/{data,res,logs,tmp,cache,pytest,pycache}
export TMPDIR="$WORK/tmp" XDG_CACHE_HOME="$WORK/cache" CUDA_CACHE_PATH="$WORK/cache/nv" \
    TORCH_HOME="$WORK/cache/torch" MPLCONFIGDIR="$WORK/cache/mpl" \
    TORCHINDUCTOR_CACHE_DIR="$WORK/cache/inductor" PYTHONPYCACHEPREFIX="$WORK/pycache"
cd "$WORK" || exit 2
: > "$WORK/steps.tsv"
RUNNING=
trap '[ -n "$RUNNING" ] && kill -TERM "$RUNNING" 2>/dev/null; exit 130' INT TERM

# step NAME CAP_S CMD...: run CMD with at most CAP_S seconds (less if the budget is nearly
# spent), its output in logs/NAME.log; record name, exit status and seconds in steps.tsv
step() {
    local name=$1 cap=$2
    shift 2
    local left=$((BUDGET_S - ($(date +%s) - T0)))
    cap=$((cap * CAP_X))
    local t=$((cap < left ? cap : left))
    if [ "$t" -lt 15 ]; then
        printf '%s\tskipped\t0\n' "$name" >> "$WORK/steps.tsv"
        echo "== $name: skipped (budget spent)"
        return
    fi
    echo "== $name (at most ${t} s): $*"
    local s rc
    s=$(date +%s)
    # in the background, so that a signal to this script stops the step too (timeout
    # passes it on to the step's whole process group)
    timeout --kill-after=10 "$t" "$@" > "$WORK/logs/$name.log" 2>&1 &
    RUNNING=$!
    wait $RUNNING
    rc=$?
    RUNNING=
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - s))" >> "$WORK/steps.tsv"
    tail -n 3 "$WORK/logs/$name.log"
}

if [ $SMOKE = 1 ]; then
    # a CPU steps through ResNet-50 and CosmoFlow some 50x slower: longer caps and budget
    N_IMG=256; N_COSMO=8; STEPS=1; B_IMG=4; B_COSMO=1; W=2; W_FILES=2; DEV=cpu; AMP=()
    CAP_X=8; BUDGET_S=${BUDGET_S:-2400}
    DVN=(--samples 256 --threads 2 --batch 32 --repeat 1 --epochs 1)
    TESTS="gpu or dali"; TESTS_K=(-k "workers_fork_only or gpu_without_a_gpu or live_dali")
    DEMAND=(cnn:16 --warmup 1 --steps 2)
else
    N_IMG=4096; N_COSMO=128; STEPS=25; B_IMG=128; B_COSMO=4; W=8; W_FILES=12; DEV=gpu
    CAP_X=1; BUDGET_S=${BUDGET_S:-340}
    AMP=(--amp --channels-last)
    DVN=(--samples 4096 --threads 14 --batch 256 --repeat 3 --epochs 1)
    TESTS="gpu or dali"; TESTS_K=()
    DEMAND=(resnet50:128 cosmoflow:4 cnn:64 --amp --channels-last)
fi
IOB=("$PY" -m iobench)
DATA="$WORK/data"

step info 20 bash -c "nvidia-smi -L; nproc; \"$PY\" -c 'import torch, nvidia.dali as d; \
print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available(), \"dali\", d.__version__)'"
step gen-imagenet 45 "${IOB[@]}" generate --dataset imagenet --format files --samples $N_IMG \
    --storage "$DATA" --jobs "$(nproc)"
step gen-cosmoflow 45 "${IOB[@]}" generate --dataset cosmoflow --format hdf5 \
    --samples $N_COSMO --storage "$DATA" --jobs "$(nproc)"
step dali-vs-native 75 "$PY" "$REPO/scripts/bench/dali_vs_native.py" --work "$DATA" \
    --device $DEV --json "$WORK/res/dali_vs_native.json" "${DVN[@]}"

step demand 40 "$PY" "$REPO/scripts/bench/model_demand.py" "${DEMAND[@]}" \
    --json "$WORK/res/model_demand.json"

TRAIN=("${IOB[@]}" train --storage "$DATA" --epochs 2 --max-steps $STEPS "${AMP[@]}")
step train-resnet50-dali 45 "${TRAIN[@]}" --dataset imagenet --loader dali --format files \
    --batch-size $B_IMG --workers $W --results "$WORK/res/train-resnet50-dali"
step train-resnet50-files 45 "${TRAIN[@]}" --dataset imagenet --loader files \
    --batch-size $B_IMG --workers $W_FILES --results "$WORK/res/train-resnet50-files"
step train-cosmoflow-hdf5 45 "${TRAIN[@]}" --dataset cosmoflow --loader hdf5 \
    --batch-size $B_COSMO --workers $W --results "$WORK/res/train-cosmoflow-hdf5"

# the timing-sensitive modules (`serial`, tests/conftest.py) alone, the rest 4 at a time
# where pytest-xdist is installed
PAR=()
"$PY" -c "import xdist" 2>/dev/null && PAR=(-n 4)
# (a test module whose optional import is missing there must not stop the others)
PYTEST=("$PY" -m pytest -q -p no:cacheprovider --continue-on-collection-errors
        --rootdir "$REPO" -c "$REPO/pyproject.toml")
step pytest 110 "${PYTEST[@]}" --basetemp "$WORK/pytest" "${PAR[@]}" \
    -m "($TESTS) and not serial" "${TESTS_K[@]}" "$REPO/tests"
step pytest-serial 60 "${PYTEST[@]}" --basetemp "$WORK/pytest-serial" \
    -m "($TESTS) and serial" "${TESTS_K[@]}" "$REPO/tests"

echo
"$PY" "$REPO/scripts/bench/_gpu_check_table.py" "$WORK" "$(($(date +%s) - T0))"
