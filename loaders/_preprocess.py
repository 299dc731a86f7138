"""CPU preprocessing per dataset, per batch, with randomness a pure function of (seed, epoch, index).

- imagenet: JPEG decode (simplejpeg/libjpeg-turbo, PIL fallback), random-resized
  crop to 224 (scale 0.08-1, ratio 3/4-4/3, torchvision's 10-try rule), flip,
  normalise -> float32 [B, 3, 224, 224].
- cifar10: zero-pad 4, random 32x32 crop, flip, normalise -> float32 [B, 3, 32, 32].
- cosmoflow: log1p, float32, channels first -> float32 [B, 4, 128, 128, 128].

The augmentation parameters of sample i in epoch e come from a counter-based
hash of (seed, e, i), so every loader, worker count and worker type produces
the same tensors for the same sample (the DALI loader uses them too for
cifar10; for imagenet it uses DALI's own random operators).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from iobench.errors import DatasetError
from iobench.loaders._reader import RawBatch
from iobench.loaders.base import Batch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
CROP = 224
CIFAR_PAD = 4



class DecodeError(DatasetError):
    """A stored sample that does not decode; the loader adds the file that holds it."""

    def __init__(self, index: int, cause: BaseException) -> None:
        super().__init__(f"sample {index} does not decode ({cause})")
        self.index, self.cause = index, cause


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniform(seed: int, epoch: int, indices: np.ndarray, stream: int) -> np.ndarray:
    """float64 in [0, 1) for each index: a pure function of (seed, epoch, index, stream)."""
    with np.errstate(over="ignore"):
        key = _mix(np.uint64((seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03
                              + stream * 0x8CB92BA72F3D8DD7 + 0x5EED) & 0xFFFFFFFFFFFFFFFF))
        x = _mix(np.asarray(indices, dtype=np.int64).astype(np.uint64) ^ key)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def cifar_params(seed: int, epoch: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Crop offsets (row, col in [0, 2*pad]) and flip flags of each sample, int64 [B] each."""
    span = 2 * CIFAR_PAD + 1
    oy = np.floor(uniform(seed, epoch, indices, 1) * span).astype(np.int64)
    ox = np.floor(uniform(seed, epoch, indices, 2) * span).astype(np.int64)
    flip = (uniform(seed, epoch, indices, 3) < 0.5).astype(np.int64)
    return oy, ox, flip


def _normalise_chw(chw: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]
                   ) -> torch.Tensor:
    """uint8 [B, C, H, W] (any strides) -> float32 [B, C, H, W], (x / 255 - mean) / std.

    numpy, single-threaded: torch's intra-op thread pool costs more than it
    gains on batch-sized tensors and competes with the loader's own workers.
    """
    c = chw.shape[1]
    scale = np.array([1.0 / (255.0 * s) for s in std], dtype=np.float32).reshape(1, c, 1, 1)
    shift = np.array([m / s for m, s in zip(mean, std, strict=True)],
                     dtype=np.float32).reshape(1, c, 1, 1)
    out = np.multiply(chw, scale, dtype=np.float32)
    out -= shift
    return torch.from_numpy(out)


def cifar10(samples: np.ndarray, indices: np.ndarray, seed: int, epoch: int) -> torch.Tensor:
    """Pad-4-and-crop, flip, normalise a uint8 [B, 32, 32, 3] batch -> float32 [B, 3, 32, 32]."""
    b, h, w, c = samples.shape
    p = CIFAR_PAD
    padded = np.zeros((b, c, h + 2 * p, w + 2 * p), dtype=samples.dtype)
    padded[:, :, p:p + h, p:p + w] = samples.transpose(0, 3, 1, 2)
    oy, ox, flip = cifar_params(seed, epoch, indices)
    windows = sliding_window_view(padded, (h, w), axis=(2, 3))  # [B, C, 2p+1, 2p+1, h, w]
    crops = windows[np.arange(b), :, oy, ox]  # one gather for the batch: [B, C, h, w]
    f = flip.astype(bool)
    crops[f] = crops[f][..., ::-1]
    return _normalise_chw(crops, CIFAR_MEAN, CIFAR_STD)


def cosmoflow(samples: np.ndarray) -> torch.Tensor:
    """int16 [B, D, H, W, C] -> float32 [B, C, D, H, W] of log1p(x)."""
    out = samples.transpose(0, 4, 1, 2, 3).astype(np.float32, order="C")
    np.log1p(out, out=out)
    return torch.from_numpy(out)


def rrc_params(heights: np.ndarray, widths: np.ndarray, seed: int, epoch: int,
               indices: np.ndarray, scale: tuple[float, float] = (0.08, 1.0),
               ratio: tuple[float, float] = (3 / 4, 4 / 3), tries: int = 10) -> np.ndarray:
    """Random-resized-crop boxes (top, left, height, width), int64 [B, 4], torchvision's rule."""
    heights = heights.astype(np.int64)
    widths = widths.astype(np.int64)
    area = (heights * widths).astype(np.float64)
    box = np.zeros((len(indices), 4), dtype=np.int64)
    found = np.zeros(len(indices), dtype=bool)
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(tries):
        u = [uniform(seed, epoch, indices, 10 + 4 * t + k) for k in range(4)]
        target = area * (scale[0] + (scale[1] - scale[0]) * u[0])
        ar = np.exp(lo + (hi - lo) * u[1])
        w = np.round(np.sqrt(target * ar)).astype(np.int64)
        h = np.round(np.sqrt(target / ar)).astype(np.int64)
        ok = ~found & (w > 0) & (h > 0) & (w <= widths) & (h <= heights)
        top = np.floor(u[2] * (heights - h + 1)).astype(np.int64)
        left = np.floor(u[3] * (widths - w + 1)).astype(np.int64)
        box[ok] = np.stack([top, left, h, w], axis=1)[ok]
        found |= ok
    if not found.all():  # fall back to a central crop at the clamped ratio
        r = widths / heights
        w = np.where(r < ratio[0], widths, np.where(r > ratio[1], np.round(heights * ratio[1]), widths))
        h = np.where(r < ratio[0], np.round(widths / ratio[0]), heights)
        w, h = w.astype(np.int64), h.astype(np.int64)
        fb = np.stack([(heights - h) // 2, (widths - w) // 2, h, w], axis=1)
        box[~found] = fb[~found]
    return box


def decode_jpeg(data: memoryview | bytes) -> np.ndarray:
    """JPEG bytes -> uint8 [H, W, 3] RGB (libjpeg-turbo through simplejpeg; PIL if absent)."""
    try:
        import simplejpeg
    except ImportError:  # pragma: no cover - simplejpeg is a dependency
        simplejpeg = None
    if simplejpeg is not None:
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    import io

    from PIL import Image

    with Image.open(io.BytesIO(bytes(data))) as im:
        return np.asarray(im.convert("RGB"))


def imagenet(data: np.ndarray, offsets: np.ndarray, indices: np.ndarray, seed: int,
             epoch: int) -> torch.Tensor:
    """JPEG bytes back to back -> float32 [B, 3, 224, 224]: decode, random-resized crop, flip, normalise."""
    from PIL import Image

    n = len(indices)
    mv = memoryview(data)
    images = []
    for i in range(n):
        try:
            images.append(decode_jpeg(mv[offsets[i]:offsets[i + 1]]))
        except (ValueError, OSError, SyntaxError) as e:  # simplejpeg: ValueError; PIL: OSError
            raise DecodeError(int(indices[i]), e) from None
    hs = np.array([im.shape[0] for im in images])
    ws = np.array([im.shape[1] for im in images])
    boxes = rrc_params(hs, ws, seed, epoch, indices).tolist()
    flips = (uniform(seed, epoch, indices, 3) < 0.5).tolist()
    out = np.empty((n, CROP, CROP, 3), dtype=np.uint8)
    for i, (im, (top, left, h, w), flip) in enumerate(zip(images, boxes, flips, strict=True)):
        crop = Image.fromarray(im[top:top + h, left:left + w])
        crop = crop.resize((CROP, CROP), Image.BILINEAR)
        if flip:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        out[i] = np.asarray(crop)
    return _normalise_chw(out.transpose(0, 3, 1, 2), IMAGENET_MEAN, IMAGENET_STD)


def warm_up(dataset: str, decode: bool) -> None:
    """Import the decoders `to_batch` will use for `dataset` (no data is touched)."""
    if dataset == "imagenet" and decode:
        import simplejpeg  # noqa: F401
        from PIL import Image  # noqa: F401


def to_batch(dataset: str, raw: RawBatch, indices: np.ndarray, seed: int, epoch: int,
             decode: bool) -> Batch:
    """Assemble a `Batch`: raw stored data (decode=False) or the dataset's preprocessing."""
    idx = np.asarray(indices, dtype=np.int64)
    labels = torch.from_numpy(np.ascontiguousarray(raw.labels))
    offsets = None
    if not decode:
        samples = torch.from_numpy(raw.samples)
        offsets = torch.from_numpy(raw.offsets) if raw.offsets is not None else None
    elif dataset == "imagenet":
        assert raw.offsets is not None
        samples = imagenet(raw.samples, raw.offsets, idx, seed, epoch)
    elif dataset == "cifar10":
        samples = cifar10(raw.samples, idx, seed, epoch)
    elif dataset == "cosmoflow":
        samples = cosmoflow(raw.samples)
    else:
        from iobench.errors import ConfigError

        raise ConfigError(f"no preprocessing for dataset {dataset!r}; use decode=False")
    return Batch(samples, labels, torch.from_numpy(idx.copy()), int(raw.stored_bytes.sum()),
                 offsets)
