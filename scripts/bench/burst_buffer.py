#!/usr/bin/env python3
"""The burst-buffer pattern (`train --drain-to`) against checkpoints written straight to GlusterFS.

A small cifar10/hdf5 dataset is generated once on the one-box GlusterFS volume
(scripts/pfs/local-gluster.sh, root), so the loader reads the shared tier as on a cluster,
every epoch cold (`--evict-cmd` empties the bricks' cache). Then `iobench train` with a real
model (default resnet18: ~90 MB of model and momentum a checkpoint), the same steps and
`--checkpoint-every` in every run, in five modes, interleaved (each repetition in a rotated
order):

- a: `--checkpoint-to` GlusterFS, sync;        b: the same, async;
- c: `--checkpoint-to` local disk, sync, `--drain-to` GlusterFS;
- d: local disk, async, `--drain-to` GlusterFS;
- e: no checkpoints (the baseline).

From each result: the steps' blocked time per save (`checkpoint.summary.cost_s`), the
checkpoints' share of training time, AU with and without the checkpoints' time, the data
stall per step with a drain in flight against none (rank 0's drain spans), each drain's time
and whether it kept up, the write time per save. It prints each repetition's figures, a table
of median [min-max] of 3 (or --repeat) interleaved repetitions, and the ratios within each
repetition: blocked per save c/a and d/b, AU with checkpoints / the baseline's AU, the data
stall per step in flight / idle. Results and checkpoints go to temporary folders, removed.

    .venv/bin/python scripts/bench/burst_buffer.py [--local /var/tmp/iobench-burst]
        [--model resnet18] [--batch-size 8] [--steps 32] [--every 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
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

MODES = {"a": "GlusterFS sync", "b": "GlusterFS async", "c": "local sync + drain",
         "d": "local async + drain", "e": "no checkpoints"}


def mode_args(mode: str, gl_ck: Path, local_ck: Path, a: argparse.Namespace) -> list[str]:
    """The checkpoint options of one mode."""
    if mode == "e":
        return []
    to = gl_ck if mode in "ab" else local_ck
    out = ["--checkpoint-every", str(a.every), "--checkpoint-to", str(to),
           "--checkpoint-mode", "sync" if mode in "ac" else "async"]
    return out + (["--drain-to", str(gl_ck)] if mode in "cd" else [])


def per_step_stall(doc: dict[str, Any]) -> float:
    eps = [e["summary"] for e in doc["epochs"]]
    return float(sum(e["stall_s_max"] for e in eps) / sum(e["steps"] for e in eps))


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    """One run's figures (one repetition; its epochs together)."""
    eps = doc["epochs"]
    wall = sum(e["summary"]["wall_s"] for e in eps)
    compute = sum(e["summary"]["au_min"] * e["summary"]["wall_s"] for e in eps)
    f: dict[str, Any] = {"au": compute / wall, "stall_step": per_step_stall(doc),
                         "wall": wall, "cache": t.statuses(doc)}
    ck = doc.get("checkpoint")
    if not ck:
        return f
    s = ck["summary"]
    cks = [e["checkpoint"] for e in eps]
    wall_ck = sum(c["wall_with_checkpoint_s"] for c in cks)
    f.update(blocked=s["cost_s"], fraction=s["fraction"], write=s["write_s_median"],
             au_ck=compute / wall_ck, mb=s["bytes_median"] / 1e6, saves=s["saves"],
             wall_ck=wall_ck)
    drains = [sv["drain"] for sv in ck["saves"] if sv.get("drain")]
    if drains:
        n_in = sum(c["drain"]["steps_in_flight"] for c in cks)
        n_out = sum(c["drain"]["steps_idle"] for c in cks)
        f.update(drain=statistics.median(d["drain_s"] for d in drains),
                 kept_up=s["drains_kept_up"], end_wait=s["final_drain_wait_s"],
                 n_in=n_in, n_out=n_out,
                 st_in=(sum(c["drain"]["stall_in_flight_s"] for c in cks) / n_in
                        if n_in else None),
                 st_out=(sum(c["drain"]["stall_idle_s"] for c in cks) / n_out
                         if n_out else None))
    return f


def one_run(mode: str, data: Path, gl_ck: Path, local_ck: Path,
            a: argparse.Namespace) -> dict[str, Any]:
    """One `iobench train` in one mode; its figures; its checkpoints removed."""
    with tempfile.TemporaryDirectory() as res:
        doc = t.train(data, "cifar10", "hdf5", Path(res) / "r",
                      ["--model", a.model, "--batch-size", str(a.batch_size), "--epochs", "1",
                       "--max-steps", str(a.steps), "--evict-cmd", t.EVICT,
                       *mode_args(mode, gl_ck, local_ck, a)])
    for d in (gl_ck, local_ck):
        shutil.rmtree(d / f"iobench-train-{doc['run_id']}", ignore_errors=True)
    return figures(doc)


def line(i: int, mode: str, f: dict[str, Any]) -> str:
    out = (f"rep {i} {mode} ({MODES[mode]}): AU {f['au']:.3f}, stall/step "
           f"{f['stall_step'] * 1e3:.1f} ms")
    if "blocked" in f:
        out += (f", blocked/save {f['blocked']:.3f} s, write {f['write']:.3f} s, "
                f"{f['fraction']:.1%} of training, AU with checkpoints {f['au_ck']:.3f}")
    if "drain" in f:
        st_in = "n/a" if f["st_in"] is None else f"{f['st_in'] * 1e3:.1f}"
        st_out = "n/a" if f["st_out"] is None else f"{f['st_out'] * 1e3:.1f}"
        out += (f", drain {f['drain']:.3f} s (kept up: {f['kept_up']}), stall/step in "
                f"flight {st_in} ms ({f['n_in']} steps) / idle {st_out} ms ({f['n_out']})")
    return out + f" [{f['cache']}]; load {os.getloadavg()[0]:.1f}"


def col(rs: list[dict[str, Any]], key: str, scale: float = 1.0, spec: str = ".3g") -> str:
    vals = [r[key] * scale for r in rs if r.get(key) is not None]
    return t.fmt_spread(vals, spec)


def table(reps: dict[str, list[dict[str, Any]]]) -> None:
    print("\n| mode | MB/ckpt | blocked s/save | write s/save | ckpt % of training | "
          "AU (data only) | AU with ckpts | stall ms/step | drain s | stall ms/step, drain "
          "in flight | idle | kept up | end wait s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for m, rs in reps.items():
        kept = ",".join(sorted({str(r["kept_up"]) for r in rs if "kept_up" in r})) or "-"
        print(f"| {m}: {MODES[m]} | {col(rs, 'mb', spec='.1f')} | {col(rs, 'blocked')} | "
              f"{col(rs, 'write')} | {col(rs, 'fraction', 100, '.2g')} | {col(rs, 'au')} | "
              f"{col(rs, 'au_ck')} | {col(rs, 'stall_step', 1e3)} | {col(rs, 'drain')} | "
              f"{col(rs, 'st_in', 1e3)} | {col(rs, 'st_out', 1e3)} | {kept} | "
              f"{col(rs, 'end_wait')} |")


def ratio(reps: dict[str, list[dict[str, Any]]], m1: str, k1: str, m2: str, k2: str
          ) -> str:
    if m1 not in reps or m2 not in reps:
        return "n/a"
    vals = [x[k1] / y[k2] for x, y in zip(reps[m1], reps[m2], strict=True)
            if x.get(k1) is not None and y.get(k2)]
    return t.fmt_spread(vals)


def ratios(reps: dict[str, list[dict[str, Any]]]) -> None:
    print("\n| ratio (within each repetition) | median [min-max] |")
    print("|---|---:|")
    rows = [("blocked per save, c local sync + drain / a GlusterFS sync", "c", "blocked", "a",
             "blocked"),
            ("blocked per save, d local async + drain / b GlusterFS async", "d", "blocked",
             "b", "blocked"),
            ("blocked per save, b GlusterFS async / a GlusterFS sync", "b", "blocked", "a",
             "blocked"),
            ("write per save, c local / a GlusterFS (sync)", "c", "write", "a", "write")]
    rows += [(f"AU with checkpoints, {m} / e baseline AU", m, "au_ck", "e", "au")
             for m in "abcd"]
    rows += [(f"data stall per step, {m} drain in flight / idle", m, "st_in", m, "st_out")
             for m in "cd"]
    rows += [(f"data stall per step, {m} / e baseline", m, "stall_step", "e", "stall_step")
             for m in "abcd"]
    for name, m1, k1, m2, k2 in rows:
        print(f"| {name} | {ratio(reps, m1, k1, m2, k2)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--local", default="/var/tmp/iobench-burst",
                   help="a folder on the local disk: the node-local checkpoint tier")
    p.add_argument("--model", default="resnet18", help="a real model (iobench train --model)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=32, help="steps per run (--max-steps)")
    p.add_argument("--every", type=int, default=8, help="--checkpoint-every")
    p.add_argument("--samples", type=int, default=6000, help="cifar10 samples generated")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--modes", default="abcde", help="which of a-e to run (default all)")
    a = p.parse_args()
    gl = t.gluster_up() / "iobench-burst"
    data = gl / "data"
    t.ensure_dataset(data, "cifar10", "hdf5", a.samples, jobs=1)
    gl_ck, local_ck = gl / "ckpt", Path(a.local) / "ckpt"
    for d in (gl_ck, local_ck):
        d.mkdir(parents=True, exist_ok=True)
    print(t.header("burst_buffer"))
    print(f"model {a.model}, batch {a.batch_size}, {a.steps} steps, a checkpoint every "
          f"{a.every} steps; data and shared tier {gl}, local tier {a.local}; repetitions "
          f"{a.repeat}\n")
    modes = [m for m in "abcde" if m in a.modes]
    reps: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for i in range(a.repeat):
        for m in modes[i % len(modes):] + modes[:i % len(modes)]:
            f = one_run(m, data, gl_ck, local_ck, a)
            reps[m].append(f)
            print(line(i, m, f), flush=True)
    table(reps)
    ratios(reps)
    print(f"\nmedian [min-max] of {a.repeat} interleaved repetitions; ratios within each "
          f"repetition; ended {time.strftime('%H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
