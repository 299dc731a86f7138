"""NetCDF-4 loader: netCDF4 slice reads per contiguous run, PyTorch DataLoader.

Same variables as the HDF5 layout (`samples` or `jpeg` + `offsets`,
`labels`). netCDF4 (the C library) is not thread-safe: every netCDF4 call in
a process goes through one lock, so `worker_type="thread"` serialises reads
(that is what it is there to show). Process workers each have their own
library state and read in parallel. HDF5 file locking is turned off through
`HDF5_USE_FILE_LOCKING=FALSE` before netCDF4 is imported (shared filesystems).

Contiguous variables have their batch's byte ranges prefetched at once
(`posix_fadvise(WILLNEED)`, offsets from the HDF5 layout), as for HDF5.

`payload_bytes`: uncompressed samples count their array bytes; compressed
variables count each chunk's stored size, read once per file from the
HDF5 chunk index (through h5py, which is safe alongside netCDF4: checked
by the tests, which read both in one process).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from iobench.core.formats import netcdf4
from iobench.loaders._reader import (
    ContainerReader,
    OpenFile,
    contiguous_runs,
    file_groups,
    read_jpeg_runs,
)
from iobench.loaders._torch import TorchLoader

_NC_LOCK = threading.RLock()  # netCDF-C is not thread-safe: one call at a time per process


class NetCDFReader(ContainerReader):
    """Reads batches from iobench NetCDF-4 files."""

    format = "netcdf"

    def _open(self, pos: int, path: Path, n: int) -> OpenFile:
        nc4 = netcdf4()
        offsets = None
        with _NC_LOCK:
            try:
                ds = nc4.Dataset(path, "r")
            except OSError as e:
                raise self.fail(path, "netCDF cannot open it", e) from None
            with self.closed_on_error(ds, path, "netCDF", "variable", (OSError, RuntimeError)):
                ds.set_auto_maskandscale(False)
                v = ds.variables
                labels = np.asarray(v[self.label_key][...])
                if self.kind == "jpeg":
                    offsets = np.asarray(v["offsets"][...], dtype=np.int64)
                    var = v["jpeg"]
                    self.check_container(path, n, labels, offsets, var.shape[0])
                    stored, item = np.diff(offsets), 1
                    base = self._h5_layout(pos, "jpeg", n)[0]
                else:
                    var = v[self.data_key]
                    self.check_container(path, n, labels, shape=var.shape, dtype=var.dtype)
                    filters = var.filters() or {}
                    compressed = any(filters.get(k) for k in
                                     ("zlib", "szip", "zstd", "bzip2", "blosc", "shuffle"))
                    item = int(np.prod(self.array_shape)) * self.sample_dtype.itemsize
                    base, stored = self._h5_layout(pos, self.data_key, n)
                    if not compressed:
                        stored = np.full(n, item, dtype=np.int64)
                if not self.library_cache:
                    # netCDF-C's chunk cache (64 MiB per variable by default) would serve
                    # a persistent worker's next "cold" epoch from memory
                    var.set_var_chunk_cache(size=0)
        return self.opened(path, ds, var, labels, stored, base, item, offsets)

    def warm_up(self) -> None:
        netcdf4()
        import h5py  # noqa: F401 - the layout query (_h5_layout) reads with it

    def user_cache(self) -> dict[str, Any]:
        size = netcdf4().get_chunk_cache()[0] if self.library_cache else 0
        return {"netcdf_chunk_cache_bytes": size}

    def _h5_layout(self, pos: int, name: str, n: int) -> tuple[int | None, np.ndarray]:
        """File offset of variable `name` when contiguous, and its per-sample stored bytes.

        A NetCDF-4 file is an HDF5 file: h5py reads its layout (netCDF4 does not say).
        """
        import h5py

        from iobench.loaders.hdf5 import stored_sizes

        try:
            with h5py.File(self.paths[pos], "r", locking=False) as h:
                ds = h[name]
                return ds.id.get_offset(), (stored_sizes(ds, n) if name == self.data_key
                                            else np.zeros(n, dtype=np.int64))
        except (OSError, KeyError) as e:
            raise self.fail(self.paths[pos], "cannot read its HDF5 layout", e) from None

    def _close_state(self, state: dict[Any, Any]) -> None:
        with _NC_LOCK:
            super()._close_state(state)

    def _read_sorted_arrays(self, sorted_idx: np.ndarray, order: np.ndarray,
                            out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels, stored, groups = file_groups(self, sorted_idx)
        for pos, s, e, f, local in groups:
            var = f.data
            dest_pos = order[s:e]
            for a, b in contiguous_runs(local):
                lo = int(local[a])
                with _NC_LOCK:
                    try:
                        block = var[lo:lo + (b - a)]
                    except (OSError, RuntimeError, IndexError) as err:
                        raise self.fail(self.paths[pos], "netCDF read failed", err) from None
                out[dest_pos[a:b]] = block
        return labels, stored

    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[Any], np.ndarray, np.ndarray]:
        return read_jpeg_runs(self, sorted_idx, self._read_span)

    def _read_span(self, pos: int, f: OpenFile, lo: int, hi: int) -> np.ndarray:
        with _NC_LOCK:
            try:
                return np.asarray(f.data[lo:hi], dtype=np.uint8)
            except (OSError, RuntimeError, IndexError) as err:
                raise self.fail(self.paths[pos], "netCDF read failed", err) from None


class NetCDFLoader(TorchLoader):
    """PyTorch DataLoader over NetCDF-4 files (netCDF4)."""

    name = "netcdf"
    reader_cls = NetCDFReader
