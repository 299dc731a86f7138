"""ImageNet-like generation rate against JPEG-encoding the same images alone, side by side.

    .venv/bin/python scripts/bench/gen_encode.py [--work DIR] [--samples 1000] [--jobs 2]
                                                 [--repeat 3] [--json OUT] [--before DIR]

Each repetition runs, interleaved, with `--jobs` processes each:
  generate     `iobench generate --dataset imagenet --format hdf5` (synthesis, encode,
               write, fsync, checksums): images/s from the command's own timing;
  synth        `make_sample` of the same indices in memory (no disk);
  encode-PIL / encode-simplejpeg
               JPEG-encoding the same images, decoded once to RGB beforehand, at the
               generator's quality and chroma subsampling (libjpeg-turbo either way);
  encode-planes
               the encoder alone on the generator's own Y, Cb, Cr planes
               (`synth.imagenet_planes`, when the generator has it).
Prints medians [min-max] and generate / encode ratios (goal: >= 0.5 against the fastest
encoder), and the JPEG size distribution of the generated images. `--before DIR` also
runs `generate` with an older iobench (importable from DIR) right after the current one.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gencommon import fmt, generate, header, loadavg, median, save

_IMAGES: list[np.ndarray] = []
_PLANES: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
_JOBS = 1
_INDICES: list[int] = []


def _encode_pil(k: int) -> int:
    from PIL import Image

    from iobench.generators import synth

    sub = {"444": 0, "422": 1, "420": 2}[getattr(synth, "JPEG_SUBSAMPLING", "420")]
    for a in _IMAGES[k::_JOBS]:
        Image.fromarray(a).save(io.BytesIO(), format="JPEG", quality=synth.JPEG_QUALITY,
                                subsampling=sub)
    return len(_IMAGES[k::_JOBS])


def _encode_simplejpeg(k: int) -> int:
    import simplejpeg

    from iobench.generators import synth

    sub = getattr(synth, "JPEG_SUBSAMPLING", "420")
    for a in _IMAGES[k::_JOBS]:
        simplejpeg.encode_jpeg(a, quality=synth.JPEG_QUALITY, colorspace="RGB",
                               colorsubsampling=sub)
    return len(_IMAGES[k::_JOBS])


def _encode_planes(k: int) -> int:
    import simplejpeg

    from iobench.generators import synth

    for y, u, v in _PLANES[k::_JOBS]:
        simplejpeg.encode_jpeg_yuv_planes(y, u, v, quality=synth.JPEG_QUALITY)
    return len(_PLANES[k::_JOBS])


def _synth(k: int) -> int:
    from iobench.core.datasets import DATASETS
    from iobench.generators.synth import make_sample

    spec = DATASETS["imagenet"]
    for i in _INDICES[k::_JOBS]:
        make_sample(spec, 0, i)
    return len(_INDICES[k::_JOBS])


def _warm(_k: int) -> int:
    import simplejpeg  # noqa: F401
    from PIL import Image  # noqa: F401

    from iobench.generators import synth  # noqa: F401
    return 0


def _timed(fn, jobs: int) -> float:
    """Images/s of `fn` run on `jobs` freshly forked processes (start-up not timed)."""
    with mp.get_context("fork").Pool(jobs) as pool:
        pool.map(_warm, range(jobs))
        t0 = time.perf_counter()
        n = sum(pool.map(fn, range(jobs)))
        return n / (time.perf_counter() - t0)


def _load_images(root: Path) -> list[bytes]:
    import h5py

    blobs = []
    for p in sorted(root.glob("part-*.h5")):
        with h5py.File(p, "r") as f:
            data, off = f["jpeg"][...], f["offsets"][...]
        blobs += [data[off[i]:off[i + 1]].tobytes() for i in range(len(off) - 1)]
    return blobs


def size_stats(blobs: list[bytes]) -> dict[str, Any]:
    """JPEG bytes and pixel sizes of the generated images."""
    import simplejpeg

    s = np.array([len(b) for b in blobs], dtype=np.float64)
    hw = np.array([simplejpeg.decode_jpeg_header(b)[:2] for b in blobs])
    long_side = hw.max(axis=1)
    return {"count": int(s.size), "mean_KB": s.mean() / 1e3, "std_KB": s.std() / 1e3,
            "p5_KB": np.percentile(s, 5) / 1e3, "p50_KB": np.median(s) / 1e3,
            "p95_KB": np.percentile(s, 95) / 1e3, "p99_KB": np.percentile(s, 99) / 1e3,
            "max_KB": s.max() / 1e3, "mean_h": hw[:, 0].mean(), "mean_w": hw[:, 1].mean(),
            "frac_long_side_over_500": float((long_side > 500).mean()),
            "max_long_side": int(long_side.max())}


def main() -> int:
    global _JOBS, _INDICES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/iobench-bench-gen-encode"))
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--samples-per-file", type=int, default=64,
                    help="files are the unit of parallel work (default: 64)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--before", metavar="DIR", help="also run an older iobench's generate")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    info = header(a.work)
    _JOBS, _INDICES = a.jobs, list(range(a.samples))
    from iobench.generators import synth

    have_planes = hasattr(synth, "imagenet_planes")
    print(f"JPEG quality {synth.JPEG_QUALITY}, subsampling "
          f"{getattr(synth, 'JPEG_SUBSAMPLING', '420')}, synthesis version "
          f"{getattr(synth, 'SYNTHESIS_VERSION', 1)}, {a.samples} images, {a.jobs} processes")
    rows: dict[str, list[float]] = {k: [] for k in ("generate", "generate-before", "synth",
                                                     "encode-PIL", "encode-simplejpeg",
                                                     "encode-planes")}
    stats: dict[str, Any] = {}
    for r in range(a.repeat):
        g = generate(a.work / "gen", "imagenet", "hdf5", a.samples, a.samples_per_file,
                     jobs=a.jobs)
        rows["generate"].append(g["samples_per_s"])
        if a.before:
            g0 = generate(a.work / "gen-before", "imagenet", "hdf5", a.samples,
                          a.samples_per_file, jobs=a.jobs, pythonpath=a.before)
            rows["generate-before"].append(g0["samples_per_s"])
        if not _IMAGES:
            import simplejpeg

            blobs = _load_images(a.work / "gen" / "imagenet-hdf5")
            stats = size_stats(blobs)
            _IMAGES.extend(simplejpeg.decode_jpeg(b, colorspace="RGB") for b in blobs)
            if have_planes:
                from iobench.core.datasets import DATASETS

                _PLANES.extend(synth.imagenet_planes(DATASETS["imagenet"], 0, i)
                               for i in range(a.samples))
        rows["synth"].append(_timed(_synth, a.jobs))
        rows["encode-PIL"].append(_timed(_encode_pil, a.jobs))
        rows["encode-simplejpeg"].append(_timed(_encode_simplejpeg, a.jobs))
        if have_planes:
            rows["encode-planes"].append(_timed(_encode_planes, a.jobs))
        print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rows.items() if v)
              + f" images/s  (load {loadavg():.2f})")
    print()
    print("| what | images/s, median [min-max] |")
    print("|---|---:|")
    for k, v in rows.items():
        if v:
            print(f"| {k} | {fmt(v)} |")
    encoders = [k for k in ("encode-PIL", "encode-simplejpeg", "encode-planes") if rows[k]]
    fastest = max(encoders, key=lambda k: median(rows[k]))
    print()
    for gen in ("generate", "generate-before"):
        for k in encoders if rows[gen] else ():
            ratios = [g / e for g, e in zip(rows[gen], rows[k], strict=True)]
            print(f"{gen} / {k}: {fmt(ratios, '.2f')} (per repetition, side by side)")
    print(f"headline: generate / fastest encoder ({fastest}) = "
          f"{median(rows['generate']) / median(rows[fastest]):.2f} (medians)")
    print()
    print("JPEG sizes: " + ", ".join(f"{k} {v:.3g}" for k, v in stats.items()))
    info["load_1min_end"] = loadavg()
    save(a.json, {"info": info, "rates": rows, "sizes": stats, "samples": a.samples,
                  "jobs": a.jobs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
