"""Compare `iobench train` results side by side: stall, stall %, AU, samples/s, MB/s per epoch.

Each run's ratio is to the first run given; runs with `--repeat N` show
median [min-max], and differences within the spread are marked n.s. A staged
run (`--stage-to`) is paired with the in-place run of its source for the
break-even of staging. RESULT may be a result file or a directory of them.
`--plot FILE.png` draws stall time per epoch grouped by run.
"""

from __future__ import annotations

import argparse
from typing import Any

from iobench.core.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", metavar="RESULT",
                   help="result .json files or directories of them, searched with their "
                        "sub-directories (the first run is the baseline); `iobench stage` "
                        "results among them give the break-even of staging, `iobench "
                        "checkpoint` results a table of their own, other "
                        "documents (probe, sweep, bench-read) are skipped with a note")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="also draw stall time per epoch, grouped by run, into this PNG")
    p.add_argument("--accuracy-plot", default=None, metavar="FILE.png",
                   help="also draw training accuracy (loss for regression) per epoch, per run")


def _load(paths: list[str]) -> Any:
    """compare.load_all, or nothing measured where the paths hold projections only (then
    shown apart, labelled, by projection_view.print_compare)."""
    from iobench.core.result_types import ResultError
    from iobench.workflows import compare
    from iobench.workflows.projection_view import find_projections

    try:
        return compare.load_all(paths)
    except ResultError:
        if not find_projections(paths)[0]:
            raise
        return compare.Loaded([], [], [], [])


def main(args: argparse.Namespace) -> int:
    from iobench.core.outputs import writable_file
    from iobench.workflows import compare

    for opt, value in (("--plot", args.plot), ("--accuracy-plot", args.accuracy_plot)):
        if value is not None and not value.lower().endswith(".png"):
            raise ConfigError(f"{opt} {value}: give a file name ending in .png")
        if value is not None:
            writable_file(value, opt)  # before reading anything
    loaded = _load(args.results)
    docs = loaded.runs
    for path, why in loaded.skipped:
        print(f"compare: skipped {path}: {why}")
    if docs:
        compare.render_table(docs, stages=loaded.stages)
    if loaded.checkpoints:  # `iobench checkpoint` results, in a table of their own
        compare.render_checkpoints(loaded.checkpoints)
    from iobench.workflows.projection_view import print_compare

    print_compare(args.results)  # projections apart, labelled "projection, not measured"
    if (args.plot or args.accuracy_plot) and not docs:
        raise ConfigError("--plot and --accuracy-plot draw training runs; none was given")
    if args.plot:
        path = compare.plot_stall(docs, args.plot)
        print(f"plot: {path}")
    if args.accuracy_plot:
        path = compare.plot_training(docs, args.accuracy_plot)
        print(f"accuracy plot: {path}")
    return 0
