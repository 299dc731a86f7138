"""Run a matrix of training runs from a YAML file (datasets x formats/loaders x storage tiers x
workers x batch sizes x shuffle, optional staging), skipping runs already done, then write the
report. See scripts/sweeps/laptop.yaml for every key."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="results directory (default: the file's `results`)")
    p.add_argument("--report", default=None, metavar="FILE",
                   help="report file, .html or .md (default: the sweep file's `report`, "
                        "which is relative to the results directory)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the runs (and which are already done) without running them")
    p.add_argument("--no-report", action="store_true", help="do not write the report")
    from iobench.cli._workload import add_workload_arguments

    add_workload_arguments(p)


def _apply_workload(cfg: Any, args: argparse.Namespace) -> Any:
    """`--workload W --accelerator A`: every run reads W's dataset, format and batch with W's
    emulated compute and AU threshold; the file's tiers, workers, shuffle, epochs and ranks
    stay (samples too, when the file names the same dataset)."""
    from iobench.cli._workload import workload_of
    from iobench.workflows.sweep import DatasetCfg

    run = workload_of(args)
    if run is None:
        return cfg
    w = run.workload
    samples = next((d.samples for d in cfg.datasets if d.name == w.dataset), None)
    return replace(cfg, datasets=(DatasetCfg(str(w.dataset), samples, w.samples_per_file),),
                   formats=(w.format,), loaders=(w.loader,), batch_size=(run.batch,),
                   compute_time=run.compute_s, decode=False,
                   train_args=(*cfg.train_args, "--au-threshold", str(w.au_threshold)))


def main(args: argparse.Namespace) -> int:
    from iobench.core.errors import ConfigError
    from iobench.core.world import get_world
    from iobench.workflows.sweep import load_sweep, run_sweep

    if get_world().size > 1:
        raise ConfigError("run `iobench sweep` as one process; it launches each run itself "
                          "(under mpiexec when the sweep file sets ranks > 1)")
    cfg = load_sweep(args.sweep)
    cfg = _apply_workload(cfg, args)
    if args.results:
        cfg = replace(cfg, results=args.results)
    if args.report:  # given on the command line: relative to the current directory
        cfg = replace(cfg, report=str(Path(args.report).absolute()))
    if not args.dry_run:  # every output place, before hours of runs
        from iobench.core.outputs import writable_dir, writable_file

        writable_dir(cfg.results, "results")
        if cfg.report and not args.no_report:
            writable_file(Path(cfg.results) / cfg.report, "report")
    record = run_sweep(cfg, dry_run=args.dry_run, write_report=not args.no_report,
                       log=lambda m: print(m, flush=True))
    if args.dry_run:
        return 0
    counts = record["counts"]
    failed = [r for r in record["runs"] if r["status"] == "failed"]
    print(f"sweep {cfg.name}: {counts['done']} run, {counts['skipped']} already done, "
          f"{counts['failed']} failed")
    if failed:
        print(f"iobench: {len(failed)} step(s) of the sweep failed; each is listed in the sweep "
              "record and the report, with its log", file=sys.stderr)
        return 1
    return 0
