#!/usr/bin/env python3
"""iobench against DLIO on MLPerf Storage workloads: both AUs and throughputs, cold, side by side.

For each workload point (`W:A`, e.g. cosmoflow:h100) and accelerator count N
the script runs, in turn and interleaved over `--repeat` repetitions:

- iobench: the exact `iobench train` command line `iobench search` runs for
  that point (`iobench.workflows.search.train_command`: N ranks under `mpiexec -n N`,
  one emulated accelerator each, `--no-decode`, emulated compute, steps
  synchronised, one epoch), on the dataset `iobench generate --workload W
  --accelerator A --samples S` writes;
- DLIO (`dlio_benchmark`, PyTorch data loader, same N under the same
  `mpiexec`, same batch, reader threads = iobench's workers, computation_time
  = iobench's --compute-time, one epoch) on a dataset DLIO generated itself in
  the format closest to iobench's that DLIO reads without TensorFlow, holding
  about the same bytes per sample (cosmoflow: one `.npy` per sample; resnet50:
  HDF5 files of 1,251 samples; see FORMATS).

Both are made cold the same way before every run: `iobench.core.cache.evict` over
every file of the dataset about to be read (dirty pages written back, then
`posix_fadvise(DONTNEED)`), and the resident fraction is checked afterwards
(iobench also evicts before its epoch, the same call; DLIO evicts nothing).
No `drop_caches`: the machine is shared, and that would empty other users'
caches too. A cache outside the guest (a VM host's) is not reached by either.

Figures, as each tool reports them:
- AU: iobench's `au_mlperf_mean` (sum of measured compute / (epoch wall -
  first batch wait), mean over ranks) and its `au_mean` (first step
  included); DLIO's `train_au_percentage` / 100 (sum of *asked* compute of
  steps 2..n / (epoch wall - the whole first step, load and compute), mean over
  ranks).
- samples/s: iobench's `samples_per_s` (global samples / slowest rank's wall,
  from `Loader.start()`, workers already up); DLIO's
  `train_throughput_samples_per_second` (sum over ranks of steps x batch / the
  rank's wall, which starts before its DataLoader is built).
- MB/s: samples/s x the bytes of one sample as stored (10^6 B per MB) for
  both (DLIO's own `train_io_mean_MB_per_second` is MiB/s).

DLIO: `python -m venv V && V/bin/pip install dlio_benchmark` (docs/results.md
says how when its DALI dependency cannot be fetched), and give `--dlio
V/bin/dlio_benchmark`; its mpi4py must use the same MPI as iobench's mpiexec:
`MPI4PY_LIBMPI=$PWD/.venv/lib/libmpi.so.12`. Without DLIO, only iobench runs.

  MPI4PY_LIBMPI=$PWD/.venv/lib/libmpi.so.12 python scripts/bench/dlio_workloads.py \\
      --work /var/tmp/dlio --dlio V/bin/dlio_benchmark [--points cosmoflow:h100,resnet50:a100:40]
      [--ranks 1,2] [--repeat 3] [--slowdown 1] [--workers 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iobench.core.cache import evict, residency
from iobench.core.manifest import Manifest
from iobench.core.workloads import resolve
from iobench.workflows.search import SearchConfig, train_command

# workload -> (iobench default samples, DLIO format, DLIO samples per file). Formats DLIO
# 2.0.0 reads through its PyTorch loader, nearest to iobench's: cosmoflow is one .npy per
# sample in both; resnet50 is HDF5 of 1,251 samples in both (DLIO: fixed-size uint8 records
# read by index; iobench: variable-size JPEG bytes read by offset). MLPerf's own are TFRecord,
# which DLIO reads only through TensorFlow.
FORMATS = {
    "cosmoflow": (256, "npy", 1),
    "resnet50": (2502, "hdf5", 1251),
}
MB = 1_000_000


@dataclass(frozen=True)
class Point:
    workload: str
    accelerator: str
    batch: int | None  # None: the workload's

    @property
    def label(self) -> str:
        return f"{self.workload}:{self.accelerator}" + (f":{self.batch}" if self.batch else "")


def parse_points(text: str) -> list[Point]:
    out = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[0] not in FORMATS:
            raise SystemExit(f"--points: {item!r} is not W:A[:BATCH] with W one of "
                             f"{', '.join(FORMATS)}")
        resolve(parts[0], parts[1])  # a ConfigError names the accelerators
        out.append(Point(parts[0], parts[1], int(parts[2]) if len(parts) == 3 else None))
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def spread(xs: list[float]) -> str:
    return f"{num(med(xs))} [{num(min(xs))}-{num(max(xs))}]" if xs else "n/a"


def run(cmd: list[str], log: Path, cwd: str, env: dict[str, str] | None = None) -> None:
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    if p.returncode != 0:
        raise SystemExit(f"failed (exit {p.returncode}): {' '.join(cmd)}\nlog: {log}\n"
                         + log.read_text(errors="replace")[-3000:])


def cold(files: list[Path]) -> float:
    """Evict `files` from the page cache; the fraction still resident afterwards."""
    evict(files)
    frac = residency(files).fraction
    return float("nan") if frac is None else frac


def iobench_dataset(work: Path, pt: Point, samples: int) -> Manifest:
    cfg = SearchConfig(pt.workload, pt.accelerator, str(work / "iobench"))
    w = cfg.run.workload
    root = work / "iobench" / f"{w.dataset}-{w.format}"
    if not (root / "iobench.json").exists():
        run([sys.executable, "-m", "iobench", "generate", "--workload", pt.workload,
             "--accelerator", pt.accelerator, "--samples", str(samples), "--storage",
             str(work / "iobench"), "--jobs", "2"], work / f"gen-{pt.workload}.log", str(work))
    m = Manifest.load(root)
    if m.num_samples != samples:
        raise SystemExit(f"{root} holds {m.num_samples} samples, not {samples}: delete it or "
                         f"give --samples {pt.workload}={m.num_samples}")
    return m


def sample_bytes(m: Manifest) -> float:
    """Mean stored bytes per sample of an iobench dataset (files' bytes / samples)."""
    return sum(f.bytes for f in m.files if f.role == "data") / m.num_samples


WORKLOAD_YAML = """model: iobench_{name}
framework: pytorch
workflow:
  generate_data: {generate}
  train: {train}
  evaluation: False
  checkpoint: False
dataset:
  data_folder: {data}
  format: {fmt}
  num_files_train: {nfiles}
  num_samples_per_file: {per}
  record_length: {record}
  num_files_eval: 0
  num_subfolders_train: 0
reader:
  data_loader: pytorch
  batch_size: {batch}
  read_threads: {workers}
  file_shuffle: seed
  sample_shuffle: seed
train:
  epochs: {epochs}
  computation_time: {compute}
metric:
  au: {au}
"""


def dlio_cmd(a: argparse.Namespace, ranks: int, cfgdir: Path, name: str, out: Path) -> list[str]:
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    return [mpiexec, "-n", str(ranks), a.dlio, "--config-dir", str(cfgdir), f"workload={name}",
            f"++workload.output.folder={out}", f"hydra.run.dir={out}"]


def dlio_env(pythonpath: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("MPI4PY_LIBMPI", str(Path(sys.executable).parent.parent / "lib"
                                        / "libmpi.so.12"))
    if pythonpath:  # a patched copy of the dlio_benchmark package, ahead of the installed one
        env["PYTHONPATH"] = pythonpath
    return env


def write_yaml(cfgdir: Path, name: str, epochs: int = 1, **kw: object) -> None:
    """DLIO's workload config `name` under `cfgdir` (also used by dlio_vs_iobench.py)."""
    (cfgdir / "workload").mkdir(parents=True, exist_ok=True)
    (cfgdir / "workload" / f"{name}.yaml").write_text(
        WORKLOAD_YAML.format(name=name, epochs=epochs, **kw))


def dlio_dataset(a: argparse.Namespace, work: Path, pt: Point, m: Manifest,
                 cfg: SearchConfig) -> tuple[Path, dict[str, object], list[Path]]:
    """DLIO's own dataset for `pt` (generated once); returns its folder, the YAML fields and
    its files."""
    _, fmt, per = FORMATS[pt.workload]
    nfiles = m.num_samples // per
    record = round(sample_bytes(m))
    data = work / "dlio" / pt.workload
    kw: dict[str, object] = dict(data=data, fmt=fmt, nfiles=nfiles, per=per, record=record,
                                 batch=cfg.batch, workers=a.workers, compute=repr(cfg.compute_s),
                                 au=cfg.run.workload.au_threshold)
    files = sorted(Path(p) for p in glob.glob(f"{data}/train/*.{fmt}"))
    if len(files) != nfiles:
        shutil.rmtree(data, ignore_errors=True)
        with tempfile.TemporaryDirectory() as tmp:
            write_yaml(Path(tmp) / "cfg", "gen", generate=True, train=False, **kw)
            run(dlio_cmd(a, 1, Path(tmp) / "cfg", "gen", Path(tmp) / "out"),
                work / f"dlio-gen-{pt.workload}.log", tmp, dlio_env())
        files = sorted(Path(p) for p in glob.glob(f"{data}/train/*.{fmt}"))
        if len(files) != nfiles:
            raise SystemExit(f"DLIO generated {len(files)} files under {data}/train, not "
                             f"{nfiles}: see {work}/dlio-gen-{pt.workload}.log")
        os.sync()
    (data / "valid").mkdir(exist_ok=True)  # DLIO lists it even when unused
    return data, kw, files


def run_iobench(cfg: SearchConfig, n: int, files: list[Path], log: Path) -> dict[str, float]:
    resident = cold(files)
    with tempfile.TemporaryDirectory() as res:
        # not from a checkout: `python -m` puts the working directory first on sys.path
        run(train_command(cfg, n, Path(res)), log, res)
        doc = json.loads(Path(glob.glob(f"{res}/*.json")[0]).read_text())
    s, ranks = doc["epochs"][0]["summary"], doc["epochs"][0]["ranks"]
    # iobench's run counted DLIO's way, per rank then averaged: the asked compute of steps
    # 2..n over the wall less the whole first step (its wait, and a mean step's compute)
    asked = cfg.compute_s
    dlio_way = [(r["steps"] - 1) * asked / (r["wall_s"] - r["first_batch_s"]
                                            - r["compute_s"] / r["steps"]) for r in ranks]
    # samples/s with the first step left out, summed over ranks (as `run_dlio`'s)
    steady = sum((r["samples"] - cfg.batch) / (r["wall_s"] - r["first_batch_s"]) for r in ranks)
    return {"au": s["au_mlperf_mean"], "au_all": s["au_mean"],
            "au_dlio_way": statistics.mean(dlio_way), "sps": s["samples_per_s"],
            "sps_steady": steady,
            "MBps": s["read_MBps"], "resident": resident,
            "overshoot": sum(r["compute_s"] for r in ranks)
            / sum(r["steps"] for r in ranks) / asked}


def run_dlio(a: argparse.Namespace, n: int, kw: dict[str, object], files: list[Path],
             record: float, log: Path, pythonpath: str | None = None) -> dict[str, float]:
    resident = cold(files)
    with tempfile.TemporaryDirectory() as tmp:
        write_yaml(Path(tmp) / "cfg", "cmp", generate=False, train=True, **kw)
        out = Path(tmp) / "out"
        run(dlio_cmd(a, n, Path(tmp) / "cfg", "cmp", out), log, tmp, dlio_env(pythonpath))
        metric = json.loads((out / "summary.json").read_text())["metric"]
        # per rank: steps 2..n over its block's wall less the first step's (load + compute)
        steady, batch = 0.0, int(kw["batch"])  # type: ignore[call-overload]
        for f in out.glob("*_output.json"):
            o = json.loads(f.read_text())["1"]
            proc, thr = o["proc"]["block1"], o["throughput"]["block1"]
            steady += (len(proc) - 1) * batch / (len(proc) * batch / thr - proc[0])
    sps = metric["train_throughput_samples_per_second"][0]
    return {"au": metric["train_au_percentage"][0] / 100, "sps": sps, "sps_steady": steady,
            "MBps": sps * record / MB, "resident": resident}


def print_table(points: list[Any], ranks: list[int], tools: list[str],
                res: dict[tuple[str, int], dict[str, list[dict[str, float]]]]) -> None:
    """The Markdown table: each tool's figures per workload and N, and iobench / DLIO."""
    print("\n| workload | N | tool | AU (MLPerf: first step out) | AU, first step in | "
          "iobench's run counted DLIO's way | step overshoot | samples/s | MB/s | "
          "samples/s, first step out | iobench / DLIO samples/s (first step out) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for pt in points:
        for n in ranks:
            io = res[(pt.label, n)]["iobench"]
            for tool in tools:
                rs = res[(pt.label, n)][tool]
                ratio = [x["sps"] / y["sps"] for x, y in zip(io, rs, strict=True)]
                ratio_steady = [x["sps_steady"] / y["sps_steady"]
                                for x, y in zip(io, rs, strict=True)]
                cols = " | ".join(spread([r[k] for r in rs]) if tool == "iobench" else "-"
                                  for k in ("au_all", "au_dlio_way", "overshoot"))
                print(f"| {pt.label} | {n} | {tool} | {spread([r['au'] for r in rs])} | {cols} | "
                      f"{spread([r['sps'] for r in rs])} | {spread([r['MBps'] for r in rs])} | "
                      f"{spread([r['sps_steady'] for r in rs])} | "
                      + (f"{spread(ratio)} ({spread(ratio_steady)})"
                         if tool != "iobench" else "") + " |")
    print("\nmedian [min-max] of interleaved repetitions (order rotated per repetition); "
          "each run one cold epoch; ratios within each repetition.")



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True, help="directory for both datasets (ext4)")
    p.add_argument("--dlio", default=shutil.which("dlio_benchmark"),
                   help="the dlio_benchmark executable (default: on PATH)")
    p.add_argument("--points", default="cosmoflow:h100,resnet50:a100:40",
                   help="W:A[:BATCH],...: workload, accelerator, batch (as `search --batch-size`: "
                        "compute time scales with it, demand kept)")
    p.add_argument("--ranks", default="1,2", help="accelerator counts N")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--slowdown", type=float, default=1.0, help="as `iobench search --slowdown`")
    p.add_argument("--workers", type=int, default=2, help="iobench workers = DLIO read_threads")
    p.add_argument("--dlio-patched", metavar="DIR",
                   help="also run DLIO with DIR first on PYTHONPATH: a copy of its "
                        "dlio_benchmark package with a change (e.g. without the per-sample "
                        "formatting of its whole index map), as a third, interleaved column")
    p.add_argument("--samples", default="", help="W=S,...: samples per dataset (default: "
                   + ", ".join(f"{w} {v[0]}" for w, v in FORMATS.items()) + ")")
    a = p.parse_args()
    points = parse_points(a.points)
    ranks = [int(r) for r in a.ranks.split(",")]
    samples = {w: v[0] for w, v in FORMATS.items()}
    for item in filter(None, a.samples.split(",")):
        w, _, s = item.partition("=")
        samples[w] = int(s)
    if a.dlio is None or not Path(a.dlio).exists():
        print("DLIO is not installed (no dlio_benchmark executable; give --dlio PATH): "
              "measuring iobench only\n")
        a.dlio = None
    work = Path(a.work).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"date: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}  host: "
          f"{os.uname().nodename}  cores: {os.cpu_count()}  load avg: {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}  workers: {a.workers}  slowdown: {a.slowdown:g}  "
          f"repetitions: {a.repeat}", flush=True)
    if os.environ.get("PYTHONPATH"):  # e.g. a patched DLIO package shadowing the installed one
        print(f"PYTHONPATH={os.environ['PYTHONPATH']}", flush=True)

    setups = []
    for pt in points:
        m = iobench_dataset(work, pt, samples[pt.workload])
        cfg = SearchConfig(pt.workload, pt.accelerator, str(work / "iobench"),
                           batch_size=pt.batch, slowdown=a.slowdown, workers=a.workers)
        root = work / "iobench" / f"{cfg.run.workload.dataset}-{cfg.run.workload.format}"
        io_files = [root / f.path for f in m.files if f.role == "data"]
        dl = dlio_dataset(a, work, pt, m, cfg) if a.dlio else None
        dl_record = 0.0
        if dl:  # DLIO's bytes per sample as stored
            dl_record = sum(f.stat().st_size for f in dl[2]) / m.num_samples
        print(f"{pt.label}: batch {cfg.batch}, compute {cfg.compute_s:.5g} s/step, demand "
              f"{cfg.demand_Bps / MB:.1f} MB/s per accelerator; iobench {m.num_samples} samples "
              f"of {sample_bytes(m):,.0f} B ({m.format}, {len(io_files)} files)"
              + (f"; DLIO {m.num_samples} samples of {dl_record:,.0f} B "
                 f"({FORMATS[pt.workload][1]}, {len(dl[2])} files)" if dl else ""), flush=True)
        setups.append((pt, cfg, io_files, dl, dl_record))

    tools = ["iobench", *(["DLIO"] if a.dlio else []),
             *(["DLIO patched"] if a.dlio and a.dlio_patched else [])]
    res: dict[tuple[str, int], dict[str, list[dict[str, float]]]] = {
        (pt.label, n): {t: [] for t in tools} for pt in points for n in ranks}
    for rep in range(a.repeat):
        for pt, cfg, io_files, dl, dl_record in setups:
            for n in ranks:
                key = (pt.label, n)
                tag = f"{pt.workload}-n{n}-r{rep}"
                order = tools[rep % len(tools):] + tools[:rep % len(tools)]  # rotated
                for tool in order:
                    if tool == "iobench":
                        r = run_iobench(cfg, n, io_files, work / "logs" / f"iobench-{tag}.log")
                    else:
                        assert dl is not None
                        patched = a.dlio_patched if tool == "DLIO patched" else None
                        r = run_dlio(a, n, dl[1], dl[2], dl_record, work / "logs" /
                                     f"{tool.replace(' ', '-').lower()}-{tag}.log", patched)
                    res[key][tool].append(r)
                    print(f"  rep {rep} {pt.label} N={n} {tool}: AU {r['au']:.3f}, "
                          f"{r['sps']:.1f} samples/s, {r['MBps']:.1f} MB/s (resident after "
                          f"eviction {r['resident']:.1%})", flush=True)

    print_table(points, ranks, tools, res)

if __name__ == "__main__":
    main()
