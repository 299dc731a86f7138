#!/usr/bin/env python3
"""iobench's HDF5 loader vs DLIO's PyTorch HDF5 reader on the same files, warm page cache.

For each sample size (3 KB, 147 KB, 16 MiB) the script writes one set of HDF5
files that both read: each file holds the samples as dataset `samples` (what
iobench reads) with a second name `records` (an HDF5 hard link to the same
dataset: what DLIO reads), and `labels`; an iobench manifest lists them. Both
then read the same bytes of the same files with the same ranks, reader
workers (DLIO's read_threads) and batch size, no compute, global sample
shuffling, the page cache warm (every file read once before each run), and
the script prints samples/s of both and their ratio: the median of N
interleaved repetitions (each run: the median of its epochs after the first).

DLIO: `pip install dlio_benchmark` into its own virtual environment and give
its `dlio_benchmark` executable with --dlio (or put it on PATH). Without it,
the DLIO column says so and only iobench runs.

  python scripts/bench/dlio_vs_iobench.py --work /var/tmp/cmp [--dlio PATH]
      [--ranks 1] [--workers 2] [--repeat 3] [--sizes 3k,147k,16m]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# size -> (iobench dataset name in the manifest, sample shape, dtype, label shape, label
# dtype, samples per file, files, batch size). 147 KB is a 224x224x3 uint8 record (DLIO's
# resnet50 record_length_resize): iobench has no such dataset, so its manifest calls it
# cifar10 with that shape, read undecoded (the readers take shapes from the manifest).
#
# Sample counts are modest on purpose: DLIO 2.0.0's reader formats its whole sample index
# map into a debug-log string for every sample it reads (`read_index`), whatever the log
# level, so its per-sample cost grows with the samples per rank (~38 ms per sample at
# 65,536). The table states the counts; the ratio at small sizes depends on them.
SIZES = {
    "3k": ("cifar10", (32, 32, 3), "uint8", (), "int64", 512, 8, 64),
    "147k": ("cifar10", (224, 224, 3), "uint8", (), "int64", 128, 8, 64),
    "16m": ("cosmoflow", (128, 128, 128, 4), "int16", (4,), "float32", 8, 8, 1),
}


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    return f"{med(xs):.4g} [{min(xs):.4g}-{max(xs):.4g}]" if xs else "n/a"


def make_dataset(work: Path, size: str) -> Path:
    """The shared files of one size (reused when present); returns the dataset root."""
    import h5py

    from iobench.core.manifest import FileEntry, Manifest

    name, shape, dtype, lshape, ldtype, per, nfiles, _ = SIZES[size]
    root = work / size / f"{name}-hdf5"
    (root / "valid").mkdir(parents=True, exist_ok=True)  # DLIO lists it even unused
    if (root / "iobench.json").exists():
        return root
    (root / "train").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    entries = []
    for k in range(nfiles):
        rel = f"train/img_{k + 1}_of_{nfiles}.hdf5"
        with h5py.File(root / rel, "w") as h:
            ds = h.create_dataset("samples", (per, *shape), dtype=dtype)
            step = max(1, (64 << 20) // (int(np.prod(shape)) * np.dtype(dtype).itemsize))
            for s in range(0, per, step):
                n = min(step, per - s)
                ds[s:s + n] = rng.integers(0, 120, (n, *shape)).astype(dtype)
            h["records"] = ds  # a hard link: DLIO's name for the same dataset
            h.create_dataset("labels", data=np.zeros((per, *lshape), dtype=ldtype))
        data = (root / rel).read_bytes()
        entries.append(FileEntry(rel, len(data), hashlib.sha256(data).hexdigest(), k * per,
                                 per, "data"))
    Manifest(dataset=name, format="hdf5", num_samples=per * nfiles,
             num_classes=10 if name == "cifar10" else 0,
             sample={"kind": "array", "shape": list(shape), "dtype": dtype},
             label={"shape": list(lshape), "dtype": ldtype},
             layout={"samples_per_file": per, "compression": "none", "chunked": False},
             files=tuple(entries), seed=0, iobench_version="dlio_vs_iobench",
             created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())).write(root)
    return root


def warm(root: Path) -> None:
    for p in sorted(root.glob("train/*.hdf5")):
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass


def mpi(ranks: int) -> list[str]:
    if ranks == 1:
        return []
    exe = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    return [exe, "-n", str(ranks)]


def run_iobench(root: Path, size: str, a: argparse.Namespace) -> float:
    name, *_, batch = SIZES[size]
    with tempfile.TemporaryDirectory() as res:
        cmd = [*mpi(a.ranks), sys.executable, "-m", "iobench", "train", "--loader", "hdf5",
               "--dataset", name, "--model", "none", "--no-decode", "--warm-cache",
               "--storage", str(root.parent), "--batch-size", str(batch), "--workers",
               str(a.workers), "--epochs", str(a.epochs), "--shuffle", "global",
               "--results", res]
        # not from a checkout: `python -m` puts the working directory first on sys.path
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=res)
        if p.returncode != 0:
            raise SystemExit(f"iobench failed: {' '.join(cmd)}\n{p.stdout[-3000:]}"
                             f"{p.stderr[-3000:]}")
        doc = json.loads(Path(glob.glob(f"{res}/*.json")[0]).read_text())
    return med([e["summary"]["samples_per_s"] for e in doc["epochs"][1:]])


def run_dlio(root: Path, size: str, a: argparse.Namespace) -> float:
    name, shape, dtype, _, _, per, nfiles, batch = SIZES[size]
    record = int(np.prod(shape)) * np.dtype(dtype).itemsize
    with tempfile.TemporaryDirectory() as tmp:
        from dlio_workloads import write_yaml  # this folder is the script's sys.path[0]

        cfg = Path(tmp) / "cfg"
        write_yaml(cfg, "iobench_cmp", epochs=a.epochs, generate=False, train=True,
                   data=root, fmt="hdf5", nfiles=nfiles, per=per, record=record,
                   batch=batch, workers=a.workers, compute=0, au=0.9)
        out = Path(tmp) / "out"
        cmd = [*mpi(a.ranks), a.dlio, "--config-dir", str(cfg), "workload=iobench_cmp",
               f"++workload.output.folder={out}", f"hydra.run.dir={out}"]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        summary = out / "summary.json"
        if p.returncode != 0 or not summary.exists():
            raise SystemExit(f"DLIO failed: {' '.join(cmd)}\n{p.stdout[-3000:]}"
                             f"{p.stderr[-3000:]}")
        per_epoch = json.loads(summary.read_text())["metric"][
            "train_throughput_samples_per_second"]
    return med(per_epoch[1:] or per_epoch)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True, help="directory for the shared files (ext4)")
    p.add_argument("--dlio", default=shutil.which("dlio_benchmark"),
                   help="the dlio_benchmark executable (default: on PATH)")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sizes", default="3k,147k,16m")
    a = p.parse_args()
    sizes = a.sizes.split(",")
    for s in sizes:
        if s not in SIZES:
            raise SystemExit(f"--sizes: unknown size {s!r}; choose from {', '.join(SIZES)}")
    if a.dlio is None or not Path(a.dlio).exists():
        print("DLIO is not installed (no dlio_benchmark executable; give --dlio PATH): "
              "measuring iobench only\n")
        a.dlio = None
    load = os.getloadavg()
    print(f"date: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}  host: "
          f"{os.uname().nodename}  cores: {os.cpu_count()}  load avg: {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}  ranks: {a.ranks}  workers: {a.workers}  epochs: "
          f"{a.epochs}  repetitions: {a.repeat}\n")
    roots = {s: make_dataset(Path(a.work), s) for s in sizes}
    res: dict[str, dict[str, list[float]]] = {s: {"dlio": [], "iobench": [], "ratio": []}
                                              for s in sizes}
    for _ in range(a.repeat):
        for s in sizes:
            warm(roots[s])
            io = run_iobench(roots[s], s, a)
            res[s]["iobench"].append(io)
            if a.dlio:
                warm(roots[s])
                d = run_dlio(roots[s], s, a)
                res[s]["dlio"].append(d)
                res[s]["ratio"].append(io / d)
    print("| sample | samples | batch | DLIO samples/s | iobench samples/s | iobench MB/s "
          "| iobench / DLIO |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        _, shape, dtype, _, _, per, nfiles, batch = SIZES[s]
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mbs = [x * nbytes / 1e6 for x in res[s]["iobench"]]
        dl = spread(res[s]["dlio"]) if a.dlio else "not installed"
        print(f"| {nbytes:,} B | {per * nfiles} | {batch} | {dl} | {spread(res[s]['iobench'])} | {spread(mbs)} "
              f"| {spread(res[s]['ratio']) if a.dlio else 'n/a'} |")
    print("\nmedian [min-max] of interleaved repetitions; ratio within each; target "
          "(issue 20): iobench >= 1.2 x DLIO at every size.")


if __name__ == "__main__":
    main()
