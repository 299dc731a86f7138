"""What one rank pays at start-up for a dataset of N samples, before reading any (issue 14 item 6).

    .venv/bin/python scripts/bench/scale_ranks.py [--samples 1000000,10000000] [--world 64]
        [--work DIR] [--json OUT]

For each N, a `files`-format manifest of N one-sample files (in 1,000 sub-folders; the
files themselves are not created) is written under --work, then a fresh process, as rank
0 of --world ranks, times and measures the peak resident memory (ru_maxrss) after each
step every rank takes today: loading the manifest (`Manifest.load`, containment checks
included), the epoch's sample order (`sampling.rank_indices`, global shuffle), and the
eviction plan (`cache.files_for_node` + `cache.split_files`, what each node's ranks
evict before every epoch). Measuring only; nothing is changed to make it faster.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

STEP = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from iobench import cache, sampling
from iobench.manifest import Manifest
root, world = sys.argv[1], int(sys.argv[2])
out = {"import_s": time.perf_counter() - t0}
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out["rss_import_bytes"] = rss()
t = time.perf_counter(); m = Manifest.load(root)
out["manifest_load_s"] = time.perf_counter() - t; out["rss_manifest_bytes"] = rss()
t = time.perf_counter()
idx = sampling.rank_indices(m.num_samples, "global", 0, 0, 0, world)
out["rank_indices_s"] = time.perf_counter() - t; out["rss_indices_bytes"] = rss()
out["rank_samples"] = int(len(idx))
t = time.perf_counter()
share = cache.split_files(cache.files_for_node(m, [0], world), 0, 1)
out["evict_plan_s"] = time.perf_counter() - t; out["rss_evict_plan_bytes"] = rss()
out["evict_files"] = len(share)
out["total_s"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def write_manifest(root: Path, n: int) -> None:
    """A files-format manifest listing n one-sample files (the files are not created)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "iobench.json.tmp", "w") as f:
        f.write('{"schema": "iobench.manifest", "schema_version": 1, "dataset": "cifar10", '
                f'"format": "files", "num_samples": {n}, "num_classes": 10, '
                '"sample": {"kind": "array", "shape": [32, 32, 3], "dtype": "uint8"}, '
                '"label": {"shape": [], "dtype": "int64"}, "layout": {}, "files": [')
        sha = "0" * 64
        for i in range(n):
            sep = "," if i else ""
            f.write(f'{sep}{{"path": "d{i % 1000:03d}/{i:09d}.npy", "bytes": 3200, '
                    f'"sha256": "{sha}", "first_sample": {i}, "num_samples": 1, '
                    '"role": "data"}')
        f.write('], "seed": 0, "iobench_version": "scale", "created": "2026-11-24T00:00:00Z", '
                '"extra": {}}')
    os.replace(root / "iobench.json.tmp", root / "iobench.json")
    for d in range(1000):
        (root / f"d{d:03d}").mkdir(exist_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", default="1000000,10000000")
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/iobench-bench-scale"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rows = []
    for n in (int(s) for s in a.samples.split(",")):
        root = a.work / f"cifar10-files-{n}"
        t = time.perf_counter()
        if not (root / "iobench.json").is_file():
            write_manifest(root, n)
        size = (root / "iobench.json").stat().st_size
        print(f"N={n:,}: manifest {size / 1e6:.0f} MB ({time.perf_counter() - t:.0f} s to "
              "write)", flush=True)
        r = subprocess.run([sys.executable, "-c", STEP, str(root), str(a.world)],
                           capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
        row = {"samples": n, "world": a.world, "manifest_bytes": size, **json.loads(r.stdout)}
        rows.append(row)
        print(f"  import {row['import_s']:.2f} s ({row['rss_import_bytes'] / 1e6:.0f} MB); "
              f"Manifest.load {row['manifest_load_s']:.1f} s (peak "
              f"{row['rss_manifest_bytes'] / 1e6:.0f} MB); rank_indices "
              f"{row['rank_indices_s']:.2f} s (peak {row['rss_indices_bytes'] / 1e6:.0f} MB); "
              f"eviction plan {row['evict_plan_s']:.1f} s (peak "
              f"{row['rss_evict_plan_bytes'] / 1e6:.0f} MB); total {row['total_s']:.1f} s",
              flush=True)
    print(f"peak of this driver: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
