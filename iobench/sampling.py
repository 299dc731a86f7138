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

With `scope="local"` (a dataset sharded across nodes by `iobench stage
--mode shard`) each rank only ever reads the files `files_for_rank` gives it,
and shuffles within them.
"""

from __future__ import annotations

import numpy as np

from iobench.errors import ConfigError

SHUFFLES = ("global", "block", "none")
SCOPES = ("global", "local")


def parse_shuffle(mode: str) -> str:
    if mode not in SHUFFLES:
        raise ConfigError(f"unknown shuffle {mode!r}; choose one of: {', '.join(SHUFFLES)}")
    return mode


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, 0x5EED])


def epoch_order(indices: np.ndarray, mode: str, seed: int, epoch: int,
                block_size: int = 256, window: int = 16) -> np.ndarray:
    """The order in which `indices` (int64) are visited this epoch."""
    indices = np.asarray(indices, dtype=np.int64)
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


def files_for_rank(num_files: int, rank: int, world: int) -> list[int]:
    """Data files (by position in the manifest) that rank `rank` owns in `local` scope."""
    return list(range(rank, num_files, world))


def rank_indices(num_samples: int, mode: str, seed: int, epoch: int, rank: int, world: int,
                 block_size: int = 256, window: int = 16, *,
                 file_ranges: list[tuple[int, int]] | None = None,
                 scope: str = "global") -> np.ndarray:
    """Global sample indices rank `rank` reads this epoch, in order.

    Every rank gets the same count. `file_ranges` lists (first_sample,
    num_samples) per data file and is needed for `scope="local"`.
    """
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"{rank=} must be in [0, {world=})")
    if scope == "global":
        order = epoch_order(np.arange(num_samples, dtype=np.int64), mode, seed, epoch,
                            block_size, window)
        per_rank = num_samples // world
        return order[rank * per_rank:(rank + 1) * per_rank]
    if scope == "local":
        if file_ranges is None:
            raise ConfigError("scope='local' needs the dataset's file ranges")
        if len(file_ranges) < world:
            raise ConfigError(f"local shuffle scope needs at least one file per rank: "
                              f"{len(file_ranges)} files for {world} ranks; regenerate with "
                              "a smaller --samples-per-file")
        counts = []
        mine = None
        for r in range(world):
            idx = [np.arange(a, a + n, dtype=np.int64)
                   for a, n in (file_ranges[f] for f in files_for_rank(len(file_ranges), r, world))]
            owned = np.concatenate(idx)
            counts.append(len(owned))
            if r == rank:
                mine = owned
        assert mine is not None
        order = epoch_order(mine, mode, seed * 1_000_003 + rank, epoch, block_size, window)
        return order[:min(counts)]
    raise ConfigError(f"unknown shuffle scope {scope!r}; choose one of: {', '.join(SCOPES)}")
