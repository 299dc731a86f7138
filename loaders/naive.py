"""The naive baselines every user writes first: a per-sample `Dataset` over h5py, default `DataLoader`.

Two baselines, both `DataLoader(batch_size=B, num_workers=W)` over a
per-sample `Dataset` with a `DistributedSampler` (shuffled, 1/world share per
rank), reading one sample and its label per `__getitem__`:

- `naive-h5py` (the baseline, what users really write): the HDF5 file is
  opened lazily in the process that reads it (each worker process, or the
  main process with W = 0), once, and kept open; with the default
  (non-persistent) workers that is once per file per worker per epoch. The
  main process's handles are closed between epochs, so no HDF5 cache carries
  samples from one cold epoch to the next.
- `naive-h5py-open-per-sample`: `__getitem__` opens the file, reads the
  sample and closes it again (the older, slower habit; on a parallel
  filesystem every open is a metadata round trip).

With `decode=True` they apply the same preprocessing as the iobench loaders,
one sample at a time, float conversion included (in the worker, as users'
datasets do; the iobench loaders leave it to the consumer by default). They exist only so `bench-read` can show every figure
as a ratio to them; they are not registered loaders.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from iobench.core.errors import DatasetError
from iobench.core.formats import BASELINE_FORMAT
from iobench.core.manifest import Manifest
from iobench.loaders._preprocess import pipeline, to_batch
from iobench.loaders._reader import RawBatch
from iobench.loaders._torch import WorkerFailure
from iobench.loaders.base import Batch

#: baseline name -> whether `__getitem__` opens the file for every sample
BASELINES: dict[str, bool] = {"naive-h5py": False, "naive-h5py-open-per-sample": True}


class NaiveH5Dataset(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """One sample per `__getitem__`; the file kept open per process, or opened per sample."""

    def __init__(self, manifest: Manifest, decode: bool, seed: int = 0,
                 open_per_sample: bool = False) -> None:
        if manifest.format != BASELINE_FORMAT:
            raise DatasetError(f"the naive baseline reads HDF5; {manifest.root} is "
                               f"{manifest.format!r}: generate a {BASELINE_FORMAT} copy of "
                               "the dataset")
        self.paths = [str(manifest.path_of(f)) for f in manifest.data_files]
        self.starts = [f.first_sample for f in manifest.data_files]
        self.n = manifest.num_samples
        self.dataset, self.decode, self.seed = pipeline(manifest), decode, seed
        # array names: iobench's, or those of the user's own HDF5 (`--data`)
        self.data_key = manifest.layout.get("data_key", "samples")
        self.label_key = manifest.layout.get("label_key", "labels")
        self.jpeg = manifest.sample["kind"] == "jpeg"
        self.open_per_sample = open_per_sample
        self.epoch = 0
        self._files: dict[int, Any] = {}  # file index -> h5py.File, of process `_pid`
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        # open HDF5 handles never cross a process boundary (spawned workers open their own)
        return {**self.__dict__, "_files": {}}

    def _file(self, k: int) -> Any:
        """File k, opened on first use in this process (a forked worker opens its own)."""
        import h5py

        if self._pid != os.getpid():
            self._files, self._pid = {}, os.getpid()
        f = self._files.get(k)
        if f is None:
            f = self._files[k] = h5py.File(self.paths[k], "r")
        return f

    def close_files(self) -> None:
        """Close this process's handles (between epochs: nothing cached survives)."""
        if self._pid == os.getpid():
            for f in self._files.values():
                f.close()
        self._files = {}

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        import h5py

        k = bisect.bisect_right(self.starts, i) - 1
        local = i - self.starts[k]
        try:
            if self.open_per_sample:
                with h5py.File(self.paths[k], "r") as f:
                    x, y, offsets = self._read(f, local)
            else:
                x, y, offsets = self._read(self._file(k), local)
        except (OSError, KeyError, ValueError, TypeError) as e:  # held to iobench's contract
            raise DatasetError(f"the naive baseline cannot read sample {i} from "
                               f"{self.paths[k]} ({str(e).splitlines()[0]}); the file is "
                               "damaged: regenerate the dataset") from None
        raw = RawBatch(x[None] if offsets is None else x, np.asarray(y)[None],
                       np.array([x.nbytes], dtype=np.int64), offsets)
        # converted to floats here, one sample at a time, as users' datasets do
        b = to_batch(self.dataset, raw, np.array([i]), self.seed, self.epoch, self.decode,
                     convert="loader")
        return b.samples, b.labels[0], x.nbytes

    def _read(self, f: Any, local: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if self.jpeg:
            lo, hi = f["offsets"][local:local + 2]
            return f["jpeg"][lo:hi], f["labels"][local], np.array([0, hi - lo], dtype=np.int64)
        return f[self.data_key][local], f[self.label_key][local], None


def _collate(items: list[Any]) -> Any:
    """Default-collate fixed-shape samples; keep variable-size JPEG bytes as a list (a
    sample's failure instead of the batch)."""
    failed = next((x for x in items if isinstance(x, WorkerFailure)), None)
    if failed is not None:
        return failed
    xs, ys, nb = zip(*items, strict=True)
    # arrays come as [1, ...] each; undecoded JPEG as 1-D bytes of varying length
    samples: Any = list(xs) if xs[0].dim() == 1 else torch.cat(xs)
    return samples, torch.stack(ys), int(sum(nb))


class _Carried(Dataset[Any]):
    """The dataset as the DataLoader sees it: a DatasetError comes back as a value, whole
    (raised in a worker, torch would raise it again with the worker's traceback as its
    text)."""

    def __init__(self, ds: NaiveH5Dataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Any:
        try:
            return self.ds[i]
        except DatasetError as e:
            return WorkerFailure(e)


class NaiveLoader:
    """Epoch iterator over a naive baseline, yielding `Batch`es like the real loaders."""

    def __init__(self, manifest: Manifest, batch_size: int, workers: int, shuffle: bool,
                 decode: bool, seed: int = 0, rank: int = 0, world: int = 1,
                 open_per_sample: bool = False) -> None:
        self.ds = NaiveH5Dataset(manifest, decode, seed, open_per_sample)
        # what users write for several ranks: DistributedSampler, a 1/world share each
        self.sampler: DistributedSampler[int] = DistributedSampler(
            self.ds, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        # default DataLoader: workers (if any) start afresh every epoch
        self.dl = DataLoader(_Carried(self.ds), batch_size=batch_size, sampler=self.sampler,
                             num_workers=workers, collate_fn=_collate)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        self.ds.close_files()  # before workers fork: they inherit no open handle
        self.sampler.set_epoch(epoch)
        self.ds.epoch = epoch
        try:
            for item in self.dl:
                if isinstance(item, WorkerFailure):
                    item.reraise()  # a sample's DatasetError, with its own message
                samples, labels, nbytes = item
                n = len(labels)
                yield Batch(samples, labels, torch.empty(n, dtype=torch.int64), nbytes)
        finally:
            self.ds.close_files()  # W = 0: the next cold epoch starts without HDF5's caches

    def close(self) -> None:
        self.ds.close_files()
        self.dl = None  # type: ignore[assignment]
