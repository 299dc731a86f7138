"""The naive baseline every user writes first: a per-sample `Dataset` over h5py, default `DataLoader`.

`__getitem__(i)` opens the HDF5 file holding sample i, reads that one sample
and its label, and closes the file; `DataLoader(batch_size=B, num_workers=W)`
with a `DistributedSampler` (shuffled, 1/world share per rank). With `decode=True` it applies the
same preprocessing as the iobench loaders, one sample at a time. It exists
only so `bench-read` can show every figure as a ratio to it; it is not a
registered loader.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from iobench.errors import DatasetError
from iobench.loaders._preprocess import to_batch
from iobench.loaders._reader import RawBatch
from iobench.loaders.base import Batch
from iobench.manifest import Manifest


class NaiveH5Dataset(Dataset):
    """One sample per `__getitem__`, opening its file each time (as typical user code does)."""

    def __init__(self, manifest: Manifest, decode: bool, seed: int = 0) -> None:
        if manifest.format != "hdf5":
            raise DatasetError(f"the naive baseline reads HDF5; {manifest.root} is "
                               f"{manifest.format!r}: generate an hdf5 copy of the dataset")
        self.paths = [str(manifest.path_of(f)) for f in manifest.data_files]
        self.starts = [f.first_sample for f in manifest.data_files]
        self.n = manifest.num_samples
        self.dataset, self.decode, self.seed = manifest.dataset, decode, seed
        self.jpeg = manifest.sample["kind"] == "jpeg"
        self.epoch = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        import h5py

        k = bisect.bisect_right(self.starts, i) - 1
        local = i - self.starts[k]
        with h5py.File(self.paths[k], "r") as f:
            if self.jpeg:
                lo, hi = f["offsets"][local:local + 2]
                x = f["jpeg"][lo:hi]
                offsets: np.ndarray | None = np.array([0, hi - lo], dtype=np.int64)
            else:
                x = f["samples"][local]
                offsets = None
            y = f["labels"][local]
        raw = RawBatch(x[None] if offsets is None else x, np.asarray(y)[None],
                       np.array([x.nbytes], dtype=np.int64), offsets)
        b = to_batch(self.dataset, raw, np.array([i]), self.seed, self.epoch, self.decode)
        return b.samples, b.labels[0], x.nbytes


def _collate(items: list[tuple[torch.Tensor, torch.Tensor, int]]) -> tuple[Any, torch.Tensor, int]:
    """Default-collate fixed-shape samples; keep variable-size JPEG bytes as a list."""
    xs, ys, nb = zip(*items, strict=True)
    # arrays come as [1, ...] each; undecoded JPEG as 1-D bytes of varying length
    samples: Any = list(xs) if xs[0].dim() == 1 else torch.cat(xs)
    return samples, torch.stack(ys), int(sum(nb))


class NaiveLoader:
    """Epoch iterator over the naive baseline, yielding `Batch`es like the real loaders."""

    def __init__(self, manifest: Manifest, batch_size: int, workers: int, shuffle: bool,
                 decode: bool, seed: int = 0, rank: int = 0, world: int = 1) -> None:
        self.ds = NaiveH5Dataset(manifest, decode, seed)
        # what users write for several ranks: DistributedSampler, a 1/world share each
        self.sampler = DistributedSampler(self.ds, num_replicas=world, rank=rank,
                                          shuffle=shuffle, seed=seed, drop_last=True)
        self.dl = DataLoader(self.ds, batch_size=batch_size, sampler=self.sampler,
                             num_workers=workers, collate_fn=_collate)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        self.ds.epoch = epoch
        for samples, labels, nbytes in self.dl:
            n = len(labels)
            yield Batch(samples, labels, torch.empty(n, dtype=torch.int64), nbytes)

    def close(self) -> None:
        self.dl = None  # type: ignore[assignment]
