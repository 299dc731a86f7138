"""HDF5 writer (h5py): one file per `samples_per_file` samples.

Layout (docs/design.md): `samples` [n, *shape] (contiguous, or one sample per
chunk when compressed) and `labels` [n, *label_shape]; JPEG datasets store
`jpeg` (uint8, all images back to back, contiguous) and `offsets` [n + 1].
Object timestamps are off, so the same seed gives byte-identical files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from iobench.errors import DatasetError
from iobench.generators.base import ContainerWriter, Task, atomic_file, entry_for
from iobench.generators.synth import make_sample
from iobench.manifest import FileEntry

_FILTERS = {"none": {}, "gzip": {"compression": "gzip", "compression_opts": 4},
            "lzf": {"compression": "lzf"}}


def build_arrays(spec, seed: int, first: int, count: int):
    """(payload, labels) of samples [first, first+count): an array, or JPEG bytes + offsets."""
    labels = np.empty((count, *spec.label_shape), dtype=spec.label_dtype)
    if spec.sample_kind == "jpeg":
        blobs = []
        for i in range(count):
            b, labels[i] = make_sample(spec, seed, first + i)
            blobs.append(b)
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum([len(b) for b in blobs], out=offsets[1:])
        return (np.frombuffer(b"".join(blobs), dtype=np.uint8), offsets), labels
    samples = np.empty((count, *spec.sample_shape), dtype=spec.sample_dtype)
    for i in range(count):
        samples[i], labels[i] = make_sample(spec, seed, first + i)
    return samples, labels


class HDF5Writer(ContainerWriter):
    format = "hdf5"
    suffix = ".h5"
    compressions = tuple(_FILTERS)

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        import h5py

        payload, labels = build_arrays(self.spec, self.seed, task.first, task.count)
        with atomic_file(root / task.files[0]) as tmp, \
                h5py.File(tmp, "w", track_order=False, locking=False) as f:
            if self.spec.sample_kind == "jpeg":
                blob, offsets = payload
                f.create_dataset("jpeg", data=blob, track_times=False)
                f.create_dataset("offsets", data=offsets, track_times=False)
            else:
                kw = _FILTERS[self.compression]
                chunks = (1, *self.spec.sample_shape) if kw else None
                f.create_dataset("samples", data=payload, chunks=chunks,
                                 track_times=False, **kw)
            f.create_dataset("labels", data=labels, track_times=False)
            f.attrs["first_sample"] = np.int64(task.first)
            f.attrs["dataset"] = self.spec.name
        return [entry_for(root, task.files[0], task.first, task.count)]

    def check(self, path: Path, entry: FileEntry) -> None:
        import h5py

        try:
            with h5py.File(path, "r", locking=False) as f:
                n = f["labels"].shape[0]
                if self.spec.sample_kind == "jpeg":
                    ok = f["offsets"].shape[0] == n + 1 and f["jpeg"].shape[0] == f["offsets"][-1]
                else:
                    ok = f["samples"].shape == (n, *self.spec.sample_shape)
        except (OSError, KeyError) as e:
            raise DatasetError(f"{path}: cannot be read as HDF5 ({e})") from e
        if n != entry.num_samples or not ok:
            raise DatasetError(f"{path}: holds {n} samples in an unexpected layout, manifest "
                               f"says {entry.num_samples}")
