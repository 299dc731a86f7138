"""What one rank pays before its first batch for a dataset of N samples (issue 14 item 6).

    .venv/bin/python scripts/bench/scale_ranks.py [--samples 1000000,10000000] [--world 64]
        [--form compact,json] [--runs 3] [--batch 256] [--work DIR] [--json OUT]

For each N and manifest form, a `files`-format cifar10 manifest of N one-sample .npy
files (in 1,000 sub-folders) is written under --work: `json` lists every file
(version 1, what generators wrote before), `compact` is the version 2 table (a pattern
and memory-mapped side arrays). Only the files rank 0 reads in its first batch exist
(real .npy files of the size the manifest records, and a real labels.npy of N labels),
so the first batch is a real read through the real `files` loader. Then a fresh
process, as rank 0 of --world ranks (one rank per node), times each step and the peak
resident memory (ru_maxrss) after it, and the private (RssAnon) part at the end: loading the manifest (`Manifest.load`,
containment checks included), the epoch's sample order (`sampling.rank_indices`,
global shuffle), the eviction plan (`cache.rank_share`, what this rank evicts), and
importing the loaders (torch), and building the real loader (workers=0) and taking
its first batch. Forms and sizes run interleaved, --runs times; the medians and
spreads (min-max) are printed. Torch alone holds ~300 MB in any rank that reads data
(the `import loaders` step): a tiny N shows those fixed costs, and what a larger N
adds on top of them is the dataset's. With --walk, after the first batch, the rank
also walks the paths it would evict before a cold epoch (no system calls: the cost
of listing them, which one rank per node pays for every file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

STEP = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from iobench.core import cache, sampling
from iobench.core.manifest import Manifest
root, world, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
walk, stage = sys.argv[4] == "1", sys.argv[5] == "1"
out = {"import_s": time.perf_counter() - t0}
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
def now():  # current private (anonymous) and file-backed resident bytes
    st = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/self/status")
          if l.startswith(("RssAnon", "RssFile"))}
    return st["RssAnon"], st["RssFile"]
out["rss_import_bytes"] = rss()
t = time.perf_counter(); m = Manifest.load(root)
out["manifest_load_s"] = time.perf_counter() - t; out["rss_manifest_bytes"] = rss()
t = time.perf_counter()
idx = sampling.rank_indices(m.num_samples, "global", 0, 0, 0, world)
out["rank_indices_s"] = time.perf_counter() - t; out["rss_indices_bytes"] = rss()
out["rank_samples"] = int(len(idx))
del idx
t = time.perf_counter()
share = cache.rank_share(m, [0], 0, world)
out["evict_files"] = len(share)
out["evict_plan_s"] = time.perf_counter() - t; out["rss_evict_plan_bytes"] = rss()
out["anon_evict_plan_bytes"], out["file_evict_plan_bytes"] = now()
del share
t = time.perf_counter()
from iobench.loaders import LoaderConfig, make_loader  # torch: ~300 MB, whatever the dataset
out["loader_import_s"] = time.perf_counter() - t; out["rss_loader_import_bytes"] = rss()
t = time.perf_counter()
cfg = LoaderConfig(batch_size=batch, workers=0, decode=False, seed=0, shuffle="global")
with make_loader("files", m, cfg, rank=0, world=world) as ld:
    b = next(iter(ld.epoch(0)))
    out["first_batch_samples"] = int(len(b.indices))
out["first_batch_s"] = time.perf_counter() - t; out["rss_first_batch_bytes"] = rss()
out["anon_first_batch_bytes"], out["file_first_batch_bytes"] = now()
out["total_s"] = time.perf_counter() - t0
if walk:  # after the first batch, not in it: what eviction walks before each cold epoch
    t = time.perf_counter()
    out["walked_paths"] = sum(1 for _ in cache.share_paths(m, cache.rank_share(m, [0], 0, world)))
    out["evict_walk_s"] = time.perf_counter() - t; out["rss_walk_bytes"] = rss()
if stage:  # a node's staging plan, one rank per node: its share (global scope: every file),
    # the share's bytes, what the destination lacks (absent: nothing to stat), then the
    # share streamed as the copy threads draw it, with no copying: iobench's own per-file cost
    from iobench.core.placement import need_bytes
    from pathlib import Path
    t = time.perf_counter()
    share = cache.rank_share(m, [0], 0, world)
    plan = (cache.share_bytes(share), need_bytes(share, Path(root) / "absent-destination"))
    out["stage_plan_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out["stage_files"] = sum(1 for _ in share)
    out["stage_walk_s"] = time.perf_counter() - t; out["rss_stage_bytes"] = rss()
    out["anon_stage_bytes"], _ = now()
print(json.dumps(out))
"""

SAMPLE = (32, 32, 3)  # cifar10: a .npy of 128 header bytes + 3,072 = 3,200 bytes
FILE_BYTES = 3200
DIRS = 1000


def rel(i: int) -> str:
    return f"d{i % DIRS:03d}/{i:09d}.npy"


def write_json_manifest(root: Path, n: int, head: str) -> None:
    """Version 1: every file one JSON object (the files themselves are not created)."""
    with open(root / "iobench.json.tmp", "w") as f:
        f.write(head.replace('"schema_version": 2', '"schema_version": 1') + '"files": [')
        sha = "0" * 64
        for i in range(n):
            f.write(f'{"," if i else ""}{{"path": "{rel(i)}", "bytes": {FILE_BYTES}, '
                    f'"sha256": "{sha}", "first_sample": {i}, "num_samples": 1, '
                    '"role": "data"}')
        f.write(f', {LABELS}], "seed": 0, "iobench_version": "scale", '
                '"created": "2026-11-24T00:00:00Z", "extra": {}}')
    os.replace(root / "iobench.json.tmp", root / "iobench.json")


def write_compact_manifest(root: Path, n: int, head: str) -> None:
    """Version 2: the table as a pattern and side arrays, as `Manifest.write` writes it."""
    from iobench.core.manifest import TABLE_DIR

    top = root / TABLE_DIR
    top.mkdir(exist_ok=True)
    np.save(top / "dir.npy", (np.arange(n, dtype=np.int64) % DIRS).astype(np.uint16))
    np.save(top / "bytes.npy", np.full(n, FILE_BYTES, dtype=np.int64))
    np.save(top / "sha256.npy", np.zeros((n, 32), dtype=np.uint8))
    table = {"count": n, "samples_per_file": 1, "dirs": [f"d{d:03d}" for d in range(DIRS)],
             "prefix": "", "width": 9, "suffix": ".npy", "data_bytes": n * FILE_BYTES}
    (root / "iobench.json.tmp").write_text(
        head + f'"files": [{LABELS}], "seed": 0, "iobench_version": "scale", '
        '"created": "2026-11-24T00:00:00Z", "extra": {}, "table": ' + json.dumps(table) + "}")
    os.replace(root / "iobench.json.tmp", root / "iobench.json")


LABELS = ""  # the labels file's entry, set once its size is known


def make_dataset(root: Path, n: int, form: str, world: int, batch: int) -> None:
    """The manifest, labels.npy, and the real files of rank 0's first batch."""
    global LABELS
    from iobench.core import sampling

    root.mkdir(parents=True, exist_ok=True)
    for d in range(DIRS):
        (root / f"d{d:03d}").mkdir(exist_ok=True)
    labels = (np.arange(n, dtype=np.int64) * 7919) % 10
    np.save(root / "labels.npy", labels)
    LABELS = json.dumps({"path": "labels.npy", "bytes": (root / "labels.npy").stat().st_size,
                         "sha256": "", "first_sample": -1, "num_samples": 0,
                         "role": "labels"})
    rng = np.random.default_rng(0)
    for i in sampling.rank_indices(n, "global", 0, 0, 0, world)[:batch].tolist():
        np.save(root / rel(i), rng.integers(0, 255, SAMPLE, dtype=np.uint8))
    head = ('{"schema": "iobench.manifest", "schema_version": 2, "dataset": "cifar10", '
            f'"format": "files", "num_samples": {n}, "num_classes": 10, '
            '"sample": {"kind": "array", "shape": [32, 32, 3], "dtype": "uint8"}, '
            '"label": {"shape": [], "dtype": "int64"}, '
            '"layout": {"samples_per_file": 1, "labels": "labels.npy"}, ')
    (write_compact_manifest if form == "compact" else write_json_manifest)(root, n, head)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", default="1000000,10000000")
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument("--form", default="compact,json", help="manifest forms: compact, json")
    ap.add_argument("--json-max", type=int, default=1_000_000,
                    help="the json form only up to this N (10M: ~410 s and 8.4 GB a run)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--walk", action="store_true",
                    help="then walk the paths this rank evicts (one rank per node: all)")
    ap.add_argument("--stage", action="store_true",
                    help="then (compact form) plan a node's staging copy and stream its share "
                         "as the copy threads would, without copying")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/iobench-bench-scale"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    cases = [(int(s), f) for s in a.samples.split(",") for f in a.form.split(",")
             if f != "json" or int(s) <= a.json_max]
    for n, form in cases:
        root = a.work / f"cifar10-files-{form}-{n}"
        if not (root / "iobench.json").is_file():
            t = time.perf_counter()
            make_dataset(root, n, form, a.world, a.batch)
            print(f"N={n:,} {form}: written in {time.perf_counter() - t:.0f} s", flush=True)
    rows: dict[tuple[int, str], list[dict]] = {c: [] for c in cases}
    for run in range(a.runs):
        for n, form in cases:  # interleaved: each run measures every case once
            root = a.work / f"cifar10-files-{form}-{n}"
            r = subprocess.run([sys.executable, "-c", STEP, str(root), str(a.world),
                                str(a.batch), "1" if a.walk else "0",
                                "1" if a.stage and form == "compact" else "0"],
                               capture_output=True,
                               text=True, timeout=3600)
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return 1
            row = json.loads(r.stdout)
            rows[(n, form)].append(row)
            print(f"run {run + 1} N={n:,} {form}: load {row['manifest_load_s']:.2f} s, "
                  f"first batch at {row['total_s']:.2f} s, peak "
                  f"{row['rss_first_batch_bytes'] / 1e6:.0f} MB", flush=True)
    print("\nmedian (min-max) of", a.runs, "runs, rank 0 of", a.world)
    keys = ("import_s", "manifest_load_s", "rank_indices_s", "evict_plan_s", "loader_import_s",
            "first_batch_s", "total_s")
    summary = []
    for (n, form), rs in rows.items():
        man = (a.work / f"cifar10-files-{form}-{n}" / "iobench.json").stat().st_size
        med = {k: statistics.median(r[k] for r in rs) for k in keys}
        peak = [r["rss_first_batch_bytes"] / 1e6 for r in rs]
        plan = [r["rss_evict_plan_bytes"] / 1e6 for r in rs]
        anon = [r["anon_first_batch_bytes"] / 1e6 for r in rs]
        line = ", ".join(f"{k[:-2]} {med[k]:.2f} s ({min(r[k] for r in rs):.2f}-"
                         f"{max(r[k] for r in rs):.2f})" for k in keys)
        print(f"N={n:,} {form} (iobench.json {man / 1e6:.1f} MB): {line}; peak RSS "
              f"{statistics.median(peak):.0f} MB ({min(peak):.0f}-{max(peak):.0f}), before "
              f"torch {statistics.median(plan):.0f} MB ({min(plan):.0f}-{max(plan):.0f}), "
              f"private (RssAnon) at the first batch {statistics.median(anon):.0f} MB "
              f"({min(anon):.0f}-{max(anon):.0f}); "
              f"rank samples {rs[0]['rank_samples']:,}, evicts {rs[0]['evict_files']:,} files")
        if a.walk:
            w = [r["evict_walk_s"] for r in rs]
            print(f"    walking the {rs[0]['walked_paths']:,} paths it evicts: "
                  f"{statistics.median(w):.2f} s ({min(w):.2f}-{max(w):.2f}), peak RSS then "
                  f"{statistics.median(r['rss_walk_bytes'] for r in rs) / 1e6:.0f} MB")
        if "stage_files" in rs[0]:
            pl, wk = [r["stage_plan_s"] for r in rs], [r["stage_walk_s"] for r in rs]
            an = [r["anon_stage_bytes"] / 1e6 for r in rs]
            print(f"    a node's staging plan ({rs[0]['stage_files']:,} files, one rank per "
                  f"node): share, bytes and need {statistics.median(pl):.2f} s "
                  f"({min(pl):.2f}-{max(pl):.2f}); streaming the share as the copy threads "
                  f"draw it {statistics.median(wk):.2f} s ({min(wk):.2f}-{max(wk):.2f}), "
                  f"private (RssAnon) then {statistics.median(an):.0f} MB "
                  f"({min(an):.0f}-{max(an):.0f})")
        summary.append({"samples": n, "form": form, "world": a.world, "manifest_bytes": man,
                        "runs": rs})
    if a.json:
        a.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
