#!/usr/bin/env python3
"""`iobench checkpoint` against fio on the same files: sequential write with fsync, O_DIRECT read.

For each rank count R (1, then `mpiexec -n 2`) and each tier, every repetition runs
`iobench checkpoint --repeat 1 --keep` (DCP: one fsync'ed shard per rank, evicted, then read
back cold) and fio on the same bytes, the order of the two alternating:

- write: R fio jobs at once, each writing one file of the size of one of iobench's shards
  (`rw=write`, `bs`, `end_fsync=1`: the file is fsync'ed before the job ends, as DCP's
  `sync_files` does), against iobench's `throughput_GBps` (every shard's bytes over the
  slowest rank's time to its shard fsync'ed: MLPerf's figure);
- read: R fio jobs at once, each reading one of iobench's own shard files with O_DIRECT
  (`direct=1`, nothing from the page cache), against iobench's cold read.

With `--saves N` (default 1), each repetition's iobench run writes N checkpoints (`--repeat
N`, as MLPerf Storage's run writes 10 in one process), and fio writes the same N back to
back (N fio runs of R jobs, each fsync'ed, every file kept until the N are written, as
iobench keeps its checkpoints), so that a disk which slows after a burst slows both. The
write figures are then: the median save (iobench's own summary; fio's median run), the
whole run (all N saves' bytes over the sum of their durations, MLPerf's run; fio's the
same), and the first save (which plans in full) and the later ones (DCP's cached plan),
each against fio's run of the same position.

fio's figure is computed the same way: all jobs' bytes over the slowest job's runtime. The
script prints each repetition's ratios (iobench / fio, within the repetition) and, per rank
count and tier, the median [min-max] of 3 (or --repeat) interleaved repetitions. With
`--gluster`, the same on the one-box GlusterFS volume (scripts/pfs/local-gluster.sh, root;
iobench reads with `--evict-cmd` emptying the bricks' cache), and the GlusterFS / local
ratios. GB = 10^9 bytes.

    .venv/bin/python scripts/bench/checkpoint_vs_fio.py [--work /var/tmp/iobench-ckpt-fio]
        [--model llama3-8b] [--scale 0.05] [--ranks 1,2] [--repeat 3] [--saves 1] [--settle 0]
        [--bs 1m] [--gluster]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tiers as t


def mpi(ranks: int) -> list[str]:
    if ranks == 1:
        return []
    exe = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    return [exe, "-n", str(ranks)]


def iobench_run(storage: Path, ranks: int, a: argparse.Namespace,
                evict_cmd: str | None) -> tuple[dict[str, Any], list[Path]]:
    """One `iobench checkpoint` (kept): its result document and its shard files."""
    with tempfile.TemporaryDirectory() as res:
        cmd = [*mpi(ranks), *t.IOBENCH, "checkpoint", "--storage", str(storage), "--model",
               a.model, "--scale", str(a.scale), "--repeat", str(a.saves), "--keep",
               "--results", res]
        if evict_cmd:
            cmd += ["--evict-cmd", evict_cmd]
        t.run(cmd, cwd=res)
        doc = t.only_result(Path(res))
    shards = sorted(Path(doc["kept"][0]).glob("__*_0.distcp"))
    return doc, shards


def fio_run(jobs: list[tuple[Path, int]], rw: str, a: argparse.Namespace) -> float:
    """R fio jobs at once (one file each); all bytes over the slowest job's runtime, GB/s."""
    common = [f"--bs={a.bs}", "--ioengine=psync", "--group_reporting=0",
              "--output-format=json"]
    common += (["--rw=write", "--end_fsync=1", "--fallocate=none"] if rw == "write"
               else ["--rw=read", "--direct=1"])
    argv = [a.fio, *common]
    for k, (path, size) in enumerate(jobs):
        argv += [f"--name=j{k}", f"--filename={path}", f"--size={size}"]
    out = json.loads(t.run(argv).stdout)
    phase = "write" if rw == "write" else "read"
    total = sum(j[phase]["io_bytes"] for j in out["jobs"])
    # job_runtime (ms) holds the whole job: for writes, the end_fsync too
    slowest = max(j["job_runtime"] for j in out["jobs"]) / 1e3
    return total / 1e9 / slowest


def one_rep(storage: Path, ranks: int, a: argparse.Namespace, evict_cmd: str | None,
            fio_first: bool) -> dict[str, float]:
    """One repetition on one tier: iobench and fio, write and read, in the given order."""
    fio_dir = storage / "fio"
    fio_dir.mkdir(exist_ok=True)
    got: dict[str, float] = {}

    def fio_write(sizes: list[int]) -> None:
        settle(a.settle)
        runs = [[(fio_dir / f"shard{r}-{n}", s) for r, s in enumerate(sizes)]
                for n in range(a.saves)]  # the N checkpoints, back to back, all kept
        gbps = [fio_run(jobs, "write", a) for jobs in runs]
        got["fio_saves"] = gbps
        got["fio_write"] = statistics.median(gbps)
        got["fio_run"] = len(gbps) / sum(1 / g for g in gbps)  # same bytes each: total/time
        for jobs in runs:
            for p, _ in jobs:
                p.unlink()

    sizes = a.sizes.get((str(storage), ranks))
    if fio_first and sizes:
        fio_write(sizes)
    settle(a.settle)
    doc, shards = iobench_run(storage, ranks, a, evict_cmd)
    sizes = a.sizes[(str(storage), ranks)] = [p.stat().st_size for p in shards]
    if "fio_write" not in got:
        fio_write(sizes)
    got["fio_read"] = fio_run([(p, p.stat().st_size) for p in shards], "read", a)
    shutil.rmtree(Path(doc["kept"][0]).parent)
    saves = [w["throughput_GBps"] for w in doc["writes"]]
    got["io_write"] = doc["summary"]["write"]["throughput_GBps"]["median"]
    got["io_run"] = (sum(w["bytes"] for w in doc["writes"]) / 1e9
                     / sum(w["duration_s"] for w in doc["writes"]))
    got["io_write_first"] = saves[0]
    got["io_write_later"] = statistics.median(saves[1:]) if len(saves) > 1 else None
    fio = got["fio_saves"]
    got["first_ratio"] = saves[0] / fio[0]
    got["later_ratio"] = (statistics.median(x / f for x, f in zip(saves[1:], fio[1:], strict=True))
                          if len(saves) > 1 else None)
    got["io_read"] = doc["reads"][0]["throughput_GBps"]
    got["cache"] = doc["reads"][0]["cache"]["status"] + "/" + doc["reads"][0]["os_read_check"]
    got["bytes"] = doc["writes"][0]["bytes"]
    return got


def settle(seconds: float) -> None:
    """Before a write phase (either tool's): everything written before on its way to the
    disk (`sync`), then `seconds` idle, for a disk whose write cache (a VM host's) slows
    the writes that follow a burst of several GB, whichever tool comes second."""
    if seconds > 0:
        os.sync()
        time.sleep(seconds)


def saves_note(r: dict[str, Any]) -> str:
    if r["io_write_later"] is None:
        return ""
    return (f"; whole run iobench {r['io_run']:.3f} / fio {r['fio_run']:.3f} GB/s = "
            f"{r['io_run'] / r['fio_run']:.3f}; first save {r['io_write_first']:.3f} GB/s "
            f"({r['first_ratio']:.3f} of fio's first), later saves {r['io_write_later']:.3f} "
            f"GB/s (median; {r['later_ratio']:.3f} of fio's save by save)")


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]" if xs else "n/a"


def table(reps: dict[tuple[str, int], list[dict[str, Any]]]) -> None:
    print("\n| tier | ranks | GB | fio write GB/s | iobench write GB/s | write ratio | "
          "fio O_DIRECT read GB/s | iobench cold read GB/s | read ratio | reads |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for (tier, ranks), rs in reps.items():
        col = {k: [r[k] for r in rs] for k in ("fio_write", "io_write", "fio_read", "io_read")}
        wr = [r["io_write"] / r["fio_write"] for r in rs]
        rr = [r["io_read"] / r["fio_read"] for r in rs]
        print(f"| {tier} | {ranks} | {rs[0]['bytes'] / 1e9:.2f} | {spread(col['fio_write'])} | "
              f"{spread(col['io_write'])} | {spread(wr)} | {spread(col['fio_read'])} | "
              f"{spread(col['io_read'])} | {spread(rr)} | "
              f"{','.join(sorted({r['cache'] for r in rs}))} |")
    if any(r["io_write_later"] is not None for rs in reps.values() for r in rs):
        saves_table(reps)


def saves_table(reps: dict[tuple[str, int], list[dict[str, Any]]]) -> None:
    """With --saves N: the whole run (all saves' bytes over their summed durations, iobench
    and fio), the first save of each iobench run and its later ones, each against fio's
    write of the same position in the same repetition."""
    print("\n| tier | ranks | saves | fio run GB/s | iobench run GB/s | run ratio | first save "
          "GB/s | first save / fio's first | later saves GB/s (median) | later saves / fio's |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (tier, ranks), rs in reps.items():
        print(f"| {tier} | {ranks} | {len(rs[0]['fio_saves'])} | "
              f"{spread([r['fio_run'] for r in rs])} | {spread([r['io_run'] for r in rs])} | "
              f"{spread([r['io_run'] / r['fio_run'] for r in rs])} | "
              f"{spread([r['io_write_first'] for r in rs])} | "
              f"{spread([r['first_ratio'] for r in rs])} | "
              f"{spread([r['io_write_later'] for r in rs])} | "
              f"{spread([r['later_ratio'] for r in rs])} |")


def tier_ratios(reps: dict[tuple[str, int], list[dict[str, Any]]]) -> None:
    ranks = sorted({r for _, r in reps})
    if not any(k[0] == "gluster" for k in reps):
        return
    print("\n| ranks | tool | phase | GlusterFS / local (median of per-repetition ratios) |")
    print("|---:|---|---|---:|")
    for r in ranks:
        loc, glu = reps.get(("local", r)), reps.get(("gluster", r))
        if not loc or not glu:
            continue
        for key, tool, phase in (("io_write", "iobench", "write"), ("fio_write", "fio", "write"),
                                 ("io_read", "iobench", "read"), ("fio_read", "fio", "read")):
            ratios = [g[key] / lo[key] for g, lo in zip(glu, loc, strict=True)]
            print(f"| {r} | {tool} | {phase} | {spread(ratios)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="/var/tmp/iobench-ckpt-fio",
                   help="a folder on the local disk for the checkpoints and fio's files")
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--scale", type=float, default=0.05,
                   help="iobench --scale (llama3-8b 0.05: 656 MB per rank)")
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--saves", type=int, default=1,
                   help="checkpoints each iobench run writes (its --repeat; MLPerf: 10)")
    p.add_argument("--settle", type=float, default=0.0,
                   help="seconds idle (after a sync) before each write phase, iobench's and "
                        "fio's alike: a VM's disk slows after a burst of several GB "
                        "(default 0)")
    p.add_argument("--bs", default="1m", help="fio's block size (default 1m)")
    p.add_argument("--fio", default=shutil.which("fio") or "fio")
    p.add_argument("--gluster", action="store_true",
                   help="also on the one-box GlusterFS volume (root; brought up if needed)")
    a = p.parse_args()
    a.sizes = {}
    tiers = {"local": (Path(a.work), None)}
    if a.gluster:
        tiers["gluster"] = (t.gluster_up() / "ckpt-fio", t.EVICT)
    for d, _ in tiers.values():
        d.mkdir(parents=True, exist_ok=True)
    print(t.header("checkpoint_vs_fio"))
    print(f"model {a.model} --scale {a.scale:g}, fio bs={a.bs}, repetitions {a.repeat}, "
          f"saves per iobench run {a.saves}, settle {a.settle:g} s before each write phase\n")
    reps: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for i in range(a.repeat):
        for ranks in (int(x) for x in a.ranks.split(",")):
            for tier, (d, evict) in tiers.items():
                r = one_rep(d, ranks, a, evict, fio_first=bool(i % 2))
                reps.setdefault((tier, ranks), []).append(r)
                print(f"rep {i} {tier} ranks {ranks}: write iobench {r['io_write']:.3f} / fio "
                      f"{r['fio_write']:.3f} GB/s = {r['io_write'] / r['fio_write']:.3f}; "
                      f"read iobench {r['io_read']:.3f} / fio {r['fio_read']:.3f} GB/s = "
                      f"{r['io_read'] / r['fio_read']:.3f} ({r['cache']}); load "
                      f"{os.getloadavg()[0]:.1f}{saves_note(r)}", flush=True)
    table(reps)
    tier_ratios(reps)
    print(f"\nmedian [min-max] of {a.repeat} interleaved repetitions; ratios within each "
          f"repetition; ended {time.strftime('%H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
