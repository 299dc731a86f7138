"""`iobench stage` against `cp -r SRC DST && sync` (small files) and fio's read then write (large).

    .venv/bin/python scripts/bench/stage_vs_cp.py [--work DIR] [--dest DIR] [--sync all|dest]
        [--files 20000]
        [--large-mib 1024] [--large-files 2] [--repeat 3] [--verify full,size]
        [--before DIR [--before-only]] [--fpsync JOBS] [--json OUT]
        [--ranks [--slurm]]

Small files: a files-format cifar10 dataset of `--files` PNGs (`iobench generate`).
Each repetition runs, interleaved (the order turned round every other repetition):
`cp -r SRC DST && sync`, then `iobench stage` with each `--verify` mode (and, with
`--before DIR`, an older iobench importable from DIR beside it). Before every run
the destination is removed and synced, and the whole source is made cold the same
way for every contender: write-back and `POSIX_FADV_DONTNEED` of each source file
(`iobench.core.cache.evict`), residency measured after.

On a machine shared with other writers a global `sync` waits for their dirty data
too (20-73 s instead of 3 on this project's 2-core VM while another job wrote
checkpoints). There, give the copies a filesystem of their own (`--dest` on a loop
device: `truncate -s 6G d.img && mkfs.ext4 -q d.img && mount $(losetup --direct-io=on
-f --show d.img) MNT`) and `--sync dest`: cp's sync is then `sync -f DST`, the
destination's filesystem only, as iobench's fsyncs are.

Large files: a cosmoflow files-format dataset of `--large-files` files totalling
about `--large-mib` MiB. The anchor is fio's sequential copy of the same bytes in
one process: a cold read of the source files (`--rw=read --bs=16m`), then a write
of as many bytes (`--rw=write --bs=16m --end_fsync=1`); its time is the two jobs'
sum. `iobench stage --threads 1` (one copy process, the same count) times its copy.

Across ranks and nodes (`--ranks`, on the small files): `iobench stage` as one rank,
under `mpiexec -n 2` (one node, two ranks splitting it) and, with `--slurm`, under
`srun -N 2 --ntasks-per-node 1` (a cluster's two nodes; scripts/slurm/local-cluster.sh
makes two virtual ones on this host), in `replicate` and `shard` mode, each into
`DEST/{node}` from a cold source, interleaved. Prints each node's copy rate (its
bytes over its slowest rank's seconds: the result's `per_node`) against one rank's,
and checks that each node copied exactly its share: every file in replicate mode;
in shard mode the data files `sampling.files_for_rank` gives its ranks plus labels,
by bytes in the result and by the files on its disk.

Prints seconds and MB/s medians [min-max] and each contender's ratio to its anchor
(rate over the anchor's rate, per repetition side by side, then of the medians):
goal >= 0.8 for small files, >= 0.9 for large. iobench's seconds there are its
copy's (`stage_s`); beside them, the whole command's wall time (interpreter start,
manifest, eviction and residency before the copy, result file) over the anchor's
time, per repetition and of the medians: goal <= 1.5 for small files.

Before measuring, iobench's modules are compiled to bytecode once (as an installed
package has them): with PYTHONDONTWRITEBYTECODE set and no `__pycache__`, every
run would compile them again, seconds that no installed iobench pays.
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
from _gencommon import fmt, header, loadavg, median, save


def cold(root: Path) -> float:
    """Evict every file under `root` from the page cache; the resident fraction left."""
    from iobench.core import cache

    paths = [p for p in root.rglob("*") if p.is_file()]
    cache.evict(paths)
    return cache.resident_fraction(paths) or 0.0


def fresh(dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    os.sync()


def run_cp(src: Path, dst: Path, sync: str) -> float:
    """`cp -r SRC DST && sync` (`sync -f DST` with `sync` "dest"): wall seconds."""
    fresh(dst)
    cold(src)
    how = f"sync -f '{dst.parent}'" if sync == "dest" else "sync"
    t0 = time.perf_counter()
    subprocess.run(f"cp -r '{src}' '{dst}' && {how}", shell=True, check=True)
    return time.perf_counter() - t0


def run_fpsync(src: Path, dst: Path, sync: str, jobs: int) -> float:
    """fpart's parallel rsync (`fpsync -n JOBS SRC/ DST/`) then the same sync as cp's."""
    fresh(dst)
    cold(src)
    dst.mkdir(parents=True)
    how = f"sync -f '{dst.parent}'" if sync == "dest" else "sync"
    t0 = time.perf_counter()
    subprocess.run(f"fpsync -n {jobs} -t '{dst.parent}/.fpsync' '{src}/' '{dst}/' && {how}",
                   shell=True, check=True, capture_output=True)
    return time.perf_counter() - t0


def run_stage(src: Path, dst: Path, res: Path, extra: list[str],
              pythonpath: str | None = None) -> dict[str, Any]:
    """`iobench stage` from a cold source: its stage_s, checksum_s (when it says), wall."""
    fresh(dst)
    shutil.rmtree(res, ignore_errors=True)
    cold(src)
    argv = [sys.executable, "-m", "iobench", "stage", "--from", str(src), "--to", str(dst),
            "--results", str(res), "--no-progress", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=src.parent.parent)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"stage failed ({' '.join(argv)}):\n{r.stderr}")
    (doc,) = [json.loads(p.read_text()) for p in res.glob("stage-*.json")]
    if doc["source_cache"]["status"] != "cold":
        print(f"  warning: source not cold: {doc['source_cache']['warning']}")
    return {"seconds": doc["stage_s"], "wall_s": wall, "bytes": doc["stage_bytes"],
            "checksum_s": doc.get("checksum_s")}


def compile_iobench(pythonpath: str | None) -> None:
    """Byte-compile the iobench that runs (the `--before` tree's too) where it lacks .pyc."""
    import compileall

    import iobench

    for where in filter(None, [str(Path(iobench.__file__).parent), pythonpath]):
        compileall.compile_dir(where, quiet=1)


def fio_copy(src: Path, out: Path) -> float:
    """fio's cold sequential read of the source files, then a write of as many bytes with a
    final fsync, one process: the two jobs' seconds summed."""
    files = sorted(p for p in src.rglob("*") if p.is_file() and p.stat().st_size > 2**20)
    total = sum(p.stat().st_size for p in files)
    cold(src)
    names = ":".join(str(p).replace(":", "\\:") for p in files)
    rd = _fio(["--name=r", "--rw=read", "--bs=16m", f"--filename={names}",
               f"--size={total}"], "read")
    fresh(out)
    out.mkdir(parents=True)
    wr = _fio(["--name=w", "--rw=write", "--bs=16m", f"--size={total}", "--end_fsync=1",
               f"--directory={out}"], "write")
    shutil.rmtree(out, ignore_errors=True)
    return rd + wr


def _fio(args: list[str], kind: str) -> float:
    r = subprocess.run(["fio", *args, "--output-format=json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"fio failed:\n{r.stderr}")
    job = json.loads(r.stdout)["jobs"][0]
    return float(job["job_runtime"]) / 1e3 if kind == "write" else job[kind]["runtime"] / 1e3


def generate(storage: Path, dataset: str, samples: int, spf: int) -> Path:
    """The dataset, generated once (kept between runs of this script)."""
    root = storage / f"{dataset}-files"
    if not (root / "iobench.json").exists():
        storage.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "iobench", "generate", "--dataset", dataset,
                        "--format", "files", "--samples", str(samples), "--samples-per-file",
                        str(spf), "--jobs", "2", "--storage", str(storage)],
                       check=True, capture_output=True, cwd=storage.parent)
    return root


def contenders(a: argparse.Namespace, threads: list[str]) -> list[tuple[str, list[str], Any]]:
    """(name, stage options, PYTHONPATH) of each iobench run."""
    out = []
    if a.fpsync:
        out.append(("fpsync", ["fpsync"], None))
    for v in a.verify.split(","):
        if not a.before_only:
            out.append((f"stage --verify {v}", [*threads, "--verify", v], None))
        if a.before:  # the old code has --no-verify, not --verify
            opts = [*threads] + (["--no-verify"] if v == "size" else [])
            out.append((f"before --verify {v}", opts, a.before))
    return out


def bench(a: argparse.Namespace, src: Path, anchor: str, threads: list[str]) -> dict[str, Any]:
    """Every contender against the anchor, interleaved, `a.repeat` times."""
    runs = contenders(a, threads)
    secs: dict[str, list[float]] = {anchor: []}
    extra: dict[str, list[Any]] = {}
    nbytes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    for r in range(a.repeat):
        order = [(anchor, None, None), *runs]
        for name, opts, pp in (order if r % 2 == 0 else order[::-1]):  # A,B,.. then ..,B,A
            dst = a.dest
            if opts is None:
                s = (run_cp(src, dst, a.sync) if anchor.startswith("cp")
                     else fio_copy(src, a.dest.with_name("fio-w")))
            elif opts == ["fpsync"]:
                s = run_fpsync(src, dst, a.sync, a.fpsync)
            else:
                d = run_stage(src, dst, a.work / "res", opts, pp)
                s = d["seconds"]
                extra.setdefault(name, []).append(d)
            secs.setdefault(name, []).append(s)
        print(f"  repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in secs.items())
              + f"  (load {loadavg():.2f})", flush=True)
    fresh(a.dest)
    table(secs, extra, anchor, nbytes)
    return {"seconds": secs, "runs": extra, "bytes": nbytes}


def table(secs: dict[str, list[float]], extra: dict[str, list[Any]], anchor: str,
          nbytes: int) -> None:
    """The copy's seconds and rate against the anchor's, then (iobench runs) the whole
    command's wall seconds over the anchor's seconds."""
    print(f"\n| what | seconds | MB/s | rate / {anchor}, per repetition | checksum s | "
          f"whole command s | whole / {anchor}, per repetition |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, v in secs.items():
        ratio = "" if k == anchor else fmt([c / s for s, c in zip(v, secs[anchor],
                                                                   strict=True)], ".2f")
        ck = [d["checksum_s"] for d in extra.get(k, []) if d["checksum_s"] is not None]
        wall = [d["wall_s"] for d in extra.get(k, [])]
        whole = fmt([w / c for w, c in zip(wall, secs[anchor], strict=True)], ".2f") if wall else ""
        print(f"| {k} | {fmt(v, '.2f')} | {fmt([nbytes / 1e6 / s for s in v], '.1f')} | "
              f"{ratio} | {fmt(ck, '.2f') if ck else ''} | "
              f"{fmt(wall, '.2f') if wall else ''} | {whole} |")
    print("median ratios (rate / anchor's): " + ", ".join(
        f"{k} {median(secs[anchor]) / median(v):.2f}" for k, v in secs.items() if k != anchor))
    walls = {k: [d["wall_s"] for d in runs] for k, runs in extra.items()}
    if walls:
        print("median ratios (whole command / anchor's seconds): " + ", ".join(
            f"{k} {median(w) / median(secs[anchor]):.2f}" for k, w in walls.items()))


def launchers(slurm: bool) -> list[tuple[str, list[str]]]:
    """(name, argv in front of the python command) of each way to start the ranks."""
    from _gencommon import venv_bin

    out = [("1 rank", []), ("mpiexec -n 2", [venv_bin("mpiexec"), "-n", "2"])]
    if slurm:
        out.append(("srun -N 2", ["srun", "-N", "2", "--ntasks-per-node", "1", "--mpi=pmi2",
                                  "--kill-on-bad-exit=1"]))
    return out


def run_ranked(prefix: list[str], src: Path, dest: Path, res: Path,
               mode: str) -> dict[str, Any]:
    """One staging under a launcher into `dest/{node}`, from a cold source: the result's
    per-node figures, each node's bytes on disk, stage_s and the wall time."""
    fresh(dest)
    shutil.rmtree(res, ignore_errors=True)
    cold(src)
    argv = [*prefix, sys.executable, "-m", "iobench", "stage", "--from", str(src), "--to",
            f"{dest}/{{node}}", "--mode", mode, "--results", str(res), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=src.parent.parent)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"stage failed ({' '.join(argv)}):\n{r.stdout}{r.stderr}")
    (doc,) = [json.loads(p.read_text()) for p in res.glob("stage-*.json")]
    on_disk = {n["node"]: sum(p.stat().st_size
                              for p in (dest / str(n["node"]) / src.name).rglob("*")
                              if p.is_file() and p.name != "iobench.json")
               for n in doc["per_node"]}
    return {"stage_s": doc["stage_s"], "wall_s": wall, "per_node": doc["per_node"],
            "world_size": doc["config"]["world_size"], "on_disk": on_disk,
            "status": doc["source_cache"]["status"]}


def share_bytes(src: Path, ranks: list[int], world_size: int, mode: str) -> int:
    """The bytes a node whose ranks are `ranks` must receive (`cache.files_for_node`)."""
    from iobench.core import cache
    from iobench.core.manifest import Manifest

    m = Manifest.load(src)
    scope = "local" if mode == "shard" else "global"
    return sum(f.bytes for f in cache.files_for_node(m, ranks, world_size, scope))


def bench_ranks(a: argparse.Namespace, src: Path) -> dict[str, Any]:
    """Every launcher x mode, interleaved, `a.repeat` times; the per-node table."""
    runs = [(f"{name}, {mode}", prefix, mode) for name, prefix in launchers(a.slurm)
            for mode in ("replicate", "shard") if prefix or mode == "replicate"]
    got: dict[str, list[dict[str, Any]]] = {}
    for r in range(a.repeat):
        for name, prefix, mode in (runs if r % 2 == 0 else runs[::-1]):
            got.setdefault(name, []).append(run_ranked(prefix, src, a.dest, a.work / "res",
                                                       mode))
        print(f"  repeat {r + 1}: " + ", ".join(
            f"{k} {min(n['MBps'] for n in v[-1]['per_node']):.1f} MB/s/node"
            for k, v in got.items()) + f"  (load {loadavg():.2f})", flush=True)
    fresh(a.dest)
    ranks_table(got, src)
    return got


def ranks_table(got: dict[str, list[dict[str, Any]]], src: Path) -> None:
    """Per node: its copy rate against one rank's, and its bytes against its share."""
    base = [min(n["MBps"] for n in d["per_node"]) for d in got["1 rank, replicate"]]
    print("\n| launcher, mode | nodes x ranks | slowest node MB/s | / 1 rank's, per repetition "
          "| all nodes MB/s | stage_s | wall s | bytes per node (share; on disk) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, runs in got.items():
        mode = name.rsplit(", ", 1)[1]
        slow = [min(n["MBps"] for n in d["per_node"]) for d in runs]
        total = [sum(n["copied_bytes"] for n in d["per_node"]) / d["stage_s"] / 1e6
                 for d in runs]
        last = runs[-1]
        checks = []
        for n in last["per_node"]:
            want = share_bytes(src, n["ranks"], last["world_size"], mode)
            ok = all(d_n["copied_bytes"] == want and d["on_disk"][d_n["node"]] == want
                     for d in runs for d_n in d["per_node"] if d_n["node"] == n["node"])
            checks.append(f"node {n['node']}: {n['copied_bytes'] / 1e6:.2f} MB "
                          f"({want / 1e6:.2f}; {'exact' if ok else 'WRONG'})")
        shape = f"{len(last['per_node'])} x {last['world_size'] // len(last['per_node'])}"
        print(f"| {name} | {shape} | {fmt(slow, '.1f')} | "
              f"{fmt([s / b for s, b in zip(slow, base, strict=True)], '.2f')} | "
              f"{fmt(total, '.1f')} | {fmt([d['stage_s'] for d in runs], '.2f')} | "
              f"{fmt([d['wall_s'] for d in runs], '.2f')} | {'; '.join(checks)} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/iobench-bench-stage"))
    ap.add_argument("--dest", type=Path, default=None,
                    help="where the copies go (default WORK/dst); its parent holds fio's file")
    ap.add_argument("--sync", choices=("all", "dest"), default="all",
                    help="after cp: sync (all), or sync -f of the destination's filesystem "
                         "only (dest: other writers on a shared machine)")
    ap.add_argument("--files", type=int, default=20000, help="small PNGs (0: skip)")
    ap.add_argument("--large-mib", type=int, default=1024, help="large files' total (0: skip)")
    ap.add_argument("--large-files", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--verify", default="full,size")
    ap.add_argument("--threads", type=int, default=None, help="--threads for small files")
    ap.add_argument("--before", metavar="DIR", help="also run an older iobench from DIR")
    ap.add_argument("--fpsync", type=int, default=0, metavar="JOBS",
                    help="also run fpsync -n JOBS on the small files (apt-get install fpart)")
    ap.add_argument("--before-only", action="store_true", help="run only the code in --before")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--ranks", action="store_true",
                    help="the small files across ranks and nodes instead (one rank, "
                         "mpiexec -n 2; replicate and shard)")
    ap.add_argument("--slurm", action="store_true",
                    help="with --ranks: also srun -N 2 (a Slurm cluster up: SLURM_CONF)")
    a = ap.parse_args()
    a.work = a.work.resolve()
    a.dest = (a.dest or a.work / "dst").resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    compile_iobench(a.before)
    info = header(a.work)
    doc: dict[str, Any] = {"info": info}
    if a.files:
        src = generate(a.work / f"small-{a.files}", "cifar10", a.files, 1)
        print(f"\nsmall files: {a.files} PNGs in {src}")
        threads = ["--threads", str(a.threads)] if a.threads else []
        anchor = "cp -r && sync" + (" -f" if a.sync == "dest" else "")
        if a.ranks:
            doc["ranks"] = bench_ranks(a, src)
        else:
            doc["small"] = bench(a, src, anchor, threads)
    if a.large_mib:
        from iobench.core.datasets import DATASETS

        spf = max(1, a.large_mib * 2**20 // a.large_files // DATASETS["cosmoflow"].sample_nbytes)
        src = generate(a.work / f"large-{a.large_mib}", "cosmoflow", spf * a.large_files, spf)
        print(f"\nlarge files: {a.large_files} files of {spf} cosmoflow samples in {src}")
        doc["large"] = bench(a, src, "fio read+write", ["--threads", "1"])
    info["load_1min_end"] = loadavg()
    save(a.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
