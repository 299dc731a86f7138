#!/usr/bin/env python3
"""Is iobench its own bottleneck? Loader figures next to their limits, measured side by side.

Subcommands (each prints a Markdown table; every figure is a median of N interleaved
repetitions, ratios are computed within each repetition, then their median):

  pipeline  `iobench train --model none --warm-cache` with the dataset's defaults, decoded
            (the default pipeline) vs `--no-decode`, same settings, per dataset found
            under STORAGE (<dataset>-hdf5). Target: decoded >= 0.8 x no-decode (imagenet:
            see `jpeg`). `--before DIR` adds the same runs with an older iobench (a tree
            with iobench/loaders and iobench/generators linked in, e.g. from git archive).
  cold-fio  cosmoflow, default `iobench train --model none` cold (evicted before every
            epoch) vs fio reading the same files (O_DIRECT, 1 MiB blocks, one job per
            loader worker, each job one file after another), evicted first. Target >= 0.8.
            `--before DIR` adds the same pair with an older iobench, interleaved.
  jpeg      imagenet JPEGs of STORAGE/imagenet-hdf5, one core: raw libjpeg-turbo decode
            (simplejpeg, full size, RGB) vs iobench's decode + random-resized crop + flip
            (loaders/_preprocess.imagenet) vs DALI's CPU pipeline (decoders.image +
            random_resized_crop + crop_mirror_normalize, 1 thread). images/s per core
            from CPU time. Target: iobench >= 0.8 x raw decode.
  cpu       the loader's own CPU cost per sample, no workers (read + decode in one process),
            warm, decoded vs --no-decode, per dataset under STORAGE, from CPU time (so
            less sensitive to other jobs on a shared machine than `pipeline`'s wall
            clock). `--before DIR` as for `pipeline`.
  convert   cosmoflow through 2 worker processes, warm: the stored int16 delivered
            (convert=device, the conversion left to the device) vs float32 converted in
            the workers (convert=loader), and the conversion's own rate per core
            (log1p table vs numpy's float32 log1p).

  python scripts/bench/loader_limits.py pipeline --storage DIR [--repeat 3] [--before DIR]
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
from pathlib import Path

DATASETS = ("cosmoflow", "cifar10", "imagenet")


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    return f"{med(xs):.3g} [{min(xs):.3g}-{max(xs):.3g}]" if xs else "n/a"


def header(what: str) -> None:
    load = os.getloadavg()
    print(f"# {what}\n\ndate: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}  host: "
          f"{os.uname().nodename}  cores: {os.cpu_count()}  load avg (1/5/15 min): "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")


def train(storage: str, dataset: str, extra: list[str], pythonpath: str | None = None,
          epochs: int = 3) -> dict:
    """Run `iobench train --model none`; return {samples_per_s, read_MBps} (median of the
    epochs after the first, whose start-up is apart)."""
    with tempfile.TemporaryDirectory() as res:
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        cmd = [sys.executable, "-m", "iobench", "train", "--loader", "hdf5", "--dataset",
               dataset, "--model", "none", "--storage", storage, "--epochs", str(epochs),
               "--results", res, *extra]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=res)  # not a
        # checkout: python -m puts the working directory first on sys.path
        if p.returncode != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        doc = json.loads(Path(glob.glob(f"{res}/*.json")[0]).read_text())
    eps = [e["summary"] for e in doc["epochs"]][1:]
    return {"samples_per_s": med([e["samples_per_s"] for e in eps]),
            "read_MBps": med([e["read_MBps"] for e in eps]),
            "batch_size": doc["config"]["batch_size"], "workers": doc["config"]["workers"]}


def cmd_pipeline(a: argparse.Namespace) -> None:
    header("default pipeline vs --no-decode, warm page cache (iobench train --model none)")
    versions = [("after", None)] + ([("before", a.before)] if a.before else [])
    found = [d for d in DATASETS if (Path(a.storage) / f"{d}-hdf5").is_dir()]
    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    meta: dict[tuple[str, str], dict] = {}
    for _ in range(a.repeat):
        for ds in found:
            for ver, pp in versions:
                dec = train(a.storage, ds, ["--warm-cache"], pp)
                raw = train(a.storage, ds, ["--warm-cache", "--no-decode"], pp)
                r = rows.setdefault((ds, ver), {"dec": [], "raw": [], "ratio": []})
                r["dec"].append(dec["samples_per_s"])
                r["raw"].append(raw["samples_per_s"])
                r["ratio"].append(dec["samples_per_s"] / raw["samples_per_s"])
                meta[(ds, ver)] = dec
    print("| dataset | iobench | batch | workers | decoded samples/s | --no-decode samples/s "
          "| decoded / no-decode |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (ds, ver), r in rows.items():
        m = meta[(ds, ver)]
        print(f"| {ds} | {ver} | {m['batch_size']} | {m['workers']} | {spread(r['dec'])} | "
              f"{spread(r['raw'])} | {spread(r['ratio'])} |")
    print(f"\nmedian [min-max] of {a.repeat} interleaved repetitions; ratios within each. "
          "Target (issue 20): decoded >= 0.8 x no-decode (imagenet: the `jpeg` limit).")


BATCH = {"cosmoflow": 1, "cifar10": 64, "imagenet": 64}  # the datasets' default batches


def _cpu_one(storage: str, dataset: str, epochs: int) -> None:
    """(subprocess) samples per CPU-second, decoded and not, no workers: prints JSON."""
    from iobench.loaders import LoaderConfig, make_loader

    out = {}
    for decode in (True, False):
        c = LoaderConfig(batch_size=BATCH[dataset], workers=0, library_cache=True,
                         decode=decode)
        with make_loader("hdf5", Path(storage) / f"{dataset}-hdf5", c) as ld:
            ld.start()
            sum(len(b.indices) for b in ld.epoch(0))  # warm-up: page cache, first use
            t0 = time.process_time()
            n = sum(len(b.indices) for e in range(1, epochs + 1) for b in ld.epoch(e))
            out["dec" if decode else "raw"] = n / (time.process_time() - t0)
    print(json.dumps(out))


def cmd_cpu(a: argparse.Namespace) -> None:
    header("loader CPU cost per sample, no workers, warm: decoded vs --no-decode")
    versions = [("after", None)] + ([("before", a.before)] if a.before else [])
    found = [d for d in DATASETS if (Path(a.storage) / f"{d}-hdf5").is_dir()]
    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    for _ in range(a.repeat):
        for ds in found:
            for ver, pp in versions:
                env = dict(os.environ)
                if pp:
                    env["PYTHONPATH"] = pp
                with tempfile.TemporaryDirectory() as cwd:  # not a checkout (sys.path)
                    p = subprocess.run([sys.executable, str(Path(__file__).resolve()),
                                        "_cpu1", "--storage", a.storage, "--dataset", ds],
                                       env=env, capture_output=True, text=True, cwd=cwd)
                if p.returncode != 0:
                    raise SystemExit(f"failed: {p.stderr[-2000:]}")
                got = json.loads(p.stdout.strip().splitlines()[-1])
                r = rows.setdefault((ds, ver), {"dec": [], "raw": [], "ratio": []})
                r["dec"].append(got["dec"])
                r["raw"].append(got["raw"])
                r["ratio"].append(got["dec"] / got["raw"])
    print("| dataset | iobench | batch | decoded samples per CPU-s | --no-decode samples per "
          "CPU-s | decoded / no-decode |")
    print("|---|---|---:|---:|---:|---:|")
    for (ds, ver), r in rows.items():
        print(f"| {ds} | {ver} | {BATCH[ds]} | {spread(r['dec'])} | {spread(r['raw'])} | "
              f"{spread(r['ratio'])} |")
    print(f"\nmedian [min-max] of {a.repeat} interleaved repetitions; ratios within each; "
          "CPU time of the one process (user + system), 3 epochs after a warm-up epoch.")


def fio_read(files: list[str], jobs: int) -> float:
    """MB/s of fio reading `files` with O_DIRECT, 1 MiB blocks, `jobs` jobs (each reads the
    files one after another, starting at a different one)."""
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed (apt-get install fio, or make system-deps)")
    args = ["fio", "--output-format=json", "--name=read", "--rw=read", "--bs=1M",
            "--direct=1", "--ioengine=psync", f"--numjobs={jobs}", "--group_reporting",
            "--filename=" + ":".join(files), "--file_service_type=sequential"]
    out = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    return out["jobs"][0]["read"]["bw_bytes"] / 1e6


def evict(files: list[str]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cmd_cold_fio(a: argparse.Namespace) -> None:
    header("cosmoflow cold read: default iobench train --model none vs fio, same files")
    root = Path(a.storage) / "cosmoflow-hdf5"
    files = sorted(str(p) for p in root.glob("*.h5"))
    if not files:
        raise SystemExit(f"no cosmoflow HDF5 files under {root}: iobench generate --dataset "
                         "cosmoflow --storage STORAGE")
    versions = [("after", None)] + ([("before", a.before)] if a.before else [])
    rows: dict[str, dict[str, list[float]]] = {v: {"io": [], "fio": [], "ratio": []}
                                               for v, _ in versions}
    for _ in range(a.repeat):
        for ver, pp in versions:  # interleaved: each version next to its own fio run
            t = train(a.storage, "cosmoflow", [], pp, epochs=3)
            evict(files)
            f = fio_read(files, t["workers"])
            rows[ver]["io"].append(t["read_MBps"])
            rows[ver]["fio"].append(f)
            rows[ver]["ratio"].append(t["read_MBps"] / f)
    print("| iobench | iobench train (default, cold) MB/s | fio O_DIRECT read MB/s "
          "| iobench / fio |")
    print("|---|---:|---:|---:|")
    for ver, r in rows.items():
        print(f"| {ver} | {spread(r['io'])} | {spread(r['fio'])} | {spread(r['ratio'])} |")
    print(f"\n{len(files)} files, {sum(os.path.getsize(f) for f in files) / 1e6:.0f} MB; fio: "
          f"--rw=read --bs=1M --direct=1 --numjobs={t['workers']} (the loader's workers); "
          "target (issue 20) >= 0.8.")


def _jpegs(storage: str, n: int) -> tuple[list[bytes], list[int]]:
    import h5py
    import numpy as np

    path = sorted((Path(storage) / "imagenet-hdf5").glob("*.h5"))[0]
    with h5py.File(path, "r") as h:
        off = h["offsets"][: n + 1]
        data = h["jpeg"][: off[-1]]
    del np
    return [bytes(data[off[i]:off[i + 1]]) for i in range(len(off) - 1)], list(range(n))


def cmd_jpeg(a: argparse.Namespace) -> None:
    import numpy as np
    import simplejpeg
    import torch

    from iobench.loaders import _preprocess as pp

    torch.set_num_threads(1)  # per core, as in a loader worker
    header("imagenet JPEG: decode + random-resized crop + flip per core, vs raw decode")
    jpegs, idx = _jpegs(a.storage, a.images)
    offsets = np.zeros(len(jpegs) + 1, dtype=np.int64)
    np.cumsum([len(j) for j in jpegs], out=offsets[1:])
    data = np.frombuffer(b"".join(jpegs), dtype=np.uint8)
    index = np.array(idx)
    out = np.empty((len(jpegs), 224, 224, 3), dtype=np.uint8)

    def raw() -> None:
        for j in jpegs:
            simplejpeg.decode_jpeg(j, colorspace="RGB")

    def iobench(epoch: int) -> None:
        pp.imagenet(data, offsets, index, 0, epoch, out=out)

    dali = _dali_cpu(jpegs)
    res: dict[str, list[float]] = {"raw": [], "iobench": [], "dali": [], "ratio": [],
                                   "dali_ratio": []}
    for rep in range(a.repeat):
        rates = {}
        for name, fn in (("raw", raw), ("iobench", lambda rep=rep: iobench(rep)),
                         ("dali", dali)):
            if fn is None:
                continue
            t0 = time.process_time()
            fn()
            rates[name] = len(jpegs) / (time.process_time() - t0)
            res[name].append(rates[name])
        res["ratio"].append(rates["iobench"] / rates["raw"])
        if "dali" in rates:
            res["dali_ratio"].append(rates["dali"] / rates["raw"])
    print("| path | images/s per core | / raw decode |")
    print("|---|---:|---:|")
    print(f"| raw decode (simplejpeg, full size, RGB) | {spread(res['raw'])} | 1 |")
    print(f"| iobench decode + crop + flip (uint8) | {spread(res['iobench'])} | "
          f"{spread(res['ratio'])} |")
    if res["dali"]:
        print(f"| DALI CPU pipeline, 1 thread (uint8 HWC) | {spread(res['dali'])} | "
              f"{spread(res['dali_ratio'])} |")
    else:
        print("| DALI CPU pipeline | not installed | |")
    print(f"\n{len(jpegs)} images of {a.storage}/imagenet-hdf5 (mean "
          f"{np.mean([len(j) for j in jpegs]) / 1e3:.0f} KB); CPU time of this process, "
          "torch at 1 thread; target (issue 20): iobench >= 0.8 x raw decode.")


def _dali_cpu(jpegs: list[bytes]):
    """A function running DALI's CPU decode + random-resized crop + flip over `jpegs`
    once (1 thread), or None without DALI."""
    try:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def
    except ImportError:
        return None
    import numpy as np

    bs = 32
    arrays = [np.frombuffer(j, dtype=np.uint8) for j in jpegs]
    batches = [arrays[s:s + bs] for s in range(0, len(arrays), bs)]
    batches = [b for b in batches if len(b) == bs]

    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        x = fn.external_source(name="jpeg", dtype=types.UINT8)
        img = fn.decoders.image(x, device="cpu", output_type=types.RGB)
        img = fn.random_resized_crop(img, size=[224, 224], random_area=[0.08, 1.0],
                                     random_aspect_ratio=[3 / 4, 4 / 3])
        return fn.crop_mirror_normalize(img, mirror=fn.random.coin_flip(),
                                        dtype=types.UINT8, output_layout="HWC")

    p = pipe()
    p.build()

    def run() -> None:
        for b in batches:
            p.feed_input("jpeg", b)
            p.run()

    run()  # warm-up (first-use allocations)
    return run


def cmd_convert(a: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from iobench.loaders import LoaderConfig, make_loader
    from iobench.loaders.base import log1p_int16

    header("cosmoflow: where to convert (2 worker processes, warm) and the conversion itself")
    root = Path(a.storage) / "cosmoflow-hdf5"
    res: dict[str, list[float]] = {"device": [], "loader": [], "lut": [], "np": []}
    x = np.random.default_rng(0).integers(0, 200, (2, 128, 128, 128, 4)).astype(np.int16)
    for _ in range(a.repeat):
        for convert in ("device", "loader"):
            c = LoaderConfig(batch_size=1, workers=2, library_cache=True, convert=convert)
            with make_loader("hdf5", root, c) as ld:
                ld.start()
                rates = []
                for e in range(3):
                    t0 = time.perf_counter()
                    n = sum(len(b.indices) for b in ld.epoch(e))
                    rates.append(n / (time.perf_counter() - t0))
            res[convert].append(med(rates[1:]))
        torch.set_num_threads(1)
        t0 = time.process_time()
        log1p_int16(x)
        res["lut"].append(x.size / (time.process_time() - t0) / 1e6)
        t0 = time.process_time()
        np.log1p(x.astype(np.float32))
        res["np"].append(x.size / (time.process_time() - t0) / 1e6)
    print("| what | figure |")
    print("|---|---:|")
    print(f"| int16 delivered, float conversion at the device: samples/s | "
          f"{spread(res['device'])} |")
    print(f"| float32 converted in the workers (table): samples/s | {spread(res['loader'])} |")
    print(f"| log1p by table, one core: M values/s | {spread(res['lut'])} |")
    print(f"| numpy float32 log1p, one core: M values/s | {spread(res['np'])} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("pipeline", "cold-fio", "jpeg", "convert", "cpu", "_cpu1"):
        s = sub.add_parser(name)
        s.add_argument("--storage", required=True, help="directory holding <dataset>-hdf5/")
        s.add_argument("--repeat", type=int, default=3)
        if name == "_cpu1":
            s.add_argument("--dataset", required=True)
            s.add_argument("--epochs", type=int, default=3)
        if name in ("pipeline", "cpu", "cold-fio"):
            s.add_argument("--before", default=None, metavar="DIR",
                           help="also run an older iobench importable from DIR")
        if name == "jpeg":
            s.add_argument("--images", type=int, default=256)
    a = p.parse_args()
    if a.cmd == "_cpu1":
        return _cpu_one(a.storage, a.dataset, a.epochs)
    {"pipeline": cmd_pipeline, "cold-fio": cmd_cold_fio, "jpeg": cmd_jpeg,
     "convert": cmd_convert, "cpu": cmd_cpu}[a.cmd](a)


if __name__ == "__main__":
    main()
