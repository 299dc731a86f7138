"""Validate `iobench project` on the emulated parallel filesystem: predicted vs measured at N = 1, 2, 4.

One emulated tier (`iobench emulate-pfs`: one bandwidth cap and one metadata
latency shared by every reader of the mount) stands in for the shared PFS,
and N clients are N MPI ranks reading it at once (`mpiexec -n N iobench
train`, synchronous steps, each reading 1/N of the epoch, as N one-rank
nodes would). The script:

1. generates a small dataset on local disk and serves it through the tier;
2. probes the tier (`iobench probe`, its limits) and measures one client
   (`train`, and `stage` of one node);
3. projects N = 1, 2, 4 from those alone (`iobench project`);
4. measures N = 2 and 4: training (`mpiexec -n N`), staging replicated (N
   `iobench stage` processes at once, each a full copy, through a
   `--direct-io` remount so that no process reads another's pages from the
   one client cache) and sharded (`mpiexec -n N iobench stage`: one copy
   spread over N ranks);
5. prints predicted vs measured stall per epoch, AU, steady step and staging
   time per N, with the error (target: within 25 %), and the box's load;
6. and, per N, what tells a CPU-bound run from a tier-bound one: the cores
   the training's processes, the tier's daemon and the whole box used while
   the tier served (from /proc every 0.5 s), and the share of rank 0's steady
   stall in the first half of each epoch (from its `--trace`: the client
   cache's front-loading of a shuffled epoch, docs/projection.md).

    .venv/bin/python scripts/bench/project_validate.py [--work /tmp/iobench-project-validate] \
        [--nodes 1,2,4] [--bandwidth 12] [--compute 0.1] [--samples 16384] [--batch 256]

Needs FUSE and MPICH (the venv's mpiexec). About 5-10 minutes on 2 cores.

With `--gluster` the tier is the one-box GlusterFS instead (root;
scripts/pfs/local-gluster.sh, brought up if it is not): the dataset is copied
to MNT/s10-project, the probe writes its scratch files to MNT/s10-probe, every
probe, train and stage run empties the bricks' caches (`--evict-cmd
'local-gluster.sh evict'`), and the replicated staging reads through a second
GlusterFS client mounted with `direct-io-mode=enable` (WORK/gluster-direct)
in place of the emulator's `--direct-io` remount. --bandwidth and the
latencies then do not apply.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
IOBENCH = [sys.executable, "-m", "iobench"]
MPIEXEC = str(BIN / "mpiexec") if (BIN / "mpiexec").exists() else "mpiexec"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
TARGET = 0.25
GLUSTER = REPO / "scripts" / "pfs" / "local-gluster.sh"
GLUSTER_EVICT = ["--evict-cmd", f"{GLUSTER} evict"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[Any]) -> str:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return r.stdout


def one(d: Path, pattern: str = "*.json") -> dict[str, Any]:
    (path,) = sorted(d.glob(pattern))
    return json.loads(path.read_text())


def mount(a: argparse.Namespace, backing: Path, mnt: Path, direct: bool) -> None:
    if (mnt / ".iobench-pfs-stats").exists():
        run([*IOBENCH, "emulate-pfs", "--unmount", mnt])
    mnt.mkdir(parents=True, exist_ok=True)
    run([*IOBENCH, "emulate-pfs", "--backing", backing, "--mount", mnt, "--bandwidth",
         a.bandwidth, "--open-latency", a.open_latency, "--read-latency", a.read_latency,
         *(["--direct-io"] if direct else [])])


def _proc_cpu() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Every process's children and CPU seconds (user + system), from /proc."""
    kids: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        f = text[text.rindex(")") + 2:].split()
        kids.setdefault(int(f[1]), []).append(int(name))
        cpu[int(name)] = (int(f[11]) + int(f[12])) / tick
    return kids, cpu


def _tree_cpu(root: int) -> float:
    """CPU seconds of the live processes under `root` (the ranks and their loader workers)."""
    kids, cpu = _proc_cpu()
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += kids.get(pid, [])
    return total


def _box_busy() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def _tier_now(mnt: Path) -> tuple[float, float]:
    try:
        c = json.loads((mnt / ".iobench-pfs-stats").read_text())["counters"]
        return float(c["bytes_served"]), float(c["daemon_cpu_s"])
    except (OSError, ValueError, KeyError):
        return 0.0, 0.0


def sampled(cmd: list[Any], mnt: Path, every: float = 0.5) -> dict[str, float]:
    """Run `cmd`, sampling every `every` s while the tier serves (> 1 MB/s, i.e. in the
    epochs, start-up left out): cores used by the command's processes, by the tier's daemon
    and by the whole box (CPU seconds per wall second, means over those samples)."""
    proc = subprocess.Popen([str(c) for c in cmd], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    rows: list[tuple[float, float, float]] = []
    (b0, t0), (s0, d0), c0 = _box_busy(), _tier_now(mnt), 0.0
    while proc.poll() is None:
        time.sleep(every)
        (b1, t1), (s1, d1), c1 = _box_busy(), _tier_now(mnt), _tree_cpu(proc.pid)
        if (s1 - s0) / every > 1e6:
            rows.append(((c1 - c0) / every, (d1 - d0) / every,
                         (b1 - b0) / max(t1 - t0, 1) * (os.cpu_count() or 1)))
        (b0, t0), (s0, d0), c0 = (b1, t1), (s1, d1), max(c0, c1)
    out = proc.communicate()[0]
    if proc.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        sys.exit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    if not rows:  # a tier without the emulator's counters: nothing says when it served
        return dict.fromkeys(("run_cores", "daemon_cores", "box_cores"), float("nan"))
    n = len(rows)
    return {"run_cores": sum(r[0] for r in rows) / n, "daemon_cores": sum(r[1] for r in rows) / n,
            "box_cores": sum(r[2] for r in rows) / n}


def train(a: argparse.Namespace, mnt: Path, out: Path, n: int) -> tuple[Path, dict[str, float]]:
    """`mpiexec -n N iobench train` on the tier, with a trace; its result and CPU use."""
    log(f"train, {n} rank(s) at once")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cpu = sampled([MPIEXEC, "-n", n, *IOBENCH, "train", "--loader", "hdf5", "--storage", mnt,
                   "--compute-time", a.compute, "--epochs", a.epochs, "--batch-size", a.batch,
                   "--workers", a.workers, "--shuffle", a.shuffle, "--results", out,
                   "--trace", out / "trace.trace", *(GLUSTER_EVICT if a.gluster else [])], mnt)
    (path,) = out.glob("*.json")
    return path, cpu


def first_half(trace: Path) -> float:
    """Of rank 0's steady stall (every wait but each epoch's first), the share in the first
    half of its epoch's steps (0.5: spread evenly), median over epochs."""
    waits: dict[int, list[tuple[int, float]]] = {}
    for e in json.loads(trace.read_text())["traceEvents"]:
        if e.get("name") == "wait" and e.get("pid") == 0 and "dur" in e:
            waits.setdefault(e["args"]["epoch"], []).append((e["args"]["step"], e["dur"]))
    shares = []
    for steps in waits.values():
        steps.sort()
        rest = steps[1:]
        total = sum(d for _, d in rest)
        half = sum(d for k, d in rest if k < (len(steps) + 1) // 2)
        shares.append(half / total if total else 0.5)
    return statistics.median(shares) if shares else float("nan")


def stage_replicate(mnt: Path, work: Path, n: int, extra: tuple[str, ...] = ()) -> float:
    """N full copies at once (N processes): the slowest one's stage_s."""
    log(f"stage, replicate: {n} process(es) at once")
    procs, outs = [], []
    for i in range(n):
        dest, res = work / f"local-{n}-{i}", work / f"stage-{n}-{i}"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.rmtree(res, ignore_errors=True)
        outs.append(res)
        procs.append(subprocess.Popen(
            [*IOBENCH, "stage", "--from", str(mnt), "--to", str(dest), "--no-progress",
             "--results", str(res), *extra], env=ENV, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"stage failed: {err[-800:]}")
    return max(float(one(r)["stage_s"]) for r in outs)


def stage_shard(mnt: Path, work: Path, n: int, extra: tuple[str, ...] = ()) -> float:
    """One copy spread over N ranks (`mpiexec -n N iobench stage`)."""
    log(f"stage, one copy over {n} rank(s)")
    dest, res = work / f"shard-{n}", work / f"stage-shard-{n}"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(res, ignore_errors=True)
    run([MPIEXEC, "-n", n, *IOBENCH, "stage", "--from", mnt, "--to", dest, "--no-progress",
         "--results", res, *extra])
    return float(one(res)["stage_s"])


def gluster_tier(backing: Path, work: Path, direct: bool) -> Path:
    """--gluster: the dataset's copy on the one-box GlusterFS, through a second client
    mounted with direct-io-mode=enable when `direct` (no page cache shared by the copies)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _tiers

    root = _tiers.gluster_up()
    _tiers.ensure_copy(backing / "cifar10-hdf5", root / "s10-project")
    if not direct:
        return root / "s10-project"
    dmnt = work / "gluster-direct"
    dmnt.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", str(dmnt)]).returncode != 0:
        run(["mount", "-t", "glusterfs", "-o", "direct-io-mode=enable",
             f"{os.uname().nodename}:/iobench", dmnt])
    return dmnt / "s10-project"


def measured(path: Path, cpu: dict[str, float]) -> dict[str, float]:
    doc = json.loads(path.read_text())
    eps = doc["epochs"]
    steps = [max((r["wall_s"] - (r["first_batch_s"] or 0)) / r["steps"] for r in e["ranks"])
             for e in eps]
    return {"stall_s": statistics.median(e["summary"]["stall_s_max"] for e in eps),
            "au": statistics.median(e["summary"]["au_min"] for e in eps),
            "step_s": statistics.median(steps),
            "first_s": statistics.median(max(r["first_batch_s"] for r in e["ranks"])
                                         for e in eps),
            "spread_stall": (max(e["summary"]["stall_s_max"] for e in eps)
                             - min(e["summary"]["stall_s_max"] for e in eps)),
            "first_half": first_half(path.parent / "trace.trace"), **cpu}


def err(pred: float, meas: float) -> str:
    e = (pred - meas) / meas if meas else float("inf")
    return f"{e:+.0%}{'' if abs(e) <= TARGET else ' MISS'}"


def table(proj: dict[str, Any], meas: dict[int, dict[str, float]]) -> list[str]:
    """Predicted vs measured per N; the first batch apart (its share of the stall)."""
    pts = {p["nodes"]: p for p in proj["points"]}
    compute = next(f["value"] for f in proj["figures"] if f["name"] == "compute per step")
    out = ["| N | stall/epoch s pred | meas | err | first batch s pred | meas | AU pred | meas "
           "| err | step s pred | meas | err | sim AU | stage repl s pred | meas | err "
           "| stage shard s pred | meas | err |", "|---|" + "---|" * 18]
    for n, m in sorted(meas.items()):
        p = pts[n]
        first = p["stall_s"] - (p["steps_per_epoch"] - 1) * (p["step_s"] - compute)
        sim = "-" if p.get("simulated_au") is None else f"{p['simulated_au']:.2f}"
        out.append(
            f"| {n} | {p['stall_s']:.2f} | {m['stall_s']:.2f} | {err(p['stall_s'], m['stall_s'])} "
            f"| {first:.2f} | {m['first_s']:.2f} "
            f"| {p['au']:.2f} | {m['au']:.2f} | {err(p['au'], m['au'])} "
            f"| {p['step_s']:.3f} | {m['step_s']:.3f} | {err(p['step_s'], m['step_s'])} "
            f"| {sim} | {p['stage_replicate_s']:.2f} | {m['replicate_s']:.2f} "
            f"| {err(p['stage_replicate_s'], m['replicate_s'])} | {p['stage_shard_s']:.2f} "
            f"| {m['shard_s']:.2f} | {err(p['stage_shard_s'], m['shard_s'])} |")
    return out


def cpu_table(meas: dict[int, dict[str, float]]) -> list[str]:
    """Per N, while the tier served: cores the training used (ranks and loader workers), the
    tier's daemon, and the whole box (other sessions' work included), of os.cpu_count(); and
    the share of the steady stall in the first half of the epoch (the client cache's
    front-loading: 0.5 would be even)."""
    out = [f"| N | training cores | daemon cores | box busy cores (of {os.cpu_count()}) "
           "| steady stall in the epoch's first half |", "|---|---|---|---|---|"]
    out += [f"| {n} | {_cores(m['run_cores'])} | {_cores(m['daemon_cores'])} "
            f"| {_cores(m['box_cores'])} | {m['first_half']:.0%} |"
            for n, m in sorted(meas.items())]
    return out


def _cores(v: float) -> str:
    return "n/a (no tier counters)" if math.isnan(v) else f"{v:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/iobench-project-validate"))
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--bandwidth", default="12", help="MB/s cap of the tier (default 12)")
    ap.add_argument("--open-latency", default="0.5", help="ms (default 0.5)")
    ap.add_argument("--read-latency", default="0.3", help="ms (default 0.3)")
    ap.add_argument("--samples", default="16384", help="cifar10 samples (default 16384)")
    ap.add_argument("--batch", default="256", help="batch per rank (default 256)")
    ap.add_argument("--compute", default="0.1", help="emulated s per step (default 0.1)")
    ap.add_argument("--workers", default="2", help="loader workers per rank (default 2)")
    ap.add_argument("--shuffle", default="global", help="sample order (default global)")
    ap.add_argument("--epochs", default="2", help="epochs per run (default 2)")
    ap.add_argument("--probe-sample", default="3072",
                    help="bytes of the probe's random reads: the samples' size, for the "
                         "request-rate limit (default 3072, cifar10's)")
    ap.add_argument("--gluster", action="store_true",
                    help="the one-box GlusterFS as the tier instead of the emulator (root)")
    a = ap.parse_args()
    nodes = [int(x) for x in a.nodes.split(",")]
    work = a.work
    backing, mnt, res = work / "backing", work / "mnt", work / "res"
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    if not (backing / "cifar10-hdf5" / "iobench.json").is_file():
        log("generating cifar10/hdf5")
        run([*IOBENCH, "generate", "--dataset", "cifar10", "--format", "hdf5", "--samples",
             a.samples, "--samples-per-file", "1024", "--storage", backing, "--force"])
    meas: dict[int, dict[str, float]] = {}
    try:
        if a.gluster:
            mnt = gluster_tier(backing, work, direct=False)
            (mnt.parent / "s10-probe").mkdir(exist_ok=True)
            where = ["--storage", mnt.parent / "s10-probe", *GLUSTER_EVICT]
        else:
            mount(a, backing, mnt, direct=False)
            where = ["--storage", mnt, "--write-via", backing]
        shutil.rmtree(res, ignore_errors=True)
        log("probe of the tier")
        run([*IOBENCH, "probe", *where, "--size", "16M",
             "--readers", "1,4", "--runtime", "1", "--metadata-files", "100",
             "--sample-size", a.probe_sample,
             "--engine", "python", "--results", res / "probe"])
        trained = {n: train(a, mnt, res / f"train-{n}", n) for n in nodes}
        runs = {n: t[0] for n, t in trained.items()}
        extra = tuple(GLUSTER_EVICT) if a.gluster else ()
        direct = gluster_tier(backing, work, direct=True) if a.gluster else mnt
        if not a.gluster:
            mount(a, backing, mnt, direct=True)
        for n in nodes:
            meas[n] = {**measured(*trained[n]),
                       "replicate_s": stage_replicate(direct, work, n, extra),
                       "shard_s": stage_shard(mnt, work, n, extra)}
    finally:
        if a.gluster:
            subprocess.run(["umount", str(work / "gluster-direct")], capture_output=True)
        else:
            subprocess.run([*IOBENCH, "emulate-pfs", "--unmount", str(mnt), "--lazy"],
                           env=ENV, capture_output=True)
    (probe,) = (res / "probe").glob("probe-*.json")
    (stage1,) = (work / "stage-1-0").glob("stage-*.json")
    log("project from N = 1")
    cmd = [*IOBENCH, "project", "--train", runs[nodes[0]], "--probe", probe, "--stage", stage1,
           "--nodes", a.nodes, "--simulate-max-nodes", max(nodes), "--results", res / "proj"]
    projection_text = run(cmd)
    proj = one(res / "proj", "projection-*.json")
    load_after = os.getloadavg()
    print(f"# iobench project validation, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    tier = ("one-box GlusterFS (2 bricks, cold: --evict-cmd)" if a.gluster else
            f"emulated, {a.bandwidth} MB/s cap, {a.open_latency} ms open, "
            f"{a.read_latency} ms per read")
    print(f"tier: {tier}; cifar10/hdf5 {a.samples} samples, batch {a.batch}, "
          f"{a.workers} workers, compute {a.compute} s/step, shuffle {a.shuffle}, "
          f"{a.epochs} epochs (medians over epochs)")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}, "
          f"on {os.cpu_count()} CPUs")
    print(f"fitted latency per batch {proj['model']['latency_s']:.4f} s; "
          f"local write per chunk {proj['model']['local_write_s']:.4f} s")
    print("\n".join(table(proj, meas)))
    print("measured stall spread over epochs (max - min, s): "
          + ", ".join(f"N={n}: {m['spread_stall']:.2f}" for n, m in sorted(meas.items())))
    k = next(f for f in proj["figures"] if f["name"].startswith("samples per tier request"))
    print(f"samples per tier request k = {k['value']:.2f} ({k['source']})")
    print("\n".join(cpu_table(meas)))
    print("\n" + " ".join(map(str, cmd[2:])))
    print(projection_text.split("\n\n", 1)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
