"""CPU preprocessing per dataset, per batch, with randomness a pure function of (seed, epoch, index).

- imagenet: JPEG decode (simplejpeg/libjpeg-turbo, PIL fallback), random-resized
  crop to 224 (scale 0.08-1, ratio 3/4-4/3, torchvision's 10-try rule), flip
  -> uint8 [B, 224, 224, 3]; then normalise -> float32 [B, 3, 224, 224].
- cifar10: zero-pad 4, random 32x32 crop, flip -> uint8 [B, 3, 32, 32]; then
  normalise -> float32 [B, 3, 32, 32].
- cosmoflow: the stored int16 [B, 128, 128, 128, 4]; then log1p (by table,
  bit-identical to numpy's), float32, channels first -> float32 [B, 4, 128, 128, 128].

The "then" steps are the batch's `Finish` (loaders/base.py): with
`convert="device"` (the default) they run where the batch is consumed, so
the compact form crosses processes; with `convert="loader"` here.

The augmentation parameters of sample i in epoch e come from a counter-based
hash of (seed, e, i), so every loader, worker count and worker type produces
the same tensors for the same sample (the DALI loader uses them too for
cifar10; for imagenet it uses DALI's own random operators).
"""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch

from iobench.core.errors import DatasetError
from iobench.loaders._reader import Alloc, RawBatch
from iobench.loaders.base import Batch, Finish

_U64 = TypeVar("_U64", np.ndarray, np.uint64)  # _mix: an array of keys, or one

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
CROP = 224
CIFAR_PAD = 4
FINISH: dict[str, Finish] = {
    "imagenet": Finish("normalise", channels_last=True, mean=IMAGENET_MEAN, std=IMAGENET_STD),
    "cifar10": Finish("normalise", mean=CIFAR_MEAN, std=CIFAR_STD),
    "cosmoflow": Finish("log1p", channels_last=True),
}


class DecodeError(DatasetError):
    """A stored sample that does not decode; the loader adds the file that holds it."""

    def __init__(self, index: int, cause: BaseException) -> None:
        super().__init__(f"sample {index} does not decode ({cause})")
        self.index, self.cause = index, cause


def _mix(x: _U64) -> _U64:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    mixed: _U64 = x ^ (x >> np.uint64(31))
    return mixed


def uniform(seed: int, epoch: int, indices: np.ndarray, stream: int) -> np.ndarray:
    """float64 in [0, 1) for each index: a pure function of (seed, epoch, index, stream)."""
    with np.errstate(over="ignore"):
        key = _mix(np.uint64((seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03
                              + stream * 0x8CB92BA72F3D8DD7 + 0x5EED) & 0xFFFFFFFFFFFFFFFF))
        x = _mix(np.asarray(indices, dtype=np.int64).astype(np.uint64) ^ key)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def uniforms(seed: int, epoch: int, indices: np.ndarray, streams: tuple[int, ...]) -> np.ndarray:
    """`uniform` of several streams at once, float64 [len(streams), B]: the same values
    in one pass (for a batch of 64, numpy's per-call overhead is the cost, not the work)."""
    base = seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + 0x5EED
    with np.errstate(over="ignore"):
        keys = _mix(np.array([(base + s * 0x8CB92BA72F3D8DD7) & 0xFFFFFFFFFFFFFFFF
                              for s in streams], dtype=np.uint64))
        x = _mix(np.asarray(indices, dtype=np.int64).astype(np.uint64)[None, :] ^ keys[:, None])
    u: np.ndarray = (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return u


_CIFAR_STREAMS = (1, 2, 3)  # the uniform streams of a sample's crop row, crop column, flip
_KEYS: dict[tuple[int, int], np.ndarray] = {}  # (seed, epoch) -> the streams' mixed keys


def _stream_keys(seed: int, epoch: int) -> np.ndarray:
    """`uniforms`' per-stream keys for the cifar10 streams, uint64 [3, 1] (one epoch's kept)."""
    keys = _KEYS.get((seed, epoch))
    if keys is None:
        base = seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + 0x5EED
        with np.errstate(over="ignore"):
            keys = _mix(np.array([(base + s * 0x8CB92BA72F3D8DD7) & 0xFFFFFFFFFFFFFFFF
                                  for s in _CIFAR_STREAMS], dtype=np.uint64))[:, None]
        _KEYS.clear()  # (thread workers: a lost race only recomputes the same keys)
        _KEYS[(seed, epoch)] = keys
    return keys


def cifar_params(seed: int, epoch: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Crop offsets (row, col in [0, 2*pad]) and flip flags of each sample, int64 [B] each.

    The values of `uniforms(seed, epoch, indices, (1, 2, 3))` taken as floor(u * (2p+1))
    and u < 0.5, bit for bit, in fewer numpy calls (for a batch of 64 the calls are
    the cost): m * ((2p+1) / 2**53) rounds as (m / 2**53) * (2p+1) does (a power-of-two
    scale is exact), truncation is floor for u >= 0, and u < 0.5 is m < 2**52, i.e. the
    mixed value's top bit clear.
    """
    with np.errstate(over="ignore"):
        x = _mix(np.asarray(indices, dtype=np.int64).astype(np.uint64)[None, :]
                 ^ _stream_keys(seed, epoch))
    o = ((x[:2] >> np.uint64(11)).astype(np.float64)
         * ((2 * CIFAR_PAD + 1) / (1 << 53))).astype(np.int64)
    flip = (x[2] < np.uint64(1 << 63)).astype(np.int64)
    return o[0], o[1], flip


_CIFAR_BUFS = threading.local()  # per thread: thread workers run `cifar10` side by side


class _CifarBuffers(NamedTuple):
    placed: np.ndarray  # [B * (h+2p) * (w+2p) * C] samples placed so that each crop is centred
    rows: np.ndarray  # `placed` as one element of a sample row per byte offset (void dtype)
    sorted: np.ndarray  # [B, C, h, w] the crops, unflipped samples first
    where: np.ndarray  # [(2p+1)**2, h] offset in `placed` of each row, per crop (oy, ox)
    arange: np.ndarray  # 0..B-1


def _cifar_buffers(b: int, h: int, w: int, c: int, dtype: np.dtype) -> _CifarBuffers:
    """This thread's reused cifar10 buffers for batches of shape [b, h, w, c]."""
    key = (b, h, w, c, np.dtype(dtype))
    got: tuple[tuple[Any, ...], _CifarBuffers] | None = getattr(_CIFAR_BUFS, "bufs", None)
    if got is not None and got[0] == key:
        return got[1]
    p, span, item = CIFAR_PAD, 2 * CIFAR_PAD + 1, np.dtype(dtype).itemsize
    hp, wp = h + 2 * p, w + 2 * p
    placed = np.zeros(b * hp * wp * c, dtype=dtype)
    # a sample row may start at any element (its crop column shifts it): a view whose
    # k-th element is the row's bytes starting at element k
    row = np.dtype((np.void, w * c * item))
    rows = np.ndarray((placed.size - w * c + 1,), dtype=row, buffer=placed, strides=(item,))
    # a crop at (oy, ox) takes padded rows oy.. and columns ox..: the sample goes to
    # (2p - oy, 2p - ox), so that its crop is the window at (p, p) for every sample
    shift = 2 * p - np.arange(span)
    where = (shift[:, None, None] * (wp * c) + shift[None, :, None] * c
             + np.arange(h)[None, None, :] * (wp * c)).reshape(span * span, h)
    bufs = _CifarBuffers(placed, rows, np.empty((b, c, h, w), dtype=dtype), where,
                         np.arange(b))
    _CIFAR_BUFS.bufs = (key, bufs)
    return bufs


def cifar10(samples: np.ndarray, indices: np.ndarray, seed: int, epoch: int,
            out: np.ndarray | None = None) -> np.ndarray:
    """Pad-4-and-crop and flip a uint8 [B, 32, 32, 3] batch -> uint8 [B, 3, 32, 32] (into `out`).

    Four passes over the batch, each a single numpy call: (1) every sample row is
    copied whole (one fancy assignment of row-sized elements) into a zeroed
    padded buffer at the offset that puts its crop window at (p, p) -- the
    unflipped samples first, then the flipped ones; (2, 3) the windows go
    channels first in two transposing copies, the flipped samples' with their
    columns read right to left (the mirror costs nothing in a byte-by-byte
    copy, where numpy's reversed copy of a row is slow); (4) the crops go back
    to batch order. The transposing copies are most of the time.
    """
    b, h, w, c = samples.shape
    p = CIFAR_PAD
    bufs = _cifar_buffers(b, h, w, c, samples.dtype)
    hp, wp = h + 2 * p, w + 2 * p
    oy, ox, flip = cifar_params(seed, epoch, indices)
    # slot of each sample in `sorted`: unflipped ones first, each group in batch order
    flipped = np.cumsum(flip)
    n0 = b - int(flipped[-1]) if b else 0
    slot = np.where(flip, flipped + (n0 - 1), bufs.arange - flipped)
    dest = bufs.where[oy * (2 * p + 1) + ox] + (slot * (hp * wp * c))[:, None]
    bufs.placed.fill(0)
    bufs.rows[dest.reshape(-1)] = samples.reshape(b * h, w * c).view(bufs.rows.dtype).reshape(-1)
    win = bufs.placed.reshape(b, hp, wp, c)[:, p:p + h, p:p + w]
    srt = bufs.sorted
    srt[:n0] = win[:n0].transpose(0, 3, 1, 2)
    srt[n0:] = win[n0:, :, ::-1].transpose(0, 3, 1, 2)
    if out is None:
        out = np.empty((b, c, h, w), dtype=samples.dtype)
    out[...] = srt[slot]
    return out


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
        image: np.ndarray = simplejpeg.decode_jpeg(data, colorspace="RGB")
        return image
    import io

    from PIL import Image

    with Image.open(io.BytesIO(bytes(data))) as im:
        return np.asarray(im.convert("RGB"))


DCT_REDUCTIONS = (8, 4, 2)  # libjpeg-turbo's fast (SIMD) reduced-size IDCTs: 1/8, 1/4, 1/2


def dct_reduction(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per crop box (h, w in full-size pixels): the largest of 8, 4, 2 (else 1) by which the
    JPEG can be decoded smaller while the crop still spans >= CROP pixels each way (so the
    resize to CROP x CROP stays a downscale)."""
    r = np.ones(len(h), dtype=np.int64)
    for f in reversed(DCT_REDUCTIONS):  # 2, then 4, then 8: keep the largest that fits
        r = np.where((h // f >= CROP) & (w // f >= CROP), f, r)
    return r


def _resize(x: torch.Tensor) -> torch.Tensor:
    """uint8 [1, 3, h, w] -> [1, 3, CROP, CROP], antialiased bilinear (half-pixel centres).

    F.interpolate's own checks cost a tenth of the kernel at this size: call the
    kernel it dispatches to, when this torch has it under that name.
    """
    if _AA is not None:
        out: torch.Tensor = _AA(x, [CROP, CROP], False)
        return out
    import torch.nn.functional as F

    return F.interpolate(x, size=(CROP, CROP), mode="bilinear", antialias=True,
                         align_corners=False)


_AA = getattr(torch._C._nn, "_upsample_bilinear2d_aa", None)


def imagenet(data: np.ndarray, offsets: np.ndarray, indices: np.ndarray, seed: int,
             epoch: int, out: np.ndarray | None = None, reduced_dct: bool = True) -> np.ndarray:
    """JPEG bytes back to back -> uint8 [B, 224, 224, 3] (into `out`): decode,
    random-resized crop (antialiased bilinear), flip.

    The crop boxes come from each image's full size (read from its header),
    so the random draws are those of a full-size decode. With `reduced_dct`, an
    image whose crop box spans >= 2 x 224 pixels each way is decoded at 1/2,
    1/4 or 1/8 size by libjpeg-turbo (less IDCT and colour conversion work)
    and its box resized from there. The resize is torch's antialiased bilinear
    on uint8 (channels last), which follows PIL's BILINEAR within 2 levels;
    docs/loaders.md gives the measured differences to the full-size PIL path.
    One decode buffer serves the whole batch; the crop is the only copy before
    the resize, the flip is folded into the copy into `out`.
    """
    import simplejpeg

    n = len(indices)
    mv = data.data
    jpegs = [mv[offsets[i]:offsets[i + 1]] for i in range(n)]
    hs = np.empty(n, dtype=np.int64)
    ws = np.empty(n, dtype=np.int64)
    for i, j in enumerate(jpegs):
        try:
            hs[i], ws[i] = simplejpeg.decode_jpeg_header(j)[:2]
        except ValueError as e:
            raise DecodeError(int(indices[i]), e) from None
    boxes = rrc_params(hs, ws, seed, epoch, indices)
    reduce = dct_reduction(boxes[:, 2], boxes[:, 3]) if reduced_dct else np.ones(n, np.int64)
    flips = (uniform(seed, epoch, indices, 3) < 0.5).tolist()
    if out is None:
        out = np.empty((n, CROP, CROP, 3), dtype=np.uint8)
    dest = torch.from_numpy(out)
    hr, wr = -(-hs // reduce), -(-ws // reduce)  # libjpeg's output size at scale 1/r
    scratch = np.empty(int((hr * wr).max(initial=0)) * 3, dtype=np.uint8)
    rows = zip(jpegs, boxes.tolist(), reduce.tolist(), hr.tolist(), wr.tolist(), flips,
               strict=True)
    for i, (j, (top, left, h, w), r, ht, wd, flip) in enumerate(rows):
        try:
            # min sizes of exactly ceil(H / r) x ceil(W / r) select libjpeg's 1/r scaling
            im = simplejpeg.decode_jpeg(j, colorspace="RGB", min_height=ht, min_width=wd,
                                        buffer=scratch)
        except ValueError as e:
            raise DecodeError(int(indices[i]), e) from None
        if r > 1:  # the box at the decoded scale (whole pixels, rounded inwards)
            t2, l2 = -(-top // r), -(-left // r)
            h, w = (top + h) // r - t2, (left + w) // r - l2
            top, left = t2, l2
        # the crop, copied once into channels-last [1, 3, h, w]: the layout torch's uint8
        # antialiased kernel is fast in
        x = torch.from_numpy(im[top:top + h, left:left + w]).permute(2, 0, 1)[None]
        y = _resize(x.contiguous(memory_format=torch.channels_last))[0].permute(1, 2, 0)
        dest[i] = y.flip(1) if flip else y  # torch's flip: numpy's reversed copy is 6x slower
    return out


def pipeline(manifest: Any) -> str:
    """The preprocessing a dataset's batches get (`to_batch`'s `dataset`): the generated
    dataset's own, or for the user's data (`--data`) the one its layout names: "imagenet"
    for JPEG samples, "raw" (delivered as stored) for arrays."""
    name: str = manifest.layout.get("preprocess", manifest.dataset)
    return name


def warm_up(dataset: str, decode: bool) -> None:
    """Import the decoders `to_batch` will use for `dataset` (no data is touched)."""
    if dataset == "imagenet" and decode:
        import simplejpeg  # noqa: F401
        from PIL import Image  # noqa: F401


def delivers_raw(dataset: str, decode: bool, convert: str) -> bool:
    """Whether `to_batch` hands the stored samples on as they are (read them into the
    buffer that is delivered) or computes new ones from them."""
    return not decode or dataset == "raw" or (dataset == "cosmoflow" and convert == "device")


def finish_of(dataset: str, decode: bool, convert: str) -> Finish | None:
    """The `Finish` that `to_batch` gives a dataset's batches (the same for every batch)."""
    return FINISH.get(dataset) if decode and convert != "loader" else None


def to_batch(dataset: str, raw: RawBatch, indices: np.ndarray, seed: int, epoch: int,
             decode: bool, convert: str = "device", alloc: Alloc | None = None) -> Batch:
    """Assemble a `Batch`: raw stored data (decode=False) or the dataset's preprocessing.

    `alloc(shape, dtype)` gives the array computed samples go into (a reusable
    batch buffer). With convert="device" the batch carries its `Finish`; with
    "loader" it is applied here and the samples are float32.
    """
    alloc = alloc or np.empty
    idx = np.asarray(indices, dtype=np.int64)
    labels = torch.from_numpy(np.ascontiguousarray(raw.labels))
    offsets = None
    finish = FINISH.get(dataset) if decode else None  # applied below with convert="loader"
    n = len(idx)
    if not decode:
        x = raw.samples
        offsets = torch.from_numpy(raw.offsets) if raw.offsets is not None else None
    elif dataset == "imagenet":
        assert raw.offsets is not None
        x = imagenet(raw.samples, raw.offsets, idx, seed, epoch,
                     out=None if convert == "loader" else alloc((n, CROP, CROP, 3), np.uint8))
    elif dataset == "cifar10":
        c, (h, w) = raw.samples.shape[3], raw.samples.shape[1:3]
        x = cifar10(raw.samples, idx, seed, epoch,
                    out=None if convert == "loader" else alloc((n, c, h, w), np.uint8))
    elif dataset in ("cosmoflow", "raw"):  # raw: the user's arrays, as they are stored
        x = raw.samples
    else:
        from iobench.core.errors import ConfigError

        raise ConfigError(f"no preprocessing for dataset {dataset!r}: pass --no-decode "
                          "(its stored arrays are delivered as they are)")
    if finish is not None and convert == "loader":
        x = finish.numpy(x, alloc(x.shape, np.float32))
        samples = torch.from_numpy(x)
        if finish.channels_last:
            samples = samples.movedim(-1, 1)
        finish = None
    else:
        samples = torch.from_numpy(x)
    return Batch(samples, labels, torch.from_numpy(idx.copy()), int(raw.stored_bytes.sum()),
                 offsets, finish)
