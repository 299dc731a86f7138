"""The loader contract: configuration, the batch a step receives, the Loader base.

A loader reads one rank's share of a dataset each epoch (order from
`iobench.core.sampling`) and yields `Batch`es of torch tensors. The layout comes
from the dataset's manifest (`iobench.manifest`), never from guesses.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol

import numpy as np
import torch

from iobench.core import interrupts, sampling
from iobench.core.errors import ConfigError
from iobench.core.manifest import Manifest

WORKER_TYPES = ("process", "thread")
DEVICES = ("cpu", "gpu")
CONVERTS = ("device", "loader")


@dataclass(frozen=True)
class LoaderConfig:
    """How to read. Validated when built; every field has a safe default."""

    batch_size: int = 32  # samples per step per rank
    workers: int = 2  # reader workers per rank (0: read in the main process)
    worker_type: str = "process"  # "process" or "thread"
    shuffle: str = "global"  # "global", "block" or "none"
    block_size: int = 256  # samples per block, for shuffle="block"
    shuffle_window: int = 16  # blocks shuffled together, for shuffle="block"
    scope: str = "global"  # "global", or "local" for datasets sharded per node
    seed: int = 0
    decode: bool = True  # False: raw stored samples, no decode or augmentation
    prefetch: int = 2  # batches in flight per worker
    pin_memory: bool = False
    persistent_workers: bool = True
    device: str = "cpu"  # where DALI runs its operators: "cpu" or "gpu"
    # Keep the format libraries' own caches (HDF5/netCDF chunk caches, HDF5's sieve
    # buffer) at their defaults. Off for cold-cache runs: a cache in user space would
    # carry samples from one "cold" epoch to the next (docs/metrics.md, "Cold cache").
    library_cache: bool = False
    # Where decoded samples become the model's float input: "device" (default) delivers
    # them in their compact form (int16 cosmoflow, uint8 images after crop and flip) with
    # `Batch.finish`, applied by the consumer where it trains (on the GPU when there is
    # one), as production pipelines do; "loader" converts in the loader's workers, so
    # float32 (2-4x the bytes) crosses processes.
    convert: str = "device"
    # Steps each epoch is read for, when the consumer stops early (`train --max-steps`): a
    # loader may end its epoch there instead of reading batches nobody takes (DALI then
    # keeps its pipeline for the next epoch rather than rebuilding it). None: whole epochs.
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be >= 1")
        if self.workers < 0:
            raise ConfigError(f"workers={self.workers} must be >= 0")
        if self.worker_type not in WORKER_TYPES:
            raise ConfigError(f"worker_type={self.worker_type!r}; choose one of {WORKER_TYPES}")
        sampling.parse_shuffle(self.shuffle)
        if self.scope not in sampling.SCOPES:
            raise ConfigError(f"scope={self.scope!r}; choose one of {sampling.SCOPES}")
        if self.block_size < 1 or self.shuffle_window < 1:
            raise ConfigError(f"block_size={self.block_size} and "
                              f"shuffle_window={self.shuffle_window} must be >= 1")
        if self.prefetch < 1:
            raise ConfigError(f"prefetch={self.prefetch} must be >= 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps={self.max_steps} must be >= 1")
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r}; choose one of {DEVICES}")
        if self.convert not in CONVERTS:
            raise ConfigError(f"convert={self.convert!r}; choose one of {CONVERTS}")


def _log1p_table() -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):  # -1 -> -inf, below -1 -> nan
        return np.log1p(np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.float32))


LOG1P_INT16: np.ndarray = _log1p_table()
"""log1p of every int16 value as float32, indexed by the value's bits (uint16): numpy's own
results, so a lookup is bit-identical to `np.log1p(x.astype(np.float32))`."""

_TAKE_CHUNK = 1 << 17  # values per np.take call: its intp copy of the indices stays in cache


def log1p_int16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 log1p of an int16 array by table lookup (~10x numpy's log1p, same bits)."""
    src = np.ascontiguousarray(x).reshape(-1).view(np.uint16)
    if out is None:
        out = np.empty(x.shape, dtype=np.float32)
    dst = out.reshape(-1)
    for s in range(0, src.size, _TAKE_CHUNK):
        np.take(LOG1P_INT16, src[s:s + _TAKE_CHUNK], out=dst[s:s + _TAKE_CHUNK], mode="wrap")
    return out


_DEVICE_LUTS: dict[torch.device, torch.Tensor] = {}


@dataclass(frozen=True)
class Finish:
    """Per-element conversion of a decoded batch into the model's float32 input.

    Deterministic, no random draws (those happened in the loader): the same
    float values on every device. `op`: "log1p" (int16 [B,D,H,W,C] -> float32
    [B,C,D,H,W], by `LOG1P_INT16`) or "normalise" (uint8 -> float32
    `(x / 255 - mean) / std` per channel, computed as numpy did:
    `x * float32(1 / (255 std)) - float32(mean / std)`). `channels_last`: the
    input holds channels last ([B,...,C]); the output is then a channels-first
    view of channels-last memory (`torch.channels_last(_3d)`), which
    convolutions take as is, so no transpose copy is made.
    """

    op: str
    channels_last: bool = False
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.op not in ("log1p", "normalise"):
            raise ConfigError(f"Finish op={self.op!r}; choose 'log1p' or 'normalise'")

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Convert `x` where it is (CPU: numpy, into `out` when given; a GPU: torch)."""
        if x.device.type == "cpu":
            dst = out.numpy() if out is not None else None
            y = torch.from_numpy(self.numpy(x.numpy(), dst))
        elif self.op == "log1p":
            y = self._log1p_device(x)
        else:
            scale, shift = (torch.from_numpy(a).to(x.device) for a in self._affine())
            y = x.to(torch.float32)
            y.mul_(scale)
            y.sub_(shift)
        return y.movedim(-1, 1) if self.channels_last else y

    def numpy(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The conversion on the CPU, in x's layout (no channel move), into `out` if given."""
        if self.op == "log1p":
            if x.dtype != np.int16:
                raise ConfigError(f"log1p input must be int16, got {x.dtype}")
            return log1p_int16(x, out)
        scale, shift = self._affine()
        out = np.multiply(x, scale, out=out, dtype=np.float32)
        out -= shift
        return out

    def _affine(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 scale and shift, shaped to broadcast over the channel axis."""
        c = len(self.mean)
        shape = (c,) if self.channels_last else (c, 1, 1)
        scale = np.array([1.0 / (255.0 * s) for s in self.std], dtype=np.float32)
        shift = np.array([m / s for m, s in zip(self.mean, self.std, strict=True)],
                         dtype=np.float32)
        return scale.reshape(shape), shift.reshape(shape)

    @staticmethod
    def _log1p_device(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.int16:
            raise ConfigError(f"log1p input must be int16, got {x.dtype}")
        lut = _DEVICE_LUTS.get(x.device)
        if lut is None:
            lut = _DEVICE_LUTS[x.device] = torch.from_numpy(LOG1P_INT16).to(x.device)
        # a gather of the table's float32 values: bit for bit the CPU's
        return lut[x.to(torch.int64) & 0xFFFF]


class Batch(NamedTuple):
    """One step's data for one rank.

    samples: decoded with `finish` None: float32, channels first ([B,3,224,224]
      imagenet, [B,3,32,32] cifar10, [B,4,128,128,128] cosmoflow; image and
      cosmoflow batches may be channels-last in memory). Decoded with `finish`
      set: the compact form `finish` turns into that (uint8 [B,224,224,3]
      imagenet and uint8 [B,3,32,32] cifar10, cropped and flipped; cosmoflow's
      stored int16 [B,128,128,128,4]). Undecoded: the stored arrays (uint8
      [B,32,32,3], int16 [B,128,128,128,4]) or, for JPEG, all images' bytes
      back to back (uint8, 1-D) with `offsets` ([B+1], int64).
    labels: int64 [B] (classes) or float32 [B, 4] (regression targets).
    indices: int64 [B], the global sample indices, in batch order.
    payload_bytes: bytes the readers took from storage for this batch
      (encoded/stored bytes), per METRICS.md `batch_bytes`.
    timing: (read_ns, decode_ns, done_ns, worker) of the reader that made this
      batch: time reading it from storage, time decoding and preprocessing it,
      `perf_counter_ns()` when it was done (the same clock in every process of
      a node: the consumer can tell how long a finished batch took to reach
      it), and the worker's id (-1: the consumer's own process); None when the
      loader keeps no such clocks.
    finish: the conversion still due where the batch is consumed (`model_input`).

    The tensors may live in buffers the loader reuses: a buffer is reused only
    once nothing refers to it any more (no tensor, view or array), so a batch
    stays valid for as long as it is held.
    """

    samples: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    payload_bytes: int
    offsets: torch.Tensor | None = None
    finish: Finish | None = None
    timing: tuple[int, int, int, int] | None = None

    def model_input(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The samples as the model's float32 input, on `device` (default: where they are).

        Moves the compact samples first (fewer bytes), then converts there.
        """
        x = self.samples if device is None else self.samples.to(device, non_blocking=True)
        return self.finish(x) if self.finish is not None else x


class Loader(ABC):
    """Reads one rank's share of a dataset, epoch by epoch."""

    name: ClassVar[str]

    def __init__(self, dataset: Manifest | str | Path, config: LoaderConfig,
                 rank: int = 0, world: int = 1) -> None:
        self.manifest = dataset if isinstance(dataset, Manifest) else Manifest.load(dataset)
        self.config = config
        self.rank, self.world = rank, world
        n_local = self.samples_per_epoch()
        if n_local == 0:
            raise ConfigError(f"dataset has {self.manifest.num_samples} samples: too few for "
                              f"{world} ranks; generate more with --samples")

    def indices(self, epoch: int, start: int = 0) -> np.ndarray:
        """Global sample indices this rank reads in `epoch`, in order, without the first
        `start` of them (samples)."""
        c, m = self.config, self.manifest
        ranges = sampling.FileRanges.of(m) if c.scope == "local" else None
        return sampling.rank_indices(m.num_samples, c.shuffle, c.seed, epoch, self.rank,
                                     self.world, c.block_size, c.shuffle_window,
                                     file_ranges=ranges, scope=c.scope, start=start)

    def samples_per_epoch(self) -> int:
        """Samples this rank reads each epoch (the same every epoch, on every rank), by
        arithmetic: no epoch order is built for it."""
        c, m = self.config, self.manifest
        ranges = sampling.FileRanges.of(m) if c.scope == "local" else None
        return sampling.rank_count(m.num_samples, self.world, file_ranges=ranges,
                                   scope=c.scope)

    def steps_per_epoch(self) -> int:
        """Steps per epoch; the same on every rank (the last batch may be short)."""
        return math.ceil(self.samples_per_epoch() / self.config.batch_size)

    @abstractmethod
    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        """Yield this rank's batches for `epoch` (0-based), from batch `start_step` on: the
        same batches as a whole epoch's from there (`train --resume` part-way through an
        epoch), the earlier ones' samples never read."""

    def start_sample(self, start_step: int) -> int:
        """The samples of this rank's share that batch `start_step` starts after (all of them
        after the last batch, a short one included); a ConfigError past the epoch's last
        batch. The one check of a resumed epoch's start: the epoch orders trust it."""
        steps = self.steps_per_epoch()
        if not 0 <= start_step <= steps:
            raise ConfigError(f"{start_step=} must be in [0, {steps}], the steps of an epoch "
                              f"({self.samples_per_epoch()} samples a rank, batch "
                              f"{self.config.batch_size})")
        return min(start_step * self.config.batch_size, self.samples_per_epoch())

    def start(self) -> None:  # noqa: B027 - optional hook
        """Start workers and load their libraries, reading no data.

        Called before the first epoch's clocks and counters start, so that
        `os_read_bytes` counts the dataset's bytes, not the shared libraries
        new worker processes load (docs/metrics.md).
        """

    def cache_settings(self) -> dict[str, Any]:
        """The user-space caches this loader's readers run with (recorded in results)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop workers and close files."""

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Epochs(Protocol):
    """What `batches` iterates: a `Loader`, or a naive baseline (`loaders/naive.py`)."""

    def epoch(self, epoch: int) -> Iterator[Batch]: ...


def batches(loader: Epochs | Loader, epoch: int, start_step: int = 0) -> Iterator[Batch]:
    """`loader`'s batches of `epoch` from batch `start_step` on, as every command that reads
    an epoch takes them (train, bench-read). Loaders written to the one-argument contract
    are only ever asked for whole epochs. At each batch an interrupt whose raise Python
    dropped (inside a weakref callback: a batch's buffers freed) is raised again
    (`interrupts.check`), and the loader's iterator is closed however the caller stops
    (early, on an error), so its workers settle."""
    it: Iterator[Batch] = (loader.epoch(epoch, start_step=start_step)  # type: ignore[call-arg]
                           if start_step else loader.epoch(epoch))
    try:
        for b in it:
            interrupts.check()
            yield b
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
