#!/bin/bash
# iobench sweep: runs on the job's first node and starts each training run with the sweep
# file's `launcher` (here: [flux, run, -n, "{ranks}"]).
#
#   export IOBENCH_ARGS="scripts/sweeps/cluster.yaml --results /lus/me/sweep"
#   export IOBENCH_VENV=$HOME/iobench/.venv        # or have `iobench` on PATH
#   flux batch -N 2 scripts/flux/sweep.flux        # IOBENCH_PPN=4 for 4 ranks per node
#
# flux batch passes the environment as it is. Site lines: docs/cluster.md.
#flux: --job-name=iobench-sweep
#flux: -N 2
#flux: -t 480m
#flux: --output=iobench-sweep-{{id}}.out
## Site-specific: remove one '#' to use (docs/cluster.md)
##flux: --queue=QUEUE
##flux: --setattr=system.bank=PROJECT
set -euo pipefail
# Site modules (docs/cluster.md), e.g.: module load python mvapich2
if [ -z "${IOBENCH_ARGS:-}" ]; then
  echo "iobench job: IOBENCH_ARGS is empty; export it with iobench sweep's arguments (e.g. IOBENCH_ARGS=\"SWEEP.yaml --results DIR\") before flux batch" >&2
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
echo "iobench job: $nodes node(s): sweep ${args[*]}" >&2
# not under the launcher: the sweep is one process; its runs are started by it
iobench sweep "${args[@]}"
