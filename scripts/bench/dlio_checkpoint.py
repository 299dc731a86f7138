#!/usr/bin/env python3
"""DLIO's checkpoint workload against `iobench checkpoint` at the same total size, same ranks, same disk.

DLIO (its GitHub version: the PyPI 2.0.0 has no llama workloads and no checkpoint reads)
runs its `llama_8b_zero3` workload (checkpoint only: `num_checkpoints_write` N, then
`num_checkpoints_read` N, `fsync: True`) with the transformer scaled down (hidden size,
layers, vocabulary: --hidden, --ffn, --vocab, layers chosen by the script) so that its
checkpoint holds about as many bytes as iobench's `--model llama3-8b --scale S` by the same
ranks. iobench runs `checkpoint --repeat N` on the same folder's disk. For both: bytes on
disk per checkpoint, write and read GB/s (GB = 10^9 B; DLIO's own figures are GiB and are
converted), and whether the reads came from storage: the OS's read bytes of each tool's
whole process tree (`/proc/self/io` of this script, which counts its reaped children) and,
for DLIO, the page-cache residency (`fincore`) of its checkpoint files after the run.

    .venv/bin/python scripts/bench/dlio_checkpoint.py --dlio $HOME/dlio-venv/bin/dlio_benchmark \\
        [--work /var/tmp/iobench-dlio-ckpt] [--scale 0.03] [--ranks 1,2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tiers as t

GIB = 1 << 30


def read_bytes() -> int:
    """This process's and its reaped children's bytes read from storage."""
    with open("/proc/self/io") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("read_bytes"))


def mpi(exe_dir: Path, ranks: int) -> list[str]:
    return [] if ranks == 1 else [str(exe_dir / "mpiexec"), "-n", str(ranks)]


def dlio_params(hidden: int, ffn: int, vocab: int, heads: int, kv: int, layers: int) -> int:
    """DLIO's own parameter count of a transformer (base_checkpointing.get_num_parameters)."""
    dim_kv = hidden // heads * kv
    per_layer = hidden + hidden * (hidden + 2 * dim_kv) + hidden * hidden + hidden \
        + ffn * 2 * hidden + ffn * hidden
    return 2 * vocab * hidden + per_layer * layers + hidden


def dlio_layers(target_bytes: float, a: argparse.Namespace) -> int:
    """Layers that bring DLIO's checkpoint closest to `target_bytes` (ZeRO-3: fp16 model,
    three fp32 optimizer groups: 14 bytes per parameter in all)."""
    best = min(range(1, 200), key=lambda n: abs(
        14 * dlio_params(a.hidden, a.ffn, a.vocab, a.heads, a.kv, n) - target_bytes))
    return best


def run_dlio(ranks: int, layers: int, folder: Path, a: argparse.Namespace) -> dict[str, Any]:
    """One DLIO checkpoint-only run; its summary and the OS's read bytes and residency."""
    shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=a.work) as out:
        cmd = [*mpi(Path(a.dlio).parent, ranks), a.dlio, "workload=llama_8b_zero3",
               f"++workload.model.num_layers={layers}",
               f"++workload.model.transformer.hidden_size={a.hidden}",
               f"++workload.model.transformer.ffn_hidden_size={a.ffn}",
               f"++workload.model.transformer.vocab_size={a.vocab}",
               f"++workload.model.transformer.num_attention_heads={a.heads}",
               f"++workload.model.transformer.num_kv_heads={a.kv}",
               f"++workload.checkpoint.checkpoint_folder={folder}",
               f"++workload.checkpoint.num_checkpoints_write={a.repeat}",
               f"++workload.checkpoint.num_checkpoints_read={a.repeat}",
               "++workload.checkpoint.time_between_checkpoints=0",
               f"++workload.output.folder={out}", f"hydra.run.dir={out}"]
        r0 = read_bytes()
        t.run(cmd, cwd=out)
        got = read_bytes() - r0
        summary = json.loads((Path(out) / "summary.json").read_text())["metric"]
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    disk = sum(p.stat().st_size for p in files)
    return {"summary": summary, "os_read_bytes": got, "disk_bytes": disk,
            "per_checkpoint_bytes": disk / a.repeat, "resident": resident(files)}


def resident(files: list[Path]) -> float | None:
    """Fraction of `files`' bytes in the page cache now (fincore), None without fincore."""
    if not files or shutil.which("fincore") is None:
        return None
    r = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE", *map(str, files)],
                       capture_output=True, text=True)
    res = size = 0
    for line in r.stdout.split("\n"):
        parts = line.split()
        if len(parts) == 2:
            res, size = res + int(parts[0]), size + int(parts[1])
    return res / size if size else None


def run_iobench(ranks: int, storage: Path, a: argparse.Namespace) -> dict[str, Any]:
    storage.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.work) as res:
        cmd = [*mpi(Path(sys.executable).parent, ranks), *t.IOBENCH, "checkpoint",
               "--storage", str(storage), "--model", "llama3-8b", "--scale", str(a.scale),
               "--repeat", str(a.repeat), "--results", res]
        r0 = read_bytes()
        t.run(cmd, cwd=res)
        got = read_bytes() - r0
        doc = t.only_result(Path(res))
    return {"doc": doc, "os_read_bytes": got}


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"


def row(ranks: int, io: dict[str, Any], dl: dict[str, Any], layers: int) -> list[str]:
    doc, s = io["doc"], dl["summary"]
    w = [x["throughput_GBps"] for x in doc["writes"]]
    r = [x["throughput_GBps"] for x in doc["reads"]]
    ckpt = doc["writes"][0]["bytes"]
    dl_w = s["save_checkpoint_io_mean_GB_per_second"] * GIB / 1e9
    dl_r = s.get("load_checkpoint_io_mean_GB_per_second", 0.0) * GIB / 1e9
    return [
        f"| {ranks} | iobench (DCP, llama3-8b --scale {doc['layout']['scale']:g}) | "
        f"{ckpt / 1e9:.3f} | {med(w)} | {med(r)} | "
        f"{io['os_read_bytes'] / (ckpt * len(doc['reads'])):.2f} | "
        f"{','.join(doc['summary']['read_cache'])} |",
        f"| {ranks} | DLIO (llama_8b_zero3, {layers} layers, hidden {dl['hidden']}) | "
        f"{dl['per_checkpoint_bytes'] / 1e9:.3f} | {dl_w:.3f} (mean) | {dl_r:.3f} (mean) | "
        f"{dl['os_read_bytes'] / max(dl['disk_bytes'], 1):.2f} | "
        f"resident after the run: {_pct(dl['resident'])} |"]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dlio", required=True, help="the dlio_benchmark executable (own venv)")
    p.add_argument("--work", default="/var/tmp/iobench-dlio-ckpt")
    p.add_argument("--scale", type=float, default=0.03)
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=3584)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv", type=int, default=2)
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    print(t.header("dlio_checkpoint"))
    lines = ["| ranks | tool | GB per checkpoint (on disk) | write GB/s | read GB/s | "
             "OS read bytes / bytes read | reads |", "|---:|---|---:|---:|---:|---:|---|"]
    for ranks in (int(x) for x in a.ranks.split(",")):
        io = run_iobench(ranks, work / "iobench", a)
        target = io["doc"]["writes"][0]["bytes"]
        layers = dlio_layers(target, a)
        t.log(f"{ranks} rank(s): iobench {target / 1e9:.3f} GB per checkpoint; DLIO with "
              f"{layers} layers")
        dl = run_dlio(ranks, layers, work / "dlio" / "checkpoints", a)
        dl["hidden"] = a.hidden
        lines += row(ranks, io, dl, layers)
        print("\n".join(lines[-2:]), flush=True)
        shutil.rmtree(work / "dlio", ignore_errors=True)
    print("\n" + "\n".join(lines))
    print(f"\nended {time.strftime('%H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; iobench: median [min-max] of "
          f"{a.repeat} checkpoints; DLIO: its mean over {a.repeat}")


if __name__ == "__main__":
    main()
