#!/bin/bash
# iobench on both tiers: train from the shared storage (--storage), then stage to
# node-local storage (IOBENCH_LOCAL, default ${TMPDIR:-/tmp}/iobench-<job>/{node}) and train from
# the copy; `iobench compare` pairs the two results (break-even epochs). The default local
# directory is removed at the end unless IOBENCH_KEEP_LOCAL=1; IOBENCH_STAGE_ARGS adds to the
# staged run only.
#
#   export IOBENCH_ARGS="--loader hdf5 --storage /lus/me/iobench-data --results /lus/me/res"
#   export IOBENCH_VENV=$HOME/iobench/.venv        # or have `iobench` on PATH
#   flux batch -N 2 scripts/flux/stage-train.flux        # IOBENCH_PPN=4 for 4 ranks per node
#
# flux batch passes the environment as it is. Site lines: docs/cluster.md.
#flux: --job-name=iobench-stage-train
#flux: -N 2
#flux: -t 120m
#flux: --output=iobench-stage-train-{{id}}.out
## Site-specific: remove one '#' to use (docs/cluster.md)
##flux: --queue=QUEUE
##flux: --setattr=system.bank=PROJECT
set -euo pipefail
# Site modules (docs/cluster.md), e.g.: module load python mvapich2
if [ -z "${IOBENCH_ARGS:-}" ]; then
  echo "iobench job: IOBENCH_ARGS is empty; export it with iobench train's arguments (e.g. IOBENCH_ARGS=\"--loader hdf5 --storage DIR\") before flux batch" >&2
  exit 2
fi
if [ -n "${IOBENCH_VENV:-}" ]; then
  [ -x "$IOBENCH_VENV/bin/iobench" ] || { echo "iobench job: IOBENCH_VENV=$IOBENCH_VENV has no bin/iobench; point it at the environment iobench is installed in" >&2; exit 2; }
  export PATH="$IOBENCH_VENV/bin:$PATH"
fi
command -v iobench >/dev/null || { echo "iobench job: no iobench on PATH; set IOBENCH_VENV to its environment" >&2; exit 2; }
eval "args=($IOBENCH_ARGS)"  # the user's own arguments, quoted as on a command line
nodes=$(flux getattr size)  # brokers of this batch instance: one per node
ppn=${IOBENCH_PPN:-1}
# flux run gives MPI its PMI (MPICH and most MPIs use it); one task per rank
run() { flux run -N "$nodes" --tasks-per-node="$ppn" "$@"; }
eval "stage_args=(${IOBENCH_STAGE_ARGS:-})"
job_local=${TMPDIR:-/tmp}/iobench-${FLUX_JOB_ID:-$$}
local_root=${IOBENCH_LOCAL:-$job_local/\{node\}}
cleanup() {
  # only the job's own default directory: an IOBENCH_LOCAL of the user's is theirs to keep
  [ -z "${IOBENCH_LOCAL:-}" ] && [ "${IOBENCH_KEEP_LOCAL:-0}" != 1 ] || return 0
  flux run -N "$nodes" --tasks-per-node=1 rm -rf "$job_local" || true
}
trap cleanup EXIT
echo "iobench job: $nodes node(s) x $ppn rank(s); tier 1: train ${args[*]}" >&2
run iobench train "${args[@]}"
echo "iobench job: tier 2: stage to $local_root, train from the copy" >&2
run iobench train "${args[@]}" --stage-to "$local_root" "${stage_args[@]}"
