"""NPZ loader: one `.npz` per sample (members `x`, `y`), one scatter read each, PyTorch
DataLoader.

Layout (docs/design.md): `train/<index:08d>.npz`, an uncompressed zip of `x.npy`
(the sample, or a JPEG's bytes) and `y.npy` (its label). A batch's files are all
opened and handed to the kernel to fetch (`posix_fadvise(WILLNEED)`) before the
first is read. Every file of an array dataset lays its members out at the same
offsets (only the zip CRCs and the values differ), so after parsing the first
file once per process, each file is one `preadv` that scatters its zip and
`.npy` headers into a small buffer, the sample straight into its row of the
batch array and the label into the batch's labels; the headers are compared
with the first file's (CRC fields aside). A file laid out otherwise (another
writer, compressed members) is read whole and parsed by `numpy.load`. JPEG
samples are read whole (one read) and sliced. A dataset whose samples vary in
their first axis (unet3d's MLPerf size spread: the manifest's
`layout.variable_depth`) is read whole, file by file (every stored byte comes
from storage, as MLPerf's reader loads each whole .npz), and each sample is
cropped or zero-padded to the fixed patch `sample.shape` (its first slices),
as MLPerf's unet3d crops fixed-size patches, so that a batch stacks.

`payload_bytes`: each sample file's size.
"""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from iobench.core.manifest import CONTAINMENT_FILES, Manifest
from iobench.loaders._reader import (
    BatchReader,
    one_file_per_sample_sizes,
    preadv_into,
    read_each_file,
)
from iobench.loaders._torch import TorchLoader

_LOCAL = b"PK\x03\x04"
_CRC = slice(14, 18)  # a zip local header's CRC-32: the one field that differs per file


@dataclass(frozen=True)
class _Member:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    header_at: int  # its zip local header's offset in the file
    data_at: int  # its array bytes' offset in the file
    nbytes: int


def _member(buf: bytes | memoryview, at: int) -> _Member:
    """The STORED `.npy` member whose zip local header starts at `at` in `buf`; ValueError
    when it is not one (compressed, a data descriptor, not a zip entry)."""
    head = bytes(buf[at:at + 30])
    if len(head) < 30 or head[:4] != _LOCAL:
        raise ValueError(f"no zip entry at byte {at}")
    flags, method = int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
    if method != zipfile.ZIP_STORED or flags & 0x08:
        raise ValueError(f"member at byte {at} is compressed or streamed (method {method})")
    nlen, xlen = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
    name = bytes(buf[at + 30:at + 30 + nlen]).decode("utf-8", "replace")
    npy_at = at + 30 + nlen + xlen
    f = io.BytesIO(bytes(buf[npy_at:npy_at + 65536]))
    version = np.lib.format.read_magic(f)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read(f)
    if fortran or dtype.hasobject:
        raise ValueError(f"{name} is Fortran-ordered or holds objects")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return _Member(name.removesuffix(".npy"), dtype, tuple(shape), at, npy_at + f.tell(), nbytes)


@dataclass(frozen=True)
class _Layout:
    """Where x and y lie in every file of an array dataset (from its first file)."""

    head: bytes  # bytes [0, x.data_at) of the first file
    tail: bytes  # bytes [x end, y end) of the first file
    y_crc: slice  # y's CRC-32 within `tail`
    label_at: int  # the label's offset within `tail`
    file_bytes: int  # the first file's size: a file of another size is laid out otherwise


class NPZReader(BatchReader):
    """Reads batches of one-`.npz`-per-sample datasets."""

    format = "npz"

    def __init__(self, manifest: Manifest, library_cache: bool = False) -> None:
        super().__init__(manifest, library_cache)
        self.sizes: Any = one_file_per_sample_sizes(manifest, self.files, self.starts)
        self.label_nbytes = int(np.prod(self.label_shape)) * self.label_dtype.itemsize
        self._open_flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (
            os.O_NOFOLLOW if len(self.files) > CONTAINMENT_FILES else 0)
        self._layout: _Layout | None = None
        self.variable_depth = "variable_depth" in manifest.layout and self.kind == "array"

    # -- one file, any layout numpy reads ----------------------------------------------------
    # `size`: file i's size, from the batch's sizes (read once a batch: a compact
    # manifest's are table rows); its path is looked up only to name it in an error
    def _whole(self, i: int, fd: int, size: int) -> bytes:
        data = os.pread(fd, size + 1, 0)
        if len(data) != size:
            raise self.fail(self.paths[i], f"has {len(data)} bytes, the manifest records "
                                           f"{size}")
        return data

    def _members(self, i: int, data: bytes) -> tuple[Any, np.ndarray]:
        """(x, y) of file i's bytes: sliced when STORED, else through `numpy.load`."""
        try:
            x = _member(data, 0)
            y = _member(data, x.data_at + x.nbytes)
            if (x.name, y.name) != ("x", "y"):
                raise ValueError(f"members {x.name}, {y.name}")
            xv = np.frombuffer(data, x.dtype, int(np.prod(x.shape)), x.data_at).reshape(x.shape)
            yv = np.frombuffer(data, y.dtype, int(np.prod(y.shape)), y.data_at).reshape(y.shape)
        except ValueError:
            try:
                with np.load(io.BytesIO(data), allow_pickle=False) as z:
                    xv, yv = z["x"], z["y"]
            except Exception as e:  # zipfile and numpy raise many kinds for damaged files
                raise self.fail(self.paths[i], "not a readable .npz with members x and y",
                                e) from None
        if yv.shape != self.label_shape:
            raise self.fail(self.paths[i], f"y has shape {yv.shape}, expected {self.label_shape}")
        return xv, yv

    def _check_x(self, i: int, x: np.ndarray) -> None:
        if self.kind == "jpeg":
            if x.ndim != 1 or x.dtype != np.uint8:
                raise self.fail(self.paths[i], f"x is {x.dtype}{list(x.shape)}, expected "
                                               "JPEG bytes (uint8)")
        elif self.variable_depth and self.sample_shape is not None:
            if x.ndim != len(self.sample_shape) or x.shape[1:] != self.sample_shape[1:] \
                    or x.dtype != self.sample_dtype or x.shape[0] < 1:
                raise self.fail(self.paths[i], f"x is {x.dtype}{list(x.shape)}, expected "
                                               f"{self.sample_dtype}[depth, "
                                               f"{', '.join(map(str, self.sample_shape[1:]))}]")
        elif x.shape != self.sample_shape or x.dtype != self.sample_dtype:
            raise self.fail(self.paths[i], f"x is {x.dtype}{list(x.shape)}, expected "
                                           f"{self.sample_dtype}{list(self.sample_shape or ())}")

    # -- array datasets: one scatter read per file ------------------------------------------
    def _layout_of(self, data: bytes) -> _Layout | None:
        """The layout of a file's bytes, or None when it is not the STORED kind."""
        try:
            x = _member(data, 0)
            y = _member(data, x.data_at + x.nbytes)
        except ValueError:
            return None
        if (x.name, y.name) != ("x", "y") or x.shape != self.sample_shape \
                or x.dtype != self.sample_dtype or y.nbytes != self.label_nbytes:
            return None
        end = x.data_at + x.nbytes
        return _Layout(data[:x.data_at], data[end:y.data_at + y.nbytes],
                       slice(y.header_at - end + _CRC.start, y.header_at - end + _CRC.stop),
                       y.data_at - end, len(data))

    def _read_patch(self, i: int, dest: np.ndarray, label: np.ndarray, fd: int,
                    size: int) -> None:
        """A variable-depth sample, read whole, into `dest`: its first slices, zeros below."""
        x, y = self._members(i, self._whole(i, fd, size))
        self._check_x(i, x)
        d = min(len(x), len(dest))
        dest[:d] = x[:d]
        dest[d:] = 0
        label[...] = y

    def _read_array(self, i: int, dest: np.ndarray, label: np.ndarray, fd: int,
                    size: int) -> None:
        if self.variable_depth:
            self._read_patch(i, dest, label, fd, size)
            return
        lay, data = self._layout, None
        if lay is None:  # the first file this process reads: learn the layout from it
            data = self._whole(i, fd, size)
            self._layout = self._layout_of(data)
        elif size == lay.file_bytes:  # (a compressed or rewritten file has another size)
            head, tail = bytearray(len(lay.head)), bytearray(len(lay.tail))
            try:
                preadv_into(fd, [memoryview(head), dest.data.cast("B"),
                                 memoryview(tail)], 0)
            except OSError as e:
                raise self.fail(self.paths[i], "read failed", e) from None
            for got, want in ((head, lay.head), (tail, lay.tail)):
                crc = _CRC if got is head else lay.y_crc
                got[crc] = want[crc]
            if head == lay.head and tail[:lay.label_at] == lay.tail[:lay.label_at] \
                    and len(tail) - lay.label_at == self.label_nbytes:
                label[...] = np.frombuffer(bytes(tail[lay.label_at:]), self.label_dtype
                                           ).reshape(self.label_shape)
                return
        # laid out otherwise: read it whole, let numpy parse it
        x, y = self._members(i, data if data is not None else self._whole(i, fd, size))
        self._check_x(i, x)
        dest[...] = x
        label[...] = y

    def _read_sorted_arrays(self, sorted_idx: np.ndarray, order: np.ndarray,
                            out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels = np.empty((len(sorted_idx), *self.label_shape), dtype=self.label_dtype)
        sizes = np.asarray(self.sizes[sorted_idx], dtype=np.int64)  # one read a batch
        size = sizes.tolist()
        read_each_file(self, sorted_idx, self._open_flags,
                       lambda k, i, fd: self._read_array(
                           i, out[order[k]], labels[k:k + 1].reshape(self.label_shape), fd,
                           size[k]))
        return labels, sizes

    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[Any], np.ndarray, np.ndarray]:
        parts: list[Any] = [None] * len(sorted_idx)
        labels = np.empty((len(sorted_idx), *self.label_shape), dtype=self.label_dtype)
        sizes = np.asarray(self.sizes[sorted_idx], dtype=np.int64)
        size = sizes.tolist()

        def one(k: int, i: int, fd: int) -> None:
            x, y = self._members(i, self._whole(i, fd, size[k]))
            self._check_x(i, x)
            parts[k], labels[k] = memoryview(x), y

        read_each_file(self, sorted_idx, self._open_flags, one)
        return parts, labels, sizes


class NPZLoader(TorchLoader):
    """PyTorch DataLoader over a tree of one `.npz` per sample."""

    name = "npz"
    reader_cls = NPZReader
