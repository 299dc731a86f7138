"""HDF5 writer (h5py): one file per `samples_per_file` samples.

Layout (docs/design.md): `samples` [n, *shape] (contiguous, or one sample per
chunk when compressed) and `labels` [n, *label_shape]; JPEG datasets store
`jpeg` (uint8, all images back to back, contiguous) and `offsets` [n + 1].
Object timestamps are off, so the same seed gives byte-identical files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from iobench.core.errors import DatasetError
from iobench.core.manifest import FileEntry
from iobench.generators.base import (
    ContainerWriter,
    Task,
    file_entry,
    jpeg_blobs,
    sample_blocks,
    start_writeback,
    written_file,
)
from iobench.generators.synth import labels_array

_FILTERS: dict[str, dict[str, Any]] = {
    "none": {}, "gzip": {"compression": "gzip", "compression_opts": 4},
    "lzf": {"compression": "lzf"}}


class HDF5Writer(ContainerWriter):
    format = "hdf5"
    library_modules = ("h5py",)

    def jpeg_sizes(self, path: Path, entry: FileEntry) -> list[int]:
        import h5py

        with h5py.File(path, "r", locking=False) as f:
            sizes: list[int] = np.diff(f["offsets"][...]).tolist()
            return sizes

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        import h5py

        spec, n = self.spec, task.count
        with written_file(root / task.files[0]) as wf, \
                h5py.File(wf.tmp, "w", track_order=False, locking=False) as f:
            if spec.sample_kind == "jpeg":
                blob, offsets = jpeg_blobs(spec, self.seed, task.first, n)
                f.create_dataset("jpeg", data=blob, track_times=False)
                f.create_dataset("offsets", data=offsets, track_times=False)
            else:
                kw = _FILTERS[self.compression]
                chunks = (1, *spec.array_shape) if kw else None
                dset = f.create_dataset("samples", shape=(n, *spec.array_shape),
                                        dtype=spec.sample_dtype, chunks=chunks,
                                        track_times=False, **kw)
                # blocks of ~16 MB straight from the synthesis buffer: large writes,
                # bounded memory, no copy of the whole file's samples
                for lo, block in sample_blocks(spec, self.seed, task.first, n):
                    dset.write_direct(block, dest_sel=np.s_[lo:lo + len(block)])
                    start_writeback(wf.tmp)
            f.create_dataset("labels", data=labels_array(spec, self.seed, task.first, n),
                             track_times=False)
            f.attrs["first_sample"] = np.int64(task.first)
            f.attrs["dataset"] = spec.name
        return [file_entry(task.files[0], wf, task.first, n)]

    def check(self, path: Path, entry: FileEntry) -> None:
        import h5py

        try:
            with h5py.File(path, "r", locking=False) as f:
                n = f["labels"].shape[0]
                labels = f["labels"][:]
                if self.spec.sample_kind == "jpeg":
                    offsets = f["offsets"][:]
                    ok = f["offsets"].shape[0] == n + 1 and f["jpeg"].shape[0] == offsets[-1]
                    dtype = f["jpeg"].dtype
                    blobs = f["jpeg"][:] if ok else None
                else:
                    ok = f["samples"].shape == (n, *self.spec.array_shape)
                    dtype, blobs = f["samples"].dtype, None
        except (OSError, KeyError) as e:
            raise DatasetError(f"{path}: cannot be read as HDF5 ({e})") from e
        self.check_contents(path, entry, n, ok, dtype, labels, blobs,
                            offsets if blobs is not None else None)
