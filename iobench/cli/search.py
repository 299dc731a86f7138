"""Find the largest number of emulated accelerators whose AU stays at or above the workload's
threshold: real cold runs of N ranks (`mpiexec -n N`, or --launcher), doubling then bisection."""

from __future__ import annotations

import argparse
import shlex
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from iobench.cli._workload import add_workload_arguments

    add_workload_arguments(p, required=True)
    p.add_argument("--storage", required=True, metavar="DIR",
                   help="directory holding the workload's dataset (iobench generate "
                        "--workload W --accelerator A --storage DIR)")
    p.add_argument("--results", default="iobench-results", metavar="DIR",
                   help="where the search result and each point's training result go "
                        "(default: ./iobench-results)")
    p.add_argument("--max-accelerators", type=int, default=64, metavar="N",
                   help="never run more than N accelerators (default 64)")
    p.add_argument("--repeat", type=int, default=1, metavar="R",
                   help="cold repetitions of every point; a point's AU is their median "
                        "(default 1; MLPerf Storage uses 5)")
    p.add_argument("--epochs", type=int, default=1,
                   help="epochs per repetition (default 1; MLPerf's workloads run 5 to 8)")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="scale the batch to B and the compute time with it, so each "
                        "accelerator's demand (MB/s) is the workload's (default: the "
                        "workload's batch); for short tests")
    p.add_argument("--slowdown", type=float, default=1.0, metavar="K",
                   help="emulate compute K times slower, so each accelerator asks for 1/K of "
                        "the workload's MB/s: the answer is then the one for a tier K times "
                        "faster (for checks on a busy machine; default 1)")
    p.add_argument("--au-threshold", type=float, default=None, metavar="FRACTION",
                   help="pass at this AU or above (default: the workload's: 0.90, cosmoflow "
                        "0.70, retinanet 0.85)")
    p.add_argument("--workers", type=int, default=2, help="loader workers per rank (default 2)")
    p.add_argument("--launcher", default="mpiexec -n {ranks}", metavar="CMD",
                   help="how to start N ranks; {ranks} is replaced by N and {per_host} by "
                        "N / --hosts (default: 'mpiexec -n {ranks}'; e.g. 'srun -n {ranks} "
                        "--ntasks-per-node {per_host}')")
    p.add_argument("--point-timeout", type=float, default=1800.0, metavar="SECONDS",
                   help="end a point's run after this long (default 1800)")
    p.add_argument("--hosts", type=int, default=0, metavar="H",
                   help="client hosts: every N is a multiple of H, spread evenly over them "
                        "(as MLPerf requires; others are skipped), and the dataset-size "
                        "warning (iobench datasize)")
    p.add_argument("--host-memory-gb", type=float, default=0.0, metavar="G",
                   help="memory per client host in GiB, for the dataset-size warning")
    p.add_argument("--demand-from", default=None, metavar="RESULT",
                   help="a real model's measured demand (compute.demand of an `iobench "
                        "train` result on the workload's dataset) in place of the workload's "
                        "compute time")
    p.add_argument("--train-arg", action="append", default=[], metavar="ARG",
                   help="pass ARG on to every `iobench train` (repeat it; e.g. "
                        "--train-arg=--evict-cmd --train-arg='...')")


def main(args: argparse.Namespace) -> int:
    from iobench.cli._workload import workload_of
    from iobench.core.errors import ConfigError
    from iobench.core.interrupts import Interrupted, interrupts
    from iobench.core.outputs import writable_dir
    from iobench.core.world import get_world
    from iobench.workflows.search import (
        SearchConfig,
        SearchInterrupted,
        answer_line,
        run_search,
        write_search,
    )

    if get_world().size > 1:
        raise ConfigError("run `iobench search` as one process; it launches every point's "
                          "ranks itself (--launcher)")
    workload_of(args)
    demand, source = None, None
    if args.demand_from is not None:
        from iobench.core.results import load_typed
        from iobench.workflows.search import measured_demand

        demand, source = measured_demand(load_typed(args.demand_from), args.workload)
    cfg = SearchConfig(workload=args.workload, accelerator=args.accelerator,
                       storage=args.storage, results=args.results,
                       max_accelerators=args.max_accelerators, repeat=args.repeat,
                       epochs=args.epochs, batch_size=args.batch_size,
                       threshold=args.au_threshold, workers=args.workers,
                       launcher=tuple(shlex.split(args.launcher)),
                       point_timeout_s=args.point_timeout, slowdown=args.slowdown, train_args=tuple(args.train_arg),
                       hosts=args.hosts, host_memory_gb=args.host_memory_gb,
                       demand_samples_per_s=demand, demand_source=source)
    writable_dir(cfg.results, "results")
    # no exit deadline after a signal: stopping the running point's ranks (which write
    # their partial result) may take longer than a rank's grace, and the search result
    # must be written after it
    with interrupts(grace_s=None):
        try:
            doc = run_search(cfg, log=lambda m: print(m, flush=True))
        except SearchInterrupted as e:
            path = write_search(e.document, cfg.results)
            print(f"iobench: interrupted ({e}); search result marked interrupted: {path}",
                  file=sys.stderr, flush=True)
            return e.exit_code
        except Interrupted as e:
            return e.exit_code
        for w in doc["warnings"]:
            print(f"warning: {w}", file=sys.stderr)
        path = write_search(doc, cfg.results)
    print(f"result: {path}")
    print(answer_line(doc), flush=True)
    return 0
