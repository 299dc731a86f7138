"""PROJECT one node's measured I/O to N nodes with a queueing model (a projection, not a measurement).

From one node's `iobench train` result and the shared tier's `iobench probe`
result(s) (or the site's figures, given as options and marked so), predict
per node count N: AU and stall per epoch from the tier, staging time to
node-local storage with every node reading at once (replicate and shard)
and its break-even in epochs, and the N where the tier stops keeping up and
which resource limits first. The model's formulas: docs/projection.md; its
assumptions are printed beside the table. Examples:

  iobench project --train res/RUN.json --probe res/probe-X.json
  iobench project --train RUN.json --probe PROBE.json --stage STAGE.json --nodes 1,64,1024
  iobench project --train RUN.json --pfs-read-gbs 400 --pfs-mds-ops 50000 --client-gbs 12
  iobench project --train RUN.json --probe PROBE.json --pfs-iops 2000000
  iobench project --train RUN.json --diagnose res/diagnose-X.json --probe PROBE.json
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from iobench.workflows.project import DEFAULT_NODES, ProjectConfig


def _rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number > 0")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train", required=True, metavar="FILE",
                   help="one node's `iobench train` result (the demand and the measured step)")
    p.add_argument("--probe", action="append", default=None, metavar="FILE",
                   help="an `iobench probe` result of the shared tier (repeatable, probes "
                        "of one tier: the median of each figure is taken, their least and "
                        "greatest bound the [spread])")
    p.add_argument("--stage", default=None, metavar="FILE",
                   help="an `iobench stage` result of the same dataset (staging rate to fit)")
    p.add_argument("--diagnose", default=None, metavar="FILE",
                   help="an `iobench diagnose` result of the same dataset: its storage runs "
                        "(delivery against reader count, cold) fit the per-batch latency "
                        "instead of the training result's step")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="the run's `train --trace` file: drives the simulation with the "
                        "measured per-step compute and fetch times (bursts)")
    p.add_argument("--nodes", default=None, metavar="LIST",
                   help="node counts, e.g. 1,16,256 (default 1,2,4,...,8192,10000)")
    p.add_argument("--pfs-read-gbs", type=_rate, default=None, metavar="GB/s",
                   help="the site's aggregate read bandwidth, given, not measured (default: "
                        "the probe's, one client)")
    p.add_argument("--pfs-mds-ops", type=_rate, default=None, metavar="OPS/s",
                   help="the site's metadata operations per second, given, not measured "
                        "(default: the probe's open+stat+close/s)")
    p.add_argument("--pfs-iops", type=_rate, default=None, metavar="REQ/s",
                   help="the site's random-read requests per second, given, not measured "
                        "(default: the probe's random reads nearest the run's sample size; "
                        "neither: no request-rate limit)")
    p.add_argument("--client-gbs", type=_rate, default=None, metavar="GB/s",
                   help="one client node's read ceiling, given, not measured (default: the "
                        "probe's when --pfs-read-gbs is given, else none apart)")
    p.add_argument("--ops-per-sample", type=float, default=None, metavar="OPS",
                   help="metadata operations per sample read (default: 1 for one file per "
                        "sample, 0 for container formats)")
    p.add_argument("--nodes-per-host", type=int, default=1, metavar="K",
                   help="nodes that share one host: its CPU, client cache and link, and local "
                        "disk (default 1, a cluster; a one-box validation's virtual nodes "
                        "share one)")
    p.add_argument("--step-sync-ms", type=float, default=None, metavar="MS",
                   help="a synchronisation of every rank each step that the measured run did "
                        "not pay (the gradients' all-reduce across nodes; any at all when one "
                        "rank was measured), given, not measured: added to the step beyond "
                        "the measured node count (default: none)")
    p.add_argument("--threshold", type=float, default=0.90, metavar="AU",
                   help="AU below which the tier no longer keeps up (default 0.90, MLPerf "
                        "Storage's)")
    p.add_argument("--simulate-max-nodes", type=int, default=8, metavar="N",
                   help="also simulate (discrete events, seeded) node counts up to N; 0: "
                        "none (default 8)")
    p.add_argument("--simulate-steps", type=int, default=200, metavar="STEPS",
                   help="steps per node in each simulation (default 200)")
    p.add_argument("--seed", type=int, default=0, help="the simulation's seed (default 0)")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="where to draw the projection (PNG; default: beside the result, "
                        "same name)")
    p.add_argument("--no-plot", action="store_true", help="draw no plot")
    p.add_argument("--results", default="iobench-results", metavar="DIR",
                   help="directory for the projection document (default: ./iobench-results)")


def config_from_args(args: argparse.Namespace) -> ProjectConfig:
    return ProjectConfig(
        train=Path(args.train), probes=tuple(Path(p) for p in args.probe or ()),
        stage=Path(args.stage) if args.stage else None,
        diagnose=Path(args.diagnose) if args.diagnose else None,
        trace=Path(args.trace) if args.trace else None,
        nodes=args.nodes if args.nodes is not None else DEFAULT_NODES,
        pfs_read_Bps=args.pfs_read_gbs * 1e9 if args.pfs_read_gbs else None,
        pfs_mds_ops=args.pfs_mds_ops, pfs_iops=args.pfs_iops,
        client_Bps=args.client_gbs * 1e9 if args.client_gbs else None,
        ops_per_sample=args.ops_per_sample, threshold=args.threshold,
        simulate_max_nodes=args.simulate_max_nodes, simulate_steps=args.simulate_steps,
        seed=args.seed, nodes_per_host=args.nodes_per_host,
        step_sync_s=args.step_sync_ms / 1e3 if args.step_sync_ms is not None else None)


def main(args: argparse.Namespace) -> int:
    from iobench.core.outputs import writable_dir, writable_file
    from iobench.core.results import write_document
    from iobench.workflows.project import plot_projection, run_projection, table

    cfg = config_from_args(args)
    writable_dir(args.results, "--results", create=True)
    if args.plot and not args.no_plot:
        writable_file(args.plot, "--plot")
    doc = run_projection(cfg)
    path = write_document(doc.to_dict(), args.results, "projection")
    print(table(doc))
    if not args.no_plot:
        plot = plot_projection(doc, Path(args.plot) if args.plot else path.with_suffix(".png"))
        print(f"plot: {plot}")
    for w in doc.warnings:
        print(f"iobench: WARNING: {w}", file=sys.stderr)
    print(f"result: {path} (a PROJECTION by a model, not a measurement)")
    return 0

