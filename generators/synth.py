"""Synthetic samples: the ground truth every writer stores and every loader test compares against.

Every sample is a pure function of `(seed, dataset, index)`: its generator is
`np.random.default_rng([seed, DATASET_IDS[dataset], index])`, and the label is
always the first draw (so `make_label` is cheap and agrees with `make_sample`).

What each dataset looks like, and the signal that makes its label learnable:

- imagenet: JPEG (quality 90, 4:2:0) of an h x w RGB image, h, w in [300, 500].
  Content: a 1/f^beta luminance field (natural-image spectrum, beta per image),
  smooth low-resolution colour fields, 3-7 random ellipses and rectangles
  (hard edges), and fine grain, so JPEG sizes land near ILSVRC-2012's (mean
  ~110 KB; 1,000 samples here: mean 105 KB, docs/results.md). Class signal for class c (0..999): a tint of hue (c % 10) / 10
  and a sinusoidal grating at angle 18 deg * ((c // 10) % 10) with
  3 + (c // 100) cycles across the image.
- cifar10: uint8 [32, 32, 3]. Class c has its own base colour (a fixed
  palette), a grating at angle 18 deg * c with 2 + c % 3 cycles per image, a
  random smooth blob, and Gaussian noise (sigma 18 grey levels). A
  nearest-class-mean classifier on pixels beats chance (10 %) clearly.
- cosmoflow: int16 [128, 128, 128, 4] (DHWC). Label u = 4 float32 in [0, 1):
  sigma8 = 0.6 + 0.4 u0 (amplitude of the Gaussian field), n = -2.6 + 1.2 u1
  (power-spectrum slope, P(k) ~ k^n), growth = 0.5 + 0.5 u2 (how much the
  structure grows from redshift channel 0 to 3), nbar = 20 + 40 u3 (mean
  particle count per voxel). Channel z holds round(nbar * exp(g_z delta -
  g_z^2 var / 2)), a log-normal density of the same Gaussian field delta
  scaled by the channel's growth factor g_z, clipped to int16.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from iobench.datasets import DatasetSpec

DATASET_IDS: dict[str, int] = {"imagenet": 1, "cifar10": 2, "cosmoflow": 3}
JPEG_QUALITY = 90

_CIFAR_PALETTE = np.array([
    [200, 60, 60], [60, 170, 60], [60, 80, 200], [210, 190, 60], [180, 70, 190],
    [60, 190, 190], [230, 140, 50], [120, 120, 120], [140, 90, 50], [250, 250, 250],
], dtype=np.float32)


def sample_rng(spec: DatasetSpec, seed: int, index: int) -> np.random.Generator:
    """The generator of sample `index` of dataset `spec` under `seed`."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed={seed} and index={index} must be >= 0")
    return np.random.default_rng([seed, DATASET_IDS[spec.name], index])


def _draw_label(spec: DatasetSpec, rng: np.random.Generator) -> int | np.ndarray:
    if spec.num_classes > 0:
        return int(rng.integers(spec.num_classes))
    return rng.random(spec.label_shape, dtype=np.float32)


def make_label(spec: DatasetSpec, seed: int, index: int) -> int | np.ndarray:
    """The label of sample `index` (int class, or float32 parameters), without the sample."""
    return _draw_label(spec, sample_rng(spec, seed, index))


def make_sample(spec: DatasetSpec, seed: int, index: int) -> tuple[bytes | np.ndarray, int | np.ndarray]:
    """Ground truth of sample `index`: (payload, label).

    payload: JPEG bytes (imagenet) or an ndarray of the spec's shape and dtype;
    label: int class, or float32 [4] cosmological parameters in [0, 1).
    """
    rng = sample_rng(spec, seed, index)
    label = _draw_label(spec, rng)
    if spec.name == "imagenet":
        return _imagenet(rng, int(label)), label
    if spec.name == "cifar10":
        return _cifar10(rng, int(label)), label
    if spec.name == "cosmoflow":
        return _cosmoflow(rng, np.asarray(label)), label
    raise KeyError(f"no synthesis for dataset {spec.name!r}")


def labels_array(spec: DatasetSpec, seed: int, first: int, count: int) -> np.ndarray:
    """Labels of samples [first, first + count) as an array [count, *label_shape]."""
    out = np.empty((count, *spec.label_shape), dtype=spec.label_dtype)
    for i in range(count):
        out[i] = make_label(spec, seed, first + i)
    return out


# ---------------------------------------------------------------- cifar10

@functools.lru_cache(maxsize=1)
def _grid32() -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:32, 0:32].astype(np.float32) / 32.0
    return y, x


def _cifar10(rng: np.random.Generator, label: int) -> np.ndarray:
    y, x = _grid32()
    theta = math.radians(18.0 * label)
    cycles = 2 + label % 3
    phase = rng.uniform(0, 2 * math.pi)
    grating = np.sin(2 * math.pi * cycles * (x * math.cos(theta) + y * math.sin(theta)) + phase)
    cy, cx = rng.uniform(0.2, 0.8, 2)
    blob = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * rng.uniform(0.01, 0.04)))
    blob_colour = rng.uniform(-60, 60, 3).astype(np.float32)
    base = _CIFAR_PALETTE[label] * rng.uniform(0.7, 1.1)
    img = (base + rng.uniform(25, 50) * grating[..., None] + blob[..., None] * blob_colour
           + rng.normal(0, 18, (32, 32, 3)).astype(np.float32))
    return np.clip(img, 0, 255).astype(np.uint8)


# ---------------------------------------------------------------- imagenet

def _spectral_field(rng: np.random.Generator, h: int, w: int, beta: float) -> np.ndarray:
    """Unit-variance real field of shape [h, w] with amplitude spectrum ~ 1 / f^beta."""
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    f = np.sqrt(fy * fy + fx * fx)
    f[0, 0] = 1.0
    amp = f ** np.float32(-beta)
    amp[0, 0] = 0.0
    spec = (rng.standard_normal(amp.shape, dtype=np.float32)
            + 1j * rng.standard_normal(amp.shape, dtype=np.float32)) * amp
    field = np.fft.irfft2(spec, s=(h, w)).astype(np.float32)
    field /= field.std() + np.float32(1e-12)
    return field


def _smooth_noise(rng: np.random.Generator, h: int, w: int, cells: int, channels: int) -> np.ndarray:
    """Smooth random field [h, w, channels]: a coarse grid upsampled bilinearly."""
    coarse = rng.uniform(-1, 1, (cells + 1, cells + 1, channels)).astype(np.float32)
    ys = np.linspace(0, cells, h, dtype=np.float32)
    xs = np.linspace(0, cells, w, dtype=np.float32)
    y0 = np.minimum(ys.astype(np.int64), cells - 1)
    x0 = np.minimum(xs.astype(np.int64), cells - 1)
    ty = (ys - y0)[:, None, None]
    tx = (xs - x0)[None, :, None]
    c00 = coarse[y0][:, x0]
    c01 = coarse[y0][:, x0 + 1]
    c10 = coarse[y0 + 1][:, x0]
    c11 = coarse[y0 + 1][:, x0 + 1]
    return (c00 * (1 - ty) * (1 - tx) + c01 * (1 - ty) * tx + c10 * ty * (1 - tx)
            + c11 * ty * tx)


def _hue_rgb(hue: float) -> np.ndarray:
    """RGB in [-1, 1] of a fully saturated hue in [0, 1)."""
    k = (np.array([0.0, 2.0 / 3.0, 1.0 / 3.0]) + hue) % 1.0
    return np.cos(2 * math.pi * k).astype(np.float32)


def _imagenet(rng: np.random.Generator, label: int) -> bytes:
    import simplejpeg

    h, w = (int(v) for v in rng.integers(300, 501, 2))
    beta = float(rng.uniform(0.4, 1.2))
    lum = _spectral_field(rng, h, w, beta)  # [h, w], unit variance
    colour = _smooth_noise(rng, h, w, int(rng.integers(2, 6)), 3)  # [h, w, 3] in [-1, 1]
    img = (np.float32(rng.uniform(90, 160)) + colour * np.float32(rng.uniform(30, 70))
           + lum[..., None] * np.float32(rng.uniform(30, 100)))
    # Objects: flat-ish shapes with hard edges, as real scenes have.
    yy = np.arange(h, dtype=np.float32)[:, None]
    xx = np.arange(w, dtype=np.float32)[None, :]
    for _ in range(int(rng.integers(3, 8))):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(0.05, 0.3) * h, rng.uniform(0.05, 0.3) * w
        if rng.random() < 0.5:
            mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1.0
        else:
            mask = (np.abs(yy - cy) < ry) & (np.abs(xx - cx) < rx)
        fill = rng.uniform(20, 235, 3).astype(np.float32)
        img[mask] = fill + 0.6 * (img[mask] - img[mask].mean(axis=0))
    # Class signal: tint and oriented grating.
    yn, xn = yy / h, xx / w
    theta = math.radians(18.0 * ((label // 10) % 10))
    cycles = 3 + label // 100
    grating = np.sin(2 * math.pi * cycles * (xn * math.cos(theta) + yn * math.sin(theta))
                     + rng.uniform(0, 2 * math.pi)).astype(np.float32)
    img += grating[..., None] * np.float32(18.0) + _hue_rgb((label % 10) / 10.0) * np.float32(22.0)
    # Fine grain (sensor noise and texture) sets the high-frequency content JPEG keeps.
    img += rng.standard_normal((h, w, 1), dtype=np.float32) * np.float32(rng.uniform(3.0, 20.0))
    arr = np.clip(img, 0, 255).astype(np.uint8)
    return simplejpeg.encode_jpeg(arr, quality=JPEG_QUALITY, colorspace="RGB",
                                  colorsubsampling="420")


# ---------------------------------------------------------------- cosmoflow

@functools.lru_cache(maxsize=2)
def _k_grid(n: int) -> np.ndarray:
    """|k| (in units of the fundamental mode) on the rfftn grid of an n^3 box, k=0 set to 1."""
    f = np.fft.fftfreq(n).astype(np.float32) * n
    fr = np.fft.rfftfreq(n).astype(np.float32) * n
    k = np.sqrt(f[:, None, None] ** 2 + f[None, :, None] ** 2 + fr[None, None, :] ** 2)
    k[0, 0, 0] = 1.0
    return k


def _cosmoflow(rng: np.random.Generator, params: np.ndarray) -> np.ndarray:
    n = 128
    sigma8 = 0.6 + 0.4 * float(params[0])
    slope = -2.6 + 1.2 * float(params[1])
    growth = 0.5 + 0.5 * float(params[2])
    nbar = 20.0 + 40.0 * float(params[3])
    k = _k_grid(n)
    amp = k ** np.float32(slope / 2.0)
    amp[0, 0, 0] = 0.0
    modes = rng.standard_normal((2, *amp.shape), dtype=np.float32)
    delta = np.fft.irfftn((modes[0] + 1j * modes[1]) * amp, s=(n, n, n), axes=(0, 1, 2)).astype(np.float32)
    delta *= np.float32(sigma8) / (delta.std() + np.float32(1e-12))
    var = float(sigma8 * sigma8)
    out = np.empty((n, n, n, 4), dtype=np.int16)
    for z in range(4):
        g = growth ** (3 - z)  # channel 3 is today (g = 1), channel 0 the earliest
        rho = np.exp(np.float32(g) * delta - np.float32(g * g * var / 2.0))
        np.clip(np.rint(rho * np.float32(nbar)), 0, 32767, out=rho)
        out[..., z] = rho
    return out
