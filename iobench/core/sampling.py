"""Which samples each rank reads, in what order, each epoch.

Pure functions of (seed, epoch, rank, world), so every rank derives the same
global order without talking to the others, and a run repeats exactly.

- `global`: a fresh full permutation of all samples every epoch.
- `block`: permute contiguous blocks of `block_size` samples, then shuffle
  samples within windows of `window` consecutive blocks (locality-friendly).
- `none`: sequential.

Each rank takes a contiguous, equal share of the epoch's order (contiguous
keeps `block` locality per rank); the `N mod world` samples left over are
the only ones skipped that epoch, and they differ from epoch to epoch.

`start` leaves out the first samples of a rank's share (`train --resume` part-way
through an epoch: the batches trained before the failure): the rest of the SAME
order, never read and thrown away.

With `scope="local"` (a dataset sharded across nodes by `iobench stage
--mode shard`) each rank only ever reads the files `files_for_rank` gives it,
and shuffles within them.

Orders are built in int32 when the dataset has fewer than 2**31 samples (the
same permutation as in int64: the generator's draws do not depend on the
item size), and only the rank's share is returned in int64: at 10M samples a
rank holds 40 MB for a moment, not 80 MB of int64 and its copy. Local scope
never lists other ranks' files: counts are arithmetic on the file ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from iobench.core.errors import ConfigError

if TYPE_CHECKING:
    from iobench.core.manifest import Manifest

SHUFFLES = ("global", "block", "none")
SCOPES = ("global", "local")


def parse_shuffle(mode: str) -> str:
    if mode not in SHUFFLES:
        raise ConfigError(f"unknown shuffle {mode!r}; choose one of: {', '.join(SHUFFLES)}")
    return mode


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, 0x5EED])


def _index_dtype(n: int) -> type[np.integer[Any]]:
    return np.int32 if n < 2**31 else np.int64


def epoch_order(indices: np.ndarray, mode: str, seed: int, epoch: int,
                block_size: int = 256, window: int = 16) -> np.ndarray:
    """The order in which `indices` (an integer array, kept in its dtype: int32 or
    int64) are visited this epoch."""
    indices = np.asarray(indices)
    if indices.dtype.kind not in "iu":
        indices = indices.astype(np.int64)
    if mode == "none":
        return indices.copy()
    rng = _rng(seed, epoch)
    if mode == "global":
        return rng.permutation(indices)
    if mode == "block":
        if block_size < 1 or window < 1:
            raise ConfigError(f"{block_size=} and {window=} must be >= 1")
        blocks = [indices[i:i + block_size] for i in range(0, len(indices), block_size)]
        order = rng.permutation(len(blocks))
        out = []
        for w in range(0, len(order), window):
            chunk = np.concatenate([blocks[b] for b in order[w:w + window]])
            out.append(rng.permutation(chunk))
        return np.concatenate(out) if out else indices[:0]
    raise ConfigError(f"unknown shuffle {mode!r}; choose one of: {', '.join(SHUFFLES)}")


def files_for_rank(num_files: int, rank: int, world: int) -> range:
    """Data files (by position in the manifest) that rank `rank` owns in `local` scope."""
    return range(rank, num_files, world)


class FileRanges:
    """(first_sample, num_samples) of each data file, without a list of them when the
    files are uniform (`samples_per_file` each, the last one short): what local scope needs."""

    def __init__(self, num_samples: int, ranges: Sequence[tuple[int, int]] | None = None,
                 samples_per_file: int | None = None) -> None:
        if (ranges is None) == (samples_per_file is None):
            raise ConfigError("give the file ranges or samples_per_file, one of them")
        self.num_samples = num_samples
        self.k = samples_per_file
        self.ranges = (None if ranges is None
                       else np.asarray(ranges, dtype=np.int64).reshape(-1, 2))

    @classmethod
    def of(cls, manifest: Manifest) -> FileRanges:
        """The data files' ranges of a manifest (arithmetic for a compact one)."""
        t = manifest.compact
        if t is not None:
            return cls(manifest.num_samples, samples_per_file=t.samples_per_file)
        return cls(manifest.num_samples,
                   [(f.first_sample, f.num_samples) for f in manifest.data_files])

    def __len__(self) -> int:
        if self.ranges is not None:
            return len(self.ranges)
        assert self.k is not None
        return -(-self.num_samples // self.k)

    def of_rank(self, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
        """(first samples, counts) of the files rank `rank` owns."""
        if self.ranges is not None:
            mine = self.ranges[rank::world]
            return mine[:, 0], mine[:, 1]
        assert self.k is not None
        first = np.arange(rank, len(self), world, dtype=np.int64) * self.k
        return first, np.minimum(self.k, self.num_samples - first)

    def rank_counts(self, world: int) -> list[int]:
        """Samples each rank owns."""
        if self.ranges is not None:
            return [int(self.ranges[r::world, 1].sum()) for r in range(world)]
        assert self.k is not None
        f = len(self)
        last = self.num_samples - (f - 1) * self.k
        return [len(range(r, f, world)) * self.k - (self.k - last if (f - 1) % world == r
                                                    else 0) for r in range(world)]


def _expand(first: np.ndarray, counts: np.ndarray, dtype: type[np.integer[Any]]) -> np.ndarray:
    """The sample indices of the ranges (first[i], counts[i]), concatenated."""
    total = int(counts.sum())
    ends = np.cumsum(counts)
    out: np.ndarray = (np.arange(total, dtype=np.int64)
                       + np.repeat(first - (ends - counts), counts)).astype(dtype, copy=False)
    return out


def _local_ranges(num_samples: int, world: int,
                  file_ranges: Sequence[tuple[int, int]] | FileRanges | None) -> FileRanges:
    """The data files' sample ranges for local scope, checked: one file per rank at least."""
    if file_ranges is None:
        raise ConfigError("scope='local' needs the dataset's file ranges")
    ranges = (file_ranges if isinstance(file_ranges, FileRanges)
              else FileRanges(num_samples, file_ranges))
    if len(ranges) < world:
        raise ConfigError(f"local shuffle scope needs at least one file per rank: "
                          f"{len(ranges)} files for {world} ranks; regenerate with "
                          "a smaller --samples-per-file")
    return ranges


def rank_count(num_samples: int, world: int, *,
               file_ranges: Sequence[tuple[int, int]] | FileRanges | None = None,
               scope: str = "global") -> int:
    """len(rank_indices(...)) for any rank, epoch and shuffle, without building an order."""
    if scope == "global":
        return num_samples // world
    if scope == "local":
        ranges = _local_ranges(num_samples, world, file_ranges)
        return min(ranges.rank_counts(world))
    raise ConfigError(f"unknown shuffle scope {scope!r}; choose one of: {', '.join(SCOPES)}")


def rank_indices(num_samples: int, mode: str, seed: int, epoch: int, rank: int, world: int,
                 block_size: int = 256, window: int = 16, *,
                 file_ranges: Sequence[tuple[int, int]] | FileRanges | None = None,
                 scope: str = "global", start: int = 0) -> np.ndarray:
    """Global sample indices rank `rank` reads this epoch, in order (int64).

    Every rank gets the same count: num_samples // world in global scope (the
    rest skipped this epoch), the smallest rank's share in local scope.
    `file_ranges` lists (first_sample, num_samples) per data file (or is a
    `FileRanges`) and is needed for `scope="local"`. `start` (samples) leaves out
    the first samples of the share: `rank_indices(..., start=k)` is
    `rank_indices(...)[k:]`, the epoch resumed part-way.
    """
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"{rank=} must be in [0, {world=})")
    share = _share(num_samples, mode, seed, epoch, rank, world, block_size, window,
                   file_ranges, scope)
    if not 0 <= start <= len(share):
        raise ConfigError(f"{start=} must be in [0, {len(share)}], the samples rank {rank} "
                          f"reads in epoch {epoch}")
    return share[start:].astype(np.int64)


def _share(num_samples: int, mode: str, seed: int, epoch: int, rank: int, world: int,
           block_size: int, window: int,
           file_ranges: Sequence[tuple[int, int]] | FileRanges | None,
           scope: str) -> np.ndarray:
    """`rank_indices` of the whole epoch, in the order's own dtype (int32 or int64)."""
    dtype = _index_dtype(num_samples)
    if scope == "global":
        if mode == "global":  # in place: one array of N, not the arange and its permutation
            order = np.arange(num_samples, dtype=dtype)
            _rng(seed, epoch).shuffle(order)
        else:
            order = epoch_order(np.arange(num_samples, dtype=dtype), mode, seed, epoch,
                                block_size, window)
        per_rank = num_samples // world
        share: np.ndarray = order[rank * per_rank:(rank + 1) * per_rank]
        return share
    if scope == "local":
        ranges = _local_ranges(num_samples, world, file_ranges)
        mine = _expand(*ranges.of_rank(rank, world), dtype)
        order = epoch_order(mine, mode, seed * 1_000_003 + rank, epoch, block_size, window)
        share = order[:min(ranges.rank_counts(world))]
        return share
    raise ConfigError(f"unknown shuffle scope {scope!r}; choose one of: {', '.join(SCOPES)}")
