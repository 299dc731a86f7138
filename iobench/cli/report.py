"""Write a self-contained report of a results directory (and its sub-directories): the answer
first (each run's verdict, which tier keeps up, the staging break-even, what to do), then the
environment, probe figures per tier, runs per dataset (with the ratio to the tier's probe
limit), staging cost with break-even epochs, and PNG plots (embedded in HTML; written next to
a .md file)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="RESULTS_DIR",
                   help="directory of iobench result files (train, stage, probe, sweep), "
                        "searched with its sub-directories")
    p.add_argument("--out", default="report.html",
                   help="report file: .html (self-contained) or .md (PNGs beside it); "
                        "default report.html")
    p.add_argument("--title", default=None, help="report title")


def main(args: argparse.Namespace) -> int:
    from iobench.core.outputs import writable_file
    from iobench.workflows.report import write_report

    writable_file(args.out, "--out")
    path = write_report(args.results, args.out, args.title)
    print(f"report: {path}")
    return 0
