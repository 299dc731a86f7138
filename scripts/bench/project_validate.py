"""Validate `iobench project` on the emulated parallel filesystem: predicted vs measured at N = 1, 2, 4.

One emulated tier (`iobench emulate-pfs`: one bandwidth cap and one metadata
latency shared by every reader of the mount) stands in for the shared PFS,
and N clients are N MPI ranks reading it at once (`mpiexec -n N iobench
train`, synchronous steps, each reading 1/N of the epoch, as N one-rank
nodes would). The script:

1. generates a small dataset on local disk and serves it through the tier;
2. probes the tier `--probes` times, one before each training run and the
   rest after (`iobench probe`, its limits; its buffered random reads at the
   loaders' reader counts, W and W x max N, give the request rate) and
   measures one client (`train`, and `stage` of one node);
3. projects N = 1, 2, 4 from those alone (`iobench project`: the probes'
   medians, their least and greatest in the [spread]; `--reproject` again
   from a finished run's WORK/measured.json), with the N clients as nodes of
   one host (`--nodes-per-host`) and the per-step synchronisation that every
   N > 1 pays and N = 1 does not (`--step-sync-ms`), measured without the
   tier: two ranks' steady step less one rank's, both from the local copy
   with a warm cache;
4. measures N = 2 and 4: training (`mpiexec -n N`), staging replicated (N
   `iobench stage` processes at once, each a full copy, through a
   `--direct-io` remount so that no process reads another's pages from the
   one client cache) and sharded (`mpiexec -n N iobench stage`: one copy
   spread over N ranks); the sharded copies and N = 1's replicated one (the
   projection's staging input) are each the median of three cold copies
   (`--repeat 3`), the N replicating processes copy once (each would evict
   the tier during the others' copies);
5. prints predicted vs measured stall per epoch, first batch, AU, the
   epoch's mean step after its first batch ((wall - first batch) / steps,
   as train's step is measured) and staging time per N, with the error
   (target: within 25 %), and the box's load;
6. and, per N, what tells a CPU-bound run from a tier-bound one: the cores
   the training's processes, the tier's daemon and the whole box used while
   the tier served (from /proc every 0.5 s), and the share of rank 0's steady
   stall in the first half of each epoch (from its `--trace`: the client
   cache's front-loading of a shuffled epoch, docs/projection.md); the same
   cores while the copies ran, and a warning where a copy moved the data
   well under the tier's probed bandwidth with every core busy (the box's
   CPU, shared by the N clients, set its pace).

    .venv/bin/python scripts/bench/project_validate.py [--work /tmp/iobench-project-validate] \
        [--nodes 1,2,4] [--bandwidth 12] [--compute 0.1] [--samples 16384] [--batch 256]

Needs FUSE and MPICH (the venv's mpiexec). About 5-10 minutes on 2 cores.

With `--gluster` the tier is the one-box GlusterFS instead (root;
scripts/pfs/local-gluster.sh, brought up if it is not): the dataset is copied
to MNT/DIR/data (DIR: --gluster-dir), the probe writes its scratch files to MNT/DIR/probe, every
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
# what a --reproject prints from the measured run rather than from its own command line
SAVED_CONFIG = ("samples", "batch", "workers", "compute", "shuffle", "epochs", "bandwidth",
                "open_latency", "read_latency", "gluster")
GLUSTER = REPO / "scripts" / "pfs" / "local-gluster.sh"
GLUSTER_EVICT = ["--evict-cmd", f"{GLUSTER} evict"]
REPEAT = ("--repeat", "3")  # stage: the median of three cold copies


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
    """Every process's children and CPU seconds (user + system, its own and its reaped
    children's), from /proc."""
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
        # its own and its reaped children's (a loader worker or rank that ended still counts)
        cpu[int(name)] = sum(int(x) for x in f[11:15]) / tick
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
    """The emulated tier's (bytes served, daemon CPU seconds) so far."""
    try:
        c = json.loads((mnt / ".iobench-pfs-stats").read_text())["counters"]
        return float(c["bytes_served"]), float(c["daemon_cpu_s"])
    except (OSError, ValueError, KeyError):
        return 0.0, 0.0


def _gluster_now() -> tuple[float, float]:
    """GlusterFS's (CPU seconds, CPU seconds) so far: its FUSE clients and brick daemons
    (every user's: the volume is shared), as both the serving signal and the daemon's use."""
    _, cpu = _proc_cpu()
    total = 0.0
    for pid, secs in cpu.items():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() in ("glusterfs", "glusterfsd"):
                total += secs
        except OSError:
            continue
    return total, total


class Tier:
    """What says the tier serves: `now()` -> (signal, daemon CPU s) and the signal's rate
    above which it counts as serving (emulator: 1 MB/s; GlusterFS: 0.1 core of its own)."""

    def __init__(self, mnt: Path, gluster: bool) -> None:
        self.mnt, self.gluster = mnt, gluster
        self.busy = 0.1 if gluster else 1e6

    def now(self) -> tuple[float, float]:
        return _gluster_now() if self.gluster else _tier_now(self.mnt)


def watch(procs: list[subprocess.Popen[str]], tier: Tier, every: float = 0.5
          ) -> dict[str, float]:
    """Sample every `every` s while `procs` run and the tier serves (the start-up left out):
    cores used by the processes' trees, by the tier's daemons and by the whole box (CPU
    seconds per wall second, means over those samples; NaN when it never served)."""
    rows: list[tuple[float, float, float]] = []
    (b0, t0), (s0, d0), c0, w0 = _box_busy(), tier.now(), 0.0, time.monotonic()
    while any(p.poll() is None for p in procs):
        time.sleep(every)
        (b1, t1), (s1, d1), w1 = _box_busy(), tier.now(), time.monotonic()
        c1 = sum(_tree_cpu(p.pid) for p in procs if p.poll() is None)
        dt = max(w1 - w0, 1e-3)
        if (s1 - s0) / dt > tier.busy and c1 >= c0:  # (c1 < c0: a process ended unreaped)
            rows.append(((c1 - c0) / dt, (d1 - d0) / dt,
                         (b1 - b0) / max(t1 - t0, 1) * (os.cpu_count() or 1)))
        (b0, t0), (s0, d0), c0, w0 = (b1, t1), (s1, d1), c1, w1
    if not rows:
        return dict.fromkeys(("run_cores", "daemon_cores", "box_cores"), float("nan"))
    n = len(rows)
    return {"run_cores": sum(r[0] for r in rows) / n, "daemon_cores": sum(r[1] for r in rows) / n,
            "box_cores": sum(r[2] for r in rows) / n}


def sampled(cmd: list[Any], tier: Tier) -> dict[str, float]:
    """Run `cmd` (exit on failure), with `watch`'s CPU figures."""
    proc = subprocess.Popen([str(c) for c in cmd], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    cpu = watch([proc], tier)
    out = proc.communicate()[0]
    if proc.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        sys.exit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return cpu


def train(a: argparse.Namespace, mnt: Path, out: Path, n: int, tier: Tier
          ) -> tuple[Path, dict[str, float]]:
    """`mpiexec -n N iobench train` on the tier, with a trace; its result and CPU use."""
    log(f"train, {n} rank(s) at once")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cpu = sampled([MPIEXEC, "-n", n, *IOBENCH, "train", "--loader", "hdf5", "--storage", mnt,
                   "--compute-time", a.compute, "--epochs", a.epochs, "--batch-size", a.batch,
                   "--workers", a.workers, "--shuffle", a.shuffle, "--results", out,
                   "--trace", out / "trace.trace", *(GLUSTER_EVICT if a.gluster else [])], tier)
    (path,) = out.glob("*.json")
    return path, cpu


def step_sync(a: argparse.Namespace, backing: Path, work: Path) -> float:
    """The per-step synchronisation two ranks pay and one does not (`train` all-reduces every
    step when there are several), without the tier: the steady step of `mpiexec -n 2` less
    that of one rank, both reading the local copy with a warm cache."""
    steps = []
    for n in (1, 2):
        log(f"train from the local copy, warm, {n} rank(s): the per-step synchronisation")
        out = work / f"sync-{n}"
        shutil.rmtree(out, ignore_errors=True)
        run([MPIEXEC, "-n", n, *IOBENCH, "train", "--loader", "hdf5", "--storage", backing,
             "--warm-cache", "--compute-time", a.compute, "--epochs", a.epochs, "--batch-size",
             a.batch, "--workers", a.workers, "--shuffle", a.shuffle, "--results", out])
        doc = one(out)
        steps.append(statistics.median(
            max((r["wall_s"] - (r["first_batch_s"] or 0)) / r["steps"] for r in e["ranks"])
            for e in doc["epochs"]))
    return max(0.0, steps[1] - steps[0])


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


def stage_replicate(mnt: Path, work: Path, n: int, tier: Tier, extra: tuple[str, ...] = ()
                    ) -> tuple[float, dict[str, float]]:
    """N full copies at once (N processes): the slowest one's stage_s, and `watch`'s CPU
    figures of the N copying processes."""
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
    cpu = watch(procs, tier)
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"stage failed: {err[-800:]}")
    return max(float(one(r)["stage_s"]) for r in outs), cpu


def stage_shard(mnt: Path, work: Path, n: int, tier: Tier, extra: tuple[str, ...] = ()
                ) -> tuple[float, dict[str, float]]:
    """One copy spread over N ranks (`mpiexec -n N iobench stage`), and `watch`'s CPU."""
    log(f"stage, one copy over {n} rank(s)")
    dest, res = work / f"shard-{n}", work / f"stage-shard-{n}"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(res, ignore_errors=True)
    cpu = sampled([MPIEXEC, "-n", n, *IOBENCH, "stage", "--from", mnt, "--to", dest,
                   "--no-progress", "--results", res, *extra], tier)
    return float(one(res)["stage_s"]), cpu


def gluster_tier(backing: Path, work: Path, subdir: str, direct: bool) -> Path:
    """--gluster: the dataset's copy on the one-box GlusterFS (in MNT/`subdir`/data), through
    a second client mounted with direct-io-mode=enable when `direct` (no page cache shared
    by the copies)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _tiers

    root = _tiers.gluster_up()
    _tiers.ensure_copy(backing / "cifar10-hdf5", root / subdir / "data")
    if not direct:
        return root / subdir / "data"
    dmnt = work / "gluster-direct"
    dmnt.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", str(dmnt)]).returncode != 0:
        run(["mount", "-t", "glusterfs", "-o", "direct-io-mode=enable",
             f"{os.uname().nodename}:/iobench", dmnt])
    return dmnt / subdir / "data"


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
    """Predicted vs measured per N; the first batch apart (its share of the stall), and the
    epoch's mean step after it, (wall - first batch) / steps, as train's is measured."""
    pts = {p["nodes"]: p for p in proj["points"]}
    out = ["| N | stall/epoch s pred | meas | err | first batch s pred | meas | AU pred | meas "
           "| err | step s pred | meas | err | sim AU | stage repl s pred | meas | err "
           "| stage shard s pred | meas | err |", "|---|" + "---|" * 18]
    for n, m in sorted(meas.items()):
        p = pts[n]
        first = p["first_batch_s"]
        step = (p["epoch_s"] - first) / p["steps_per_epoch"]
        sim = "-" if p.get("simulated_au") is None else f"{p['simulated_au']:.2f}"
        out.append(
            f"| {n} | {spanned(p, 'stall_s', 'stall_range_s', m['stall_s'])} | {m['stall_s']:.2f} "
            f"| {err(p['stall_s'], m['stall_s'])} "
            f"| {first:.2f} | {m['first_s']:.2f} "
            f"| {p['au']:.2f} | {m['au']:.2f} | {err(p['au'], m['au'])} "
            f"| {step:.3f} | {m['step_s']:.3f} | {err(step, m['step_s'])} "
            f"| {sim} | {spanned(p, 'stage_replicate_s', 'stage_replicate_range_s', m['replicate_s'])} "
            f"| {m['replicate_s']:.2f} "
            f"| {err(p['stage_replicate_s'], m['replicate_s'])} "
            f"| {spanned(p, 'stage_shard_s', 'stage_shard_range_s', m['shard_s'])} "
            f"| {m['shard_s']:.2f} | {err(p['stage_shard_s'], m['shard_s'])} |")
    return out


def spanned(p: dict[str, Any], name: str, span: str, meas: float) -> str:
    """A prediction with its [spread] (the probes' and the step's) and `*` where the
    measurement lies inside it."""
    r = p.get(span) or []
    if not r:
        return f"{p[name]:.2f}"
    inside = "*" if r[0] <= meas <= r[-1] else ""
    return f"{p[name]:.2f} [{r[0]:.2f}-{r[-1]:.2f}]{inside}"


def cpu_table(meas: dict[int, dict[str, float]], gluster: bool) -> list[str]:
    """Per N, while the tier served: cores the training used (ranks and loader workers), the
    tier's daemons, and the whole box (other sessions' work included), of os.cpu_count(); the
    share of the steady stall in the first half of the epoch (the client cache's
    front-loading: 0.5 would be even); and the same cores while the copies ran (replicate:
    the N stage processes; shard: the N ranks)."""
    daemon = "gluster clients + bricks cores" if gluster else "daemon cores"
    out = [f"| N | training cores | {daemon} | box busy cores (of {os.cpu_count()}) "
           "| steady stall in the epoch's first half | stage repl: copies' cores | "
           f"{daemon} | box | stage shard: ranks' cores | {daemon} | box |",
           "|---|" + "---|" * 10]
    out += [f"| {n} | {_cores(m['run_cores'])} | {_cores(m['daemon_cores'])} "
            f"| {_cores(m['box_cores'])} | {m['first_half']:.0%} "
            + "".join(f"| {_cores(m[f'{w}_{k}'])} " for w in ("repl", "shard")
                      for k in ("run_cores", "daemon_cores", "box_cores")) + "|"
            for n, m in sorted(meas.items())]
    return out


def _cores(v: float) -> str:
    return "n/a (no tier counters)" if math.isnan(v) else f"{v:.2f}"


SATURATED = 0.95  # of the box's cores busy: the box's CPU, not the tier, may set the pace
TIER_BOUND = 0.75  # of the tier's probed bandwidth: a copy this fast is the tier's to limit


def cpu_warnings(meas: dict[int, dict[str, float]], proj: dict[str, Any]) -> list[str]:
    """Per N and staging mode, where the copies moved the data well below the tier's probed
    bandwidth while the box's cores were all busy: the box's CPU, shared by the N clients,
    the tier's daemons and other work, set the pace, which the model does not charge unless
    the stage result measured the host's CPU (then it has a CPU station for the host the N
    clients share, and nothing is said); with the CPU seconds the copies and the daemons used."""
    figs = {f["name"]: f["value"] for f in proj["figures"]}
    if "host CPU per staged chunk" in figs:  # the model charges the shared host's CPU
        return []
    dataset = figs["bytes per sample"] * max(p["steps_per_epoch"] for p in proj["points"]) \
        * figs["batch per rank"] * figs["ranks per node"] / 1e6  # MB (N = 1's epoch)
    bandwidth, out, cores = figs["tier read bandwidth"], [], os.cpu_count() or 1
    for n, m in sorted(meas.items()):
        for mode, key, copies in (("replicate", "repl_", n), ("shard", "shard_", 1)):
            secs, box = m[f"{mode}_s"], m[f"{key}box_cores"]
            rate = copies * dataset / secs
            if math.isnan(box) or box < SATURATED * cores or rate > TIER_BOUND * bandwidth:
                continue
            used = m[f"{key}run_cores"] + m[f"{key}daemon_cores"]
            out.append(f"N={n} staging {mode}: {copies * dataset:.0f} MB in {secs:.2f} s, "
                       f"{rate:.0f} MB/s, under {TIER_BOUND:.0%} of the tier's {bandwidth:.0f} "
                       f"MB/s, while the box's {cores} cores were {box:.2f} busy ({used:.2f} "
                       f"of them the copies and the tier's daemons, {used * secs:.2f} CPU s): "
                       "the box's CPU, shared by N clients on one machine, set the pace; the "
                       "model gives each node its own")
    return out


def arguments() -> argparse.Namespace:
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
    ap.add_argument("--probe-runtime", default="1",
                    help="seconds per probe test (default 1)")
    ap.add_argument("--probes", type=int, default=3,
                    help="probes of the tier, one before each training run and the rest "
                         "after; the projection takes their medians and spread (default 3)")
    ap.add_argument("--reproject", action="store_true",
                    help="measure nothing: project again from WORK's saved measurements "
                         "(WORK/measured.json) and print the tables")
    ap.add_argument("--gluster", action="store_true",
                    help="the one-box GlusterFS as the tier instead of the emulator (root)")
    ap.add_argument("--gluster-dir", default="iobench-projval",
                    help="--gluster: this run's folder on the shared volume (default "
                         "iobench-projval; data and probe scratch files go under it)")
    return ap.parse_args()


def probe(a: argparse.Namespace, nodes: list[int], where: list[Any], res: Path, i: int
          ) -> None:
    """The `i`-th probe of the tier (`--probes`): its limits, and buffered random reads at
    the loaders' concurrency (the workers of 1 and of max N ranks)."""
    log(f"probe {i + 1} of {a.probes} of the tier")
    run([*IOBENCH, "probe", *where, "--size", "16M",
         "--readers", "1,4", "--runtime", a.probe_runtime, "--metadata-files", "100",
         "--sample-size", a.probe_sample, "--buffered-readers",
         f"{a.workers},{int(a.workers) * max(nodes)}",
         "--engine", "python", "--results", res / "probe"])


def measure(a: argparse.Namespace, nodes: list[int], work: Path
            ) -> tuple[dict[int, Path], dict[int, dict[str, float]]]:
    """Probe the tier, train at each N, stage at each N: the training results per N and
    the measured figures per N."""
    backing, mnt, res = work / "backing", work / "mnt", work / "res"
    meas: dict[int, dict[str, float]] = {}
    try:
        if a.gluster:
            mnt = gluster_tier(backing, work, a.gluster_dir, direct=False)
            (mnt.parent / "probe").mkdir(exist_ok=True)
            where = ["--storage", mnt.parent / "probe", *GLUSTER_EVICT]
        else:
            mount(a, backing, mnt, direct=False)
            where = ["--storage", mnt, "--write-via", backing]
        tier = Tier(mnt, a.gluster)
        shutil.rmtree(res, ignore_errors=True)
        trained = {}
        for i, n in enumerate(nodes):  # one probe before each training run, the rest after
            if i < a.probes:
                probe(a, nodes, where, res, i)
            trained[n] = train(a, mnt, res / f"train-{n}", n, tier)
        for i in range(len(nodes), a.probes):
            probe(a, nodes, where, res, i)
        extra = tuple(GLUSTER_EVICT) if a.gluster else ()
        direct = gluster_tier(backing, work, a.gluster_dir, direct=True) if a.gluster else mnt
        if not a.gluster:
            mount(a, backing, mnt, direct=True)
        for n in nodes:
            # both through the client the fitted N = 1 copy read (GlusterFS: the direct-io one)
            # three cold copies, their median: where one job runs them together (one process,
            # or one mpiexec job's collective repetitions); N replicating processes would each
            # evict the shared tier in the others' copies, so they copy once
            (rep, rep_cpu), (shard, shard_cpu) = (
                stage_replicate(direct, work, n, tier, (*extra, *REPEAT * (n == 1))),
                stage_shard(direct, work, n, tier, (*extra, *REPEAT)))
            meas[n] = {**measured(*trained[n]), "replicate_s": rep, "shard_s": shard,
                       **{f"repl_{k}": v for k, v in rep_cpu.items()},
                       **{f"shard_{k}": v for k, v in shard_cpu.items()}}
    finally:
        if a.gluster:
            subprocess.run(["umount", str(work / "gluster-direct")], capture_output=True)
        else:
            subprocess.run([*IOBENCH, "emulate-pfs", "--unmount", str(mnt), "--lazy"],
                           env=ENV, capture_output=True)
    return {n: t[0] for n, t in trained.items()}, meas


def main() -> int:
    a = arguments()
    nodes = [int(x) for x in a.nodes.split(",")]
    work = a.work
    backing, res = work / "backing", work / "res"
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    if not (backing / "cifar10-hdf5" / "iobench.json").is_file():
        log("generating cifar10/hdf5")
        run([*IOBENCH, "generate", "--dataset", "cifar10", "--format", "hdf5", "--samples",
             a.samples, "--samples-per-file", "1024", "--storage", backing, "--force"])
    saved = work / "measured.json"
    if a.reproject:
        doc = json.loads(saved.read_text())
        runs = {int(n): Path(p) for n, p in doc["runs"].items()}
        meas = {int(n): m for n, m in doc["measured"].items()}
        load_before, load_after = tuple(doc["load_before"]), tuple(doc["load_after"])
        sync = doc.get("step_sync_s")  # runs before it was measured: none given
        for k, v in doc.get("config", {}).items():  # the run's, for the printed header
            setattr(a, k, v)
    else:
        runs, meas = measure(a, nodes, work)
        sync = step_sync(a, backing, work)
        load_after = os.getloadavg()
        saved.write_text(json.dumps({"runs": {n: str(p) for n, p in runs.items()},
                                     "measured": meas, "load_before": load_before,
                                     "load_after": load_after, "step_sync_s": sync,
                                     "config": {k: getattr(a, k) for k in SAVED_CONFIG}}))
    probes = sorted((res / "probe").glob("probe-*.json"))
    (stage1,) = (work / "stage-1-0").glob("stage-*.json")
    log(f"project from N = 1 and {len(probes)} probe(s)")
    shutil.rmtree(res / "proj", ignore_errors=True)
    cmd = [*IOBENCH, "project", "--train", runs[nodes[0]],
           *(x for p in probes for x in ("--probe", p)), "--stage", stage1,
           "--nodes", a.nodes, "--simulate-max-nodes", max(nodes), "--results", res / "proj",
           # the N clients are processes of this one box: they share its CPU, its client
           # cache (one mount) and its local disk, as nodes of one host
           "--nodes-per-host", max(nodes),
           # measured without the tier (step_sync): what every N > 1 pays and N = 1 did not
           *(("--step-sync-ms", f"{sync * 1e3:.4f}") if sync is not None else ())]
    projection_text = run(cmd)
    proj = one(res / "proj", "projection-*.json")
    print_report(a, proj, meas, (load_before, load_after))
    print("\n" + " ".join(map(str, cmd[2:])))
    print(projection_text.split("\n\n", 1)[0])
    return 0


def print_report(a: argparse.Namespace, proj: dict[str, Any], meas: dict[int, dict[str, float]],
                 load: tuple[Any, Any]) -> None:
    """The validation's tables and what the projection took as its inputs."""
    print(f"# iobench project validation, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    tier = ("one-box GlusterFS (2 bricks, cold: --evict-cmd)" if a.gluster else
            f"emulated, {a.bandwidth} MB/s cap, {a.open_latency} ms open, "
            f"{a.read_latency} ms per read")
    print(f"tier: {tier}; cifar10/hdf5 {a.samples} samples, batch {a.batch}, "
          f"{a.workers} workers, compute {a.compute} s/step, shuffle {a.shuffle}, "
          f"{a.epochs} epochs (medians over epochs)")
    print(f"load average (1, 5, 15 min) before {load[0]}, after {load[1]}, "
          f"on {os.cpu_count()} CPUs")
    print(f"fitted latency per batch {proj['model']['latency_s']:.4f} s; "
          f"local write per chunk {proj['model']['local_write_s']:.4f} s")
    print("\n".join(table(proj, meas)))
    print("[spread]: " + proj["model"]["spread_note"] + " *: the measurement lies inside it.")
    print("measured stall spread over epochs (max - min, s): "
          + ", ".join(f"N={n}: {m['spread_stall']:.2f}" for n, m in sorted(meas.items())))
    for f in proj["figures"]:
        if f["name"].startswith(("samples per tier request", "tier request rate",
                                 "tier read bandwidth", "host CPU", "host cores",
                                 "per-step synchronisation")):
            print(f"{f['name']} = {f['value']:.4g} {f['unit']} ({f['source']})")
    print("\n".join(cpu_table(meas, a.gluster)))
    for w in cpu_warnings(meas, proj):
        print(f"validation warning: {w}")
    for w in proj["warnings"]:
        print(f"projection warning: {w}")


if __name__ == "__main__":
    sys.exit(main())
