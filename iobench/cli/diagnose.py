"""Stage or tune? A differential diagnosis of a dataset's pipeline against the accelerator's demand.

Short bounded `iobench train` runs measure (a) the loader's ceiling with the data in
memory (decoding as the run would) and (b) the tier's ceiling cold without decoding,
at each worker count in --worker-counts, and, with --workers N, (c) your run itself.
The answer (storage: stage; loader: use N workers or decode on the accelerator; or it
keeps up) comes from (a) and (b) alone, so it does not change with the worker count
your own run used (the method of DS-Analyzer, Mohan et al., VLDB 2021).
"""

from __future__ import annotations

import argparse
from typing import Any

from iobench.core.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from iobench.cli._workload import add_workload_arguments
    from iobench.core.datasets import DATASETS
    from iobench.core.formats import FORMATS

    loaders = (*FORMATS, "dali")
    p.add_argument("--loader", default=None, choices=loaders,
                   help="reader to use, as for `iobench train` (with --data: its format)")
    p.add_argument("--storage", default=None, metavar="DIR",
                   help="directory holding <dataset>-<format>/ (from `iobench generate`)")
    p.add_argument("--data", default=None, metavar="PATH",
                   help="your own data instead of --storage (read only), as for `iobench train`")
    p.add_argument("--data-key", default=None, metavar="NAME", help="as for `iobench train`")
    p.add_argument("--label-key", default=None, metavar="NAME", help="as for `iobench train`")
    p.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help="which dataset under --storage (default: cifar10)")
    p.add_argument("--format", default=None, choices=list(FORMATS),
                   help="on-disk format, for --loader dali (default: the one found)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per step (default: the dataset's, as `iobench train`)")
    p.add_argument("--compute-time", type=float, default=None, metavar="SECONDS",
                   help="the demand: an accelerator computing SECONDS per step, so it takes "
                        "batch / SECONDS samples/s")
    p.add_argument("--demand", type=float, default=None, metavar="SAMPLES_PER_S",
                   help="the demand as measured: samples/s one accelerator consumes")
    p.add_argument("--worker-counts", default=None, metavar="N,N,...",
                   help="loader workers to try for (a) and (b) (default: 1,2,4,... up to the "
                        "cores, at least 1,2)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="also measure your own run (c) with N workers; it is reported beside "
                        "the answer and never changes it")
    p.add_argument("--no-decode", action="store_true",
                   help="your run reads stored bytes only (as --workload runs do): (a) then "
                        "measures the loader without decoding")
    p.add_argument("--steps", type=int, default=30, metavar="N",
                   help="steps per measurement run (default 30; the first is left out)")
    p.add_argument("--shuffle", default="global", choices=("global", "block", "none"),
                   help="sample order of every run, as for `iobench train` (default: global)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample order (default 0)")
    p.add_argument("--worker-type", default="process", choices=("process", "thread"),
                   help="loader workers as processes or threads (default: process)")
    p.add_argument("--evict-cmd", default=None, metavar="CMD",
                   help="as for `iobench train`: what empties a shared tier's server caches "
                        "before the cold runs")
    p.add_argument("--run-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="end a measurement run after this long (default 300)")
    p.add_argument("--results", default="iobench-results", metavar="DIR",
                   help="where the diagnosis JSON goes (default: ./iobench-results)")
    add_workload_arguments(p)


def build_config(args: argparse.Namespace) -> Any:
    from iobench.core.datasets import parse_dataset
    from iobench.workflows.diagnose import (
        DiagnoseConfig,
        default_worker_counts,
        demand_of,
        parse_worker_counts,
    )

    loader, dataset, batch, compute, decode = _workload_or_own(args)
    if args.data is not None:
        from iobench.core.userdata import USER_DATASET, detect_format

        if args.storage is not None or args.dataset is not None:
            raise ConfigError("give --storage/--dataset or --data, not both")
        loader, storage, dataset = loader or detect_format(args.data), args.data, USER_DATASET
        batch = batch or 64
    elif args.storage is None:
        raise ConfigError("--storage DIR (a dataset from `iobench generate`) or --data PATH "
                          "(your own data) is required")
    elif loader is None:
        raise ConfigError("--loader is required with --storage (or give --workload)")
    else:
        storage, dataset = args.storage, dataset or "cifar10"
        batch = batch or parse_dataset(dataset).default_batch_size
    counts = (parse_worker_counts(args.worker_counts) if args.worker_counts
              else default_worker_counts())
    return DiagnoseConfig(
        loader=loader, storage=storage, dataset=dataset, batch_size=batch,
        demand=demand_of(batch, compute, args.demand, args.workload), format=args.format,
        data=args.data, data_key=args.data_key, label_key=args.label_key,
        worker_counts=counts, user_workers=args.workers, decode=decode, steps=args.steps,
        shuffle=args.shuffle, seed=args.seed, worker_type=args.worker_type,
        evict_cmd=args.evict_cmd, results=args.results, run_timeout_s=args.run_timeout)


def _workload_or_own(args: argparse.Namespace) -> tuple[Any, Any, Any, Any, bool]:
    """(loader, dataset, batch, compute time, decode): a --workload's, or as given."""
    from iobench.cli._workload import clash, workload_of

    run = workload_of(args)
    if run is None:
        return args.loader, args.dataset, args.batch_size, args.compute_time, not args.no_decode
    w = run.workload
    if args.data is not None or args.demand is not None:
        raise ConfigError(f"--workload {w.name} sets the dataset and the demand; drop "
                          "--data/--demand or --workload")
    clash("--dataset", args.dataset, w.dataset, w.name)
    clash("--batch-size", args.batch_size, run.batch, w.name)
    clash("--compute-time", args.compute_time, run.compute_s, w.name)
    return args.loader or w.loader, w.dataset, run.batch, run.compute_s, False


def main(args: argparse.Namespace) -> int:
    from iobench.workflows.diagnose import run_diagnose, write_diagnosis

    config = build_config(args)
    d = config.demand
    print(f"iobench diagnose: {config.dataset} via {config.loader} from {config.storage}; "
          f"demand {d.samples_per_s:.4g} samples/s ({d.detail}); worker counts "
          f"{', '.join(map(str, config.worker_counts))}; {config.steps} steps per run",
          flush=True)
    result = run_diagnose(config, progress=lambda line: print(line, flush=True))
    _print_table(result)
    path = write_diagnosis(result, config.results)
    for note in result.notes:
        print(f"note: {note}")
    print(f"result: {path}")
    print(result.diagnosis.line, flush=True)
    return 0


def _print_table(result: Any) -> None:
    print(f"{'workers':>8} {'in memory (a)':>14} {'storage (b)':>12}   samples/s")
    storage = {m.workers: m.samples_per_s for m in result.storage}
    for m in result.memory:
        print(f"{m.workers:>8} {m.samples_per_s:>14.4g} {storage[m.workers]:>12.4g}")
    if result.run is not None:
        r = result.run
        au = "" if r.au is None else f", AU {r.au:.3f}"
        print(f"your run (c), {r.workers} worker(s): {r.samples_per_s:.4g} samples/s{au}")
