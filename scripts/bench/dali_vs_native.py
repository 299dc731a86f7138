#!/usr/bin/env python3
"""Is iobench's DALI path at DALI's own ceiling? Its loader against DALI's own pipeline, same files.

DALI's own ImageNet recipe ("native"): `fn.readers.file` (random_shuffle, pad_last_batch,
DALI's defaults otherwise) -> `decoders.image_random_crop` (device "mixed" on a GPU, else
"cpu") -> `resize` to 224 x 224 -> `crop_mirror_normalize` (random mirror, uint8 HWC: the
compact form iobench's loader delivers, so both do the same work), and with `--no-decode`
the reader alone. Against it: iobench's dali loader (`make_loader("dali", ...)`, global
shuffle, decode on or off) on the same JPEG files, and on the same images in each format
of `--formats` (container formats feed DALI through iobench's readers).

Both run with the same batch size and threads (`--threads`: DALI's CPU threads and
iobench's `workers`), page cache warm (the data are read once first), and are timed over
`--epochs` epochs after one warm-up epoch, so start-up is apart; iobench's per-epoch
pipeline rebuild is in its time, as it is in a real run. On a GPU each batch is waited for
(`torch.cuda.synchronize()`). Repetitions are interleaved (native then iobench, then the
other way round) and every figure is the median of `--repeat` repetitions, the ratio
(iobench / native) computed within each repetition. Target: ratio >= 0.8.

  python scripts/bench/dali_vs_native.py --work DIR [--samples 2048] [--batch 128]
      [--threads 8] [--device cpu|gpu] [--formats files,hdf5] [--repeat 3] [--json OUT]

The dataset is generated into DIR with `iobench generate` (imagenet, `--samples`), or
reused where DIR already holds it. Nothing is written outside DIR (and `--json`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CROP = 224
# nvJPEG's buffers sized up front, as in DALI's own ImageNet example (and iobench's loader)
NVJPEG_PADDING = {"device_memory_padding": 211_025_920, "host_memory_padding": 140_544_512}


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float], spec: str = ".0f") -> str:
    return f"{med(xs):{spec}} [{min(xs):{spec}}-{max(xs):{spec}}]" if xs else "n/a"


def generate(work: Path, fmt: str, samples: int, jobs: int) -> Path:
    """The imagenet dataset in format `fmt` under `work` (generated unless already there)."""
    root = work / f"imagenet-{fmt}"
    if not (root / "iobench.json").exists():
        cmd = [sys.executable, "-m", "iobench", "generate", "--dataset", "imagenet",
               "--format", fmt, "--samples", str(samples), "--storage", str(work),
               "--jobs", str(jobs), "--force"]
        subprocess.run(cmd, check=True, cwd=work, stdout=subprocess.DEVNULL)
    return root


def warm(root: Path) -> None:
    """Read every file of the dataset once, so every run finds it in the page cache."""
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 22):
                    pass


def native_pipeline(root: Path, files: list[str], batch: int, threads: int, gpu: bool,
                    decode: bool) -> Any:
    """DALI's own ImageNet training pipeline over `files` (relative to `root`), built."""
    from nvidia.dali import Pipeline, fn, types

    pipe = Pipeline(batch_size=batch, num_threads=threads, device_id=0 if gpu else None,
                    seed=1234, prefetch_queue_depth=2, exec_dynamic=True)
    with pipe:
        jpegs, labels = fn.readers.file(file_root=str(root), files=files, random_shuffle=True,
                                        pad_last_batch=True, name="Reader")
        out = jpegs
        if decode:
            img = fn.decoders.image_random_crop(
                jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB,
                random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10,
                **(NVJPEG_PADDING if gpu else {}))
            img = fn.resize(img, resize_x=CROP, resize_y=CROP, antialias=True)
            out = fn.crop_mirror_normalize(img, mirror=fn.random.coin_flip(),
                                           dtype=types.UINT8, output_layout="HWC")
        pipe.set_outputs(out, labels)
    pipe.build()
    return pipe


def sync(gpu: bool) -> None:
    if gpu:
        import torch

        torch.cuda.synchronize()


def run_native(root: Path, batch: int, threads: int, gpu: bool, decode: bool,
               epochs: int) -> float:
    """Images per second of DALI's own pipeline, over `epochs` epochs after a warm-up one."""
    from iobench.core.manifest import Manifest

    files = [f.path for f in Manifest.load(root).data_files]
    pipe = native_pipeline(root, files, batch, threads, gpu, decode)
    steps = -(-len(files) // batch)
    try:
        for _ in range(steps):  # warm-up epoch: threads, buffers, nvJPEG's allocations
            pipe.run()
        sync(gpu)
        t0 = time.perf_counter()
        for _ in range(steps * epochs):
            pipe.run()
            sync(gpu)
        return len(files) * epochs / (time.perf_counter() - t0)
    finally:
        pipe._shutdown()


def run_iobench(root: Path, batch: int, threads: int, gpu: bool, decode: bool,
                epochs: int) -> float:
    """Images per second of iobench's dali loader, over `epochs` epochs after a warm-up one."""
    from iobench.loaders import LoaderConfig, make_loader

    cfg = LoaderConfig(batch_size=batch, workers=threads, decode=decode, shuffle="global",
                       device="gpu" if gpu else "cpu")
    with make_loader("dali", root, cfg) as ld:
        for _ in ld.epoch(0):
            pass
        sync(gpu)
        t0 = time.perf_counter()
        seen = 0
        for e in range(1, epochs + 1):
            for b in ld.epoch(e):
                sync(gpu)
                seen += len(b.labels)
        return seen / (time.perf_counter() - t0)


def measure(a: argparse.Namespace, files_root: Path, roots: dict[str, Path]) -> list[dict[str, Any]]:
    """Interleaved repetitions; one row per (format, decode) with both rates and the ratio."""
    gpu = a.device == "gpu"
    rows = []
    for fmt, root in roots.items():
        for decode in (True, False):
            native = functools.partial(run_native, files_root, a.batch, a.threads, gpu, decode,
                                       a.epochs)
            ours = functools.partial(run_iobench, root, a.batch, a.threads, gpu, decode,
                                     a.epochs)
            got: dict[str, list[float]] = {"native": [], "iobench": []}
            ratios: list[float] = []
            for r in range(a.repeat):
                order: list[tuple[str, Callable[[], float]]] = [("native", native),
                                                                ("iobench", ours)]
                for name, run in (order if r % 2 == 0 else order[::-1]):
                    got[name].append(run())
                ratios.append(got["iobench"][-1] / got["native"][-1])
                print(f"  {fmt} decode={decode} rep {r}: native {got['native'][-1]:.0f} img/s, "
                      f"iobench {got['iobench'][-1]:.0f} img/s, ratio {ratios[-1]:.2f}",
                      flush=True)
            rows.append({"format": fmt, "decode": decode, "native_img_s": got["native"],
                         "iobench_img_s": got["iobench"], "ratio": ratios})
    return rows


def table(rows: list[dict[str, Any]], a: argparse.Namespace) -> str:
    lines = [f"device {a.device}, batch {a.batch}, threads {a.threads}, {a.samples} images, "
             f"{a.epochs} epochs per run after one warm-up, median [min-max] of {a.repeat}",
             "", "| format | decode | DALI's own (img/s) | iobench dali (img/s) | "
             "iobench / DALI's own |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['format']} | {'yes' if r['decode'] else 'no'} | "
                     f"{spread(r['native_img_s'])} | {spread(r['iobench_img_s'])} | "
                     f"{spread(r['ratio'], '.2f')} |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, type=Path, help="folder for the datasets")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--formats", default="files", help="comma-separated iobench formats")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per run")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                   help="generation processes")
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    formats = [f for f in a.formats.split(",") if f]
    files_root = generate(a.work, "files", a.samples, a.jobs)
    roots = {f: generate(a.work, f, a.samples, a.jobs) for f in formats}
    for root in {files_root, *roots.values()}:
        warm(root)
    load = os.getloadavg()
    print(f"# iobench's DALI loader vs DALI's own pipeline\n\ndate: "
          f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}  host: {os.uname().nodename}  "
          f"cores: {os.cpu_count()}  load avg: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n",
          flush=True)
    rows = measure(a, files_root, roots)
    print("\n" + table(rows, a))
    if a.json is not None:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                      "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
