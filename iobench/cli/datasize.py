"""Print the dataset MLPerf Storage requires for a workload on N accelerators: samples, files
and bytes, max(500 x batch x N, hosts x host memory x 5 / sample bytes)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from iobench.cli._workload import add_workload_arguments

    add_workload_arguments(p, required=True)
    p.add_argument("--accelerators", type=int, required=True, metavar="N",
                   help="emulated accelerators (ranks), over all hosts")
    p.add_argument("--hosts", type=int, default=0, metavar="H",
                   help="client hosts (for the 5x host memory rule; default 0: not applied)")
    p.add_argument("--host-memory-gb", type=float, default=0.0, metavar="G",
                   help="memory of each client host in GiB (default 0)")


def main(args: argparse.Namespace) -> int:
    from iobench.cli._workload import workload_of
    from iobench.core.errors import ConfigError
    from iobench.core.workloads import parse_accelerators, parse_host_memory

    run = workload_of(args, runnable=False)
    assert run is not None  # --workload is required
    parse_accelerators(args.accelerators)
    parse_host_memory(args.hosts, args.host_memory_gb)
    if (args.hosts > 0) != (args.host_memory_gb > 0):
        raise ConfigError("--hosts and --host-memory-gb go together: give both (or neither)")
    w = run.workload
    samples = run.required_samples(args.accelerators, args.hosts, args.host_memory_gb)
    files = run.required_files(samples)
    nbytes = samples * w.sample_bytes
    steps = 500 * run.batch * args.accelerators
    rule = "500 steps x batch x accelerators" if samples == steps else \
        f"5 x {args.hosts} host(s) x {args.host_memory_gb:,.10g} GiB"
    print(f"{w.name} on {args.accelerators} x {run.accelerator}: {samples:,} samples in "
          f"{files:,} files, {nbytes / 1e9:,.1f} GB ({nbytes / 2**30:,.1f} GiB) of "
          f"{w.sample_bytes:,} B samples; set by {rule}")
    if w.dataset is not None:
        print(f"generate it: iobench generate --workload {w.name} --accelerator "
              f"{run.accelerator} --samples {samples} --storage DIR")
    return 0
