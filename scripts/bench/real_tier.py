"""The headline comparison on a real network filesystem: one-box GlusterFS ("PFS") vs local disk.

For every dataset and format: an emulated accelerator trains in place on the
GlusterFS volume (cold: the client's pages evicted and the bricks' page cache
emptied by `--evict-cmd scripts/pfs/local-gluster.sh evict` before every
epoch), then again after staging to the local disk (`--stage-to`, from a cold
source). It prints a Markdown table: stall per epoch, samples/s and AU on each
tier, staging time and its break-even, and the bricks' own count of what they
read from disk against what the epochs needed (the proof the PFS epochs were
cold). A second table shows how the cost of a metadata round trip per file
changes the answer: cifar10 as one file per sample at growing file counts.

    .venv/bin/python scripts/bench/real_tier.py [--repeat 3] [--epochs 2] \
        [--work /var/tmp/iobench-real-tier] [--only cosmoflow,imagenet] \
        [--files-counts 1000,10000,100000] [--no-metadata] [--no-matrix]

Root, with the GlusterFS packages (scripts/install-system-deps.sh). Datasets
are generated once on the local disk under --work, copied to the volume, and
kept for reruns (--clean removes them). MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tiers as t

# dataset -> (samples, batch per step, emulated step seconds, formats)
MATRIX: dict[str, tuple[int, int, float, tuple[str, ...]]] = {
    "cosmoflow": (64, 2, 0.04, ("hdf5", "netcdf", "lmdb", "files")),
    "cifar10": (20000, 256, 0.02, ("hdf5", "netcdf", "lmdb", "files")),
    "imagenet": (2000, 64, 0.05, ("files", "hdf5", "lmdb")),
}
META_BATCH, META_STEP = 256, 0.02


def cell(pfs: Path, work: Path, res: Path, dataset: str, fmt: str, samples: int, batch: int,
         step: float, args: argparse.Namespace, epochs: int) -> dict[str, Any]:
    """In place on the PFS, then staged to local disk; the figures of both."""
    src = t.ensure_dataset(work / "src" / str(samples), dataset, fmt, samples)
    on_pfs = t.ensure_copy(src, pfs / str(samples))
    common = ["--compute-time", str(step), "--batch-size", str(batch), "--workers",
              str(args.workers), "--epochs", str(epochs), "--repeat", str(args.repeat),
              "--no-decode", "--evict-cmd", t.EVICT]
    tag = f"{dataset}-{fmt}-{samples}"
    t.log(f"{tag}: in place on GlusterFS")
    b0 = t.brick_read_bytes()
    pfs_doc = t.train(on_pfs.parent, dataset, fmt, res / tag / "pfs", common)
    bricks = t.brick_read_bytes() - b0
    nvme = work / "nvme" / tag
    shutil.rmtree(nvme, ignore_errors=True)
    t.log(f"{tag}: staged to {nvme}")
    staged = t.train(on_pfs.parent, dataset, fmt, res / tag / "staged",
                     [*common, "--stage-to", str(nvme)])
    shutil.rmtree(nvme, ignore_errors=True)
    need = pfs_doc["summary"]["batch_bytes"]
    return {"dataset": dataset, "format": fmt, "samples": samples, "batch": batch, "step": step,
            "files": len(t.json.loads((src / "iobench.json").read_text())["files"]),
            "bytes": pfs_doc["dataset"]["total_bytes"], "pfs": pfs_doc, "staged": staged,
            "bricks_over_need": bricks / need if need else None}


def row(c: dict[str, Any]) -> str:
    p, s = c["pfs"], c["staged"]
    wp, ws = t.epoch_values(p, "wall_s"), t.epoch_values(s, "wall_s")
    stage_s = s["staging"]["stage_s"]
    gain = t.med(p, "epoch_wall_s") - t.med(s, "epoch_wall_s")
    be = f"{stage_s / gain:.2f}" if gain > 0 else "never"
    # n.s.: the epoch walls' ranges overlap, so the gain is within the spread
    if gain > 0 and min(wp) <= max(ws):
        be += " (n.s.)"
    return (f"| {c['dataset']} | {c['format']} | {c['files']} | {c['bytes'] / 1e6:.0f} | "
            f"{c['batch']} / {c['step']:g} s | "
            f"{t.fmt_spread(t.epoch_values(p, 'stall_s_max'), '.2f')} | "
            f"{t.fmt_spread(t.epoch_values(p, 'samples_per_s'), '.0f')} | "
            f"{t.med(p, 'au'):.2f} | {c['bricks_over_need']:.2f} | {t.statuses(p)} | "
            f"{t.fmt_spread(t.epoch_values(s, 'stall_s_max'), '.2f')} | "
            f"{t.fmt_spread(t.epoch_values(s, 'samples_per_s'), '.0f')} | "
            f"{t.med(s, 'au'):.2f} | {stage_s:.1f} | {be} |")


HEAD = ("| dataset | format | files | MB | batch / step | PFS stall s/epoch | PFS samples/s | "
        "PFS AU | bricks read / needed | PFS cache | local stall s/epoch | local samples/s | "
        "local AU | stage s | break-even epochs |\n" + "|---" * 15 + "|")


def probe_line(storage: Path, label: str, res: Path) -> str:
    out = res / f"probe-{label}"
    shutil.rmtree(out, ignore_errors=True)
    storage.mkdir(parents=True, exist_ok=True)
    t.run([*t.IOBENCH, "probe", "--storage", storage, "--size", "128M", "--runtime", "1",
           "--label", label, "--evict-cmd", t.EVICT, "--results", out])
    (doc,) = [d for d in map(t.json.loads, (p.read_text() for p in out.glob("probe-*.json")))]
    s = doc["summary"]
    return (f"| {label} | {doc['storage']['fstype']} ({doc['storage']['statfs_type']}) | "
            f"{s['seq_read_MBps']:.0f} | {s['rand4k_read_iops']:.0f} | {s['create_per_s']:.0f} | "
            f"{s['open_stat_close_per_s']:.0f} | {s['open_read_close_per_s']:.0f} | "
            f"{s['first_byte_ms_p50']:.3f} | {doc['cache_status']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/iobench-real-tier"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default=",".join(MATRIX), help="datasets of the matrix")
    ap.add_argument("--formats", default=None, help="only these formats (default: all)")
    ap.add_argument("--files-counts", default="1000,10000,100000")
    ap.add_argument("--meta-epochs", type=int, default=1,
                    help="epochs per run of the metadata sweep (100,000 files take minutes)")
    ap.add_argument("--no-matrix", action="store_true")
    ap.add_argument("--no-metadata", action="store_true")
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--clean", action="store_true", help="remove the datasets at the end")
    args = ap.parse_args()
    work, res = args.work, args.work / "results"
    pfs_mount = t.gluster_up()
    pfs = pfs_mount / "iobench-real-tier"
    print(t.header("real-tier comparison") + f"; --repeat {args.repeat}, --epochs "
          f"{args.epochs}, --workers {args.workers}; PFS: one-box GlusterFS at {pfs_mount}, "
          f"local: {work} ({t.run(['findmnt', '-no', 'FSTYPE', '--target', '/var/tmp']).stdout.strip()})")
    if not args.no_probe:
        print("\n| tier | fstype (statfs) | seq read MB/s | 4 KiB IOPS | creates/s | "
              "open+stat+close/s | open+read+close/s | first byte ms p50 | cache |\n"
              + "|---" * 9 + "|")
        print(probe_line(pfs / "probe", "GlusterFS", res), flush=True)
        print(probe_line(work / "probe", "local disk", res), flush=True)
    formats = set(args.formats.split(",")) if args.formats else None
    if not args.no_matrix:
        print("\n" + HEAD, flush=True)
        for ds in args.only.split(","):
            samples, batch, step, fmts = MATRIX[ds]
            for fmt in fmts:
                if formats and fmt not in formats:
                    continue
                print(row(cell(pfs, work, res, ds, fmt, samples, batch, step, args, args.epochs)),
                      flush=True)
    if not args.no_metadata:
        print("\nMetadata cost per file: cifar10, one file per sample\n\n" + HEAD, flush=True)
        for n in map(int, args.files_counts.split(",")):
            print(row(cell(pfs, work, res, "cifar10", "files", n, META_BATCH, META_STEP, args,
                           args.meta_epochs)), flush=True)
    print("\nstall: the slower rank's per epoch, median [min-max] over epochs and repetitions; "
          "AU: median; break-even = stage s / (PFS epoch s - local epoch s), medians, n.s. "
          "when the epoch walls' ranges overlap; bricks read / needed: the glusterfsd "
          "processes' read_bytes over the PFS run against the epochs' payload (>= 0.9: "
          "cold from disk). Every run --no-decode (I/O, not preprocessing).")
    if args.clean:
        shutil.rmtree(pfs, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
