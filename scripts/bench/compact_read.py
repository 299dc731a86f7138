#!/usr/bin/env python3
"""What reading a compact (version 2) manifest costs against the JSON list, over the same files.

    .venv/bin/python scripts/bench/compact_read.py --storage DIR [--formats files,npz]
        [--workers 0,2] [--cache warm,cold] [--repeat 3] [--epochs 2] [--steps 50]
        [--cpu-batches 100] [--before DIR]

STORAGE holds `cifar10-<fmt>/` datasets generated above the compact threshold (e.g.
`iobench generate --dataset cifar10 --format files --samples 80000`: one file per sample,
so their manifests are compact). For each, a JSON twin is made once under
STORAGE/json-twin/: every file hard-linked (the same inodes, so the same data and the same
page-cache state), the manifest rewritten as the JSON list (`Manifest.write(form="json")`)
and no side tables. Then, interleaved, --repeat times:

  cpu    in one process, no workers, warm: samples per CPU-second (user + system) of
         the real loader over --cpu-batches batches after 10 of warm-up (what the
         table's reads cost per sample, least sensitive to other jobs on the machine);
  train  `iobench train --model none --max-steps --steps` per workers x cache:
         samples/s, median of its epochs (cold: evicted before each, iobench's default).

Each row prints compact and JSON medians [min-max] and the compact / JSON ratio (taken
within each repetition, then its median [min-max]); "n.s." where the ratio's range
holds 1. `--before DIR` adds a third run to each, the compact form read by the iobench
in DIR (e.g. `git archive` of an older commit, with `iobench/loaders` and
`iobench/generators` linked to its `loaders/` and `generators/`), and its ratio.
`--rows NPY` instead times `NpyRows` reading batches of random rows of a big table (the
path a 10M-sample manifest's tables take), this iobench vs --before.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORMS = ("compact", "json")


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    return f"{med(xs):.4g} [{min(xs):.4g}-{max(xs):.4g}]" if xs else "n/a"


def ratio_cell(xs: list[float]) -> str:
    ns = " n.s." if xs and min(xs) <= 1 <= max(xs) else ""
    return f"{med(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]{ns}" if xs else "n/a"


def json_twin(storage: Path, fmt: str) -> Path:
    """STORAGE/json-twin/cifar10-<fmt>: the same files (hard links), a JSON-list manifest."""
    from iobench.core.manifest import MANIFEST_NAME, TABLE_DIR, Manifest

    src = storage / f"cifar10-{fmt}"
    dst = storage / "json-twin" / f"cifar10-{fmt}"
    if (dst / MANIFEST_NAME).is_file():
        return dst
    m = Manifest.load(src)
    if m.compact is None:
        raise SystemExit(f"{src} has a JSON-list manifest: generate more samples than the "
                         "compact threshold (65,536 files)")
    shutil.rmtree(dst, ignore_errors=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(src), str(dst)], check=True)
    (dst / MANIFEST_NAME).unlink()  # a link to the compact one: write a new file instead
    shutil.rmtree(dst / TABLE_DIR)
    m.write(dst, form="json")
    assert Manifest.load(dst).compact is None
    return dst


def root_of(storage: Path, fmt: str, form: str) -> Path:
    return storage / f"cifar10-{fmt}" if form == "compact" else storage / "json-twin" / \
        f"cifar10-{fmt}"


def _cpu_one(root: str, fmt: str, batches: int, batch: int) -> None:
    """(subprocess) samples per CPU-second, no workers, warm: prints JSON."""
    import itertools

    from iobench.loaders import LoaderConfig, make_loader

    c = LoaderConfig(batch_size=batch, workers=0, decode=False, seed=0, shuffle="global")
    with make_loader(fmt, Path(root), c) as ld:
        ld.start()
        sum(len(b.indices) for b in itertools.islice(ld.epoch(0), 10))  # warm-up: first use
        t0, w0 = time.process_time(), time.perf_counter()
        n = sum(len(b.indices) for b in itertools.islice(ld.epoch(1), batches))
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    print(json.dumps({"per_cpu_s": n / cpu, "per_s": n / wall, "us_per_sample": cpu / n * 1e6}))


def _rows_one(npy: str, batch: int) -> None:
    """(subprocess) CPU per batch of `batch` random rows of a big .npy through `NpyRows`
    (the gathered path, as a 10M-sample table takes): prints JSON."""
    import numpy as np

    from iobench.core.manifest import NpyRows

    rows = NpyRows.open(npy)
    rng = np.random.default_rng(0)
    idx = [np.sort(rng.choice(len(rows), batch, replace=False)) for _ in range(300)]
    rows[idx[0]]
    t0 = time.process_time()
    for i in idx:
        rows[i]
    print(json.dumps({"us_per_batch": (time.process_time() - t0) / len(idx) * 1e6}))


def cmd_rows(a: argparse.Namespace) -> int:
    """--rows NPY: `NpyRows` gathering a batch's rows of a big table, this iobench vs
    --before, interleaved."""
    variants = [("after", None)] + ([("before", a.before)] if a.before else [])
    got: dict[str, list[float]] = {n: [] for n, _ in variants}
    for rep in range(a.repeat):
        for name, code in (variants if rep % 2 == 0 else variants[::-1]):
            with tempfile.TemporaryDirectory() as cwd:
                p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_rows1",
                                    a.rows, str(a.batch_size)], capture_output=True,
                                   text=True, cwd=cwd, env=env_of(code), check=True)
            got[name].append(json.loads(p.stdout)["us_per_batch"])
    print(f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}  load {os.getloadavg()[0]:.1f}"
          f"  {a.rows}: CPU per batch of {a.batch_size} random rows, median [min-max] of "
          f"{a.repeat} interleaved: " + ", ".join(f"{n} {spread(v)} us" for n, v in got.items()))
    return 0


def env_of(code: str | None) -> dict[str, str]:
    """The subprocesses' environment: PYTHONPATH=`code` to measure another iobench."""
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code
    return env


def cpu_run(root: Path, fmt: str, batches: int, batch: int, code: str | None) -> dict:
    with tempfile.TemporaryDirectory() as cwd:  # not a checkout: python puts cwd on sys.path
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_cpu1", str(root),
                            fmt, str(batches), str(batch)], capture_output=True, text=True,
                           cwd=cwd, env=env_of(code))
    if p.returncode != 0:
        raise SystemExit(f"failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def train_run(root: Path, fmt: str, workers: int, warm: bool, epochs: int, batch: int,
              steps: int, code: str | None) -> dict:
    """`iobench train --model none` on `root`: samples/s (median of its epochs)."""
    with tempfile.TemporaryDirectory() as res:
        cmd = [sys.executable, "-m", "iobench", "train", "--loader", fmt, "--storage",
               str(root.parent), "--dataset", "cifar10", "--format", fmt, "--model", "none",
               "--epochs", str(epochs), "--max-steps", str(steps), "--workers",
               str(workers), "--batch-size", str(batch), "--results", res,
               *(["--warm-cache"] if warm else [])]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=res, env=env_of(code))
        if p.returncode != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        doc = json.loads(Path(glob.glob(f"{res}/*.json")[0]).read_text())
    eps = [e["summary"] for e in doc["epochs"]]
    return {"samples_per_s": med([e["samples_per_s"] for e in eps])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", type=Path)
    ap.add_argument("--formats", default="files,npz")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--cache", default="warm,cold")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per train run")
    ap.add_argument("--steps", type=int, default=50, help="steps (batches) per train epoch")
    ap.add_argument("--cpu-batches", type=int, default=100, help="timed batches per cpu run, "
                    "after 10 of warm-up (0: no cpu rows)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--before", default=None, help="also the compact form read by another "
                    "iobench: a tree with iobench/loaders and iobench/generators linked in "
                    "(e.g. from git archive), put first on its runs' PYTHONPATH")
    ap.add_argument("--rows", default=None, metavar="NPY", help="instead: time NpyRows "
                    "reading a batch's random rows of this big .npy (e.g. scale_ranks.py's "
                    "labels.npy at 10M)")
    a = ap.parse_args()
    if a.rows:
        return cmd_rows(a)
    if a.storage is None:
        ap.error("--storage DIR is needed (or --rows NPY)")
    fmts = a.formats.split(",")
    workers = [int(w) for w in a.workers.split(",") if w]
    caches = [c for c in a.cache.split(",") if c]
    for fmt in fmts:
        json_twin(a.storage, fmt)
    # (name, manifest form, code): the JSON list is the reference of every ratio
    variants = [("compact", "compact", None), ("json", "json", None)] + (
        [("before", "compact", a.before)] if a.before else [])
    load = os.getloadavg()
    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse",
                             "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "status",
                            "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    print(f"# compact (v2) vs JSON-list (v1) manifest, same files\n\ndate: "
          f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}  host: {os.uname().nodename}  "
          f"cores: {os.cpu_count()}  commit: {commit}{'+dirty' if dirty else ''}  "
          f"before: {a.before}  load avg: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
          f"command: {' '.join(sys.argv)}\n", flush=True)
    cases = [(fmt, "cpu", 0, True) for fmt in fmts if a.cpu_batches] + [
        (fmt, "train", w, c == "warm") for fmt in fmts for w in workers for c in caches]
    got: dict[tuple, dict[str, list[float]]] = {
        c: {k: [] for v in variants for k in (v[0], f"{v[0]}/json")} for c in cases}
    for rep in range(a.repeat):
        for case in cases:
            fmt, what, w, warm = case
            val = {}
            for name, form, code in (variants if rep % 2 == 0 else variants[::-1]):
                root = root_of(a.storage, fmt, form)  # alternate who goes first
                r = (cpu_run(root, fmt, a.cpu_batches, a.batch_size, code) if what == "cpu"
                     else train_run(root, fmt, w, warm, a.epochs, a.batch_size, a.steps, code))
                val[name] = r["per_cpu_s"] if what == "cpu" else r["samples_per_s"]
                got[case][name].append(val[name])
            for name, _, _ in variants:
                got[case][f"{name}/json"].append(val[name] / val["json"])
            print(f"rep {rep + 1} {fmt} {what} workers={w} {'warm' if warm else 'cold'}: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in val.items())
                  + f"; compact/json {val['compact'] / val['json']:.3f}"
                  + (f", before/json {val['before'] / val['json']:.3f}" if a.before else "")
                  + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
    names = [v[0] for v in variants]
    print("\n| format | measure | workers | cache | " + " | ".join(
        {"compact": "compact", "json": "JSON list", "before": "compact, before"}[n]
        for n in names) + " | compact / JSON |" + (" before / JSON |" if a.before else ""))
    print("|---|---|---:|---|" + "---:|" * (len(names) + 1 + bool(a.before)))
    for (fmt, what, w, warm), r in got.items():
        unit = "samples per CPU-s" if what == "cpu" else "samples/s"
        print(f"| {fmt} | {what} ({unit}) | {w} | {'warm' if warm else 'cold'} | "
              + " | ".join(spread(r[n]) for n in names) + f" | {ratio_cell(r['compact/json'])} |"
              + (f" {ratio_cell(r['before/json'])} |" if a.before else ""))
    load = os.getloadavg()
    print(f"\nmedian [min-max] of {a.repeat} interleaved repetitions, batch {a.batch_size}, "
          f"global shuffle; train: {a.epochs} epochs of {a.steps} steps; cpu: {a.cpu_batches} "
          "batches, --no-decode (PNG is decoded anyway); ratios within each repetition; "
          f"load avg at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_rows1":
        _rows_one(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "_cpu1":
        _cpu_one(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        sys.exit(0)
    sys.exit(main())
