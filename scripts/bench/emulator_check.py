"""Does the emulated parallel filesystem, configured from a real tier's probe, reproduce it?

Probes the one-box GlusterFS (`iobench probe --evict-cmd ...`, which writes an
emulated-tier profile), mounts `iobench emulate-pfs --profile <that file>` over
a local copy of the same datasets, and runs the same pure-ingest epochs
(`train --model none --no-decode`, cold) on both, interleaved repetition by
repetition. Prints a Markdown table: samples/s and MB/s per epoch on each,
median [min-max] over epochs and repetitions, and the ratio emulated / real
(the target: within 25 %), with the emulator daemon's own verdict on what
limited it.

    .venv/bin/python scripts/bench/emulator_check.py [--repeat 3] [--epochs 2] \
        [--work /var/tmp/iobench-real-tier] [--profile FILE] [--only cifar10-hdf5,...]

Root, GlusterFS packages and FUSE. Datasets are shared with real_tier.py's
--work directory (generated once, kept).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tiers as t

# name -> (dataset, format, samples, batch)
CELLS: dict[str, tuple[str, str, int, int]] = {
    "cifar10-hdf5": ("cifar10", "hdf5", 20000, 256),
    "cifar10-lmdb": ("cifar10", "lmdb", 20000, 256),
    "cifar10-files": ("cifar10", "files", 10000, 256),
    "cosmoflow-hdf5": ("cosmoflow", "hdf5", 64, 2),
    "cosmoflow-files": ("cosmoflow", "files", 64, 2),
    "imagenet-hdf5": ("imagenet", "hdf5", 2000, 64),
    "imagenet-files": ("imagenet", "files", 2000, 64),
}


def probe(pfs: Path, res: Path) -> Path:
    """Probe the GlusterFS volume cold; return the profile file it wrote."""
    out = res / "probe-gluster"
    shutil.rmtree(out, ignore_errors=True)
    (pfs / "probe").mkdir(parents=True, exist_ok=True)
    t.log("probing GlusterFS")
    t.run([*t.IOBENCH, "probe", "--storage", pfs / "probe", "--evict-cmd", t.EVICT,
           "--label", "GlusterFS", "--results", out])
    (path,) = out.glob("pfs-profile-*.json")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/iobench-real-tier"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--profile", type=Path, default=None,
                    help="a profile file to use instead of probing GlusterFS now")
    ap.add_argument("--only", default=",".join(CELLS))
    args = ap.parse_args()
    work, res = args.work, args.work / "results-emulator"
    pfs = t.gluster_up() / "iobench-real-tier"
    print(t.header("emulator vs GlusterFS") + f"; --repeat {args.repeat}, --epochs "
          f"{args.epochs}, --workers {args.workers}")
    profile = args.profile or probe(pfs, res)
    prof = json.loads(profile.read_text())["profile"]
    print(f"\nprofile {profile}: metadata {prof['metadata_ms']:.3f} ms, read request "
          f"{prof['read_ms']:.3f} ms, bandwidth {prof['bandwidth_MBps']:.0f} MB/s, IOPS cap "
          f"{prof['iops'] or 'none'}")
    names = args.only.split(",")
    roots = {}
    for name in names:
        ds, fmt, n, _ = CELLS[name]
        src = t.ensure_dataset(work / "src" / str(n), ds, fmt, n)
        t.ensure_copy(src, pfs / str(n))
        roots[name] = src
    emu = work / "emu"
    if emu.is_mount():  # left by an interrupted run
        t.subprocess.run([*t.IOBENCH, "emulate-pfs", "--unmount", str(emu)], env=t.ENV)
    emu.mkdir(parents=True, exist_ok=True)
    t.run([*t.IOBENCH, "emulate-pfs", "--backing", work / "src", "--mount", emu,
           "--profile", profile])
    figs: dict[str, dict[str, list[Any]]] = {n: {"real": [], "emu": [], "verdict": []}
                                             for n in names}
    try:
        for rep in range(args.repeat):
            for name in names:
                ds, fmt, n, batch = CELLS[name]
                common = ["--model", "none", "--no-decode", "--epochs", str(args.epochs),
                          "--workers", str(args.workers), "--batch-size", str(batch)]
                t.log(f"[{rep + 1}/{args.repeat}] {name}: GlusterFS")
                real = t.train(pfs / str(n), ds, fmt, res / name / "real",
                               [*common, "--evict-cmd", t.EVICT])
                t.log(f"[{rep + 1}/{args.repeat}] {name}: emulated")
                em = t.train(emu / str(n), ds, fmt, res / name / "emu", common)
                assert {e["cache"]["status"] for e in real["epochs"]} == {"cold"}, name
                figs[name]["real"] += real["epochs"]
                figs[name]["emu"] += em["epochs"]
                figs[name]["verdict"].append(_verdict(em))
    finally:
        t.run([*t.IOBENCH, "emulate-pfs", "--unmount", emu])
    print("\n| dataset | format | samples | GlusterFS samples/s | emulated samples/s | "
          "GlusterFS MB/s | emulated MB/s | emulated / real | within 25 % | emulator limited by |")
    print("|---" * 10 + "|")
    for name in names:
        ds, fmt, n, _ = CELLS[name]
        r = [e["summary"]["samples_per_s"] for e in figs[name]["real"]]
        e = [x["summary"]["samples_per_s"] for x in figs[name]["emu"]]
        rm = [x["summary"]["read_MBps"] for x in figs[name]["real"]]
        em = [x["summary"]["read_MBps"] for x in figs[name]["emu"]]
        ratio = statistics.median(e) / statistics.median(r)
        print(f"| {ds} | {fmt} | {n} | {t.fmt_spread(r, '.0f')} | {t.fmt_spread(e, '.0f')} | "
              f"{t.fmt_spread(rm, '.0f')} | {t.fmt_spread(em, '.0f')} | {ratio:.2f} | "
              f"{'yes' if abs(ratio - 1) <= 0.25 else 'NO'} | "
              f"{', '.join(sorted(set(figs[name]['verdict'])))} |")
    print("\nPure ingest (no model, no decode), cold: GlusterFS with the bricks' page cache "
          "emptied before every epoch (--evict-cmd), the emulator dropping its backing pages; "
          "per epoch, median [min-max] over epochs and repetitions; MB = 10^6 bytes.")
    return 0


def _verdict(doc: dict[str, Any]) -> str:
    """What limited the emulated tier over the run (its daemon's counters, per epoch)."""
    from iobench.pfs import stats

    limited = {stats.assess(e["tier_bytes"], doc["tier"]["profile"])["limited_by"]
               for e in doc["epochs"] if e.get("tier_bytes")}
    return "/".join(sorted(limited)) or "?"


if __name__ == "__main__":
    sys.exit(main())
