"""Copy a dataset between storage tiers in parallel (replicate or shard), checksummed and resumable.

Under `mpiexec`, every node receives the files its ranks will read (all of
them with `--mode replicate`; with `--mode shard` only its ranks' share, and
training from the copy then shuffles within each rank's files). Writes a
staging result (stage_s, stage_bytes, stage_MBps, mode, tiers) into --results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from iobench.datasets import DATASETS, FORMATS
from iobench.stage import MODES, MiB, StageConfig, stage_dataset, write_result
from iobench.world import get_world


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, choices=list(DATASETS), help="dataset name")
    p.add_argument("--format", required=True, choices=list(FORMATS), help="on-disk format")
    p.add_argument("--from", dest="source", required=True, metavar="DIR",
                   help="storage root holding <dataset>-<format>/ (e.g. on Lustre)")
    p.add_argument("--to", dest="dest", required=True, metavar="DIR2",
                   help="storage root to copy to (e.g. node-local NVMe)")
    p.add_argument("--mode", choices=MODES, default="replicate",
                   help="replicate: a full copy on every node; shard: each node gets only "
                        "the files its ranks read (default: replicate)")
    p.add_argument("--threads", type=int, default=4, help="copy threads per rank (default 4)")
    p.add_argument("--buffer-mib", type=int, default=16,
                   help="size of each sequential read/write in MiB (default 16)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip sha256 (then copies go through copy_file_range in the kernel)")
    p.add_argument("--trust-existing", action="store_true",
                   help="skip files of the right size without re-hashing them on resume")
    p.add_argument("--no-fsync", action="store_true",
                   help="do not fsync each file (stage_s then excludes write-back)")
    p.add_argument("--results", default="iobench-results", metavar="DIR",
                   help="directory for the staging result (default: ./iobench-results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> StageConfig:
    return StageConfig(dataset=args.dataset, format=args.format, source=Path(args.source),
                       dest=Path(args.dest), mode=args.mode, threads=args.threads,
                       buffer_bytes=args.buffer_mib * MiB, verify=not args.no_verify,
                       verify_existing=not args.trust_existing, fsync=not args.no_fsync,
                       progress=not args.no_progress and sys.stderr.isatty())


def main(args: argparse.Namespace) -> int:
    from iobench.errors import IobenchError

    cfg = config_from_args(args)
    world = get_world()
    torchrun = world.launcher == "torchrun" and world.size > 1
    if torchrun:  # collectives go through torch.distributed there (gloo: CPU only)
        from iobench import distributed

        distributed.init_process_group(world, False)
    try:
        doc = stage_dataset(cfg, world)
    except IobenchError as e:
        if world.rank == 0:
            raise  # every rank raised it (stage_dataset agrees on failures): print it once
        return e.exit_code
    finally:
        if torchrun:
            distributed.destroy_process_group()
    if world.rank == 0:
        path = write_result(doc, args.results, "stage")
        mbps = doc["stage_MBps"]
        print(f"staged {doc['dataset']['dataset']}/{doc['dataset']['format']} "
              f"({doc['mode']}) to {doc['to']['root']}: {doc['copied_files']} files copied, "
              f"{doc['skipped_files']} already complete, {doc['stage_bytes'] / 1e6:.1f} MB in "
              f"{doc['stage_s']:.2f} s" + (f" ({mbps:.1f} MB/s)" if mbps else "")
              + f"; result {path}")
    return 0
