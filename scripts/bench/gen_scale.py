"""Scale-out generation: `mpiexec -n N iobench generate` rate for N = 1, 2, 4, next to fio.

    .venv/bin/python scripts/bench/gen_scale.py [--work DIR] [--ranks 1,2,4] [--repeat 3]
        [--json OUT]   # then: scripts/bench/plot_gen_scale.py OUT

Each repetition runs, interleaved over N: fio's buffered sequential write with
N jobs and a final fsync (the disk's limit for N writers), then `mpiexec -n N
iobench generate` of cosmoflow, cifar10 and imagenet (HDF5, enough files for
every rank). Ranks beyond the machine's cores are oversubscribed, which the
output says. Measuring only: the plot is a separate script.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gencommon import fio_write, fmt, generate, header, loadavg, median, save

# dataset -> (samples, samples per file): at least 8 files, so 4 ranks get 2 each
RUNS = {"cosmoflow": (96, 8), "cifar10": (131072, 8192), "imagenet": (768, 48)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/iobench-bench-gen-scale"))
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--datasets", default=",".join(RUNS))
    ap.add_argument("--json", type=Path, default=Path("/var/tmp/iobench-bench-gen-scale.json"))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    info = header(a.work)
    cores = os.cpu_count() or 1
    ranks = [int(n) for n in a.ranks.split(",")]
    datasets = a.datasets.split(",")
    for n in ranks:
        if n > cores:
            print(f"note: {n} ranks on {cores} cores are oversubscribed")
    from iobench.core.datasets import DATASETS

    fio_bytes = DATASETS["cosmoflow"].sample_nbytes * RUNS["cosmoflow"][0]
    figures: dict[str, dict[str, dict[str, list[float]]]] = {
        "fio": {str(n): {"MBps": []} for n in ranks},
        **{d: {str(n): {"MBps": [], "samples_per_s": []} for n in ranks} for d in datasets}}
    fio_cmds = {}
    for r in range(a.repeat):
        for n in ranks:
            fio = fio_write(a.work / "fio", fio_bytes, n)
            fio_cmds[n] = fio["command"]
            figures["fio"][str(n)]["MBps"].append(fio["MBps"])
            line = [f"N={n}: fio {fio['MBps']:.0f} MB/s"]
            for d in datasets:
                samples, spf = RUNS[d]
                g = generate(a.work / "gen", d, "hdf5", samples, spf, ranks=n)
                figures[d][str(n)]["MBps"].append(g["MBps"])
                figures[d][str(n)]["samples_per_s"].append(g["samples_per_s"])
                line.append(f"{d} {g['MBps']:.0f} MB/s ({g['samples_per_s']:.0f} samples/s)")
            print(f"repeat {r + 1}, " + ", ".join(line) + f"  (load {loadavg():.2f})")
    print("\ncommands:")
    for n in ranks:
        print(f"  N={n}: {fio_cmds[n]}")
    for d in datasets:
        s, spf = RUNS[d]
        print(f"  mpiexec -n N python -m iobench generate --dataset {d} --format hdf5 "
              f"--samples {s} --samples-per-file {spf} --storage {a.work / 'gen'}")
    print("\n| N | fio MB/s | " + " | ".join(f"{d} MB/s | {d} samples/s" for d in datasets)
          + " |")
    print("|---:|---:|" + "---:|---:|" * len(datasets))
    for n in ranks:
        cells = [fmt(figures["fio"][str(n)]["MBps"])]
        for d in datasets:
            cells += [fmt(figures[d][str(n)]["MBps"]), fmt(figures[d][str(n)]["samples_per_s"])]
        over = " (oversubscribed)" if n > cores else ""
        print(f"| {n}{over} | " + " | ".join(cells) + " |")
    base = ranks[0]
    ups = []
    for d in datasets:
        ref = median(figures[d][str(base)]["MBps"])
        ups.append(f"{d} " + ", ".join(
            f"N={n} {median(figures[d][str(n)]['MBps']) / ref:.2f}x" for n in ranks))
    print(f"\nspeed-up over N={base} (medians): " + "; ".join(ups))
    info["load_1min_end"] = loadavg()
    save(a.json, {"info": info, "cores": cores, "ranks": ranks, "runs": RUNS,
                  "figures": figures, "fio_commands": {str(k): v for k, v in fio_cmds.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
