"""What `iobench train --trace` costs in throughput (issue 28 item 6): the same job with and without.

    .venv/bin/python scripts/bench/trace_cost.py [--samples 32768] [--batch 32] [--epochs 2]
        [--workers 1] [--runs 3] [--work DIR] [--json OUT]

Generates one cifar10 HDF5 dataset under --work (kept for the next call), then runs
`iobench train --loader hdf5 --model none --warm-cache` on it, without and with
`--trace FILE`, alternately (plain, traced, plain, ...), --runs times each. Pure ingest
from a warm cache makes a step as short as it gets here (no compute, no disk), so the
trace's per-step cost is the largest share of a step it can be. Each run's throughput is
its result's samples over its summed epoch walls (the figure the result reports); the
medians of the two kinds (with their min-max) and their ratio (traced / plain) are
printed, with each run's whole process time and CPU time (both include writing the trace
at the end; CPU time, less sensitive to other jobs on the machine, is compared too). Last, the trace's own
work per step (one `StepClocks.add`, and its share of `epoch_part`) is timed in-process
and set against the plain median step: on a shared machine the ratio of whole runs
varies far more than that.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _iobench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iobench", *argv], capture_output=True,
                          text=True, check=False)


def _dataset(work: Path, samples: int) -> Path:
    storage = work / "storage"
    if not (storage / "cifar10-hdf5" / "iobench.json").exists():
        out = _iobench("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples",
                       str(samples), "--storage", str(storage))
        if out.returncode:
            sys.exit(f"generate failed: {out.stderr[-2000:]}")
    return storage


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _one(storage: Path, args: argparse.Namespace, results: Path,
         trace: Path | None) -> dict[str, Any]:
    """One run: its samples/s (result), the process's seconds and CPU seconds (its loader
    workers' included: they are its children, reaped before it ends)."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    out = _iobench("train", "--loader", "hdf5", "--storage", str(storage), "--model", "none",
                   "--warm-cache", "--epochs", str(args.epochs), "--batch-size",
                   str(args.batch), "--workers", str(args.workers), "--results", str(results),
                   *(("--trace", str(trace)) if trace else ()))
    elapsed = time.perf_counter() - t0
    cpu = _children_cpu() - cpu0
    if out.returncode:
        sys.exit(f"train failed: {out.stderr[-2000:]}")
    [path] = sorted(results.glob("*.json"))
    doc = json.loads(path.read_text())
    path.unlink()  # the next run's result is then the only one
    s = doc["summary"]
    steps = sum(e["summary"]["steps"] for e in doc["epochs"])
    return {"traced": trace is not None, "samples_per_s": s["samples"] / s["wall_s"],
            "steps": steps, "process_s": elapsed, "cpu_s": cpu,
            "trace_bytes": trace.stat().st_size if trace else None}


def bookkeeping_ns(steps: int = 20000) -> float:
    """The trace's own work per step, timed in this process: one `StepClocks.add` a step,
    then the epoch's `epoch_part` (what a traced run adds to the loop), in ns per step."""
    import time as t

    from iobench.core.metrics import EpochClock
    from iobench.core.trace import StepClocks, epoch_part

    clock = EpochClock()
    clock.start()
    clock.wait_ns, clock.compute_ns = [1000] * steps, [2000] * steps
    timing = (1, 2, 3, 0)
    t0 = t.perf_counter_ns()
    rec = StepClocks()
    for i in range(steps):
        rec.add((i, 0, timing))
    epoch_part(0, "host", clock, rec)
    return (t.perf_counter_ns() - t0) / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=32768)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", type=Path, default=None, help="default: a new temporary folder")
    p.add_argument("--json", type=Path, default=None, help="also write every run here")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="iobench-trace-cost-"))
    storage = _dataset(work, args.samples)
    runs = []
    for i in range(args.runs):
        for traced in (False, True):
            r = _one(storage, args, work / "results", work / "run.trace.json" if traced else None)
            runs.append(r)
            print(f"run {i + 1} {'traced' if traced else 'plain '}: "
                  f"{r['samples_per_s']:.0f} samples/s over {r['steps']} steps, process "
                  f"{r['process_s']:.1f} s, CPU {r['cpu_s']:.1f} s"
                  + (f", trace {r['trace_bytes'] / 1e6:.1f} MB" if traced else ""), flush=True)
    med = {k: statistics.median(r["samples_per_s"] for r in runs if r["traced"] == k)
           for k in (False, True)}
    ratio = med[True] / med[False]
    spread = {k: (min(r["samples_per_s"] for r in runs if r["traced"] == k),
                  max(r["samples_per_s"] for r in runs if r["traced"] == k)) for k in (False, True)}
    cpu = {k: statistics.median(r["cpu_s"] for r in runs if r["traced"] == k)
           for k in (False, True)}
    print(f"median samples/s: plain {med[False]:.0f} [{spread[False][0]:.0f}-"
          f"{spread[False][1]:.0f}], traced {med[True]:.0f} [{spread[True][0]:.0f}-"
          f"{spread[True][1]:.0f}]; traced / plain = {ratio:.3f} ({(1 - ratio):+.1%} cost)")
    print(f"median CPU s per run (process and loader workers): plain {cpu[False]:.2f}, traced "
          f"{cpu[True]:.2f}; traced / plain = {cpu[True] / cpu[False]:.3f}")
    per_step = bookkeeping_ns()
    step_ns = 1e9 * args.batch / med[False]
    print(f"the trace's bookkeeping: {per_step:.0f} ns per step, {per_step / step_ns:.3%} of "
          f"a plain step ({step_ns / 1e6:.2f} ms at the plain median)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "ratio": ratio,
                                         "cpu_ratio": cpu[True] / cpu[False],
                                         "bookkeeping_ns_per_step": per_step}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
