"""Check, on every node of the job, what a long run needs, and fail in seconds naming the node.

The dataset under --storage is there and its manifest is the same file on every
node, a spot check of its files has the manifest's sizes, the --stage-to target
has room for the copy, eviction empties the page cache, and every node runs the
same number of ranks. Launch it as the run will be launched (`srun`, `mpiexec`):
each node's local rank 0 checks its node. Exit 0 when all pass, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from iobench.core.datasets import DATASETS
    from iobench.core.formats import FORMATS
    from iobench.core.placement import MODES

    p.add_argument("--storage", required=True, metavar="DIR",
                   help="directory holding <dataset>-<format>/ (or a dataset root)")
    p.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help="which dataset under --storage (default: the one there)")
    p.add_argument("--format", default=None, choices=list(FORMATS),
                   help="which format under --storage (default: the one there)")
    p.add_argument("--stage-to", default=None, metavar="DIR2",
                   help="check that each node's DIR2 has room for the copy ({node} and {host} "
                        "as in `iobench stage --to`)")
    p.add_argument("--stage-mode", default="replicate", choices=MODES,
                   help="with --stage-to: a full copy per node, or each node its ranks' files "
                        "(default: replicate)")
    p.add_argument("--no-eviction", action="store_true",
                   help="skip the eviction check (it reads up to 8 MB of one file per node)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")


def main(args: argparse.Namespace) -> int:
    from iobench.core.world import get_world
    from iobench.workflows.preflight import PreflightConfig, lines, preflight

    cfg = PreflightConfig(storage=args.storage, dataset=args.dataset, format=args.format,
                          stage_to=args.stage_to, stage_mode=args.stage_mode,
                          eviction=not args.no_eviction)
    world = get_world()
    report = preflight(cfg, world)
    if world.is_root:
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            for line in lines(report):
                print(line, file=sys.stdout if report["ok"] else sys.stderr, flush=True)
    return 0 if report["ok"] else 1
