"""Measure the emulated tier against its own profiles: does each profile, not the daemon, set the pace?

    python -m iobench.pfs.bench --workdir DIR [--size-mb 256] [--threads 4]
        [--profiles passthrough lustre-light lustre-busy gpfs] [--out pfs-bench.json]

For each profile it mounts the tier over files it writes in DIR (cold: the
backing pages are evicted first) and measures, through the mount:
- `seq_MBps`: THREADS readers, each reading its own file start to end in
  1 MiB reads (MB = 10^6 bytes), next to the profile's cap;
- `small_reads_per_s`: THREADS readers doing random 4 KiB preads through a
  `direct_io` mount (one FUSE request each), for `--seconds` seconds;
- `open_ms`: mean wall time of open+close of a small file, next to the
  profile's metadata round trip;
- the daemon's verdict (`iobench.pfs.delta`) for each phase: `daemon` means
  the Python daemon, not the profile, was the limit.
`passthrough` measures the daemon's own ceiling. Everything it prints says it
is an emulation. It writes `--out` (schema `iobench.pfs-bench` v1) atomically.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from iobench.core import cache, sysinfo
from iobench.core.errors import IobenchError
from iobench.core.jsonio import write_json_atomic
from iobench.core.threads import run_threads
from iobench.pfs import control
from iobench.pfs.profiles import PROFILES, get_profile
from iobench.pfs.stats import NOTE, delta

MiB = 1 << 20


def _write_files(root: Path, threads: int, size_mb: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "small").mkdir(exist_ok=True)
    files = []
    per_file = max(size_mb // threads, 1) * MiB
    block = os.urandom(MiB)
    for i in range(threads):
        p = root / f"seq-{i}.bin"
        if not p.exists() or p.stat().st_size != per_file:
            with open(p, "wb") as f:
                for _ in range(per_file // MiB):
                    f.write(block)
        files.append(p)
    for i in range(200):
        p = root / "small" / f"{i:04d}.bin"
        if not p.exists():
            p.write_bytes(block[:1000])
    os.sync()
    return files


def _seq(mp: Path, names: list[str], threads: int) -> tuple[float, int]:
    total = [0] * threads

    def read(i: int) -> None:
        with open(mp / names[i], "rb", buffering=0) as f:
            buf = bytearray(MiB)
            while n := f.readinto(buf):
                total[i] += n

    wall = run_threads(threads, read)[1]
    return wall, sum(total)


def _small(mp: Path, name: str, size: int, threads: int, seconds: float) -> tuple[float, int]:
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def read(i: int) -> None:
        rng = random.Random(i)
        fd = os.open(mp / name, os.O_RDONLY)
        try:
            pages = size // 4096
            while time.perf_counter() < stop:
                os.pread(fd, 4096, rng.randrange(pages) * 4096)
                counts[i] += 1
        finally:
            os.close(fd)

    wall = run_threads(threads, read)[1]
    return wall, sum(counts)


def _opens(mp: Path, n: int) -> float:
    names = sorted(os.listdir(mp / "small"))[:n]
    t0 = time.perf_counter()
    for name in names:
        os.close(os.open(mp / "small" / name, os.O_RDONLY))
    return (time.perf_counter() - t0) / len(names) * 1000


def bench_profile(name: str, root: Path, files: list[Path], mnt: Path, threads: int,
                  seconds: float) -> dict[str, Any]:
    """All three measurements for one profile; mounts and unmounts twice."""
    prof = get_profile(name)
    names = [f.name for f in files]
    out: dict[str, Any] = {"profile": prof.to_dict()}
    cache.evict(files)
    h = control.mount(root, mnt, prof)
    try:
        s0 = control.stats_for(mnt)
        wall, nbytes = _seq(Path(h.mountpoint), names, threads)
        s1 = control.stats_for(mnt)
        assert s0 is not None and s1 is not None  # `mnt` is the emulated mount just made
        out["seq_MBps"] = nbytes / wall / 1e6
        out["seq"] = delta(s0, s1)
        out["open_ms"] = _opens(Path(h.mountpoint), 100)
    finally:
        h.unmount()
    cache.evict(files)
    h = control.mount(root, mnt, prof, direct_io=True)
    try:
        s0 = control.stats_for(mnt)
        wall, n = _small(Path(h.mountpoint), names[0], files[0].stat().st_size, threads, seconds)
        s1 = control.stats_for(mnt)
        assert s0 is not None and s1 is not None
        out["small_reads_per_s"] = n / wall
        out["small"] = delta(s0, s1)
    finally:
        h.unmount()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m iobench.pfs.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True, type=Path, help="local directory for the backing "
                    "files and the mount point")
    ap.add_argument("--size-mb", type=int, default=256, help="MiB read sequentially per profile")
    ap.add_argument("--threads", type=int, default=4, help="concurrent readers")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of the small-read phase")
    ap.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=sorted(PROFILES))
    ap.add_argument("--out", type=Path, help="JSON result file (default: WORKDIR/pfs-bench.json)")
    args = ap.parse_args(argv)
    try:
        if args.size_mb < 1 or args.threads < 1 or args.seconds <= 0:
            raise IobenchError(f"--size-mb={args.size_mb}, --threads={args.threads} and "
                               f"--seconds={args.seconds} must be positive")
        control.require_fuse()
        root, mnt = args.workdir.resolve() / "backing", args.workdir.resolve() / "mnt"
        files = _write_files(root, args.threads, args.size_mb)
        print(f"# {NOTE}")
        print("| profile | seq MB/s (cap) | limited by | 4 KiB reads/s (cap) | limited by "
              "| open ms (metadata RTT) |")
        print("|---|---|---|---|---|---|")
        results = []
        for name in args.profiles:
            r = bench_profile(name, root, files, mnt, args.threads, args.seconds)
            p = r["profile"]
            print(f"| {name} | {r['seq_MBps']:.0f} ({p['bandwidth_MBps'] or '-'}) | "
                  f"{r['seq']['limited_by']} | {r['small_reads_per_s']:.0f} ({p['iops'] or '-'}) "
                  f"| {r['small']['limited_by']} | {r['open_ms']:.2f} ({p['metadata_ms']}) |",
                  flush=True)
            results.append(r)
        doc = {"schema": "iobench.pfs-bench", "schema_version": 1, "emulated": True, "note": NOTE,
               "config": {"size_mb": args.size_mb, "threads": args.threads,
                          "seconds": args.seconds},
               "provenance": sysinfo.provenance(root), "results": results}
        out = write_json_atomic(args.out or args.workdir / "pfs-bench.json", doc)
        print(f"wrote {out}")
        return 0
    except IobenchError as e:
        print(f"iobench: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
