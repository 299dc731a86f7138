"""The `iobench` command line: one module per subcommand, registered in one table.

Each subcommand module defines `add_arguments(parser)` and `main(args) -> int`;
it parses, builds a config and calls one library function. `main(argv)` is
testable in-process; `run()` is the console-script entry point.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from iobench import __version__
from iobench.core.errors import IobenchError, storage_error
from iobench.core.interrupts import Interrupted, interrupts

# name -> (module, one-line help). Adding a subcommand is one line here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "info": ("iobench.cli.info", "versions, hardware, and the filesystem of a path"),
    "generate": ("iobench.cli.generate", "write a synthetic dataset (HDF5, NetCDF4, LMDB or files) in parallel"),
    "verify": ("iobench.cli.verify", "check a dataset against its manifest (sizes, checksums, opens)"),
    "preflight": ("iobench.cli.preflight", "check every node of a job before a long run (dataset version, space, eviction)"),
    "train": ("iobench.cli.train", "train a real model with a real loader; measure data stall per epoch"),
    "bench-read": ("iobench.cli.bench_read", "pure-read benchmark of loaders x workers x shuffle, cold cache"),
    "stage": ("iobench.cli.stage", "copy a dataset between storage tiers in parallel (replicate or shard)"),
    "checkpoint": ("iobench.cli.checkpoint", "write N checkpoints with torch.distributed.checkpoint, then read them back cold"),
    "probe": ("iobench.cli.probe", "measure a storage tier: bandwidth, IOPS, metadata rates (cold cache)"),
    "compare": ("iobench.cli.compare", "side-by-side table (and plot) of training results"),
    "report": ("iobench.cli.report", "self-contained HTML/Markdown report of a results directory"),
    "sweep": ("iobench.cli.sweep", "run a matrix of runs from a YAML file, then write the report"),
    "emulate-pfs": ("iobench.cli.emulate_pfs", "mount an emulated parallel filesystem (FUSE) over a directory"),
    "datasize": ("iobench.cli.datasize", "the dataset MLPerf Storage requires for a workload on N accelerators"),
    "search": ("iobench.cli.search", "largest accelerator count a storage keeps at AU >= threshold"),
    "diagnose": ("iobench.cli.diagnose", "stage or tune? storage, loader or neither, against the accelerator's demand"),
    "project": ("iobench.cli.project", "PROJECT one node's results to N nodes (queueing model): AU, stall, staging"),
}


# the commands whose module sets `RANKED` (several ranks may run them): known without
# importing the module, so the CLI enters their interrupt handling at its first moment
RANKED_COMMANDS: frozenset[str] = frozenset({"train", "stage", "checkpoint"})


class UsageError(IobenchError):
    """A command line that does not parse."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only` a subcommand's options for that one alone
    (the others listed by name: their options import what they need, torch for `train`,
    which `iobench generate` should not wait for)."""
    parser = _Parser(prog="iobench", description="Measure deep-learning ingest from HPC "
                     "storage: generate datasets, train with real loaders, compare stall time.")
    parser.add_argument("--version", action="version", version=f"iobench {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an unexpected error, print the full traceback (otherwise it "
                             "goes to a file and one line names it)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_) in SUBCOMMANDS.items():
        mod = importlib.import_module(module)
        # each module's docstring as written: its examples keep their lines
        p = sub.add_parser(name, help=help_, description=(mod.__doc__ or help_).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if only is None or only == name:
            mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; return the exit code (0 only on success).

    A user's mistake is one line and exit code 2 (`IobenchError`). Anything
    else is a bug: one line naming the exception and the file its traceback
    was written to, exit code 70, unless `--debug` asks for the traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    command = next((a for a in argv if not a.startswith("-")), None)
    ranked = _ranked(command)  # imports nothing: a Ctrl-C at any moment is one line
    try:
        with interrupts(defer=True) if ranked else contextlib.nullcontext():
            parser = build_parser(command if command in SUBCOMMANDS else None)
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
        return _leave(130, ranked)
    except Interrupted as e:  # SIGINT/SIGTERM where a command turned them into this
        print(f"iobench: interrupted ({e})", file=sys.stderr)
        return _leave(e.exit_code, ranked)
    except Exception as e:  # the last line of defence: a bug, said in one line
        storage = storage_error(e)  # unless the storage failed (a dead mount, a full disk)
        if storage is not None:
            print(f"iobench: error: {storage}", file=sys.stderr)
            return storage.exit_code
        if debug:
            raise
        where = _write_traceback(e)
        first = str(e).splitlines()[0] if str(e) else ""
        print(f"iobench: internal error: {type(e).__name__}: {first[:300]} (a bug in iobench; "
              f"traceback in {where}, or rerun with --debug; please report it)",
              file=sys.stderr)
        return INTERNAL_ERROR


INTERNAL_ERROR = 70  # EX_SOFTWARE


def _ranked(command: str | None) -> bool:
    """A command in RANKED_COMMANDS (its module sets `RANKED`: train, checkpoint, stage) may
    be one of several ranks and carries an interrupt to them at its collectives: from its
    first moment (train's parser imports torch, seconds), an interrupt waits for the ranks'
    first collective, so no rank leaves alone while a peer waits for it at the rendezvous
    (`iobench.core.interrupts`); a single process acts on it as soon as it knows it is
    alone (their `main`)."""
    return command in RANKED_COMMANDS


def _leave(code: int, ranked: bool) -> int:
    """`code`, once an interrupted command's MPI peers have stopped too: the other commands
    have no collective to carry the interrupt, and a signal that reached one rank alone
    (a `kill`, a scheduler's per-task signal) would leave its peers working, then waiting
    for it for ever (`iobench.core.world.leave_after_interrupt`)."""
    if not ranked:
        from iobench.core.world import leave_after_interrupt

        sys.stderr.flush()
        leave_after_interrupt(code)
    return code


def _write_traceback(e: BaseException) -> str:
    """Write the traceback of `e` to a new file; return its path (or why not)."""
    import tempfile
    import traceback

    try:
        fd, path = tempfile.mkstemp(prefix="iobench-traceback-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(f"iobench {__version__}: {' '.join(sys.argv)}\n")
            f.write("".join(traceback.format_exception(type(e), e, e.__traceback__)))
        return path
    except OSError as err:
        return f"(not written: {err.strerror or err})"


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
