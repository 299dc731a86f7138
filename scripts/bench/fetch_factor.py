"""Check `iobench project`'s fetch factor: N client caches fetch a request of k samples H (1 - (1 - 1/H)^k) times.

On a cluster every node has its own client page cache, so a tier request
holding k small samples is fetched once by every node that reads one of
them in a globally shuffled epoch (docs/projection.md, "Each host's client
cache fetches its own"). One box can show it with one GlusterFS client
(one FUSE daemon, one page cache) per reader: the script mounts the one-box
volume N times, gives reader r every N-th sample of a seeded permutation
(as a distributed sampler does), and has the N readers read their samples
at once, each through its own mount, cold (the mounts' pages dropped, the
bricks' by `local-gluster.sh evict`). Each mount's FUSE daemon counts its
reads (`core.fusedaemon`: its replies over the calibrated replies per read).
k is the samples per read at N = 1; the table gives the reads at each N over
N = 1's against H (1 - (1 - 1/H)^k) with H = N.

    eval "$(scripts/pfs/local-gluster.sh up)"
    .venv/bin/python scripts/bench/fetch_factor.py --data MNT/DIR/data/cifar10-hdf5 \
        [--work /var/tmp/iobench-fetch-factor] [--readers 1,2,4,8] [--repeat 2]

The dataset: an `iobench generate` HDF5 dataset (contiguous `samples`, as
cifar10's) already on the volume. Reads are the samples' byte ranges by
pread, the page-cache pattern of the HDF5 loader's sample reads. Root (mount).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from iobench.core.fusedaemon import Uncalibrated, calibrate, find_daemon
from iobench.core.projection import fetches_per_request

REPO = Path(__file__).resolve().parents[2]
GLUSTER = REPO / "scripts" / "pfs" / "local-gluster.sh"


def layout(root: Path) -> list[tuple[str, int, int, int]]:
    """(file name, offset of sample 0, bytes per sample, samples) per HDF5 file."""
    out = []
    for f in sorted(root.glob("*.h5")):
        with h5py.File(f, "r") as h:
            d = h["samples"]
            if d.chunks is not None:
                sys.exit(f"{f}: chunked samples; give a contiguous (cifar10-like) dataset")
            per = int(np.prod(d.shape[1:])) * d.dtype.itemsize
            out.append((f.name, int(d.id.get_offset()), per, int(d.shape[0])))
    if not out:
        sys.exit(f"{root}: no *.h5 files")
    return out


def volume_of(path: Path) -> str:
    """The `host:/volume` source of the GlusterFS mount holding `path`."""
    best = ("", "")
    with open("/proc/mounts") as f:
        for line in f:
            src, mnt, kind = line.split()[:3]
            if kind == "fuse.glusterfs" and str(path).startswith(mnt) and len(mnt) > len(best[1]):
                best = (src, mnt)
    if not best[0]:
        sys.exit(f"{path} is not on a GlusterFS mount")
    return best[0] + "|" + best[1]


def mounts(work: Path, source: str, n: int) -> list[Path]:
    """n client mounts of the volume (one FUSE daemon and page cache each)."""
    out = []
    for i in range(n):
        m = work / f"m{i}"
        m.mkdir(parents=True, exist_ok=True)
        if subprocess.run(["mountpoint", "-q", str(m)]).returncode != 0:
            subprocess.run(["mount", "-t", "glusterfs", source, str(m)], check=True)
        out.append(m)
    return out


def evict(dirs: list[Path]) -> None:
    """Drop every mount's pages of the dataset, then the bricks'."""
    for d in dirs:
        for f in d.glob("*.h5"):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    subprocess.run([str(GLUSTER), "evict"], check=True, capture_output=True)


def read_share(root: str, files: list[tuple[str, int, int, int]], order: list[int]) -> None:
    """Read the samples `order` (global indices) through `root`, a pread each."""
    starts = np.cumsum([0] + [f[3] for f in files])
    fds = [os.open(os.path.join(root, f[0]), os.O_RDONLY) for f in files]
    try:
        for g in order:
            i = int(np.searchsorted(starts, g, side="right")) - 1
            _, base, per, _ = files[i]
            os.pread(fds[i], per, base + (g - int(starts[i])) * per)
    finally:
        for fd in fds:
            os.close(fd)


def one_epoch(dirs: list[Path], files: list[tuple[str, int, int, int]], seed: int,
              costs: list[float]) -> float:
    """Reads the N mounts' daemons made for one cold epoch split over N readers."""
    total = sum(f[3] for f in files)
    perm = np.random.default_rng(seed).permutation(total)
    daemons = [find_daemon(str(d)) for d in dirs]
    if any(x is None for x in daemons):
        sys.exit("a mount's FUSE daemon was not found")
    evict(dirs)
    before = [x.counters()["daemon_replies"] for x in daemons if x is not None]
    procs = [mp.Process(target=read_share, args=(str(d), files, perm[r::len(dirs)].tolist()))
             for r, d in enumerate(dirs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"a reader failed ({p.exitcode})")
    after = [x.counters()["daemon_replies"] for x in daemons if x is not None]
    return sum((a - b) / c for a, b, c in zip(after, before, costs, strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="the dataset on the volume")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/iobench-fetch-factor"))
    ap.add_argument("--readers", default="1,2,4,8")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    counts = [int(x) for x in a.readers.split(",")]
    source, mnt = volume_of(a.data.resolve()).split("|")
    rel = a.data.resolve().relative_to(mnt)
    files = layout(a.data)
    ms = mounts(a.work, source, max(counts))
    try:
        return measure(a, counts, files, [m / rel for m in ms])
    finally:
        for m in ms:
            subprocess.run(["umount", str(m)], capture_output=True)


def measure(a: argparse.Namespace, counts: list[int], files: list[tuple[str, int, int, int]],
            dirs: list[Path]) -> int:
    """Calibrate each mount's daemon, read `a.repeat` cold epochs at each N, print the table."""
    samples = sum(f[3] for f in files)
    costs = []
    for d in dirs:
        daemon = find_daemon(str(d))
        if daemon is None:
            sys.exit(f"{d}: no FUSE daemon serving it found on this host")
        cost = calibrate(daemon, [d / files[0][0]])
        if isinstance(cost, Uncalibrated):
            sys.exit(f"{d}: could not calibrate its FUSE daemon's replies per read: "
                     f"{cost.reason}")
        costs.append(cost.replies_per_read)
    reads: dict[int, list[float]] = {n: [] for n in counts}
    for rep in range(a.repeat):  # interleaved: every N once per repetition
        for n in counts:
            reads[n].append(one_epoch(dirs[:n], files, seed=rep, costs=costs[:n]))
    base = statistics.median(reads[counts[0]])
    k = samples / base
    print(f"# fetch factor, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {samples} "
          f"samples of {files[0][2]} bytes in {len(files)} files, {a.repeat} cold epochs per N "
          f"(medians); k = {k:.3f} samples per read at N = {counts[0]}")
    print("| readers (own mount each) | reads per epoch | over N=1 measured | "
          "H (1 - (1 - 1/H)^k) | its error |")
    print("|---|---|---|---|---|")
    for n in counts:
        r = statistics.median(reads[n])
        want = fetches_per_request(k, n) / fetches_per_request(k, counts[0])
        print(f"| {n} | {r:,.0f} [{min(reads[n]):,.0f}-{max(reads[n]):,.0f}] | {r / base:.3f} | "
              f"{want:.3f} | {(want - r / base) / (r / base):+.1%} |")  # (model - meas) / meas
    print(json.dumps({"k": k, "reads": reads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
