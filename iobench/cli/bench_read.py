"""Pure-read benchmark: iterate loaders with no model over a grid of workers x shuffle, cold cache.

Prints samples/s, MB/s (10^6 B/s), per-batch wait p50/p95/p99, the OS's read
bytes, the page-cache residency measured after eviction, and the ratio of
samples/s to two naive per-sample h5py baselines (file kept open per worker;
file opened per sample) and of MB/s to `dd` with direct I/O on the same
files. `--repeat N` measures the grid N times, interleaved, and prints
median [min-max]. Writes a `iobench.bench_read` JSON document with
`--results DIR`. Runs under mpiexec/srun/torchrun too (one share per rank).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from iobench.core.datasets import DATASETS
from iobench.core.errors import ConfigError
from iobench.core.formats import FORMATS


def _ints(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in s.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--workers {s!r}: expected comma-separated integers, e.g. 0,2,4") from None


def _names(s: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in s.split(",") if v.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", default=None, metavar="DIR",
                   help="storage root holding <dataset>-<format>/ (as written by `generate`)")
    p.add_argument("--data", default=None, metavar="PATH",
                   help="your own data instead of --storage: an HDF5 or NetCDF-4 file or a "
                        "folder of them, an LMDB environment, or an ImageFolder tree; read "
                        "only (docs/training.md, 'Your own data')")
    p.add_argument("--data-key", default=None, metavar="NAME",
                   help="with --data (HDF5/NetCDF): the array of samples (default: detected)")
    p.add_argument("--label-key", default=None, metavar="NAME",
                   help="with --data: the labels array, or the LMDB labels record's key "
                        "(default: detected)")
    p.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help="dataset name (default: the one dataset under --storage)")
    p.add_argument("--format", default=None, choices=list(FORMATS),
                   help="on-disk format (default: the one format of the dataset under "
                        "--storage)")
    p.add_argument("--loaders", default=None, metavar="L1,L2",
                   help="loaders to compare (default: the format's own loader, and dali if "
                        "installed)")
    p.add_argument("--workers", default="0,2,4", metavar="N1,N2", help="worker counts (default 0,2,4)")
    p.add_argument("--worker-type", default="process", choices=("process", "thread"),
                   help="loader workers as processes (PyTorch DataLoader) or threads "
                        "(default: process; DALI always uses processes)")
    p.add_argument("--shuffle", default="global,block,none", metavar="S1,S2",
                   help="shuffle modes: global, block, none (default: all three)")
    p.add_argument("--block-size", type=int, default=256, help="samples per block (block shuffle; default 256)")
    p.add_argument("--shuffle-window", type=int, default=16, help="blocks shuffled together (default 16)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch per rank (default 64)")
    p.add_argument("--epochs", type=int, default=1, help="epochs per run, evicted before each (default 1)")
    p.add_argument("--max-batches", type=int, default=None, metavar="N",
                   help="batches per epoch at most (bounds a run on a huge dataset)")
    p.add_argument("--no-decode", action="store_true",
                   help="stored bytes only: no JPEG decode, augmentation or normalisation")
    p.add_argument("--warm-cache", action="store_true",
                   help="do not evict the dataset's pages before each run")
    p.add_argument("--no-naive", action="store_true",
                   help="skip both naive h5py baselines (kept handle, open per sample)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="cold repetitions of the whole grid, interleaved (default 1); rows "
                        "then show median [min-max] and n.s. for ratios not different from 1")
    p.add_argument("--evict-cmd", default=None, metavar="CMD",
                   help="shell command that empties what no client can (a shared filesystem's "
                        "server caches), run by each node's local rank 0 before every cold "
                        "epoch; without it, epochs on a shared tier are unverified, not cold")
    p.add_argument("--no-dd", action="store_true", help="skip the dd direct-I/O reference")
    p.add_argument("--dd-max-files", type=int, default=64, metavar="N",
                   help="data files dd reads (a random subset when there are more; default 64)")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                   help="where DALI runs its operators (default: cpu)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sample order and augmentation (default 0)")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="also write the JSON document into DIR (never overwrites)")


def main(args: argparse.Namespace) -> int:
    from iobench.core.world import get_world
    from iobench.workflows import bench_read as bench

    cfg, dataset = build_config(args)
    from iobench.core import faults
    from iobench.core.interrupts import interrupts

    faults.at_start()  # tests only: a no-op unless IOBENCH_TEST_FAULT is set
    world = get_world()
    verbose = world.rank == 0

    def progress(msg: str) -> None:
        if verbose:
            print(f"bench-read: {msg}", file=sys.stderr, flush=True)

    # SIGINT/SIGTERM as `Interrupted`, and raised again at the next batch where Python
    # dropped the first raise inside a weakref callback (no deadline: as before)
    with interrupts(grace_s=None):
        out = bench.bench_read(cfg, world, args.results, progress, dataset)
    if out is None:
        return 0
    print(bench.markdown_table(out.doc))
    if out.path is not None:
        print(f"\nwrote {out.path}")
    return 0


def build_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """The grid to measure, and the generated dataset it reads (found once, here; None for
    the user's data, which the library lists on rank 0)."""
    from iobench.workflows.bench_read import BenchReadConfig

    dataset = None
    storage, name, fmt = args.storage, args.dataset, args.format
    if args.data is not None:
        from iobench.core.userdata import USER_DATASET, detect_format

        if args.storage is not None or args.dataset is not None:
            raise ConfigError("give --storage/--dataset (a dataset from `iobench generate`) "
                              "or --data (your own), not both")
        fmt = detect_format(args.data)
        if args.format not in (None, fmt):
            raise ConfigError(f"--data {args.data} is {fmt} data, not {args.format}: drop "
                              "--format")
        storage, name = args.data, USER_DATASET
        default: tuple[str, ...] = (fmt,)  # DALI has no pipeline for data iobench knows nothing about
    elif args.storage is None:
        raise ConfigError("--storage DIR (a dataset from `iobench generate`) or --data PATH "
                          "(your own data) is required")
    elif args.data_key or args.label_key:
        raise ConfigError("--data-key/--label-key name arrays of your own data: add --data "
                          "PATH, or drop them")
    else:
        from iobench.core.dataref import locate

        dataset = locate(args.storage, args.dataset, args.format)
        storage, name, fmt = dataset.storage, dataset.dataset, dataset.format
        default = _default_loaders(fmt)
    return BenchReadConfig(
        storage=storage, dataset=name, format=fmt,
        loaders=_names(args.loaders) if args.loaders else default,
        workers=_ints(args.workers), shuffles=_names(args.shuffle),
        worker_type=args.worker_type, batch_size=args.batch_size, epochs=args.epochs,
        decode=not args.no_decode, warm_cache=args.warm_cache, block_size=args.block_size,
        shuffle_window=args.shuffle_window, seed=args.seed, naive=not args.no_naive,
        dd=not args.no_dd, dd_max_files=args.dd_max_files, device=args.device,
        max_batches=args.max_batches, repeat=args.repeat, evict_cmd=args.evict_cmd,
        data=args.data, data_key=args.data_key, label_key=args.label_key), dataset


def _default_loaders(fmt: str) -> tuple[str, ...]:
    from iobench.core.formats import loader_formats

    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return (fmt,)
    return (fmt, "dali") if fmt in loader_formats("dali") else (fmt,)
