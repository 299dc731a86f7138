"""HDF5 loader: h5py reads of whole batches (one H5Dread per file per batch), PyTorch DataLoader.

Layout (docs/design.md): per file `samples` [n, ...] (or `jpeg` + `offsets`)
and `labels` [n, ...]. A batch's indices are sorted and merged into runs; the
runs in one file become one union-of-hyperslabs selection read by a single
H5Dread, straight into the batch array when the batch order allows, else
into a temporary scattered once. Labels and JPEG offsets are read once per
file and worker. Contiguous, unfiltered datasets (the generator's default)
are read without HDF5's selection machinery: their bytes lie at the file
offset HDF5 reports, and one `preadv` per run of consecutive samples
scatters them straight into the batch's rows (for 147 KB samples a union of
64 hyperslabs cost HDF5 ~5 CPU-seconds per GB). Before reading, the byte ranges of every run of the batch
are handed to the kernel at once (`posix_fadvise(WILLNEED)`, for contiguous
datasets, whose file offset HDF5 reports), so a cold batch's I/O is in flight
together rather than one request after another; under `shuffle="block"` whole
blocks are requested, since the block shuffle reads each block completely
within a few batches (one large request instead of many small ones). Files are opened with HDF5 file locking off (shared
filesystems) and only in the process and thread that read.

`payload_bytes`: uncompressed samples count their array bytes; compressed
(chunked, one sample per chunk) count each chunk's stored size from the
file's chunk index; JPEG counts the JPEG bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from iobench.loaders._reader import (
    ContainerReader,
    OpenFile,
    contiguous_runs,
    file_groups,
    preadv_into,
    read_jpeg_runs,
)
from iobench.loaders._torch import TorchLoader

LARGE_SAMPLE = 256 * 1024  # bytes; above this, out-of-order samples are read one by one


def _h5py() -> Any:
    import h5py

    return h5py


def open_h5(path: Any, library_cache: bool) -> Any:
    """An h5py File opened read-only without file locking (shared filesystems).

    Without `library_cache`, HDF5 keeps no raw data of its own: the chunk
    cache (HDF5 2.0's default: 8 MiB per dataset) and the sieve buffer (64 KiB
    per file) are set to 0, so a file held open across epochs by a persistent worker
    cannot serve a cold epoch from memory.
    """
    h5py = _h5py()
    if library_cache:
        return h5py.File(path, "r", locking=False)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)
    mdc, nslots, _, w0 = fapl.get_cache()
    fapl.set_cache(mdc, nslots, 0, w0)
    fapl.set_sieve_buf_size(0)
    fapl.set_file_locking(False, True)
    return h5py.File(h5py.h5f.open(os.fsencode(str(path)), h5py.h5f.ACC_RDONLY, fapl=fapl))


def stored_sizes(ds: Any, n: int) -> np.ndarray:
    """Stored bytes of each of the n samples of h5py dataset `ds`: chunk sizes when filtered."""
    raw = int(np.prod(ds.shape[1:])) * ds.dtype.itemsize
    if ds.chunks is None or not (ds.compression or ds.id.get_create_plist().get_nfilters()):
        return np.full(n, raw, dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64)
    rows = ds.chunks[0]

    def visit(info: Any) -> None:
        first = info.chunk_offset[0]
        sizes[first:first + rows] += info.size // max(1, min(rows, n - first))

    try:
        ds.id.chunk_iter(visit)
    except (AttributeError, RuntimeError):  # HDF5 < 1.14: one query per chunk
        for i in range(ds.id.get_num_chunks()):
            visit(ds.id.get_chunk_info(i))
    return sizes


class HDF5Reader(ContainerReader):
    """Reads batches from iobench HDF5 files."""

    format = "hdf5"

    def _open(self, pos: int, path: Path, n: int) -> OpenFile:
        try:
            h = open_h5(path, self.library_cache)
        except (OSError, ValueError) as e:
            raise self.fail(path, "HDF5 cannot open it", e) from None
        offsets = None
        with self.closed_on_error(h, path, "HDF5", "dataset", (OSError,)):
            labels = h[self.label_key][...]
            if self.kind == "jpeg":
                offsets = h["offsets"][...].astype(np.int64)
                ds = h["jpeg"]
                self.check_container(path, n, labels, offsets, ds.shape[0])
                stored, item = np.diff(offsets), 1
            else:
                ds = h[self.data_key]
                self.check_container(path, n, labels, shape=ds.shape, dtype=ds.dtype)
                stored = stored_sizes(ds, n)
                item = int(np.prod(self.array_shape)) * self.sample_dtype.itemsize
            base = ds.id.get_offset()
        return self.opened(path, h, ds, labels, stored, base, item, offsets)

    def warm_up(self) -> None:
        _h5py()

    def user_cache(self) -> dict[str, Any]:
        h5py = _h5py()
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        chunk, sieve = fapl.get_cache()[2], fapl.get_sieve_buf_size()
        if not self.library_cache:
            chunk = sieve = 0
        return {"hdf5_chunk_cache_bytes": chunk, "hdf5_sieve_buffer_bytes": sieve}

    def _read_sorted_arrays(self, sorted_idx: np.ndarray, order: np.ndarray,
                            out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels, stored, groups = file_groups(self, sorted_idx)
        rows = out.reshape(len(out), -1).view(np.uint8)
        for pos, s, e, f, local in groups:
            ds = f.data
            dest_pos = order[s:e]
            if f.fd is not None and f.base is not None:
                # contiguous and unfiltered: the samples' bytes lie at the offset HDF5
                # reports; one preadv per run of consecutive samples scatters them straight
                # into their rows of the batch (no selection machinery, no temporary)
                for a, b in contiguous_runs(local):
                    views = [memoryview(rows[d]) for d in dest_pos[a:b].tolist()]
                    try:
                        preadv_into(f.fd, views, f.base + int(local[a]) * f.item)
                    except OSError as err:
                        raise self.fail(self.paths[pos], "read failed", err) from None
                continue
            direct = bool(np.all(np.diff(dest_pos) == 1))
            if not direct and out[0].nbytes >= LARGE_SAMPLE:
                # big samples: one read each straight into place beats a read plus a copy
                for k in range(e - s):
                    self._read_into(ds, pos, local[k:k + 1], out[int(dest_pos[k]):
                                                                  int(dest_pos[k]) + 1])
                continue
            dest = out[int(dest_pos[0]):int(dest_pos[0]) + (e - s)] if direct else \
                np.empty((e - s, *out.shape[1:]), dtype=out.dtype)
            self._read_into(ds, pos, local, dest)
            if not direct:
                out[dest_pos] = dest
        return labels, stored

    def _read_into(self, ds: Any, pos: int, local: np.ndarray, dest: np.ndarray) -> None:
        """One H5Dread of the sorted file-local samples `local` (a union of runs) into `dest`."""
        h5s = _h5py().h5s
        fspace = ds.id.get_space()
        tail = tuple(ds.shape[1:])
        zeros = (0,) * len(tail)
        op = h5s.SELECT_SET
        for a, b in contiguous_runs(local):
            fspace.select_hyperslab((int(local[a]), *zeros), (b - a, *tail), op=op)
            op = h5s.SELECT_OR
        try:
            ds.id.read(h5s.create_simple(dest.shape), fspace, dest)
        except OSError as err:
            raise self.fail(self.paths[pos], "HDF5 read failed", err) from None

    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[Any], np.ndarray, np.ndarray]:
        return read_jpeg_runs(self, sorted_idx, self._read_span)

    def _read_span(self, pos: int, f: OpenFile, lo: int, hi: int) -> np.ndarray:
        buf = np.empty(hi - lo, dtype=np.uint8)
        try:
            f.data.read_direct(buf, np.s_[lo:hi])
        except OSError as err:
            raise self.fail(self.paths[pos], "HDF5 read failed", err) from None
        return buf


class HDF5Loader(TorchLoader):
    """PyTorch DataLoader over HDF5 files (h5py)."""

    name = "hdf5"
    reader_cls = HDF5Reader
