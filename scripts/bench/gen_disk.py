"""Array-dataset generation (cosmoflow, cifar10) against fio's buffered write, side by side.

    .venv/bin/python scripts/bench/gen_disk.py [--work DIR] [--jobs 2] [--repeat 3]
        [--formats hdf5,netcdf,lmdb] [--cosmoflow 128] [--cifar10 131072] [--json OUT]
        [--before DIR]

Each repetition runs, interleaved: fio (`--rw=write --bs=16m --numjobs=JOBS
--end_fsync=1`, as many bytes as the largest dataset), then `iobench generate
--jobs JOBS` of every dataset and format into a fresh directory on the same disk.
Prints MB/s medians [min-max] and generate / fio ratios (goal: >= 0.5). `--before DIR`
also runs an older iobench (importable from DIR: a tree with iobench/loaders and
iobench/generators linked in) beside each of the current code's runs, after it in odd
repetitions and before it in even ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gencommon import fio_write, fmt, generate, header, loadavg, median, save

SPF = {"cosmoflow": 16, "cifar10": 16384}  # the datasets' default samples per file


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/iobench-bench-gen-disk"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--formats", default="hdf5,netcdf,lmdb")
    ap.add_argument("--cosmoflow", type=int, default=128, help="samples (16.8 MB each)")
    ap.add_argument("--cifar10", type=int, default=131072, help="samples (3 KB each)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--before", metavar="DIR", help="also run an older iobench from DIR")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    info = header(a.work)
    from iobench.core.datasets import DATASETS

    sizes = {"cosmoflow": a.cosmoflow, "cifar10": a.cifar10}
    total = max(DATASETS[d].sample_nbytes * n for d, n in sizes.items())
    runs = [(d, f) for d in sizes for f in a.formats.split(",") if sizes[d] > 0]
    rows: dict[str, list[float]] = {"fio": []}
    cpu: dict[str, list[float]] = {}
    versions = [("", None)] + ([(" before", a.before)] if a.before else [])
    for d, f in runs:
        for tag, _ in versions:
            rows[f"{d}-{f}{tag}"] = []
    fio_cmd = ""
    for r in range(a.repeat):
        fio = fio_write(a.work / "fio", total, a.jobs)
        fio_cmd = fio["command"]
        rows["fio"].append(fio["MBps"])
        for d, f in runs:
            # ABBA: the run after a large delete pays for fresh pages, so neither version
            # always goes first
            for tag, pp in (versions if r % 2 == 0 else versions[::-1]):
                g = generate(a.work / "gen", d, f, sizes[d], SPF[d], jobs=a.jobs, pythonpath=pp)
                rows[f"{d}-{f}{tag}"].append(g["MBps"])
                cpu.setdefault(f"{d}-{f}{tag}", []).append(g["MB_per_cpu_s"])
        print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rows.items())
              + f" MB/s  (load {loadavg():.2f})")
    print(f"\nfio: {fio_cmd}")
    print("\n| what | MB/s, median [min-max] | / fio, per repetition |")
    print("|---|---:|---:|")
    for k, v in rows.items():
        ratio = "" if k == "fio" else fmt([g / f for g, f in zip(v, rows["fio"], strict=True)],
                                          ".2f")
        print(f"| {k} | {fmt(v)} | {ratio} |")
    print("\n| what | MB per CPU-second (generate and its workers, user + system) |")
    print("|---|---:|")
    for k, v in cpu.items():
        print(f"| {k} | {fmt(v)} |")
    print("\nmedian ratios: " + ", ".join(
        f"{k} {median(v) / median(rows['fio']):.2f}" for k, v in rows.items() if k != "fio"))
    info["load_1min_end"] = loadavg()
    save(a.json, {"info": info, "rates_MBps": rows, "MB_per_cpu_s": cpu, "samples": sizes,
                  "jobs": a.jobs,
                  "fio_command": fio_cmd})
    return 0


if __name__ == "__main__":
    sys.exit(main())
