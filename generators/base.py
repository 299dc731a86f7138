"""The writer contract: how a format lays out files, writes them, and checks them."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import mmap
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from iobench.core.datasets import DatasetSpec
from iobench.core.errors import DatasetError
from iobench.core.formats import parse_compression, parse_format
from iobench.core.manifest import FileEntry, bad_label
from iobench.generators import synth
from iobench.generators.synth import fill_samples, make_jpeg

# samples synthesised and written together (bytes): large writes, and writeback starts
# after each (`start_writeback`). 16 MiB rather than 64: the disk starts on a file sooner
# (cifar10 generation about 1.1x, faster in 10 of 12 side-by-side pairs: docs/results.md,
# section 6, fifth pass), and a worker holds a quarter of the memory
BLOCK_BYTES = 16 << 20


@dataclass(frozen=True)
class Task:
    """One unit of generation work: samples [first, first + count) into `files`.

    Container formats write one file per task; the `files` format writes one
    file per sample, grouped into tasks. A task with `count == 0` writes an
    auxiliary file (e.g. the `files` format's labels.npy).
    """

    id: int
    first: int
    count: int
    files: tuple[str, ...]  # paths relative to the dataset root


class Writer(ABC):
    """Writes and checks one on-disk format (layouts: docs/design.md); what it can store
    (compressions, samples per file) is its entry in `iobench.core.formats.FORMATS`."""

    format: ClassVar[str]
    # top-level modules whose exceptions are storage failures (a full disk reported as
    # "HDF error" or EIO), not bugs of ours
    library_modules: ClassVar[tuple[str, ...]] = ()

    def __init__(self, spec: DatasetSpec, seed: int, compression: str = "none") -> None:
        parse_compression(self.format, compression, spec.sample_kind)
        self.spec, self.seed, self.compression = spec, seed, compression

    @property
    def suffix(self) -> str:
        """The suffix of its data files (the registry's first)."""
        return (parse_format(self.format).suffixes or ("",))[0]

    def is_storage_failure(self, e: Exception) -> bool:
        """An error the storage library raised while writing (not a bug of ours)."""
        mod = type(e).__module__ or ""
        return isinstance(e, (OSError, RuntimeError)) or mod.split(".")[0] in self.library_modules

    def jpeg_sizes(self, path: Path, entry: FileEntry) -> list[int]:
        """Bytes of each JPEG stored in data file `path` (a one-sample file: its size)."""
        return [entry.bytes]

    def prepare(self) -> None:
        """Build the synthesis tables in this process (before forking workers that share them)."""
        synth.prepare(self.spec, self.seed)

    @abstractmethod
    def plan(self, num_samples: int, samples_per_file: int) -> list[Task]:
        """Split the dataset into tasks, in sample order."""

    @abstractmethod
    def write(self, root: Path, task: Task) -> list[FileEntry]:
        """Write the task's files (temporary name, then rename) and describe them."""

    @abstractmethod
    def check(self, path: Path, entry: FileEntry) -> None:
        """Open `path` with the format's own library; raise DatasetError if it does not
        hold `entry.num_samples` samples in the expected layout."""

    def check_dtype(self, path: Path, dtype: Any) -> None:
        """A DatasetError when the stored samples' dtype is not the dataset's (a reader
        would read their bytes as the wrong type)."""
        want = np.dtype(self.spec.sample_dtype if self.spec.sample_kind != "jpeg" else np.uint8)
        if np.dtype(dtype) != want:
            raise DatasetError(f"{path}: samples stored as {np.dtype(dtype)}, {self.spec.name} "
                               f"has {want}; the file was changed: regenerate it")

    def check_contents(self, path: Path, entry: FileEntry, n: int, layout_ok: bool,
                       dtype: Any, labels: Any, blobs: np.ndarray | None = None,
                       offsets: np.ndarray | None = None) -> None:
        """What a container's `check` read, checked the same way for every format: `n`
        samples as the manifest says in the expected layout, the dataset's dtype, JPEG
        blobs (when read) that tile their bytes, and labels within the classes."""
        if n != entry.num_samples or not layout_ok:
            raise DatasetError(f"{path}: holds {n} samples in an unexpected layout, manifest "
                               f"says {entry.num_samples}")
        self.check_dtype(path, dtype)
        if blobs is not None and offsets is not None:
            check_blobs(path, blobs, offsets, entry.first_sample)
        self.check_labels(path, labels, entry.first_sample)

    def check_labels(self, path: Path, labels: Any, first: int) -> None:
        """A DatasetError when a class label of the samples from `first` is outside
        0..num_classes-1 (a real model's loss would fail on it mid-run)."""
        j = bad_label(labels, self.spec.num_classes)
        if j is not None:
            raise DatasetError(f"{path}: sample {first + j} has label {labels[j]}, outside "
                               f"0..{self.spec.num_classes - 1} of {self.spec.name}; the file "
                               "is damaged or was changed: regenerate it")

    def layout(self, samples_per_file: int) -> dict[str, object]:
        """Format-specific layout details recorded in the manifest."""
        return {"samples_per_file": samples_per_file, "compression": self.compression}


def check_blobs(path: Path, blobs: np.ndarray, offsets: np.ndarray, first: int) -> None:
    """Every JPEG blob of a container starts with the JPEG marker and ends inside it."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if len(offsets) < 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 3) \
            or offsets[-1] != len(blobs):
        raise DatasetError(f"{path}: JPEG offsets do not tile the stored bytes; the file was "
                           "changed: regenerate it")
    starts = offsets[:-1]
    ok = (blobs[starts] == 0xFF) & (blobs[starts + 1] == 0xD8) & (blobs[starts + 2] == 0xFF)
    if not ok.all():
        j = int(np.argmin(ok))
        raise DatasetError(f"{path}: sample {first + j} is not a JPEG (first bytes "
                           f"{bytes(blobs[starts[j]:starts[j] + 8])!r}); regenerate it")


def part_name(k: int, suffix: str) -> str:
    return f"part-{k:05d}{suffix}"


def sha256_file(path: Path, bufsize: int = 16 << 20) -> str:
    """Hex sha256 of a file, read in 16 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(bufsize)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _sha256_mapped(path: Path) -> str:
    """Hex sha256 of a file this process just wrote, hashed from its mapped page-cache pages
    (no copy into a buffer: about a fifth less CPU than `sha256_file`); `sha256_file` where
    the file cannot be mapped (empty, or a filesystem without mmap). Only for files no
    other process can truncate meanwhile (a mapped page that vanishes is a SIGBUS)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            return hashlib.sha256(m).hexdigest()
    except (OSError, ValueError):  # empty file, or no mmap here
        return sha256_file(path)


def entry_for(root: Path, rel: str, first: int, count: int, role: str = "data") -> FileEntry:
    p = root / rel
    return FileEntry(path=rel, bytes=p.stat().st_size, sha256=sha256_file(p),
                     first_sample=first, num_samples=count, role=role)


def tmp_path_for(final: Path) -> Path:
    """Temporary name in the same directory (so the rename is atomic)."""
    return final.with_name(f".{final.name}.tmp")


@dataclass
class WrittenFile:
    """A file being written under a temporary name: `tmp` while writing; after the
    `written_file` block, `sha256` (hex) and `bytes` of the renamed file."""

    tmp: Path
    sha256: str = ""
    bytes: int = 0


@contextlib.contextmanager
def written_file(final: Path) -> Iterator[WrittenFile]:
    """Yield a `WrittenFile` to write at `.tmp`; on success fsync it and rename it to `final`.

    The sha256 is computed while fsync waits for the disk (both run outside
    the GIL), so the checksum costs no extra time on a disk-bound run. On any
    failure (out of space included) the temporary file is removed, so a
    dataset never holds a half-written file under its final name.
    """
    wf = WrittenFile(tmp_path_for(final))
    try:
        yield wf
        with ThreadPoolExecutor(1) as pool:
            digest = pool.submit(_sha256_mapped, wf.tmp)
            with open(wf.tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            wf.sha256 = digest.result()
        wf.bytes = wf.tmp.stat().st_size
        os.replace(wf.tmp, final)
    finally:
        for p in (wf.tmp, Path(f"{wf.tmp}-lock")):
            if p.exists():
                p.unlink()


@contextlib.contextmanager
def atomic_file(final: Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success fsync it and rename it to `final`
    (`written_file` without the checksum)."""
    tmp = tmp_path_for(final)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        for p in (tmp, Path(f"{tmp}-lock")):
            if p.exists():
                p.unlink()


@functools.lru_cache(maxsize=1)
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def start_writeback(path: Path) -> None:
    """Ask the kernel to start writing `path`'s dirty pages now, without waiting.

    Called after each large block, so the disk works while the next block is
    synthesised and the final fsync has only the tail left (the kernel would
    otherwise hold the pages until its dirty limits). A no-op where Linux's
    sync_file_range(SYNC_FILE_RANGE_WRITE) is missing.
    """
    fn = _sync_file_range()
    if fn is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fn(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE: the whole file, asynchronous
    finally:
        os.close(fd)


def file_entry(rel: str, wf: WrittenFile, first: int, count: int,
               role: str = "data") -> FileEntry:
    """The manifest entry of a file written with `written_file`."""
    return FileEntry(path=rel, bytes=wf.bytes, sha256=wf.sha256, first_sample=first,
                     num_samples=count, role=role)


def sample_blocks(spec: DatasetSpec, seed: int, first: int, count: int,
                  block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
    """Samples [first, first + count) of an array dataset as (offset in the range, block).

    Blocks hold about `block_bytes` (at least one sample) and reuse one
    buffer: use each block before asking for the next.
    """
    per = max(1, min(count, block_bytes // (spec.sample_nbytes or 1)))
    buf = np.empty((per, *spec.array_shape), dtype=spec.sample_dtype)
    for lo in range(0, count, per):
        out = buf[:min(per, count - lo)]
        fill_samples(spec, seed, first + lo, out)
        yield lo, out


def jpeg_blobs(spec: DatasetSpec, seed: int, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """JPEGs of samples [first, first + count) back to back (uint8) and their offsets [count + 1]."""
    blobs = [make_jpeg(spec, seed, i) for i in range(first, first + count)]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    return np.frombuffer(b"".join(blobs), dtype=np.uint8), offsets


TASK_SAMPLES = 256  # one-file-per-sample formats: samples per unit of work (and resume record)


def per_sample_tasks(num_samples: int, path_of: Callable[[int], str]) -> list[Task]:
    """Tasks of TASK_SAMPLES one-sample files each, in sample order; `path_of(index)` names
    a sample's file."""
    return [Task(id=k, first=f, count=min(TASK_SAMPLES, num_samples - f),
                 files=tuple(path_of(i) for i in range(f, min(f + TASK_SAMPLES, num_samples))))
            for k, f in enumerate(range(0, num_samples, TASK_SAMPLES))]


SYNC_THREADS = 64  # fsyncs in flight at once: the filesystem commits them together


def write_sample_files(root: Path, items: Iterable[tuple[str, int, Iterable[Any]]]
                       ) -> list[FileEntry]:
    """Write one file per sample, (relative path, sample index, buffers) each, and
    describe them: hashed as the buffers go out (no second read), each under a temporary
    name, all of them fsynced together, then renamed. As with `atomic_file`, a file under
    its final name is complete and on the device; but one fsync at a time costs a journal
    commit each (about 250 small files/s on this VM's disk), while fsyncs in flight
    together share commits (thousands of files/s). Each item's buffers are written
    before the next item is asked for (they may be a reused block's views). On any
    error the temporary files are removed and no final name appears.
    """
    open_files: list[tuple[int, Path, Path]] = []  # (fd, temporary, final)
    out: list[FileEntry] = []
    made: set[Path] = set()
    try:
        for rel, index, parts in items:
            final = root / rel
            if final.parent not in made:
                final.parent.mkdir(parents=True, exist_ok=True)
                made.add(final.parent)
            tmp = tmp_path_for(final)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            open_files.append((fd, tmp, final))
            digest, size = hashlib.sha256(), 0
            for part in parts:
                view = memoryview(part).cast("B")
                digest.update(view)
                while view:
                    view = view[os.write(fd, view):]
                size += memoryview(part).nbytes
            out.append(FileEntry(path=rel, bytes=size, sha256=digest.hexdigest(),
                                 first_sample=index, num_samples=1))
        # threads for this batch only: a pool kept between calls would be copied without
        # its threads into a process forked later (generate --jobs), and hang it
        with ThreadPoolExecutor(max(1, min(SYNC_THREADS, len(open_files))),
                                thread_name_prefix="fsync") as pool:
            list(pool.map(os.fsync, [fd for fd, _, _ in open_files]))  # the first error
        for fd, tmp, final in open_files:
            os.close(fd)
            os.replace(tmp, final)
        open_files = []
    finally:
        for fd, tmp, _ in open_files:  # an error: nothing of this batch under a final name
            with contextlib.suppress(OSError):
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return out


def each_sample(spec: DatasetSpec, seed: int, first: int, count: int
                ) -> Iterator[tuple[int, bytes | np.ndarray]]:
    """(index, JPEG bytes or sample array) of samples [first, first + count); arrays come
    from a reused block buffer: use each before asking for the next."""
    if spec.sample_kind == "jpeg":
        for i in range(first, first + count):
            yield i, make_jpeg(spec, seed, i)
        return
    for lo, block in sample_blocks(spec, seed, first, count):
        for j, arr in enumerate(block):
            yield first + lo + j, arr


class ContainerWriter(Writer):
    """A format that packs `samples_per_file` samples into each `part-NNNNN<suffix>` file."""

    def plan(self, num_samples: int, samples_per_file: int) -> list[Task]:
        tasks = []
        for k, first in enumerate(range(0, num_samples, samples_per_file)):
            count = min(samples_per_file, num_samples - first)
            tasks.append(Task(id=k, first=first, count=count, files=(part_name(k, self.suffix),)))
        return tasks

    def layout(self, samples_per_file: int) -> dict[str, object]:
        return {**super().layout(samples_per_file), "chunked": self.compression != "none"}
