"""Copy a dataset between storage tiers in parallel (replicate or shard), checksummed and resumable.

Under `mpiexec`, every node receives the files its ranks will read (all of
them with `--mode replicate`; with `--mode shard` only its ranks' share, and
training from the copy then shuffles within each rank's files). The source is
evicted from the page cache first (unless --warm-source), so the copy reads
storage. Each copy is checked against the manifest: its sha256 while copying
(--verify full, the default; the result's checksum_s says what that cost) or its
size only (--verify size). Writes a staging result (stage_s, stage_bytes,
stage_MBps, checksum_s, os_read_bytes, source_cache, mode, tiers) into --results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from iobench.core.dataref import DatasetRef, locate
from iobench.core.datasets import DATASETS
from iobench.core.formats import FORMATS
from iobench.core.placement import MODES
from iobench.core.world import get_world
from iobench.workflows.stage import (
    SYNC_MODES,
    VERIFY_MODES,
    MiB,
    StageConfig,
    parse_verify,
    run_stage,
)

RANKED = True  # may run as several ranks: interrupts wait for a collective (cli._signals)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help="dataset name (default: the one dataset under --from)")
    p.add_argument("--format", default=None, choices=list(FORMATS),
                   help="on-disk format (default: the one format of the dataset under --from)")
    p.add_argument("--from", dest="source", required=True, metavar="DIR",
                   help="storage root holding <dataset>-<format>/ (e.g. on Lustre), or that "
                        "dataset directory itself")
    p.add_argument("--to", dest="dest", required=True, metavar="DIR2",
                   help="storage root to copy to (e.g. node-local NVMe)")
    p.add_argument("--mode", choices=MODES, default="replicate",
                   help="replicate: a full copy on every node; shard: each node gets only "
                        "the files its ranks read (default: replicate)")
    p.add_argument("--threads", type=int, default=4,
                   help="copy workers per rank: processes, or with 1 a thread of the rank's "
                        "own (default 4)")
    p.add_argument("--buffer-mib", type=int, default=16,
                   help="size of each sequential read/write in MiB (default 16)")
    p.add_argument("--verify", choices=VERIFY_MODES, default=None,
                   help="full: sha256 of every file while copying, checked against the "
                        "manifest (the result gives its seconds, checksum_s); size: sizes only, "
                        "copies then go through copy_file_range in the kernel (default: full)")
    p.add_argument("--no-verify", action="store_true", help="the same as --verify size")
    p.add_argument("--trust-existing", action="store_true",
                   help="skip files of the right size without re-hashing them on resume")
    p.add_argument("--sync", choices=SYNC_MODES, default="fs",
                   help="how a batch of small copies reaches the device before it is renamed: "
                        "fs, one syncfs of the destination per batch (also waits for other "
                        "writers' data there, as sync does); file, an fsync per file "
                        "(default: fs)")
    p.add_argument("--no-fsync", action="store_true",
                   help="do not fsync each file (stage_s then excludes write-back)")
    p.add_argument("--warm-source", action="store_true",
                   help="do not evict the source from the page cache first (the copy may then "
                        "read memory; the result says so)")
    p.add_argument("--evict-cmd", default=None, metavar="CMD",
                   help="shell command that empties what no client can (the source's server "
                        "caches, a remount), run by each node's local rank 0 before each copy; "
                        "without it a source on a shared tier is unverified, not cold")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="N full copies, each from a cold source into a destination emptied of "
                        "the previous one's files; reports median [min-max] (default 1; a "
                        "rerun skips complete files only with 1)")
    p.add_argument("--results", default="iobench-results", metavar="DIR",
                   help="directory for the staging result (default: ./iobench-results)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (on a terminal) or progress lines (off one: a line "
                        "every 60 s, IOBENCH_PROGRESS_S)")


def config_from_args(args: argparse.Namespace) -> tuple[StageConfig, DatasetRef]:
    """The staging config, and the dataset it copies (found once, here)."""
    source = locate(args.source, args.dataset, args.format)
    cfg = StageConfig(dataset=source.dataset, format=source.format, source=Path(args.source),
                      dest=Path(args.dest), mode=args.mode, threads=args.threads,
                      buffer_bytes=args.buffer_mib * MiB,
                      verify=parse_verify(args.verify, args.no_verify),
                      verify_existing=not args.trust_existing, fsync=not args.no_fsync,
                      sync=args.sync,
                      progress=not args.no_progress and sys.stderr.isatty(),
                      log_progress=not args.no_progress and not sys.stderr.isatty(),
                      warm_source=args.warm_source, repeat=args.repeat,
                      evict_cmd=args.evict_cmd)
    return cfg, source


def main(args: argparse.Namespace) -> int:
    from iobench.core import faults
    from iobench.core.errors import IobenchError
    from iobench.core.interrupts import act_now
    from iobench.core.outputs import writable_dir

    faults.at_start()  # tests only: a no-op unless IOBENCH_TEST_FAULT is set
    # the CLI entered interrupts(defer=True) first thing (RANKED): several ranks stop
    # together at a collective; one process at once, from here. Either way SIGTERM, as
    # SIGINT, stops the copy workers and removes their temporary files (exit 143)
    world = get_world()
    if world.size == 1:
        act_now()
    try:
        cfg, source = config_from_args(args)  # bad values fail here, the same on every rank
        source.refuse_inside(args.results, copies=[cfg.dest])  # no result in a dataset
        writable_dir(args.results, "--results")  # before copying anything
        out = run_stage(cfg, world, args.results, source)
    except IobenchError as e:
        if world.rank == 0:
            raise  # every rank raised it (stage_dataset agrees on failures): print it once
        return e.exit_code
    if out.path is not None:
        doc = out.doc
        print(f"staged {doc['dataset']['dataset']}/{doc['dataset']['format']} "
              f"({doc['mode']}) to {doc['to']['root']}: {doc['copied_files']} files copied, "
              f"{doc['skipped_files']} already complete, {_figures(doc)}; {_checks(doc)}; "
              f"{_source(doc)}; result {out.path}")
    return 0


def _figures(doc: dict[str, Any]) -> str:
    """`MB in s (MB/s), OS read MB`; median [min-max] over repetitions when there are several."""
    from iobench.core.spread import fmt_spread

    mb = f"{doc['stage_bytes'] / 1e6:.1f} MB"
    n = doc["repeats"]
    if n > 1:
        sp = doc["spread"]
        text = (f"{mb} in {fmt_spread(sp['stage_s'], '.2f')} s "
                f"({fmt_spread(sp['stage_MBps'], '.1f')} MB/s), median [min-max] of {n} "
                "repetitions")
    else:
        mbps = doc["stage_MBps"]
        text = f"{mb} in {doc['stage_s']:.2f} s" + (f" ({mbps:.1f} MB/s)" if mbps else "")
    reads = doc["os_read_bytes"]
    if reads is None:
        return text + ", OS read n/a"
    text += f", OS read {reads / 1e6:.1f} MB" + (" (least of the repetitions)" if n > 1 else "")
    if doc["skipped_files"] and doc["config"]["verify_existing"]:
        text += " (with re-hashing the files found complete)"
    return text


def _checks(doc: dict[str, Any]) -> str:
    """What verification cost: the copies' sha256 seconds and share of the workers' time."""
    if doc["verify"] == "size":
        return "verified by size only (--verify size)"
    share = doc["checksum_share"]
    return (f"sha256 checked: {doc['checksum_s']:.2f} s of hashing"
            + (f", {share:.0%} of the copy workers' time" if share is not None else ""))


def _source(doc: dict[str, Any]) -> str:
    sc = doc["source_cache"]
    frac = sc["resident_fraction_at_start"]
    res = "residency unknown" if frac is None else f"{frac:.0%} resident"
    # measured as the copy opened each file, right before its read; else by a pass before
    at = " as each file was read" if sc.get("per_file") == "copy" else " at start"
    if sc["mode"] == "warm":
        return f"source WARM (--warm-source: not evicted, {res}{at})"
    if sc["status"] == "warm":
        return f"source NOT COLD: eviction failed, {res}{at}"
    if sc["status"] == "unverified":
        return (f"source cache UNVERIFIED ({sc['fstype']}: server caches not emptied, give "
                f"--evict-cmd; {res} on the client{at})")
    how = " with --evict-cmd" if sc.get("evict_cmd") else ""
    return f"source cold (evicted{how}, {res}{at})"
