"""Write a synthetic dataset (imagenet, cifar10, cosmoflow) in any registered format
(`iobench.core.formats`), in parallel (mpiexec ranks or --jobs), deterministic and resumable.
Off a terminal (a batch job's log), a progress line every 60 s (IOBENCH_PROGRESS_S)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

from iobench.core.datasets import DATASETS
from iobench.core.formats import COMPRESSIONS, DEFAULT_FORMAT, FORMATS
from iobench.core.progress import LogProgress

if TYPE_CHECKING:
    from iobench.core.world import World
    from iobench.workflows.generate import GenerateConfig, GenerateStats


def add_arguments(p: argparse.ArgumentParser) -> None:
    from iobench.cli._workload import add_workload_arguments

    p.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help="what to imitate (default: cifar10)")
    p.add_argument("--format", default=None, choices=list(FORMATS),
                   help=f"on-disk format (default: {DEFAULT_FORMAT})")
    p.add_argument("--storage", default="./iobench-data",
                   help="directory to write <dataset>-<format>/ into (default: ./iobench-data)")
    p.add_argument("--samples", type=int, help="number of samples (default: small per dataset)")
    p.add_argument("--scale", default="small", choices=["small", "full"],
                   help="full: the real dataset's sample count (default: small)")
    p.add_argument("--samples-per-file", type=int,
                   help="samples per container file, or per shard ("
                        + "/".join(n for n, f in FORMATS.items() if not f.per_sample_files)
                        + ")")
    p.add_argument("--compression", default="none", choices=list(COMPRESSIONS),
                   help="; ".join(f"{n}: {', '.join(f.compressions[1:])}"
                                  for n, f in FORMATS.items() if f.compressed)
                   + " (default: none)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes when not under mpiexec (default: 1)")
    p.add_argument("--force", action="store_true",
                   help="replace a different dataset already at the target")
    add_workload_arguments(p)


def main(args: argparse.Namespace) -> int:
    from iobench.core.world import get_world
    from iobench.workflows.generate import GenerateConfig, GenerateStats

    _apply_workload(args)
    cfg = GenerateConfig(dataset=args.dataset, format=args.format, storage=args.storage,
                         samples=args.samples, samples_per_file=args.samples_per_file,
                         compression=args.compression, seed=args.seed, jobs=args.jobs,
                         force=args.force, scale=args.scale)
    from iobench.core import faults
    from iobench.core.interrupts import interrupts

    faults.at_start()  # tests only: a no-op unless IOBENCH_TEST_FAULT is set
    world = get_world()
    with interrupts():  # SIGINT/SIGTERM: the pool stopped in order, one line, 130/143
        return _run(cfg, world, GenerateStats())


def _apply_workload(args: argparse.Namespace) -> None:
    """`--workload W --accelerator A`: W's dataset, format and samples per file."""
    from iobench.cli._workload import clash, workload_of

    run = workload_of(args)
    if run is None:
        args.dataset = args.dataset or "cifar10"
        args.format = args.format or DEFAULT_FORMAT
        return
    w = run.workload
    clash("--dataset", args.dataset, w.dataset, w.name)
    clash("--format", args.format, w.format, w.name)
    clash("--samples-per-file", args.samples_per_file, w.samples_per_file, w.name)
    args.dataset, args.format, args.samples_per_file = w.dataset, w.format, w.samples_per_file


def _run(cfg: GenerateConfig, world: World, stats: GenerateStats) -> int:
    from iobench.workflows.generate import generate_dataset

    if not world.is_root:
        generate_dataset(cfg, world, stats=stats)
        return 0
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    cols = (TextColumn(f"generate {cfg.dataset}-{cfg.format}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn())
    from rich.console import Console

    console = Console(stderr=True)
    log = LogProgress(f"generate {cfg.dataset}-{cfg.format}")  # off a terminal: a line a minute
    with Progress(*cols, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, done))
            log.update(done, total)

        with log if not console.is_terminal else contextlib.nullcontext(log):
            manifest = generate_dataset(cfg, world, progress=progress, stats=stats)
    if stats.already_complete:
        print(f"{manifest.root}: already complete ({manifest.num_samples} samples, "
              f"{manifest.total_bytes / 1e6:.1f} MB); nothing to do", file=sys.stderr)
    else:
        resumed = f", {stats.files_resumed} kept from an earlier run" if stats.files_resumed else ""
        par = f"{world.size} ranks" if world.size > 1 else f"{cfg.jobs} job(s)"
        print(f"wrote {stats.bytes_written / 1e6:.1f} MB in {stats.files_written} files"
              f"{resumed} in {stats.seconds:.1f} s ({stats.mb_per_s:.1f} MB/s, {par})",
              file=sys.stderr)
        jb = manifest.extra.get("jpeg_bytes")
        if jb:
            print(f"JPEG sizes: mean {jb['mean'] / 1e3:.1f} KB, std {jb['std'] / 1e3:.1f} KB, "
                  f"p5 {jb['p5'] / 1e3:.1f} KB, p95 {jb['p95'] / 1e3:.1f} KB", file=sys.stderr)
    print(manifest.root)
    return 0
