"""The `iobench` command line: one module per subcommand, registered in one table.

Each subcommand module defines `add_arguments(parser)` and `main(args) -> int`;
it parses, builds a config and calls one library function. `main(argv)` is
testable in-process; `run()` is the console-script entry point.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from iobench import __version__
from iobench.errors import IobenchError

# name -> (module, one-line help). Adding a subcommand is one line here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "info": ("iobench.cli.info", "versions, hardware, and the filesystem of a path"),
    "generate": ("iobench.cli.generate", "write a synthetic dataset (HDF5, NetCDF4, LMDB or files) in parallel"),
    "verify": ("iobench.cli.verify", "check a dataset against its manifest (sizes, checksums, opens)"),
    "train": ("iobench.cli.train", "train a real model with a real loader; measure data stall per epoch"),
    "bench-read": ("iobench.cli.bench_read", "pure-read benchmark of loaders x workers x shuffle, cold cache"),
    "stage": ("iobench.cli.stage", "copy a dataset between storage tiers in parallel (replicate or shard)"),
    "probe": ("iobench.cli.probe", "measure a storage tier: bandwidth, IOPS, metadata rates (cold cache)"),
    "compare": ("iobench.cli.compare", "side-by-side table (and plot) of training results"),
    "report": ("iobench.cli.report", "self-contained HTML/Markdown report of a results directory"),
    "sweep": ("iobench.cli.sweep", "run a matrix of runs from a YAML file, then write the report"),
    "emulate-pfs": ("iobench.cli.emulate_pfs", "mount an emulated parallel filesystem (FUSE) over a directory"),
}


class UsageError(IobenchError):
    """A command line that does not parse."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="iobench", description="Measure deep-learning ingest from HPC "
                     "storage: generate datasets, train with real loaders, compare stall time.")
    parser.add_argument("--version", action="version", version=f"iobench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_) in SUBCOMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_, description=(mod.__doc__ or help_).strip())
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; return the exit code (0 only on success)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return int(args._module.main(args) or 0)
    except IobenchError as e:
        print(f"iobench: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("iobench: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
