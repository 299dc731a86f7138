"""The loader contract: configuration, the batch a step receives, the Loader base.

A loader reads one rank's share of a dataset each epoch (order from
`iobench.sampling`) and yields `Batch`es of torch tensors. The layout comes
from the dataset's manifest (`iobench.manifest`), never from guesses.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from iobench import sampling
from iobench.errors import ConfigError
from iobench.manifest import Manifest

WORKER_TYPES = ("process", "thread")
DEVICES = ("cpu", "gpu")


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
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r}; choose one of {DEVICES}")


class Batch(NamedTuple):
    """One step's data for one rank.

    samples: decoded: float32, channels first ([B,3,224,224] imagenet,
      [B,3,32,32] cifar10, [B,4,128,128,128] cosmoflow). Undecoded: the stored
      arrays (uint8 [B,32,32,3], int16 [B,128,128,128,4]) or, for JPEG, all
      images' bytes back to back (uint8, 1-D) with `offsets` ([B+1], int64).
    labels: int64 [B] (classes) or float32 [B, 4] (regression targets).
    indices: int64 [B], the global sample indices, in batch order.
    payload_bytes: bytes the readers took from storage for this batch
      (encoded/stored bytes), per METRICS.md `batch_bytes`.
    timing: (read_ns, decode_ns, done_ns) of the reader that made this batch:
      time reading it from storage, time decoding and preprocessing it, and
      `perf_counter_ns()` when it was done (the same clock in every process of
      a node: the consumer can tell how long a finished batch took to reach
      it); None when the loader keeps no such clocks.
    """

    samples: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    payload_bytes: int
    offsets: torch.Tensor | None = None
    timing: tuple[int, int, int] | None = None


class Loader(ABC):
    """Reads one rank's share of a dataset, epoch by epoch."""

    name: ClassVar[str]

    def __init__(self, dataset: Manifest | str | Path, config: LoaderConfig,
                 rank: int = 0, world: int = 1) -> None:
        self.manifest = dataset if isinstance(dataset, Manifest) else Manifest.load(dataset)
        self.config = config
        self.rank, self.world = rank, world
        n_local = len(self.indices(0))
        if n_local == 0:
            raise ConfigError(f"dataset has {self.manifest.num_samples} samples: too few for "
                              f"{world} ranks; generate more with --samples")

    def indices(self, epoch: int) -> np.ndarray:
        """Global sample indices this rank reads in `epoch`, in order."""
        c, m = self.config, self.manifest
        ranges = [(f.first_sample, f.num_samples) for f in m.data_files]
        return sampling.rank_indices(m.num_samples, c.shuffle, c.seed, epoch, self.rank,
                                     self.world, c.block_size, c.shuffle_window,
                                     file_ranges=ranges, scope=c.scope)

    def steps_per_epoch(self) -> int:
        """Steps per epoch; the same on every rank (the last batch may be short)."""
        return math.ceil(len(self.indices(0)) / self.config.batch_size)

    @abstractmethod
    def epoch(self, epoch: int) -> Iterator[Batch]:
        """Yield this rank's batches for `epoch` (0-based)."""

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
