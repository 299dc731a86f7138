"""Synthetic samples: the ground truth every writer stores and every loader test compares against.

Synthesis versions are per dataset (`DATASET_SYNTHESIS_VERSION`, recorded in
every manifest as `extra.synthesis_version`): version 1 was a per-sample FFT
synthesis; version 2 the vectorised one below; version 3 changed two
datasets only: cifar10's pixels in int16 fixed point (1.3x faster than
version 2's float32) and unet3d's per-sample depth spread. Every sample is a pure function of `(seed, dataset, index)`: the
same bytes whatever the number of ranks or jobs, and whatever range a writer
asks for. The random streams, each a `np.random.default_rng([seed,
DATASET_IDS[dataset], stream, n])`:

- labels (stream 1): block `n = index // LABEL_BLOCK` draws the labels of
  its `LABEL_BLOCK` samples at once (so labels cost no per-sample generator);
- pixels (stream 2): imagenet and cosmoflow draw one generator per sample
  (`n = index`); cifar10 draws one per block of `CIFAR_BLOCK` samples, so a
  block is synthesised with vectorised numpy;
- tables (stream 3): per-process tables (imagenet scene and grain tiles,
  cifar10 noise), built once per process and seed (`prepare`) and cached.

What each dataset looks like, and the signal that makes its label learnable:

- imagenet: a baseline JPEG (libjpeg-turbo, quality `JPEG_QUALITY`, 4:4:4 like
  most of ILSVRC-2012) of an h x w image. Sizes imitate ILSVRC-2012 train
  (`IMAGENET_SIZES` below, with sources): 88 % have a 500 px long side, 10 %
  are smaller, 2 % larger, log-uniform up to 4288 px; aspect ratios 4:3, 3:2,
  1:1, 5:4, 16:9 or anything from 1 to 2.5, three in four landscape (mean
  471 x 394 px against ILSVRC-2012's 469 x 387). Content,
  in the YCbCr planes the encoder takes: a crop (random offset, random flips)
  of one of 8 periodic 1024^2 scene tiles (a 1/f^beta luminance field, beta
  0.8-1.6, smooth chroma fields, 40 ellipses and rectangles with hard
  edges), a brightness and colour cast, and grain cropped from one of 8 noise
  tiles (sigma 1.5-12 grey levels; large images take the finer half, as large
  photos are smoother per pixel). Only the per-image offsets, flips and
  scalars are drawn per image, so an image costs about as much as its JPEG
  encode. Class signal for class c (0..999), added in RGB terms: a tint of 22
  grey levels towards hue (c % 10) / 10 and a luminance grating of amplitude
  18 at angle 18 deg * ((c // 10) % 10) with 3 + (c // 100) cycles across
  the image, random phase.
- cifar10: uint8 [32, 32, 3]. Class c has its own base colour (a fixed
  palette, scaled by 0.7-1.1), a grating at angle 18 deg * c with 2 + c % 3
  cycles per image and one of 64 phases (integer amplitude 25-50), a random
  smooth Gaussian blob (colour +-60), and Gaussian noise (sigma 18 grey levels, read
  from a per-process table at a random offset). A nearest-class-mean
  classifier on pixels beats chance (10 %) clearly.
- cosmoflow: int16 [128, 128, 128, 4] (DHWC). Label u = 4 float32 in [0, 1):
  sigma8 = 0.6 + 0.4 u0 (standard deviation of the Gaussian field delta),
  n = -2.6 + 1.2 u1 (power-spectrum slope, P(k) ~ k^n), growth = 0.5 + 0.5 u2
  (how much the structure grows from redshift channel 0 to 3), nbar = 20 +
  40 u3 (mean particle count per voxel). delta is a "fixed-amplitude" Gaussian
  field (Angulo & Pontzen 2016, MNRAS 462, L1): every Fourier mode has the
  amplitude k^(n/2) exactly and a random phase (one of 256), so its power
  spectrum is k^n with no sample variance; one 128^3 inverse FFT per sample.
  Channel z holds round(nbar * exp(g_z delta - g_z^2 sigma8^2 / 2)), a
  log-normal density with mean nbar, where g_z = growth^(3 - z) and delta is
  quantised to sigma8 / 1024 (within +-8 sigma8) so that all four channels
  come from one 16,384-entry table lookup; clipped to [0, 32767].
- cosmoflow-mlperf and unet3d: the same field on a 71^3 and a 264^3 box.
  unet3d's stored samples vary in depth (synthesis version 3, `DEPTH_SPREAD`):
  sample i holds d_i x 264 x 264 x 4, the 264^3 field cropped to its first
  d_i slices or repeated along the first axis (the field is periodic, so the
  seam is invisible), with d_i log-normal of MLPerf's mean and standard
  deviation (146,600,628 B +- 68,341,808, KiTS19's varying slice counts),
  drawn at the quantiles of a golden-ratio sequence so that even a few
  samples have about the right mean and spread (`sample_depth`).
"""

from __future__ import annotations

import functools
import math
import statistics
import threading

import numpy as np

from iobench.core.datasets import DatasetSpec

SYNTHESIS_VERSION = 3  # the newest; each dataset's own is `synthesis_version_of`
# each dataset's synthesis version, recorded in its manifests: a dataset whose bytes did not
# change in a later version keeps its number, so it is not refused as stale. 3: cifar10's
# pixels in int16 fixed point; unet3d's per-sample depth spread
DATASET_SYNTHESIS_VERSION: dict[str, int] = {
    "imagenet": 2, "cifar10": 3, "cosmoflow": 2, "cosmoflow-mlperf": 2, "unet3d": 3,
    "openimages": 2}
DATASET_IDS: dict[str, int] = {"imagenet": 1, "cifar10": 2, "cosmoflow": 3, "cosmoflow-mlperf": 4,
                               "unet3d": 5, "openimages": 6}
_LABELS, _PIXELS, _TABLES = 1, 2, 3  # random streams of a dataset
LABEL_BLOCK = 4096  # labels drawn together
CIFAR_BLOCK = 1024  # cifar10 samples synthesised together (divides LABEL_BLOCK)

JPEG_QUALITY = 90
JPEG_SUBSAMPLING = "444"

__all__ = ["CIFAR_BLOCK", "DATASET_IDS", "DATASET_SYNTHESIS_VERSION", "DEPTH_SPREAD",
           "IMAGENET_SIZES", "JPEG_QUALITY", "JPEG_SUBSAMPLING", "LABEL_BLOCK",
           "SYNTHESIS_VERSION", "fill_samples", "has_depth_spread", "imagenet_planes",
           "labels_array", "make_jpeg", "make_label", "make_sample", "prepare", "sample_depth",
           "sample_rng", "stored_sample", "synthesis_version_of"]


def _rng(spec: DatasetSpec, seed: int, stream: int, n: int) -> np.random.Generator:
    if seed < 0 or n < 0:
        raise ValueError(f"seed={seed} and index={n} must be >= 0")
    return np.random.default_rng([seed, DATASET_IDS[spec.name], stream, n])


def sample_rng(spec: DatasetSpec, seed: int, index: int) -> np.random.Generator:
    """The pixel generator of sample `index` (imagenet, cosmoflow) under `seed`."""
    return _rng(spec, seed, _PIXELS, index)


# ---------------------------------------------------------------- labels

@functools.lru_cache(maxsize=16)
def _label_block(spec: DatasetSpec, seed: int, block: int) -> np.ndarray:
    rng = _rng(spec, seed, _LABELS, block)
    if spec.num_classes > 0:
        out: np.ndarray = rng.integers(spec.num_classes, size=LABEL_BLOCK, dtype=np.int64)
    else:
        out = rng.random((LABEL_BLOCK, *spec.label_shape), dtype=np.float32)
    out.flags.writeable = False
    return out


def labels_array(spec: DatasetSpec, seed: int, first: int, count: int) -> np.ndarray:
    """Labels of samples [first, first + count) as an array [count, *label_shape]."""
    if first < 0 or count < 0:
        raise ValueError(f"first={first} and count={count} must be >= 0")
    out = np.empty((count, *spec.label_shape), dtype=spec.label_dtype)
    i = first
    while i < first + count:
        b, off = divmod(i, LABEL_BLOCK)
        n = min(LABEL_BLOCK - off, first + count - i)
        out[i - first:i - first + n] = _label_block(spec, seed, b)[off:off + n]
        i += n
    return out


def make_label(spec: DatasetSpec, seed: int, index: int) -> int | np.ndarray:
    """The label of sample `index` (int class, or float32 parameters), without the sample."""
    if index < 0:
        raise ValueError(f"index={index} must be >= 0")
    lab = _label_block(spec, seed, index // LABEL_BLOCK)[index % LABEL_BLOCK]
    return int(lab) if spec.num_classes > 0 else lab.copy()


# ---------------------------------------------------------------- samples

def synthesis_version_of(dataset: str) -> int:
    """The synthesis version of `dataset`'s bytes as this iobench writes them."""
    return DATASET_SYNTHESIS_VERSION.get(dataset, SYNTHESIS_VERSION)


def make_jpeg(spec: DatasetSpec, seed: int, index: int) -> bytes:
    """The JPEG bytes of sample `index` of a JPEG dataset (`make_sample`'s payload)."""
    return _encode(*imagenet_planes(spec, seed, index))


def make_sample(spec: DatasetSpec, seed: int, index: int) -> tuple[bytes | np.ndarray, int | np.ndarray]:
    """Ground truth of sample `index` as stored: (payload, label).

    payload: JPEG bytes (imagenet) or an ndarray of the spec's shape and dtype
    (unet3d: its first axis `sample_depth` long); label: int class, or float32
    [4] cosmological parameters in [0, 1).
    """
    label = make_label(spec, seed, index)
    if spec.sample_kind == "jpeg":
        return make_jpeg(spec, seed, index), label
    out = np.empty((1, *spec.array_shape), dtype=spec.sample_dtype)
    fill_samples(spec, seed, index, out)
    return stored_sample(spec, seed, index, out[0]), label


# ---------------------------------------------------------------- depth spread

# MLPerf Storage unet3d: 146,600,628 B +- 68,341,808 per sample (iobench/core/workloads.py), as
# (mean, standard deviation) of the first axis in slices of 264 x 264 x 4 int16 (557,568 B)
DEPTH_SPREAD: dict[str, tuple[float, float]] = {
    "unet3d": (146_600_628 / 557_568, 68_341_808 / 557_568)}
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def has_depth_spread(spec: DatasetSpec) -> bool:
    """Whether `spec`'s stored samples vary in their first axis."""
    return spec.name in DEPTH_SPREAD


def sample_depth(spec: DatasetSpec, seed: int, index: int) -> int:
    """First-axis length of stored sample `index`: the spec's, or for a dataset with a
    `DEPTH_SPREAD` a log-normal draw of that mean and standard deviation, taken at the
    quantile (golden-ratio sequence, offset by the seed) so any run of samples spreads."""
    assert spec.sample_shape is not None
    spread = DEPTH_SPREAD.get(spec.name)
    if spread is None:
        return spec.sample_shape[0]
    mean, std = spread
    s2 = math.log1p((std / mean) ** 2)
    u = ((index + 1) * _GOLDEN + seed * math.sqrt(2.0)) % 1.0
    u = min(max(u, 1e-9), 1 - 1e-9)
    z = statistics.NormalDist().inv_cdf(u)
    return max(1, round(math.exp(math.log(mean) - s2 / 2 + math.sqrt(s2) * z)))


def stored_sample(spec: DatasetSpec, seed: int, index: int, base: np.ndarray) -> np.ndarray:
    """Sample `index` as stored, from its base volume (`fill_samples`): `base` itself, or
    cut to `sample_depth` slices, or repeated along the first axis up to it (the field is
    periodic: no seam)."""
    if not has_depth_spread(spec):
        return base
    d, n = sample_depth(spec, seed, index), base.shape[0]
    if d <= n:
        return base[:d]
    out: np.ndarray = np.take(base, np.arange(d) % n, axis=0)
    return out


def fill_samples(spec: DatasetSpec, seed: int, first: int, out: np.ndarray) -> None:
    """Write samples [first, first + len(out)) of an array dataset into `out` (no copies).

    `out` is C-contiguous [count, *sample_shape] of the sample dtype; the bytes
    equal `make_sample`'s for every index, whatever the range.
    """
    if spec.sample_kind != "array":
        raise ValueError(f"{spec.name} samples are JPEG bytes; use make_sample")
    if out.shape[1:] != spec.sample_shape or out.dtype != np.dtype(spec.sample_dtype) \
            or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous [n, {spec.sample_shape}] {spec.sample_dtype}, "
                         f"got {out.shape} {out.dtype}")
    if spec.name == "cifar10":
        _cifar10_fill(spec, seed, first, out)
    elif spec.name in ("cosmoflow", "cosmoflow-mlperf", "unet3d"):
        labels = labels_array(spec, seed, first, len(out))
        for i in range(len(out)):
            _cosmoflow(sample_rng(spec, seed, first + i), labels[i], out[i])
    else:
        raise KeyError(f"no synthesis for dataset {spec.name!r}")


def prepare(spec: DatasetSpec, seed: int) -> None:
    """Build this process's tables for `(spec, seed)` now (before forking workers)."""
    if spec.sample_kind == "jpeg":
        _imagenet_tables(seed)
    elif spec.name == "cifar10":
        _cifar10_tables(seed)


# ---------------------------------------------------------------- cifar10

_CIFAR_PALETTE = np.array([
    [200, 60, 60], [60, 170, 60], [60, 80, 200], [210, 190, 60], [180, 70, 190],
    [60, 190, 190], [230, 140, 50], [120, 120, 120], [140, 90, 50], [250, 250, 250],
], dtype=np.float32)
_CIFAR_PHASES = 64
_CIFAR_NOISE = 1 << 20  # noise table length (plus one sample's worth)
_CIFAR_CHUNK = 256  # samples per vectorised step: its int16 planes stay in cache
_GRATING_SHIFT, _BLOB_SHIFT = 6, 7  # fixed point: gratings x 64, blob rows x 127 (~2^7)
_GRATING_ONE, _BLOB_ONE = 1 << _GRATING_SHIFT, 127


@functools.lru_cache(maxsize=1)
def _cifar10_gratings() -> np.ndarray:
    """sin gratings [class, phase, 1024 * 3] in int16 fixed point (x 64): 32 x 32 planes
    flattened, each pixel's value repeated for its 3 channels (the samples' HWC order)."""
    y, x = np.mgrid[0:32, 0:32].astype(np.float64) / 32.0
    c = np.arange(10)[:, None, None, None]
    theta = np.radians(18.0 * c)
    arg = (2 * np.pi * (2 + c % 3) * (x * np.cos(theta) + y * np.sin(theta))
           + 2 * np.pi * np.arange(_CIFAR_PHASES)[None, :, None, None] / _CIFAR_PHASES)
    table: np.ndarray = np.rint(np.sin(arg) * _GRATING_ONE).astype(np.int16)
    return np.repeat(table.reshape(10, _CIFAR_PHASES, 1024), 3, axis=2)


@functools.lru_cache(maxsize=2)
def _cifar10_tables(seed: int) -> np.ndarray:
    """Gaussian noise (sigma 18, int8), read at a random offset per sample: sample noise
    at offset o is the table's values o + ch * 1024 + pixel (channel planes). Kept in
    HWC order: entry 3 * k + ch holds value k + ch * 1024, so a sample's noise in its
    own (HWC) order is the contiguous run [3 * o, 3 * o + 3072)."""
    from iobench.core.datasets import DATASETS

    rng = _rng(DATASETS["cifar10"], seed, _TABLES, 0)
    noise = rng.standard_normal(_CIFAR_NOISE + 3072, dtype=np.float32) * np.float32(18.0)
    planar = np.clip(np.rint(noise), -127, 127).astype(np.int8)
    rows = _CIFAR_NOISE + 1024
    table = np.empty((rows, 3), dtype=np.int8)
    for ch in range(3):
        table[:, ch] = planar[ch * 1024:ch * 1024 + rows]
    return table.reshape(-1)


def _cifar10_synth(spec: DatasetSpec, seed: int, block: int, dest: np.ndarray) -> None:
    """Samples [block * CIFAR_BLOCK, (block + 1) * CIFAR_BLOCK) into `dest` (uint8
    [CIFAR_BLOCK, 32, 32, 3], C-contiguous).

    Per-sample draws are made in floating point and rounded once; the per-pixel work is
    int16 fixed point (half the memory traffic of float32 and twice the SIMD lanes),
    computed in the samples' own HWC order: the tables hold each term already
    interleaved (gratings repeated per channel, noise in HWC order, the blob's columns
    times each channel's colour), so every pass runs over rows of 96 or 3,072 values
    and the result is stored with one contiguous cast (no per-channel strided copies).
    """
    b = CIFAR_BLOCK
    labels = labels_array(spec, seed, block * b, b)
    rng = _rng(spec, seed, _PIXELS, block)
    phase = rng.integers(0, _CIFAR_PHASES, b)
    amp = rng.integers(25, 51, (b, 1), dtype=np.int16)
    centre = rng.uniform(0.2, 0.8, (b, 2))
    width = rng.uniform(0.01, 0.04, (b, 1))
    colour = rng.uniform(-60, 60, (b, 3))
    base = np.rint(_CIFAR_PALETTE[labels] * rng.uniform(0.7, 1.1, (b, 1))).astype(np.int16)
    offsets = rng.integers(0, _CIFAR_NOISE, b)
    t = np.arange(32) / 32.0
    # the blob is separable: rows in Q7 fixed point, columns already times each channel's
    # colour ([B, x * 3 + ch]), so the blob is one int16 outer product and a shift
    by = np.rint(np.exp(-(t - centre[:, :1]) ** 2 / (2 * width)) * _BLOB_ONE).astype(np.int16)
    bx = np.exp(-(t - centre[:, 1:]) ** 2 / (2 * width))
    bxc = np.rint(bx[:, :, None] * colour[:, None, :]).astype(np.int16).reshape(b, 96)
    base_row = np.tile(base, 32)  # [B, x * 3 + ch]
    hwc = _cifar10_tables(seed)
    noise = np.lib.stride_tricks.as_strided(hwc, shape=(_CIFAR_NOISE, 3072), strides=(3, 1),
                                            writeable=False)
    gratings = _cifar10_gratings()
    out = dest.reshape(b, 3072)
    n = _CIFAR_CHUNK
    grating = np.empty((n, 3072), dtype=np.int16)
    pixels = np.empty((n, 3072), dtype=np.int16)
    rows = pixels.reshape(n, 32, 96)
    for lo in range(0, b, n):
        s = slice(lo, lo + n)
        np.multiply(gratings[labels[s], phase[s]], amp[s], out=grating)  # |x| <= 50 * 64
        grating >>= _GRATING_SHIFT
        np.multiply(by[s, :, None], bxc[s, None, :], out=rows)  # |x| <= 127 * 60
        pixels >>= _BLOB_SHIFT
        pixels += grating
        rows += base_row[s, None, :]
        pixels += noise[offsets[s]]
        np.clip(pixels, 0, 255, out=pixels)
        np.copyto(out[s], pixels, casting="unsafe")


@functools.lru_cache(maxsize=4)
def _cifar10_block(spec: DatasetSpec, seed: int, block: int) -> np.ndarray:
    """A whole block (read-only, cached): for ranges that start or end inside it."""
    out = np.empty((CIFAR_BLOCK, 32, 32, 3), dtype=np.uint8)
    _cifar10_synth(spec, seed, block, out)
    out.flags.writeable = False
    return out


def _cifar10_fill(spec: DatasetSpec, seed: int, first: int, out: np.ndarray) -> None:
    i, end = first, first + len(out)
    while i < end:
        blk, off = divmod(i, CIFAR_BLOCK)
        n = min(CIFAR_BLOCK - off, end - i)
        if n == CIFAR_BLOCK:  # whole blocks straight into the caller's buffer
            _cifar10_synth(spec, seed, blk, out[i - first:i - first + n])
        else:
            out[i - first:i - first + n] = _cifar10_block(spec, seed, blk)[off:off + n]
        i += n


# ---------------------------------------------------------------- cosmoflow

_COSMO_N = 128  # cosmoflow's box; cosmoflow-mlperf's is its sample shape's (71)
_COSMO_LEVELS = 1 << 14  # delta quantised to sigma8 / 1024 over +-8 sigma8
_COSMO_STEP = 1024.0


@functools.lru_cache(maxsize=2)
def _cosmo_tables(n: int = _COSMO_N) -> tuple[np.ndarray, np.ndarray]:
    """log|k| on the rfftn grid of an n^3 box (k=0 set to 0), and 256 unit phases."""
    f = np.fft.fftfreq(n) * n
    fr = np.fft.rfftfreq(n) * n
    k2 = f[:, None, None] ** 2 + f[None, :, None] ** 2 + fr[None, None, :] ** 2
    k2[0, 0, 0] = 1.0
    logk = (0.5 * np.log(k2)).astype(np.float32)
    a = 2 * np.pi * np.arange(256) / 256
    return logk, (np.cos(a) + 1j * np.sin(a)).astype(np.complex64)


_SCRATCH = threading.local()  # per-thread work buffers: page faults cost as much as work


def _cosmo_scratch(n: int = _COSMO_N) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(modes complex64 [n, n, n/2+1], delta float32 [n, n, n], index intp [n^3])."""
    bufs = getattr(_SCRATCH, "cosmo", None)
    if bufs is None or bufs[1].shape[0] != n:
        bufs = (np.empty((n, n, n // 2 + 1), dtype=np.complex64),
                np.empty((n, n, n), dtype=np.float32), np.empty(n ** 3, dtype=np.intp))
        _SCRATCH.cosmo = bufs
    return bufs


def _cosmoflow(rng: np.random.Generator, params: np.ndarray, out: np.ndarray) -> None:
    """One volume into `out` (int16 [n, n, n, 4]; n = 128 for cosmoflow)."""
    n = out.shape[0]
    sigma8 = 0.6 + 0.4 * float(params[0])
    slope = -2.6 + 1.2 * float(params[1])
    growth = 0.5 + 0.5 * float(params[2])
    nbar = 20.0 + 40.0 * float(params[3])
    logk, phases = _cosmo_tables(n)
    modes, delta, index = _cosmo_scratch(n)
    # the work buffers double up (index holds the phase draws, delta the amplitudes, each
    # before its own use) and the lookups skip numpy's out-buffering (mode="clip": every
    # index is in range): page faults and copies would cost as much as the arithmetic
    draws = index[:logk.size].reshape(logk.shape)
    np.copyto(draws, rng.integers(0, 256, logk.shape, dtype=np.uint8))
    np.take(phases, draws, out=modes, mode="clip")
    amp = delta.reshape(-1)[:logk.size].reshape(logk.shape)
    np.multiply(logk, np.float32(slope / 2.0), out=amp)
    np.exp(amp, out=amp)
    amp[0, 0, 0] = 0.0  # no mean density mode
    modes *= amp
    # irfftn's own steps (the inverse complex FFT along axes 0 and 1, then the real one
    # along axis 2), the first two in place: the same floats, no 8 MB temporaries
    np.fft.ifft(modes, axis=0, out=modes)
    np.fft.ifft(modes, axis=1, out=modes)
    np.fft.irfft(modes, n=n, axis=2, out=delta)
    flat = delta.reshape(-1)
    rms = math.sqrt(float(np.dot(flat, flat)) / flat.size)  # the mean is 0 (no k=0 mode)
    # delta / sigma8 * 1024 + levels / 2, rounded: the index of the quantised field
    np.multiply(flat, np.float32(_COSMO_STEP / (rms + 1e-30)), out=flat)
    flat += np.float32(_COSMO_LEVELS / 2 + 0.5)
    np.clip(flat, 0, _COSMO_LEVELS - 1, out=flat)
    np.copyto(index, flat, casting="unsafe")
    level = (np.arange(_COSMO_LEVELS) - _COSMO_LEVELS / 2) / _COSMO_STEP * sigma8
    g = growth ** (3.0 - np.arange(4))
    table = np.rint(nbar * np.exp(level[:, None] * g - g * g * (sigma8 * sigma8) / 2.0))
    table = np.clip(table, 0, 32767).astype(np.int16)
    # the 4 channels of one voxel are 8 bytes: one int64 lookup writes them all
    np.take(table.view(np.int64).reshape(-1), index, out=out.reshape(-1, 4).view(np.int64)
            .reshape(-1), mode="clip")


# ---------------------------------------------------------------- imagenet

# Sizes of ILSVRC-2012 train images, imitated. Sources: mean 469 x 387 px (the
# figure commonly quoted from the ILSVRC pages, e.g. image-net.org/challenges/
# LSVRC/2014); most common size 500 px on the long side, outliers up to 2592 x
# 3888 and 4288 x 2848, 4:4:4 and quality ~96 for most files (M. Ehrlich,
# "Compression in the ImageNet Dataset", Towards Data Science, 2021); mean file
# size ~110 KB (the 1,281,167-image train archive is ~138 GB). The mixture
# weights below are ours, chosen to reproduce those means (docs/design.md).
IMAGENET_SIZES: dict[str, object] = {
    "long_side": {"500": 0.88, "uniform 150-499": 0.10, "log-uniform 501-4288": 0.02},
    "aspect": {"4:3": 0.40, "3:2": 0.35, "1:1": 0.04, "5:4": 0.04, "16:9": 0.07,
               "uniform 1-2.5": 0.10},
    "landscape": 0.76,
    "target": {"mean_w": 469, "mean_h": 387, "mean_KB": 110},
}
_P_SMALL, _P_LARGE, _MAX_SIDE, _LANDSCAPE = 0.10, 0.02, 4288, 0.76
_ASPECTS = np.array([4 / 3, 3 / 2, 1.0, 5 / 4, 16 / 9])
_ASPECT_CDF = np.cumsum([0.40, 0.35, 0.04, 0.04, 0.07])  # the rest: uniform 1-2.5
# openimages (MLPerf Storage retinanet): imagenet's images at this many times the side, so
# the mean JPEG is ~323 KB (measured: docs/mlperf.md)
IMAGE_SCALE: dict[str, float] = {"openimages": 1.85}
_SCALED_MAX_SIDE = 1600
_TILE = 768
_SCENES = 8
_OBJECTS = 24  # per scene tile
_CHROMA_RANGE = 96  # scene chroma offsets are clipped to +-96 (uint8 tables, no clip)
_GRAIN = (1.0, 2.0, 3.5, 5.0, 7.5, 11.0, 16.0, 24.0)  # grain levels' sigma, grey levels
_GRAIN_OF = ((0, 4), (1, 5), (2, 6), (3, 7), (0, 5), (1, 6), (2, 7), (3, 4))  # per scene
_GRATING_PHASES = 64  # grating phases per cycle (rows take the nearest)
_RGB_TO_YCC = np.array([[0.299, 0.587, 0.114],
                        [-0.168736, -0.331264, 0.5],
                        [0.5, -0.418688, -0.081312]])


def _imagenet_size(rng: np.random.Generator) -> tuple[int, int]:
    u, v, a, land = rng.random(4)
    if u < _P_SMALL:
        long_side = 150 + int(u / _P_SMALL * 350)
    elif u < _P_SMALL + _P_LARGE:
        long_side = int(500 * (_MAX_SIDE / 500) ** ((u - _P_SMALL) / _P_LARGE)) + 1
    else:
        long_side = 500
    k = int(np.searchsorted(_ASPECT_CDF, v, side="right"))
    ratio = float(_ASPECTS[k]) if k < len(_ASPECTS) else 1.0 + 1.5 * a
    short = max(32, int(round(long_side / ratio)))
    return (short, long_side) if land < _LANDSCAPE else (long_side, short)


@functools.lru_cache(maxsize=1)
def _log_f() -> np.ndarray:
    """log |f| on the full FFT grid of a TILE^2 tile (f=0 set to 1), float32."""
    fy = np.fft.fftfreq(_TILE).astype(np.float32)[:, None]
    fx = np.fft.fftfreq(_TILE).astype(np.float32)[None, :]
    f2 = fy * fy + fx * fx
    f2[0, 0] = 1.0
    return np.float32(0.5) * np.log(f2)


@functools.lru_cache(maxsize=1)
def _unit_phases() -> np.ndarray:
    """256 unit complex numbers (complex64): the random phases of fixed-amplitude fields."""
    a = 2 * np.pi * np.arange(256) / 256
    return (np.cos(a) + 1j * np.sin(a)).astype(np.complex64)


def _periodic_fields(rng: np.random.Generator, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """Two unit-variance periodic fields [TILE, TILE] (float32) with amplitude spectrum
    1 / f^beta and random phases: the real and imaginary parts of one inverse FFT."""
    modes = _unit_phases().take(rng.integers(0, 256, (_TILE, _TILE), dtype=np.uint8))
    amp = np.exp(_log_f() * np.float32(-beta))
    amp[0, 0] = 0.0
    modes *= amp
    field = np.fft.ifft2(modes)
    out = []
    for part in (field.real, field.imag):
        flat = np.ascontiguousarray(part).reshape(-1)
        out.append(flat.reshape(_TILE, _TILE) * np.float32(1 / math.sqrt(
            float(np.dot(flat, flat)) / flat.size)))  # zero mean: no f = 0 mode
    return out[0], out[1]


def _box(centre: int, radius: int) -> slice | None:
    """[centre - radius, centre + radius] as a slice, or None when it wraps around."""
    lo, hi = centre - radius, centre + radius + 1
    return slice(lo, hi) if lo >= 0 and hi <= _TILE else None


def _box_index(centre: int, radius: int) -> np.ndarray:
    """Indices of [centre - radius, centre + radius] on the periodic tile."""
    return np.arange(centre - radius, centre + radius + 1) % _TILE


def _scene(seed: int, j: int) -> np.ndarray:
    """Scene tile j: int16 [3, TILE, TILE] Y, Cb, Cr offsets, periodic in both directions."""
    from iobench.core.datasets import DATASETS

    rng = _rng(DATASETS["imagenet"], seed, _TABLES, j)
    # scene j runs from detailed (j = 0: flat spectrum, strong contrast, detailed colour)
    # to smooth (j = 7): with the grain level, this spreads the JPEG sizes
    detail = 1.0 - j / (_SCENES - 1)
    lum, _ = _periodic_fields(rng, 2.0 - 1.5 * detail)
    cb, cr = _periodic_fields(rng, 2.2 - 1.0 * detail)
    planes = np.empty((3, _TILE, _TILE), dtype=np.float32)
    np.multiply(lum, np.float32(rng.uniform(25, 45) + 30 * detail), out=planes[0])
    np.multiply(cb, np.float32(rng.uniform(8, 18)), out=planes[1])
    np.multiply(cr, np.float32(rng.uniform(8, 18)), out=planes[2])
    # objects with hard edges (ellipses and rectangles), drawn with wrap-around: any
    # brightness, moderate colours (the mean colour of an image must keep the class tint)
    for _ in range(_OBJECTS):
        cy, cx = (int(v) for v in rng.integers(0, _TILE, 2))
        ry, rx = (int(v) for v in rng.integers(_TILE // 80, _TILE // 6, 2))
        ys, xs = _box(cy, ry), _box(cx, rx)
        wraps = not (isinstance(ys, slice) and isinstance(xs, slice))
        box = np.ix_(_box_index(cy, ry), _box_index(cx, rx)) if wraps else (ys, xs)
        ellipse = rng.random() < 0.5
        fill = _RGB_TO_YCC @ rng.uniform(-50, 50, 3)
        fill[0] = rng.uniform(-90, 90)
        region = planes[(slice(None), *box)]  # a view unless the box wraps
        # a flat colour keeping 60 % of the texture around it
        new = region - region.mean(axis=(1, 2), keepdims=True)
        new *= np.float32(0.6)
        new += fill[:, None, None].astype(np.float32)
        if ellipse:
            dy = np.arange(-ry, ry + 1, dtype=np.float32)[:, None] / np.float32(ry)
            dx = np.arange(-rx, rx + 1, dtype=np.float32)[None, :] / np.float32(rx)
            np.copyto(region, new, where=(dy * dy + dx * dx < 1.0)[None])
        else:
            region[...] = new
        if wraps:
            planes[(slice(None), *box)] = region
    np.rint(planes, out=planes)
    np.clip(planes, -255, 255, out=planes)
    return planes.astype(np.int16)


@functools.lru_cache(maxsize=2)
def _imagenet_tables(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-process tables: scene luminance with grain [S, 2, T, T] (int16; variant v of
    scene j carries grain level `_GRAIN_OF[j][v]`) and scene chroma [S, 2, T, T] (uint8,
    128 +- 96, so an image's chroma offset of at most +-31 never leaves [0, 255] and
    needs no clipping)."""
    from iobench.core.datasets import DATASETS

    rng = _rng(DATASETS["imagenet"], seed, _TABLES, _SCENES)
    grain = rng.standard_normal((_TILE, _TILE), dtype=np.float32)
    luma = np.empty((_SCENES, 2, _TILE, _TILE), dtype=np.int16)
    chroma = np.empty((_SCENES, 2, _TILE, _TILE), dtype=np.uint8)
    for j in range(_SCENES):
        planes = _scene(seed, j)
        for v, level in enumerate(_GRAIN_OF[j]):
            np.rint(planes[0] + grain * np.float32(_GRAIN[level]), out=luma[j, v],
                    casting="unsafe")
        chroma[j] = np.clip(planes[1:], -_CHROMA_RANGE, _CHROMA_RANGE) + 128
    return luma, chroma


def _segments(start: int, n: int) -> list[tuple[slice, slice]]:
    """(tile slice, output slice) pairs covering [start, start + n) of a periodic axis."""
    out, d = [], 0
    while d < n:
        s = (start + d) % _TILE
        m = min(_TILE - s, n - d)
        out.append((slice(s, s + m), slice(d, d + m)))
        d += m
    return out


def _periodic(tile: np.ndarray, oy: int, ox: int, out: np.ndarray,
              offset: np.generic | None) -> None:
    """out = the periodic tile's window at (oy, ox) + offset (a scalar of the tile's dtype),
    or out += the window (offset None): slices of the tile, one pass, no copies."""
    h, w = out.shape
    for ty, oys in _segments(oy, h):
        for tx, oxs in _segments(ox, w):
            if offset is None:
                np.add(out[oys, oxs], tile[ty, tx], out=out[oys, oxs])
            else:
                np.add(tile[ty, tx], offset, out=out[oys, oxs])


@functools.lru_cache(maxsize=1024)
def _grating_rows(w: int, cycles: int, angle: int) -> np.ndarray:
    """18 * sin(2 pi cycles x / w cos theta + 2 pi k / K) for the K = `_GRATING_PHASES`
    phases k: int16 [K, w], theta = 18 deg * angle."""
    k = _GRATING_PHASES
    theta = math.radians(18.0 * angle)
    x = np.arange(w, dtype=np.float32) * np.float32(2 * np.pi * cycles * math.cos(theta) / w)
    shift = np.arange(k, dtype=np.float32) * np.float32(2 * np.pi / k)
    rows = np.rint(np.sin(x[None, :] + shift[:, None]) * np.float32(18.0)).astype(np.int16)
    rows.flags.writeable = False
    return rows


def _grating(h: int, w: int, cycles: int, angle: int, phase: float) -> np.ndarray:
    """18 * sin(2 pi cycles (x / w cos theta + y / h sin theta) + phase), int16 [h, w].

    Every row is the same sinusoid in x at its own phase: rows are gathered from
    `_GRATING_PHASES` precomputed phases (error below one grey level)."""
    k = _GRATING_PHASES
    step = 2 * np.pi * cycles * math.sin(math.radians(18.0 * angle)) / h
    row_phase = (phase + np.arange(h) * step) * (k / (2 * np.pi))
    rows: np.ndarray = _grating_rows(w, cycles, angle)[np.rint(row_phase).astype(np.intp) % k]
    return rows


def imagenet_planes(spec: DatasetSpec, seed: int, index: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Y, Cb, Cr planes (uint8 [h, w] each) that imagenet sample `index` encodes."""
    label = make_label(spec, seed, index)
    assert isinstance(label, int)  # JPEG datasets' labels are classes
    rng = sample_rng(spec, seed, index)
    h, w = _imagenet_size(rng)
    luma, chroma = _imagenet_tables(seed)
    u = rng.random(9)  # per-image draws: scene, grain, offsets, flip, brightness, casts, phase
    scene = int(u[0] * _SCENES)
    grained = int(u[1] < 0.5) if max(h, w) <= 500 else 0  # large images: the finer grain
    scale = IMAGE_SCALE.get(spec.name, 1.0)  # openimages: the same picture, larger
    if scale != 1.0:  # ... its long side capped, so that a few huge files do not set the mean
        scale = min(scale, _SCALED_MAX_SIDE / max(h, w))
        h, w = max(32, round(h * scale)), max(32, round(w * scale))
    oy, ox = int(u[2] * _TILE), int(u[3] * _TILE)
    flip = bool(u[4] < 0.5)
    # class signal: a tint (RGB, converted to YCbCr offsets) and a luminance grating
    tint = _RGB_TO_YCC @ (22.0 * np.cos(2 * np.pi * (np.array([0.0, 2 / 3, 1 / 3])
                                                     + (label % 10) / 10.0)))
    y = np.empty((h, w), dtype=np.int16)
    # rows reversed through the destination view: the inner loops stay contiguous
    _periodic(luma[scene, grained], oy, ox, y[::-1] if flip else y,
              np.int16(round(90.0 + 75.0 * u[5] + tint[0])))
    y += _grating(h, w, 3 + label // 100, (label // 10) % 10, 2 * np.pi * u[8])
    planes = [np.clip(y, 0, 255, out=np.empty((h, w), dtype=np.uint8), casting="unsafe")]
    for c in range(2):  # Cb, Cr: colour cast +-6 and the tint; uint8 sums stay in range
        plane = np.empty((h, w), dtype=np.uint8)
        offset = round(-6.0 + 12.0 * u[6 + c] + tint[1 + c])
        _periodic(chroma[scene, c], oy, ox, plane[::-1] if flip else plane,
                  np.uint8(offset % 256))
        planes.append(plane)
    return planes[0], planes[1], planes[2]


def _encode(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> bytes:
    import simplejpeg

    blob: bytes = simplejpeg.encode_jpeg_yuv_planes(y, cb, cr, quality=JPEG_QUALITY)
    return blob
