"""The per-format batch reader contract and the batch-level helpers every reader shares.

A `BatchReader` turns one batch of global sample indices into the stored
samples and labels, in batch order. Readers sort the indices, merge
contiguous runs, read one request per run where the format allows, and
restore batch order at the end. File handles are opened lazily in whichever
process and thread reads (after a DataLoader fork, in each pool thread), and
never cross a fork.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from iobench.core import sampling
from iobench.core.errors import DatasetError
from iobench.core.manifest import (
    DataColumn,
    DataPaths,
    FileEntry,
    Manifest,
    bad_label,
    refuse_irregular,
)

Alloc = Callable[[tuple[int, ...], Any], np.ndarray]  # (shape, dtype) -> array to fill


class RawBatch(NamedTuple):
    """Stored samples of one batch, in batch order.

    samples: [B, *sample_shape] array, or for JPEG all images' bytes back to
      back (uint8, 1-D) with `offsets` ([B+1] int64).
    labels: [B, *label_shape] in the label dtype.
    stored_bytes: int64 [B], bytes each sample took from storage (encoded or
      compressed bytes where the format stores them so).
    """

    samples: np.ndarray
    labels: np.ndarray
    stored_bytes: np.ndarray
    offsets: np.ndarray | None = None


@dataclass(frozen=True)
class OpenFile:
    """One data file opened for reading by one process and thread (HDF5, NetCDF).

    handle: the library's open file, closed with the reader. data: its samples'
      (or JPEG bytes') dataset or variable. labels, stored: per sample of the
      file, its label and the bytes it takes in storage. base: file offset of
      the data when stored contiguous and unfiltered (else None), `item` bytes
      per sample there; offsets: [n + 1] JPEG byte offsets (JPEG datasets).
      fd: a plain descriptor for prefetch advice and direct reads (None when
      `base` is None).
    """

    handle: Any
    data: Any
    labels: np.ndarray
    stored: np.ndarray
    base: int | None
    item: int
    offsets: np.ndarray | None = None
    fd: int | None = None


class FileOpener(Protocol):
    """A reader whose data files open as `OpenFile`s (what the batch helpers below need)."""

    kind: str
    starts: np.ndarray
    counts: np.ndarray
    label_shape: tuple[int, ...]
    label_dtype: np.dtype
    prefetch_block: int | None

    def open_file(self, pos: int) -> OpenFile: ...

    def file_of(self, sorted_idx: np.ndarray) -> np.ndarray: ...


def contiguous_runs(sorted_idx: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs [start, stop) of consecutive positions in a sorted index array.

    Positions index into `sorted_idx`; a run covers sample indices
    sorted_idx[start] .. sorted_idx[stop - 1], which are consecutive integers.
    """
    if len(sorted_idx) == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_idx) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(sorted_idx)]))
    return list(zip(starts.tolist(), stops.tolist(), strict=True))


def willneed(fd: int, ranges: list[tuple[int, int]]) -> None:
    """Tell the kernel to start fetching each (offset, length) byte range of `fd` now.

    Issued for a whole batch before the first read, so its I/O is in flight
    together (queue depth) instead of one synchronous request at a time.
    """
    for off, length in ranges:
        if length > 0:
            os.posix_fadvise(fd, off, length, os.POSIX_FADV_WILLNEED)


_IOV_MAX = 512  # buffers per preadv call (Linux allows 1024)


def preadv_into(fd: int, views: list[memoryview], offset: int) -> None:
    """Fill each writable buffer in turn from `fd` at `offset` on (scatter read), whole.

    OSError(EIO) when the file ends first (a truncated file).
    """
    for s in range(0, len(views), _IOV_MAX):
        bufs = [v.cast("B") for v in views[s:s + _IOV_MAX]]
        want = sum(len(b) for b in bufs)
        while want:
            got = os.preadv(fd, bufs, offset)
            if got == 0:
                raise OSError(5, f"file ends at {offset}, {want} bytes short")
            offset += got
            want -= got
            while bufs and got >= len(bufs[0]):  # drop the filled buffers
                got -= len(bufs[0])
                bufs.pop(0)
            if got:
                bufs[0] = bufs[0][got:]


_PAGE = os.sysconf("SC_PAGE_SIZE")
_MADV_WILLNEED, _MADV_DONTNEED = 3, 4
_madvise: Any = None


def _advise_pages(views: list[Any], advice: int) -> None:
    global _madvise
    if _madvise is None:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise = libc.madvise
    for v in views:
        n = len(v)
        if n < _PAGE:
            continue  # a small value's page came in with its lookup
        addr = np.frombuffer(v, dtype=np.uint8).ctypes.data
        start = addr - addr % _PAGE
        _madvise(start, addr + n - start, advice)  # advice only: errors are harmless


def madvise_willneed(views: list[Any]) -> None:
    """`madvise(MADV_WILLNEED)` the pages under each buffer (e.g. LMDB values in its map)."""
    _advise_pages(views, _MADV_WILLNEED)


def file_mappings(path: str | Path) -> list[tuple[int, int]]:
    """(start, end) addresses of this process's shared mappings of `path` (/proc/self/maps)."""
    target = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == target and parts[1][3] == "s":
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return out


def unmap_pages(ranges: list[tuple[int, int]]) -> None:
    """`madvise(MADV_DONTNEED)` over shared file mappings found by `file_mappings` (only!).

    The data stays in the page cache and is refaulted when touched again, but
    pages no process maps can be evicted, so a cold-cache epoch can follow.
    On private or anonymous memory DONTNEED would discard the contents: never
    pass other ranges.
    """
    global _madvise
    if _madvise is None:
        _advise_pages([], _MADV_WILLNEED)  # loads libc's madvise
    for lo, hi in ranges:
        _madvise(lo, hi - lo, _MADV_DONTNEED)


def check_files(manifest: Manifest, entries: tuple[FileEntry, ...] | None = None) -> None:
    """Each file exists and has the size the manifest records; else a DatasetError naming it."""
    for f in manifest.files if entries is None else entries:
        path = manifest.path_of(f)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise DatasetError(f"{path} is missing: the dataset at {manifest.root} is incomplete; "
                               "regenerate it (iobench generate) or re-stage it") from None
        if not stat.S_ISREG(st.st_mode):
            refuse_irregular(path)
        size = st.st_size
        if size != f.bytes:
            raise DatasetError(f"{path} has {size} bytes but the manifest records {f.bytes}: "
                               "the file is truncated or was changed; regenerate or re-stage it")


OPEN_AT_ONCE = 128  # one-file-per-sample readers: files open at a time (under the 1024 fd limit)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def open_batch(paths: Sequence[str | Path], flags: int,
               fail: Callable[[str | Path, str, BaseException | None], DatasetError]
               ) -> list[int]:
    """Open a batch's one-sample files and start fetching them all (posix_fadvise
    WILLNEED), so their I/O overlaps; `fail(path, what, err)` builds the error that names
    a file that cannot be opened (all opened ones are closed first)."""
    fds: list[int] = []
    path: str | Path = Path()
    try:
        for path in paths:
            # O_NONBLOCK (in flags): a FIFO in the tree opens at once (and `fail` names it)
            # instead of waiting for a writer forever
            fd = os.open(path, flags)
            fds.append(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except FileNotFoundError:
        close_all(fds)
        raise fail(path, "file is missing", None) from None
    except OSError as e:
        close_all(fds)
        raise fail(path, "cannot open it", e) from None
    return fds


def read_each_file(reader: BatchReader, sorted_idx: np.ndarray, flags: int,
                   read_one: Callable[[int, int, int], None]) -> None:
    """`read_one(k, index, fd)` for each sample `index = sorted_idx[k]` of a one-file-per-
    sample dataset, OPEN_AT_ONCE files opened (and prefetched together) at a time."""
    if len(sorted_idx) and (sorted_idx[0] < 0 or sorted_idx[-1] >= reader.manifest.num_samples):
        raise DatasetError(f"sample index out of range [0, {reader.manifest.num_samples})")
    paths = reader.paths
    for c in range(0, len(sorted_idx), OPEN_AT_ONCE):
        chunk = sorted_idx[c:c + OPEN_AT_ONCE].tolist()
        # a compact manifest's paths: the chunk's folders in one read, not one per file
        fds = open_batch(paths.at(sorted_idx[c:c + OPEN_AT_ONCE])
                         if isinstance(paths, DataPaths) else [paths[i] for i in chunk],
                         flags, reader.fail)
        try:
            for k, (i, fd) in enumerate(zip(chunk, fds, strict=True)):
                read_one(c + k, i, fd)
        finally:
            close_all(fds)


def one_file_per_sample_sizes(manifest: Manifest, files: Sequence[FileEntry],
                              starts: Any) -> Any:
    """Each sample's file size (a column read on demand for a compact manifest), after a
    DatasetError unless the manifest lists one data file per sample, in order."""
    n = manifest.num_samples
    t = manifest.compact
    if (t.samples_per_file != 1 or t.num_files != n) if t is not None else (
            len(files) != n or not np.array_equal(starts, np.arange(n))):
        raise DatasetError(f"manifest of {manifest.root} lists {len(files)} sample files "
                           f"for {n} samples; expected one file per sample: regenerate it")
    return (DataColumn(t, "bytes") if t is not None
            else np.array([f.bytes for f in files], dtype=np.int64))


class EpochOrder:
    """This rank's sample order per epoch, as `Loader.indices` (picklable, holds no loader)."""

    def __init__(self, loader: Any) -> None:
        c, m = loader.config, loader.manifest
        self.args = (m.num_samples, c.shuffle, c.seed)
        self.kw = {"rank": loader.rank, "world": loader.world, "block_size": c.block_size,
                   "window": c.shuffle_window, "scope": c.scope,
                   # local scope only: no per-file list for the global one
                   "file_ranges": (sampling.FileRanges.of(m) if c.scope == "local"
                                   else None)}
        self._cache: tuple[int, np.ndarray] | None = None

    def __call__(self, epoch: int, start: int = 0) -> np.ndarray:
        """The epoch's order without its first `start` samples (a view of the cached one);
        `start` as `Loader.start_sample` checked it."""
        if self._cache is None or self._cache[0] != epoch:
            n, mode, seed = self.args
            kw = dict(self.kw)
            idx = sampling.rank_indices(n, mode, seed, epoch, kw.pop("rank"), kw.pop("world"),
                                        kw.pop("block_size"), kw.pop("window"), **kw)
            self._cache = (epoch, idx)
        return self._cache[1][start:]


class BatchReader(ABC):
    """Reads batches of one dataset; picklable, opens its files lazily per process and thread."""

    format: str = ""

    def __init__(self, manifest: Manifest, library_cache: bool = False) -> None:
        if manifest.root is None:
            raise DatasetError("manifest has no root directory; load it with Manifest.load()")
        if manifest.format != self.format:
            raise DatasetError(f"{manifest.root} is a {manifest.format!r} dataset; the "
                               f"{self.format!r} reader cannot read it")
        self.manifest = manifest
        self.root: Path = manifest.root  # checked above: the folder it was loaded from
        self.kind: str = manifest.sample["kind"]
        shape = manifest.sample.get("shape")
        self.sample_shape: tuple[int, ...] | None = tuple(shape) if shape is not None else None
        self.sample_dtype = np.dtype(manifest.sample["dtype"])
        self.label_shape: tuple[int, ...] = tuple(manifest.label["shape"])
        self.label_dtype = np.dtype(manifest.label["dtype"])
        # the arrays' names in container formats (HDF5, NetCDF): iobench's own, or those
        # of the user's data (`--data`, iobench/core/userdata.py)
        self.data_key: str = manifest.layout.get("data_key", "samples")
        self.label_key: str = manifest.layout.get("label_key", "labels")
        data = manifest.data_files
        self.files: Sequence[FileEntry] = data
        self.paths: Sequence[Path]
        t = manifest.compact
        if t is not None:  # millions of files: positions map to paths and counts on demand
            self.paths = DataPaths(manifest.root, t)
            self.starts: Any = DataColumn(t, "starts")
            self.counts: Any = DataColumn(t, "counts")
        else:
            self.paths = [manifest.path_of(f) for f in data]
            self.starts = np.array([f.first_sample for f in data], dtype=np.int64)
            self.counts = np.array([f.num_samples for f in data], dtype=np.int64)
        self._local = threading.local()
        self._pid = os.getpid()
        self.prefetch_block: int | None = None  # samples per block to prefetch whole
        # False (cold runs): the format library keeps no data cache of its own between reads
        self.library_cache = library_cache

    @property
    def array_shape(self) -> tuple[int, ...]:
        """`sample_shape` of array samples (JPEG samples have none: asking is a bug)."""
        assert self.sample_shape is not None, f"{self.manifest.root} holds JPEG samples"
        return self.sample_shape

    def warm_up(self) -> None:  # noqa: B027 - optional hook
        """Import what reading needs, in the process that will read (no data is read)."""

    def user_cache(self) -> dict[str, Any]:
        """The user-space data caches this reader runs with, for the result file."""
        return {}

    # -- lazily opened per-process, per-thread state ---------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d.pop("_local")
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._local = threading.local()

    def _state(self) -> dict[Any, Any]:
        """This thread's open handles (keyed as each reader likes: file positions, names);
        dropped (not reused) in a forked child."""
        if self._pid != os.getpid():  # forked: inherited handles belong to the parent
            self._local = threading.local()
            self._pid = os.getpid()
        st = getattr(self._local, "state", None)
        if st is None:
            st = self._local.state = {}
        return st

    def close(self) -> None:
        """Close this thread's handles (other threads' close when they are collected)."""
        st = getattr(self._local, "state", None)
        if st and self._pid == os.getpid():
            self._close_state(st)
        self._local = threading.local()

    def _close_state(self, state: dict[Any, Any]) -> None:  # noqa: B027 - optional hook
        """Close the handles in `state`."""

    # -- reading -----------------------------------------------------------------------------
    def file_of(self, sorted_idx: np.ndarray) -> np.ndarray:
        """Position in `self.files` of the data file holding each index."""
        t = self.manifest.compact
        pos = (sorted_idx // t.samples_per_file if t is not None
               else np.searchsorted(self.starts, sorted_idx, side="right") - 1)
        if len(sorted_idx) and (sorted_idx[0] < 0 or sorted_idx[-1] >= self.manifest.num_samples):
            raise DatasetError(f"sample index out of range [0, {self.manifest.num_samples}) "
                               f"for {self.manifest.root}")
        return pos

    def where(self, index: int) -> str:
        """The file that holds sample `index` (for error messages)."""
        return str(self.paths[int(self.file_of(np.array([index], dtype=np.int64))[0])])

    def label_file(self, index: int) -> str:
        """The file that holds sample `index`'s label (for error messages)."""
        return self.where(index)

    def read(self, indices: np.ndarray, alloc: Alloc | None = None) -> RawBatch:
        """Stored samples and labels of `indices` (int64, any order), in that order.

        `alloc(shape, dtype)` gives the array the samples are read into (a
        reusable batch buffer); default: a new one.
        """
        alloc = alloc or np.empty
        indices = np.asarray(indices, dtype=np.int64)
        order = np.argsort(indices, kind="stable")
        sorted_idx = indices[order]
        inv = np.empty_like(order)
        inv[order] = np.arange(len(order))
        if self.kind == "jpeg":
            parts, labels, nbytes = self._read_sorted_bytes(sorted_idx)
            self._check_labels(sorted_idx, labels)
            lengths = np.array([len(p) for p in parts], dtype=np.int64)[inv]
            offsets = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            data = alloc((int(offsets[-1]),), np.uint8)
            for k, p in zip(order.tolist(), parts, strict=True):  # sorted j -> batch order[j]
                data[offsets[k]:offsets[k + 1]] = np.frombuffer(p, dtype=np.uint8)
            return RawBatch(data, labels[inv], nbytes[inv], offsets)
        out = alloc((len(indices), *self.array_shape), self.sample_dtype)
        labels, nbytes = self._read_sorted_arrays(sorted_idx, order, out)
        self._check_labels(sorted_idx, labels)
        return RawBatch(out, labels[inv], nbytes[inv])

    def _check_labels(self, sorted_idx: np.ndarray, labels: np.ndarray) -> None:
        """Class labels outside 0..num_classes-1 are a damaged file, named here: a model's
        loss would otherwise fail on them mid-run (two comparisons per batch)."""
        j = bad_label(labels, self.manifest.num_classes)
        if j is not None:
            i = int(sorted_idx[j])
            raise DatasetError(f"sample {i} in {self.label_file(i)} has label {labels[j]}, "
                               f"outside 0..{self.manifest.num_classes - 1} of "
                               f"{self.manifest.dataset}; the file is damaged or was changed: "
                               "regenerate or re-stage it")

    @abstractmethod
    def _read_sorted_arrays(self, sorted_idx: np.ndarray, order: np.ndarray,
                            out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fill out[order[k]] with sample sorted_idx[k]; return (labels, stored_bytes) in sorted order."""

    @abstractmethod
    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        """Encoded samples of sorted_idx as bytes, with labels and stored bytes, in sorted order."""

    def fail(self, path: str | Path, what: str, err: BaseException | None = None) -> DatasetError:
        """A DatasetError naming `path`, for a file that cannot be read as expected."""
        refuse_irregular(path)  # a FIFO, socket or device: say so rather than "damaged"
        detail = f" ({err})" if err is not None else ""
        return DatasetError(f"cannot read {path}: {what}{detail}; the file is damaged or not a "
                            f"{self.format} file written by iobench: regenerate or re-stage it")

    @contextlib.contextmanager
    def closed_on_error(self, handle: Any, path: str | Path, library: str, what: str,
                        errors: tuple[type[BaseException], ...]) -> Iterator[None]:
        """Run a container's checks on an open `handle`; on any error close it, and turn a
        missing key (a KeyError) or the library's `errors` into one line naming `path`."""
        try:
            yield
        except KeyError as e:
            handle.close()
            raise self.fail(path, f"missing {what} {e}") from None
        except errors as e:
            handle.close()
            raise self.fail(path, f"{library} read failed", e) from None
        except BaseException:
            handle.close()
            raise

    def check_container(self, path: str | Path, n: int, labels: np.ndarray,
                        offsets: np.ndarray | None = None, blob_bytes: int = 0,
                        shape: tuple[int, ...] = (), dtype: Any = None) -> None:
        """What a container file (HDF5, NetCDF) holds against what the manifest says of its
        `n` samples: the labels' shape, and either the JPEG `offsets` tiling `blob_bytes`
        or the samples' `shape` and `dtype`."""
        if labels.shape != (n, *self.label_shape):
            raise self.fail(path, f"labels have shape {labels.shape}, expected "
                                  f"{(n, *self.label_shape)}")
        if offsets is not None:
            if offsets.shape != (n + 1,) or offsets[-1] != blob_bytes:
                raise self.fail(path, "JPEG offsets do not match the stored JPEG bytes")
        elif shape != (n, *self.array_shape) or dtype != self.sample_dtype:
            raise self.fail(path, f"samples are {dtype}{list(shape)}, expected "
                                  f"{self.sample_dtype}{[n, *self.array_shape]}")


class ContainerReader(BatchReader):
    """A reader of container files (HDF5, NetCDF): each data file opened and checked once
    per process and thread (`_open`), held as an `OpenFile`, closed with the reader."""

    def open_file(self, pos: int) -> OpenFile:
        """File `pos`, opened once per process and thread."""
        st = self._state()
        f: OpenFile | None = st.get(pos)
        if f is None:
            f = st[pos] = self._open(pos, self.paths[pos], int(self.counts[pos]))
        return f

    @abstractmethod
    def _open(self, pos: int, path: Path, n: int) -> OpenFile:
        """Open file `pos` (at `path`, holding `n` samples) and check it against the
        manifest (`opened` makes the result)."""

    def opened(self, path: Path, handle: Any, data: Any, labels: np.ndarray,
               stored: np.ndarray, base: int | None, item: int,
               offsets: np.ndarray | None) -> OpenFile:
        """The `OpenFile` of a checked container file: its labels in the manifest's dtype,
        and, when its data lies contiguous and unfiltered at file offset `base`, a plain
        descriptor, with which a whole batch's byte ranges are prefetched (posix_fadvise
        WILLNEED) before reading."""
        fd = os.open(path, os.O_RDONLY) if base is not None else None
        return OpenFile(handle, data, labels.astype(self.label_dtype, copy=False), stored,
                        base, item, offsets, fd)

    def _close_state(self, state: dict[Any, Any]) -> None:
        for f in state.values():
            f.handle.close()
            if f.fd is not None:
                os.close(f.fd)


BLOCK_PREFETCH_MAX = 64 << 20  # bytes: larger blocks are prefetched sample by sample


def advise_batch(reader: FileOpener, groups: list[tuple[int, int, int]],
                 sorted_idx: np.ndarray) -> None:
    """Prefetch every run of a batch at once (files whose `OpenFile.fd` is set: contiguous
    data at a known offset).

    With `reader.prefetch_block = K` (set for `shuffle="block"`), whole blocks of K
    samples around each index are prefetched: the block shuffle reads each block
    completely within a few batches, so one large request replaces many small ones
    (blocks over BLOCK_PREFETCH_MAX bytes are not: their samples are large already).
    """
    block = reader.prefetch_block
    for pos, s, e in groups:
        f = reader.open_file(pos)
        if f.fd is None:
            continue
        first, count = int(reader.starts[pos]), int(reader.counts[pos])
        local = sorted_idx[s:e] - first
        spans: Iterable[tuple[int, int]]
        if block:
            b = np.unique(sorted_idx[s:e] // block)
            spans = zip((np.maximum(b * block, first) - first).tolist(),
                        (np.minimum((b + 1) * block, first + count) - first).tolist(),
                        strict=True)
        else:
            spans = ((int(local[a]), int(local[b - 1]) + 1) for a, b in contiguous_runs(local))
        ranges = _byte_ranges(f, reader.kind, spans)
        if block and max((n for _, n in ranges), default=0) > BLOCK_PREFETCH_MAX:
            # blocks of big samples: a block would flood the page cache; the samples
            # themselves are large requests already
            ranges = _byte_ranges(f, reader.kind, ((int(local[a]), int(local[b - 1]) + 1)
                                                    for a, b in contiguous_runs(local)))
        willneed(f.fd, ranges)


def file_groups(reader: FileOpener, sorted_idx: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int, OpenFile, np.ndarray]]]:
    """Split a sorted batch by data file and prefetch all of it at once.

    Returns the batch's labels, its stored bytes per sample, and per file
    touched: (file position, start, stop, its `OpenFile`, file-local sorted indices).
    """
    labels = np.empty((len(sorted_idx), *reader.label_shape), dtype=reader.label_dtype)
    stored = np.empty(len(sorted_idx), dtype=np.int64)
    groups = split_by_file(reader, sorted_idx)
    advise_batch(reader, groups, sorted_idx)
    out = []
    for pos, s, e in groups:
        f = reader.open_file(pos)
        local = sorted_idx[s:e] - reader.starts[pos]
        labels[s:e] = f.labels[local]
        stored[s:e] = f.stored[local]
        out.append((pos, s, e, f, local))
    return labels, stored, out


def read_jpeg_runs(reader: FileOpener, sorted_idx: np.ndarray,
                   read_span: Callable[[int, OpenFile, int, int], np.ndarray]
                   ) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """JPEG bytes of a sorted batch, one read per contiguous run of samples.

    `read_span(pos, file, lo, hi)` returns bytes [lo, hi) of the file's JPEG
    array; the samples are memoryview slices of it (no copy).
    """
    labels, stored, groups = file_groups(reader, sorted_idx)
    parts: list[Any] = []
    for pos, _s, _e, f, local in groups:
        off = f.offsets
        assert off is not None  # a JPEG file's OpenFile has them
        for a, b in contiguous_runs(local):
            lo, hi = int(off[local[a]]), int(off[local[b - 1] + 1])
            mv = read_span(pos, f, lo, hi).data
            rel = off[local[a]:local[b - 1] + 2] - lo
            parts.extend(mv[int(rel[k]):int(rel[k + 1])] for k in range(b - a))
    return parts, labels, stored


def _byte_ranges(f: OpenFile, kind: str, spans: Any) -> list[tuple[int, int]]:
    """File byte ranges (offset, length) of file-local sample spans [lo, hi)."""
    base, item = f.base, f.item
    assert base is not None
    if kind == "jpeg" and f.offsets is not None:
        off = f.offsets
        return [(base + int(off[lo]), int(off[hi] - off[lo])) for lo, hi in spans]
    return [(base + lo * item, (hi - lo) * item) for lo, hi in spans]


def split_by_file(reader: BatchReader | FileOpener, sorted_idx: np.ndarray
                  ) -> list[tuple[int, int, int]]:
    """(file position, start, stop) slices of `sorted_idx` that fall in one data file each."""
    files = reader.file_of(sorted_idx)
    if len(files) == 0:
        return []
    breaks = np.flatnonzero(np.diff(files) != 0) + 1
    starts = np.concatenate(([0], breaks)).tolist()
    stops = np.concatenate((breaks, [len(files)])).tolist()
    return [(int(files[s]), s, e) for s, e in zip(starts, stops, strict=True)]
