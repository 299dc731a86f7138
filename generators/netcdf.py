"""NetCDF-4 writer (netCDF4): the HDF5 layout, with named dimensions.

Variables: `samples` (sample, d0, d1, ...) or `jpeg` (byte) + `offsets`
(sample_plus_one), and `labels` (sample[, param]). Uncompressed variables are
contiguous; compressed ones (gzip) use one sample per chunk. netCDF-C has no
lzf filter, so lzf is refused with the alternatives named.
"""

from __future__ import annotations

from pathlib import Path

from iobench.errors import DatasetError
from iobench.generators.base import ContainerWriter, Task, atomic_file, entry_for
from iobench.generators.hdf5 import build_arrays
from iobench.manifest import FileEntry

COMPRESSIONS = ("none", "gzip")


class NetCDFWriter(ContainerWriter):
    format = "netcdf"
    suffix = ".nc"

    compressions = COMPRESSIONS
    compression_hint = f"netCDF-C has no such filter; choose one of: {', '.join(COMPRESSIONS)}"

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        import netCDF4

        payload, labels = build_arrays(self.spec, self.seed, task.first, task.count)
        with atomic_file(root / task.files[0]) as tmp, \
                netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
            ds.createDimension("sample", task.count)
            if self.spec.sample_kind == "jpeg":
                blob, offsets = payload
                ds.createDimension("byte", len(blob))
                ds.createDimension("sample_plus_one", task.count + 1)
                ds.createVariable("jpeg", "u1", ("byte",), contiguous=True)[:] = blob
                ds.createVariable("offsets", "i8", ("sample_plus_one",),
                                  contiguous=True)[:] = offsets
            else:
                dims = ["sample"]
                for i, n in enumerate(self.spec.sample_shape):
                    ds.createDimension(f"d{i}", n)
                    dims.append(f"d{i}")
                kw = ({"contiguous": True} if self.compression == "none" else
                      {"zlib": True, "complevel": 4,
                       "chunksizes": (1, *self.spec.sample_shape)})
                v = ds.createVariable("samples", self.spec.sample_dtype, tuple(dims), **kw)
                v.set_auto_maskandscale(False)
                v[:] = payload
            ldims = ("sample",)
            if self.spec.label_shape:
                ds.createDimension("param", self.spec.label_shape[0])
                ldims = ("sample", "param")
            lv = ds.createVariable("labels", self.spec.label_dtype, ldims, contiguous=True)
            lv.set_auto_maskandscale(False)
            lv[:] = labels
            ds.setncattr("dataset", self.spec.name)
            ds.setncattr("first_sample", task.first)
        return [entry_for(root, task.files[0], task.first, task.count)]

    def check(self, path: Path, entry: FileEntry) -> None:
        import netCDF4

        try:
            with netCDF4.Dataset(path, "r") as ds:
                n = ds.dimensions["sample"].size
                if self.spec.sample_kind == "jpeg":
                    ok = ds.variables["offsets"].shape == (n + 1,)
                else:
                    ok = ds.variables["samples"].shape == (n, *self.spec.sample_shape)
        except (OSError, KeyError) as e:
            raise DatasetError(f"{path}: cannot be read as NetCDF-4 ({e})") from e
        if n != entry.num_samples or not ok:
            raise DatasetError(f"{path}: holds {n} samples in an unexpected layout, manifest "
                               f"says {entry.num_samples}")
