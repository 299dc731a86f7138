"""`--workload W --accelerator A` (MLPerf Storage presets, iobench/core/workloads.py) for the CLI."""

from __future__ import annotations

import argparse

from iobench.core.workloads import ACCELERATORS, WORKLOADS, WorkloadRun


def add_workload_arguments(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--workload", default=None, choices=list(WORKLOADS), required=required,
                   help="an MLPerf Storage training workload: sets the dataset, format, sample "
                        "size, batch, emulated compute time and AU threshold (docs/mlperf.md)")
    p.add_argument("--accelerator", default=None, choices=list(ACCELERATORS),
                   required=required,
                   help="with --workload: the accelerator type whose compute time per step is "
                        "emulated")


def workload_of(args: argparse.Namespace, runnable: bool = True) -> WorkloadRun | None:
    """The `--workload`/`--accelerator` pair checked, or None when no workload was given."""
    from iobench.core.errors import ConfigError
    from iobench.core.workloads import resolve

    if args.workload is None:
        if args.accelerator is not None:
            raise ConfigError("--accelerator applies with --workload; add --workload W "
                              f"({', '.join(WORKLOADS)}) or drop --accelerator")
        return None
    return resolve(args.workload, args.accelerator, runnable=runnable)


def clash(flag: str, given: object, preset: object, workload: str) -> None:
    """A ConfigError when a flag given by hand contradicts the workload's preset."""
    from iobench.core.errors import ConfigError

    if given is not None and given != preset:
        raise ConfigError(f"{flag} {given} contradicts --workload {workload} ({flag} "
                          f"{preset}); drop {flag} or --workload")
