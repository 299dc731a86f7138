"""Staging time against file count, from the local disk and the one-box GlusterFS (issue 31 item 4).

    .venv/bin/python scripts/bench/stage_scale.py [--data /var/tmp/iobench-stage-scale]
        [--counts 1000,10000,100000] [--tiers local,gluster] [--repeat 3]
        [--once-above 10000] [--fpsync-jobs 2] [--dest DIR] [--gluster-sub NAME]
        [--json OUT]

For each file count: a files-format cifar10 dataset of that many PNGs (one sample
a file, `iobench generate`) on the local disk under DATA/local, and a copy of it
on the one-box GlusterFS (scripts/pfs/local-gluster.sh, brought up if it is not).
Each is staged to the local disk (DATA/dst) by three contenders, interleaved (the
order turned round every other repetition):

- `cp -r SRC DST && sync -f DST` (the anchor),
- `fpsync -n JOBS SRC/ DST/ && sync -f DST` (fpart's parallel rsync, as HPC sites stage),
- `iobench stage --from SRC --to DATA` (default options; on GlusterFS with
  `--evict-cmd 'local-gluster.sh evict'`): its own copy figure (stage_s) and the
  whole command's wall time (start-up, manifest, eviction, result included), and the
  seconds stage spent evicting: the evict command before the copy, and inside the
  copy each source file's eviction through its descriptor and both sides' pages
  dropped after each batch, those two summed over the copy workers
  (`source_cache.seconds + evict_s`).

Before every run the destination is removed and synced, and the source is made cold
the same way for every contender. Local disk: each file's pages written back and
dropped (`POSIX_FADV_DONTNEED`, stage_vs_cp.cold); directory entries and inodes stay
cached. GlusterFS: the contenders read through a client of this script's own
(DATA/gmnt, so the shared mount is left alone), and before each run the bricks'
files are evicted (`local-gluster.sh evict`) and that client is remounted, which
empties its page cache and its inode and dentry caches at once (a per-file pass of
opens through the mount runs at ~70 files/s on this loaded box); the translators
that cache in the FUSE client are off. The bricks' disk reads during each run
(`/proc/<pid>/io` of glusterfsd) are printed as a fraction of the dataset's bytes:
the proof it was cold. `iobench stage` evicts the source once more itself, as a
user's run would (the evict command, and each file as the copy opens it).

Counts above `--once-above` run once (the 100,000-file copies take minutes each).
Prints seconds median [min-max] per contender and its rate relative to cp's
(cp seconds / its seconds, per repetition side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tiers
import stage_vs_cp
from _gencommon import fmt, header, loadavg, median, save
from stage_vs_cp import generate, run_cp, run_fpsync, run_stage

CP = "cp -r && sync -f"
CONTENDERS = (CP, "fpsync", "stage")
LOCAL_COLD = stage_vs_cp.cold


def no_client_pass(root: Path) -> float:
    """Stands in for stage_vs_cp's per-file eviction on GlusterFS, where `gluster_cold` has
    emptied the client already (a pass of opens through the mount: ~70 files/s here)."""
    return 0.0


def private_mount(data: Path, remount: bool = False) -> Path:
    """A GlusterFS client of our own at DATA/gmnt (the shared mount stays as it is)."""
    mnt = data / "gmnt"
    mnt.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mountpoint", "-q", str(mnt)]).returncode == 0
    if mounted and remount:
        _tiers.run(["umount", str(mnt)])
    if remount or not mounted:
        _tiers.run(["mount", "-t", "glusterfs", f"{os.uname().nodename}:/iobench", str(mnt)])
    return mnt


def gluster_cold(data: Path) -> None:
    """Empty every cache of the source: the bricks' pages, then the client's (a remount)."""
    _tiers.run(["bash", str(_tiers.GLUSTER), "evict"])
    private_mount(data, remount=True)


def sources(tiers: list[str], data: Path, count: int, sub: str = "stage-scale"
            ) -> dict[str, Path]:
    """The dataset of `count` files on each tier (generated, or copied to GlusterFS under
    the volume's folder `sub`, once)."""
    local = generate(data / "local" / f"n{count}", "cifar10", count, 1)
    out = {"local": local}
    if "gluster" in tiers:
        copy = _tiers.ensure_copy(local, _tiers.gluster_up() / sub / f"n{count}")
        out["gluster"] = private_mount(data) / sub / f"n{count}" / copy.name
    return {t: out[t] for t in tiers}


def one_run(name: str, tier: str, src: Path, a: argparse.Namespace) -> dict[str, Any]:
    """One contender's copy of `src` into `a.dest` from a cold source: seconds (and stage's)."""
    on_gluster = tier == "gluster"
    stage_vs_cp.cold = no_client_pass if on_gluster else LOCAL_COLD
    if on_gluster:
        gluster_cold(a.data)
        disk0 = _tiers.brick_read_bytes()
    if name == CP:
        out: dict[str, Any] = {"seconds": run_cp(src, a.dest, "dest")}
    elif name == "fpsync":
        out = {"seconds": run_fpsync(src, a.dest, "dest", a.fpsync_jobs)}
    else:
        extra = ["--evict-cmd", _tiers.EVICT] if on_gluster else []
        d = run_stage(src, a.dest, a.data / "res", extra)
        (doc,) = [json.loads(p.read_text()) for p in (a.data / "res").glob("stage-*.json")]
        out = {"seconds": d["seconds"], "wall_s": d["wall_s"], "checksum_s": d["checksum_s"],
               "evict_s": doc["source_cache"]["seconds"] + doc["evict_s"]}
    if on_gluster:
        out["disk_bytes"] = _tiers.brick_read_bytes() - disk0
    return out


def bench(tier: str, src: Path, count: int, a: argparse.Namespace) -> dict[str, Any]:
    """Every contender on one tier and count, interleaved; their runs by name."""
    nbytes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    repeat = a.repeat if count <= a.once_above else 1
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    for r in range(repeat):
        for name in (CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]):
            runs[name].append(one_run(name, tier, src, a))
            _tiers.log(f"{tier} {count} files: {name} {runs[name][-1]}")  # kept if a later run fails
        print(f"  {tier} {count} files, repeat {r + 1}: "
              + ", ".join(f"{k} {v[-1]['seconds']:.2f} s" for k, v in runs.items())
              + f" (stage wall {runs['stage'][-1]['wall_s']:.2f} s, load {loadavg():.2f})",
              flush=True)
    shutil.rmtree(a.dest, ignore_errors=True)
    return {"tier": tier, "files": count, "bytes": nbytes, "runs": runs}


def ratio(anchor: list[float], xs: list[float]) -> str:
    """cp's seconds over the contender's, per repetition: its rate relative to cp's."""
    return fmt([c / x for c, x in zip(anchor, xs, strict=True)], ".2f")


def secs(cell: dict[str, Any], name: str) -> list[float]:
    return [r["seconds"] for r in cell["runs"][name]]


def row(cell: dict[str, Any]) -> str:
    runs = cell["runs"]
    cp, fp, st = secs(cell, CP), secs(cell, "fpsync"), secs(cell, "stage")
    wall = [r["wall_s"] for r in runs["stage"]]
    ev = [r["evict_s"] for r in runs["stage"]]
    ck = [r["checksum_s"] for r in runs["stage"] if r["checksum_s"] is not None]
    disk = ""
    if cell["tier"] == "gluster":
        disk = fmt([r["disk_bytes"] / cell["bytes"] for rs in runs.values() for r in rs], ".2f")
    return (f"| {cell['tier']} | {cell['files']:,} | {cell['bytes'] / 1e6:.0f} | {len(cp)} "
            f"| {fmt(cp, '.2f')} | {fmt(fp, '.2f')} | {ratio(cp, fp)} "
            f"| {fmt(st, '.2f')} | {ratio(cp, st)} | {fmt(wall, '.2f')} | {ratio(cp, wall)} | {fmt(ev, '.1f')} "
            f"| {fmt(ck, '.2f') if ck else ''} | {disk} |")


def table(cells: list[dict[str, Any]], jobs: int) -> None:
    print(f"\n| source | files | MB | runs | {CP} s | fpsync -n {jobs} s | rate / cp "
          "| stage copy s | rate / cp | stage wall s | rate / cp | of which evicting s "
          "| stage checksum s "
          "| brick disk reads / dataset |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        print(row(c))
    meds = [f"{c['tier']} {c['files']}: "
            f"{median(secs(c, CP)) / median(secs(c, 'stage')):.2f}" for c in cells]
    print("rate / cp: cp's seconds over the contender's, per run side by side (> 1: faster "
          "than cp); stage's copy figure, ratio of the medians: " + "; ".join(meds))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/iobench-stage-scale"),
                    help="datasets (DATA/local/nCOUNT), copies (DATA/dst), results")
    ap.add_argument("--counts", default="1000,10000,100000", help="file counts")
    ap.add_argument("--tiers", default="local,gluster", help="sources: local, gluster")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs per cell")
    ap.add_argument("--once-above", type=int, default=10000,
                    help="file counts above this run once (default 10000)")
    ap.add_argument("--fpsync-jobs", type=int, default=2, help="fpsync -n (default 2)")
    ap.add_argument("--dest", type=Path, default=None,
                    help="where the copies go (default DATA/dst/copy); e.g. on a loop-mounted "
                         "ext4 of its own, so that the syncs do not wait for other jobs' data")
    ap.add_argument("--gluster-sub", default="stage-scale",
                    help="the folder of the GlusterFS volume the copies go to (one's own when "
                         "the volume is shared; default stage-scale)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    a.data = a.data.resolve()
    a.dest = (a.dest or a.data / "dst" / "copy").resolve()
    a.dest.parent.mkdir(parents=True, exist_ok=True)
    tiers = a.tiers.split(",")
    if shutil.which("fpsync") is None:
        sys.exit("fpsync is missing: apt-get install fpart")
    doc: dict[str, Any] = {"info": header(a.data), "cells": []}
    for count in (int(c) for c in a.counts.split(",")):
        for tier, src in sources(tiers, a.data, count, a.gluster_sub).items():
            _tiers.log(f"{tier}: {count} files from {src}")
            doc["cells"].append(bench(tier, src, count, a))
            save(a.json, doc)  # a cell at a time: the large counts take long
    doc["info"]["load_1min_end"] = loadavg()
    doc["info"]["end"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    if "gluster" in tiers:
        subprocess.run(["umount", str(a.data / "gmnt")], capture_output=True)
    table(doc["cells"], a.fpsync_jobs)
    print(f"load average (1 min) at the end {loadavg():.2f}; "
          f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    save(a.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
