"""NetCDF-4 writer (netCDF4): the HDF5 layout, with named dimensions.

Variables: `samples` (sample, d0, d1, ...) or `jpeg` (byte) + `offsets`
(sample_plus_one), and `labels` (sample[, param]). Uncompressed variables are
contiguous; compressed ones (gzip) use one sample per chunk. netCDF-C has no
lzf filter (the registry lists what --compression takes).
"""

from __future__ import annotations

from pathlib import Path

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


class NetCDFWriter(ContainerWriter):
    format = "netcdf"
    library_modules = ("netCDF4",)

    def jpeg_sizes(self, path: Path, entry: FileEntry) -> list[int]:
        import netCDF4

        with netCDF4.Dataset(path) as ds:
            sizes: list[int] = np.diff(ds.variables["offsets"][:]).tolist()
            return sizes

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        import netCDF4

        spec, n = self.spec, task.count
        with written_file(root / task.files[0]) as wf, \
                netCDF4.Dataset(wf.tmp, "w", format="NETCDF4") as ds:
            ds.createDimension("sample", n)
            if spec.sample_kind == "jpeg":
                blob, offsets = jpeg_blobs(spec, self.seed, task.first, n)
                ds.createDimension("byte", len(blob))
                ds.createDimension("sample_plus_one", n + 1)
                ds.createVariable("jpeg", "u1", ("byte",), contiguous=True)[:] = blob
                ds.createVariable("offsets", "i8", ("sample_plus_one",),
                                  contiguous=True)[:] = offsets
            else:
                dims = ["sample"]
                for i, size in enumerate(spec.array_shape):
                    ds.createDimension(f"d{i}", size)
                    dims.append(f"d{i}")
                kw = ({"contiguous": True} if self.compression == "none" else
                      {"zlib": True, "complevel": 4, "chunksizes": (1, *spec.array_shape)})
                v = ds.createVariable("samples", spec.sample_dtype, tuple(dims), **kw)
                v.set_auto_maskandscale(False)
                for lo, block in sample_blocks(spec, self.seed, task.first, n):
                    v[lo:lo + len(block)] = block
                    start_writeback(wf.tmp)
            ldims: tuple[str, ...] = ("sample",)
            if spec.label_shape:
                ds.createDimension("param", spec.label_shape[0])
                ldims = ("sample", "param")
            lv = ds.createVariable("labels", spec.label_dtype, ldims, contiguous=True)
            lv.set_auto_maskandscale(False)
            lv[:] = labels_array(spec, self.seed, task.first, n)
            ds.setncattr("dataset", spec.name)
            ds.setncattr("first_sample", task.first)
        return [file_entry(task.files[0], wf, task.first, n)]

    def check(self, path: Path, entry: FileEntry) -> None:
        import netCDF4

        try:
            with netCDF4.Dataset(path, "r") as ds:
                n = ds.dimensions["sample"].size
                lv = ds.variables["labels"]
                lv.set_auto_maskandscale(False)
                labels = lv[:]
                if self.spec.sample_kind == "jpeg":
                    ok = ds.variables["offsets"].shape == (n + 1,)
                    dtype = ds.variables["jpeg"].dtype
                    if ok:
                        for name in ("offsets", "jpeg"):
                            ds.variables[name].set_auto_maskandscale(False)
                        offsets = np.asarray(ds.variables["offsets"][:])
                        blobs = np.asarray(ds.variables["jpeg"][:])
                    else:
                        blobs = None
                else:
                    ok = ds.variables["samples"].shape == (n, *self.spec.array_shape)
                    dtype, blobs = ds.variables["samples"].dtype, None
        except (OSError, KeyError) as e:
            raise DatasetError(f"{path}: cannot be read as NetCDF-4 ({e})") from e
        self.check_contents(path, entry, n, ok, dtype, labels, blobs,
                            offsets if blobs is not None else None)
