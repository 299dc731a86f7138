"""Stage a dataset from one storage tier to another (e.g. Lustre to node-local NVMe).

`stage_dataset(config, world)` is one call, usable from `iobench stage` and
from `iobench train --stage-to`. Under `mpiexec` every node receives the files
its ranks will read (all of them in `replicate` mode; in `shard` mode only the
data files `sampling.files_for_rank` gives its ranks, plus labels and index
files), and the ranks of a node split that node's files, balanced by bytes.
Each rank copies with several worker processes (`_stage_pool`, started before
the timed copy; one thread of its own with `threads=1`), a batch of small files
or one large file at a time, 16 MiB sequential reads and writes, computing
sha256 while copying (no second pass) and checking it against the manifest
(`verify`; else sizes only, and the kernel copies). Files land under a temporary name, a batch's are fsynced
together and then renamed, so a file under its final name is always complete
and on the device; a rerun skips files that are already complete and correct.
The destination manifest is written last, so a dataset that has a manifest at
the destination was staged completely. Once a batch is durable its files' pages
(the copies', and the sources' unless `warm_source`) are dropped from the page
cache through the descriptors the copy still holds (`evict_s`), no file opened
again for it.

The copy is timed from a cold source (docs/metrics.md, "Staging"): it evicts
each source file through the descriptor it opened it with, right before the
first read, and measures the residency left there (no other open of the file:
on a parallel or FUSE filesystem each open is a round trip); the node-wide steps
(`--evict-cmd`) run before the copy, and where virtual nodes share a host's page
cache a pass over every file does (`_Cold`). What the copy read from storage is
counted too (`os_read_bytes`, the OS's own count). With
`repeat` > 1 the whole copy runs that many times, each from a cold source
into a destination emptied of the previous repetition's files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import mmap
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from iobench.core import cache, hostcpu, procio, sysinfo
from iobench.core.dataref import DatasetRef, load_ref, locate
from iobench.core.datasets import parse_dataset
from iobench.core.errors import (
    ConfigError,
    DatasetError,
    IobenchError,
    StorageError,
)
from iobench.core.formats import parse_format
from iobench.core.interrupts import check, pending
from iobench.core.manifest import MANIFEST_NAME, FileEntry, Manifest, refuse_irregular
from iobench.core.options import parse_evict_cmd, parse_repeat
from iobench.core.outputs import probe_write
from iobench.core.placement import check_same_dataset, need_bytes, parse_mode, staging_root
from iobench.core.progress import LogProgress
from iobench.core.results import STAGE_SCHEMA, STAGE_SCHEMA_VERSION, now_iso
from iobench.core.spread import spread
from iobench.core.world import World, agree
from iobench.workflows import _stage_pool

SCHEMA, SCHEMA_VERSION = STAGE_SCHEMA, STAGE_SCHEMA_VERSION  # iobench.core.results says each version
MiB = 2**20
PARTIAL = ".iobench-partial-"  # temporary names: .<name>.iobench-partial-<host>-<pid>
WINDOW = 4  # copy tasks queued per thread: enough to keep every thread busy, never a list
T = TypeVar("T")
SYNC_MODES = ("fs", "file")  # --sync: a syncfs per batch, or an fsync per file
VERIFY_MODES = ("full", "size")  # --verify: sha256 of every copy, or its size only


def parse_verify(mode: str | None, no_verify: bool = False) -> bool:
    """`--verify full|size` (or `--no-verify`, the same as size) as `StageConfig.verify`:
    whether each copy's sha256 is computed and checked."""
    if mode is not None and mode not in VERIFY_MODES:
        raise ConfigError(f"--verify {mode!r} is not one of {', '.join(VERIFY_MODES)}")
    if no_verify and mode == "full":
        raise ConfigError("--no-verify with --verify full: give one of them")
    return not no_verify and mode != "size"


@dataclass(frozen=True)
class StageConfig:
    """What to stage where. `source` and `dest` are storage roots; the dataset lives in
    `<root>/<dataset>-<format>` (or `source` itself when it is that dataset's root)."""

    dataset: str
    format: str
    source: Path
    dest: Path
    mode: str = "replicate"
    threads: int = 4  # copy threads per rank
    buffer_bytes: int = 16 * MiB  # size of each sequential read and write
    verify: bool = True  # sha256 while copying, checked against the manifest
    verify_existing: bool = True  # re-hash complete-looking files before skipping them
    fsync: bool = True  # a staged file is on the device, not in the page cache
    # how a batch of small copies gets there: "file", an fsync each (in flight together);
    # "fs", one syncfs of the destination per batch (far fewer device flushes, but it also
    # waits for other writers' dirty data on that filesystem, as `sync` does)
    sync: str = "file"
    progress: bool = False  # a progress bar on rank 0 (stderr)
    log_progress: bool = False  # else, off a terminal: a line a minute on rank 0 (stderr)
    warm_source: bool = False  # do not evict the source first (then the copy may read memory)
    repeat: int = 1  # full copies from a cold source; the last one stays
    evict_cmd: str | None = None  # the site's command emptying the source's server caches


    def __post_init__(self) -> None:
        parse_dataset(self.dataset)
        parse_format(self.format)
        parse_mode(self.mode)
        object.__setattr__(self, "source", Path(self.source))
        object.__setattr__(self, "dest", Path(self.dest))
        if self.threads < 1:
            raise ConfigError(f"threads={self.threads} must be >= 1")
        if not MiB // 16 <= self.buffer_bytes <= 1024 * MiB:
            raise ConfigError(f"buffer_bytes={self.buffer_bytes} must be in [64 KiB, 1 GiB]")
        parse_repeat(self.repeat, "full copies")
        if self.sync not in SYNC_MODES:
            raise ConfigError(f"sync={self.sync!r} is not one of {', '.join(SYNC_MODES)}")
        parse_evict_cmd(self.evict_cmd, self.warm_source, "--warm-source")

    @property
    def shuffle_scope(self) -> str:
        """The shuffle scope a training run from the staged copy must use."""
        return "local" if self.mode == "shard" else "global"

    def locate_source(self) -> DatasetRef:
        """The dataset to copy: `<source>/<dataset>-<format>`, or `source` when it is that
        dataset's root."""
        return locate(self.source, self.dataset, self.format)


@dataclass
class _Counters:
    copied_files: int = 0
    copied_bytes: int = 0
    skipped_files: int = 0  # complete and correct already
    skipped_bytes: int = 0
    recopied_files: int = 0  # present but incomplete or wrong: copied again
    removed_partials: int = 0
    verify_s: float = 0.0  # time spent re-hashing existing files
    checksum_s: float = 0.0  # time spent hashing the copies (their sha256 while copying)
    copy_s: float = 0.0  # time the copy workers spent on batches (checksum_s's share of it)
    # dropping the copied files' pages (copy and source): inside copy_s after each synced
    # batch, and with --no-fsync a pass after the timed copy for the copies' dirty pages
    evict_s: float = 0.0
    # the source's eviction through the copy's own descriptor, before its first read
    # (`_Local.source`): files and bytes, bytes resident then, files the OS would not tell
    source_files: int = 0
    source_bytes: int = 0
    source_resident_bytes: int = 0
    source_unknown_files: int = 0
    source_evict_s: float = 0.0  # inside copy_s

    def add(self, **kw: float) -> None:
        for k, v in kw.items():
            setattr(self, k, getattr(self, k) + v)


def _check_manifest(m: Manifest, cfg: StageConfig) -> None:
    """A DatasetError unless `m` is the dataset `cfg` names and lists only plain paths."""
    if (m.dataset, m.format) != (cfg.dataset, cfg.format):
        raise DatasetError(f"{m.root} holds {m.dataset}/{m.format}, not "
                           f"{cfg.dataset}/{cfg.format}: check --dataset/--format/--from")
    # a damaged manifest must not make us write outside the destination; a compact table's
    # data files are its folders and name pattern, checked when it loaded: only its JSON
    # entries are walked here
    for f in (m.aux_files if m.compact is not None else m.files):
        # Path(f.path).parts without building a Path per file (a second per 20,000 files)
        parts = [x for x in f.path.split("/") if x not in ("", ".")]
        if not parts or f.path.startswith("/") or ".." in parts or f.path == MANIFEST_NAME:
            raise DatasetError(f"manifest in {m.root} lists the file {f.path!r}, which is not "
                               "a plain path inside the dataset: the manifest is damaged")


def _sha256_file(path: str | Path, buf: memoryview) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO: named below, not waited on
    try:
        refuse_irregular(path, fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while k := os.readv(fd, [buf]):
            h.update(buf[:k])
            n += k
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read once: leave no pages
    finally:
        os.close(fd)
    return n, h.hexdigest()


def _open_source(src: str, entry: FileEntry) -> tuple[int, os.stat_result]:
    """The source file open for reading, checked to be a regular file of the manifest's size
    (one fstat: the copy then reads exactly that many bytes, no read to find the end), and
    that fstat."""
    fin = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO is not waited on
    try:
        st = os.fstat(fin)
        if not stat.S_ISREG(st.st_mode):
            refuse_irregular(src, fin)
        if st.st_size != entry.bytes:
            raise DatasetError(f"source {src} has {st.st_size} bytes, the manifest says "
                               f"{entry.bytes}: the source dataset is damaged; run `iobench "
                               "verify` on it")
    except BaseException:
        os.close(fin)
        raise
    return fin, st


def _evict_source(fin: int, src: str, st: os.stat_result, how: str,
                  counters: _Counters) -> None:
    """Evict an open source file's pages (`how` "evict"; "measure" only measures them) and
    count the bytes still resident, before its first read: its data comes from storage,
    and no file is opened for it but by the copy (on a parallel filesystem each open is a
    round trip to its servers). A file the OS will not tell about counts as unknown."""
    t0 = time.perf_counter()
    try:
        resident = cache.evict_fd(fin, src, st, evict_pages=how == "evict")
    except OSError:
        resident = None
    counters.add(source_files=1, source_bytes=st.st_size,
                 source_resident_bytes=resident or 0,
                 source_unknown_files=resident is None and st.st_size > 0,
                 source_evict_s=time.perf_counter() - t0)


def _copy_verified(src: str, tmp: str, entry: FileEntry, cfg: StageConfig, buf: memoryview,
                   on_bytes: Callable[[int], None], counters: _Counters,
                   defer_sync: bool = False, source: str | None = None
                   ) -> tuple[int, int] | None:
    """Copy src to tmp with large sequential I/O, hashing while copying (`cfg.verify`; the
    hashing's seconds go to `counters.checksum_s`). With `defer_sync` the copy is left
    open, unsynced, and its descriptor and the source's returned: the caller syncs it
    together with others (`_finish`), drops their pages (`_drop_batch`), then closes them.
    Else the copy is synced here and its pages and the source's dropped (one advice each).
    With `source` ("evict" or "measure") the source is first evicted through `fin`
    (`_evict_source`)."""
    fin, st = _open_source(src, entry)
    try:
        if source is not None:
            _evict_source(fin, src, st, source, counters)
        fout = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except BaseException:
        os.close(fin)
        raise
    try:
        big = entry.bytes > len(buf)  # a small file is one read and one write
        if big:  # read-ahead, and fewer extents; not every fs can
            os.posix_fadvise(fin, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            with contextlib.suppress(OSError):
                os.posix_fallocate(fout, 0, entry.bytes)
        if cfg.verify:
            n, digest = _copy_hashed(fin, fout, entry.bytes, buf, on_bytes, counters)
        else:
            n, digest = _copy_kernel(fin, fout, entry.bytes, buf, on_bytes), None
        if n != entry.bytes:  # the file shrank while being copied
            raise DatasetError(f"source {src} has {n} bytes, the manifest says {entry.bytes}: "
                               "the source dataset is damaged; run `iobench verify` on it")
        if big:  # fallocate may have reserved more than the source had
            os.ftruncate(fout, n)
        if digest is not None and digest != entry.sha256:
            raise DatasetError(f"source {src} does not match its manifest checksum (sha256 "
                               f"{digest[:16]}..., expected {entry.sha256[:16]}...): the "
                               "source dataset is damaged; run `iobench verify` on it")
        if defer_sync:
            handed, fout, fin = (fout, fin), -1, -1
            return handed
        _finish(fout, cfg)
        t0 = time.perf_counter()
        _drop(fout, fin, cfg)
        counters.evict_s += time.perf_counter() - t0
        return None
    finally:
        if fout >= 0:
            os.close(fout)
        if fin >= 0:
            os.close(fin)


def _drop(fout: int, fin: int, cfg: StageConfig) -> None:
    """Drop a synced copy's pages, and its source's unless --warm-source, from the page
    cache, with their descriptors still open: staged data should not crowd the cache (and
    training from it starts cold). With --no-fsync the copy's pages are dirty still: a pass
    after the copy drops them (`_drop_pages`)."""
    if cfg.fsync:
        os.posix_fadvise(fout, 0, 0, os.POSIX_FADV_DONTNEED)
    if not cfg.warm_source:
        os.posix_fadvise(fin, 0, 0, os.POSIX_FADV_DONTNEED)


def _copy_hashed(fin: int, fout: int, size: int, buf: memoryview,
                 on_bytes: Callable[[int], None], counters: _Counters) -> tuple[int, str]:
    """Copy `size` bytes from `fin` to `fout` through `buf`, hashing each chunk once between
    its read and its write; (bytes copied, sha256 hex digest)."""
    h = hashlib.sha256()
    hashing = 0.0
    n = 0
    while n < size:
        k = os.readv(fin, [buf[:size - n]])
        if k == 0:
            break
        chunk = buf[:k]
        t0 = time.perf_counter()
        h.update(chunk)  # releases the interpreter lock for large buffers
        hashing += time.perf_counter() - t0
        w = 0
        while w < k:
            w += os.write(fout, chunk[w:])
        n += k
        on_bytes(k)
    t0 = time.perf_counter()
    digest = h.hexdigest()
    counters.checksum_s += hashing + time.perf_counter() - t0
    return n, digest


def _finish(fout: int, cfg: StageConfig) -> None:
    """Make a copy durable (unless --no-fsync)."""
    if cfg.fsync:
        os.fsync(fout)


def _copy_kernel(fin: int, fout: int, size: int, buf: memoryview,
                 on_bytes: Callable[[int], None]) -> int:
    """Unverified copy in the kernel (copy_file_range, else read/write); bytes copied."""
    n = 0
    step = len(buf)
    use_cfr = hasattr(os, "copy_file_range")
    while n < size:
        if use_cfr:
            try:
                k = os.copy_file_range(fin, fout, min(step, size - n))
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                use_cfr = False
                continue
        else:
            k = os.readv(fin, [buf])
            w = 0
            while w < k:
                w += os.write(fout, buf[w:k])
        if k == 0:
            break
        n += k
        on_bytes(k)
    return n


class _Stopped(Exception):
    """Another copy thread failed, or the user interrupted: stop after this chunk."""


class _Progress:
    """A rich progress bar with MB/s for this rank's bytes (rank 0 only), thread-safe.

    Copy threads report every chunk here, which is also where they learn to stop
    (`stop` set after a failure or Ctrl-C), so a large file is not copied to the end.
    """

    def __init__(self, enabled: bool, total: int, label: str, log: bool = False) -> None:
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self._bar = None
        self._log = None  # off a terminal: a line every IOBENCH_PROGRESS_S (a batch job's log)
        self._done, self._total = 0, total
        if log and not enabled:
            self._log = LogProgress(label).__enter__()
            self._log.update(0, total)
        if enabled:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress("[progress.description]{task.description}", BarColumn(),
                                 DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                 transient=False)
            self._bar.start()
            self._task = self._bar.add_task(label, total=total)

    def advance(self, n: int) -> None:
        # an interrupt several ranks act on together (iobench.core.interrupts) is only recorded:
        # the copies stop here, and the ranks' next collective raises it on every rank
        if self.stop.is_set() or pending():
            raise _Stopped()
        self.show(n)

    def show(self, n: int) -> None:
        """Count `n` more bytes copied (on the bar or the log), without the stop check."""
        if self._bar is not None:
            with self._lock:
                self._bar.advance(self._task, n)
        elif self._log is not None:
            with self._lock:
                self._done += n
                self._log.update(self._done, self._total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self._log is not None:
            self._log.__exit__(None, None, None)


def _remove_partials(dest_root: Path, manifest: Manifest, host: str) -> int:
    """Remove temporary files an interrupted run on this host left for the manifest's files.

    One listing per folder the manifest puts files in (a `files` dataset has millions of
    files); a compact table's data files are matched by its name pattern, never listed.
    Run by one rank per node while no rank copies.
    """
    t = manifest.compact
    by_dir: dict[str, set[str]] = {}
    for e in (manifest.aux_files if t is not None else manifest.files):
        folder, _, name = e.path.rpartition("/")
        by_dir.setdefault(folder, set()).add(name)
    is_data = t.path_test() if t is not None else None
    for folder in (t.dirs if t is not None else ()):
        by_dir.setdefault(folder, set())
    n = 0
    for folder, names in by_dir.items():
        where = dest_root / folder
        try:
            listing = os.listdir(where)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for item in listing:
            if not item.startswith(".") or PARTIAL not in item:
                continue
            name, _, owner = item[1:].partition(PARTIAL)
            ours = name in names or (is_data is not None
                                     and is_data(f"{folder}/{name}" if folder else name))
            if ours and owner.startswith(f"{host}-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(where / item)
                    n += 1
    return n


SMALL_FILE = 1 * MiB  # smaller files are copied in batches whose fsyncs run together
BATCH_FILES = 64  # at most this many files per batch (and fsyncs in flight for one batch)


def batch_files(threads: int) -> int:
    """Files per batch for `threads` copy threads: BATCH_FILES, fewer where a batch's open
    copies and their sources (two descriptors a file), in every thread at once, would take
    over a quarter of the process's file descriptors."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    budget = soft // 4 if soft != resource.RLIM_INFINITY else 1 << 16
    return max(1, min(BATCH_FILES, budget // (2 * threads)))


def _batches(entries: Iterable[FileEntry], size: int) -> Iterator[list[FileEntry]]:
    """`entries` in order, in lists: runs of up to `size` small files, a large one alone."""
    run: list[FileEntry] = []
    for e in entries:
        if e.bytes >= SMALL_FILE:
            if run:
                yield run
                run = []
            yield [e]
            continue
        run.append(e)
        if len(run) == size:
            yield run
            run = []
    if run:
        yield run


@dataclass
class _Local:
    """What one copying thread or worker process keeps between its batches."""

    fresh: bool  # the destination was empty when the copy began: nothing there to skip
    buf: memoryview | None = None  # its read/write buffer (allocated where it copies)
    tag: str = ""  # its temporary names' suffix: .<name><tag>
    dirs: set[str] = field(default_factory=set)  # destination folders made already
    sync: ThreadPoolExecutor | None = None  # its fsync threads (`_sync_batch`)
    # "evict": each source file is evicted through the copy's descriptor before its first
    # read, and its residency measured then; "measure": measured only (--warm-source);
    # None: a pass before the copy did both (`cache.evict_for_node`)
    source: str | None = None


def _stage_batch(batch: list[FileEntry], src_root: Path, dest_root: Path, cfg: StageConfig,
                 counters: _Counters, lock: threading.Lock,
                 progress: _Progress | _WorkerProgress, local: _Local) -> None:
    """Stage a batch of files: each copied and checked under a temporary name, then all
    fsynced together, then each renamed, so a file under its final name is complete
    and on the device. One fsync at a time costs a journal commit each (about 1,800
    small files/s per rank on this project's test machine); a batch's fsyncs in flight
    together share commits (docs/results.md, section 9)."""
    if local.buf is None:  # in the copying thread or worker process, at its first batch
        # anonymous pages, each faulted in when a read first fills it: no zeroing of the
        # whole buffer (bytearray's 16 MiB memset cost every worker ~5 ms of CPU)
        local.buf = memoryview(mmap.mmap(-1, cfg.buffer_bytes,
                                         flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
        local.tag = f"{PARTIAL}{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
    t0 = time.perf_counter()
    copied: list[_Copied] = []
    where = [batch[0], ""]  # the file being worked on, and its copy's temporary name
    try:
        _copy_batch(batch, src_root, dest_root, cfg, counters, lock, progress, local, copied,
                    where)
        _sync_batch(copied, cfg, where, local)
        _drop_batch(copied, cfg, counters, lock)
        while copied:
            c = copied[0]
            where[0] = c.entry
            c.close()
            os.replace(c.tmp, c.dst)
            copied.pop(0)
            with lock:
                counters.add(copied_files=1, copied_bytes=c.entry.bytes, recopied_files=c.recopy)
        with lock:
            counters.add(copy_s=time.perf_counter() - t0)
    except BaseException as e:
        _discard(copied, str(where[1]))
        current = where[0]
        assert isinstance(current, FileEntry)
        if isinstance(e, OSError) and not isinstance(e, IobenchError):
            raise _copy_error(e, current, src_root, dest_root) from e
        raise


def _drop_batch(copied: list[_Copied], cfg: StageConfig, counters: _Counters,
                lock: threading.Lock) -> None:
    """Drop a synced batch's pages (`_drop`) through the descriptors it holds open, so that
    no file is opened again for it; the seconds go to `counters.evict_s`."""
    t0 = time.perf_counter()
    for c in copied:
        if c.fd >= 0:
            _drop(c.fd, c.src_fd, cfg)
    with lock:
        counters.add(evict_s=time.perf_counter() - t0)


@dataclass
class _Copied:
    """A file of a batch copied under its temporary name, its descriptor and its source's
    open until synced and dropped from the page cache."""

    fd: int  # -1 once closed (or when the copy was synced on its own)
    src_fd: int  # the source's, -1 as `fd`
    tmp: str
    dst: str
    entry: FileEntry
    recopy: int  # 1 when it replaces a wrong or partial file

    def close(self) -> None:
        for fd in (self.fd, self.src_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.src_fd = -1


def _copy_batch(batch: list[FileEntry], src_root: Path, dest_root: Path, cfg: StageConfig,
                counters: _Counters, lock: threading.Lock,
                progress: _Progress | _WorkerProgress, local: _Local, copied: list[_Copied],
                where: list[Any]) -> None:
    """Copy the batch's files that are not staged yet under temporary names (into `copied`);
    `where` names the file being copied and its temporary name, for the caller's cleanup."""
    # plain strings, not Paths: with thousands of small files a second, building Paths
    # was a fifth of the copy threads' time (and they share one interpreter lock)
    src_top, dst_top = os.fspath(src_root), os.fspath(dest_root)
    for entry in batch:
        where[0] = entry
        src, dst = os.path.join(src_top, entry.path), os.path.join(dst_top, entry.path)
        recopy = _already_staged(entry, dst, cfg, counters, lock, progress, local)
        if recopy is None:
            continue
        folder, name = os.path.split(dst)
        if folder not in local.dirs:
            os.makedirs(folder, exist_ok=True)
            local.dirs.add(folder)
        where[1] = tmp = os.path.join(folder, f".{name}{local.tag}")
        assert local.buf is not None  # allocated by `_stage_batch`
        try:
            fds = _copy_verified(src, tmp, entry, cfg, local.buf, progress.advance, counters,
                                 defer_sync=len(batch) > 1, source=local.source)
        except FileNotFoundError as e:
            if e.filename is not None and os.fspath(e.filename) == src:
                raise DatasetError(f"source file {src} (in the manifest) is missing: the "
                                   "source dataset is incomplete; regenerate it or run "
                                   "`iobench verify`") from None
            raise
        fd, src_fd = fds if fds is not None else (-1, -1)
        copied.append(_Copied(fd, src_fd, tmp, dst, entry, recopy))
        where[1] = ""


SYNC_THREADS = 16  # fsyncs of a batch in flight together (they share journal commits)


def _sync_batch(copied: list[_Copied], cfg: StageConfig, where: list[Any],
                local: _Local) -> None:
    """Make the batch's open copies durable together: one syncfs of their filesystem
    (`cfg.sync` "fs", where the OS has it), else their fsyncs in flight together (they
    share journal commits), from a pool of threads the copier keeps (`local.sync`)."""
    synced = [c for c in copied if c.fd >= 0]
    if not synced or not cfg.fsync:
        return
    if cfg.sync == "fs" and _SYNCFS is not None:
        where[0] = synced[0].entry
        if _SYNCFS(synced[0].fd) != 0:  # Linux >= 5.8 reports a writeback error here
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return
    if local.sync is None:
        local.sync = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="stage-sync")
    for c, fut in [(c, local.sync.submit(_finish, c.fd, cfg)) for c in synced]:
        where[0] = c.entry
        fut.result()  # the first error, named by its file


def _libc_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs(fd), where there is one (Linux)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


_SYNCFS = _libc_syncfs()


def _end_sync(local: _Local) -> None:
    """Stop the sync threads a copying thread started (`_sync_batch`)."""
    pool = local.sync
    if pool is not None:
        pool.shutdown()
        local.sync = None


def _discard(copied: list[_Copied], tmp: str) -> None:
    """Remove a failed batch's temporary copies (and `tmp`, the copy that failed midway)."""
    for c in copied:
        c.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(c.tmp)
    if tmp:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _copy_error(e: OSError, current: FileEntry, src_root: Path, dest_root: Path
                ) -> StorageError:
    """The one-line error of a copy that failed: out of space, or what the OS said."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageError(f"out of space on {dest_root} while copying {current.path} "
                            f"({current.bytes} bytes); free space or stage elsewhere; "
                            "the partial copy was removed")
    where = f"{src_root / current.path} to {dest_root / current.path}"
    return StorageError(f"cannot copy {where}: {e.strerror or e}")


def _already_staged(entry: FileEntry, dst: str, cfg: StageConfig, counters: _Counters,
                    lock: threading.Lock, progress: _Progress | _WorkerProgress,
                    local: _Local) -> int | None:
    """None when `dst` is already a complete, correct copy (counted as skipped); else 1 when
    a wrong or partial file is there to be replaced, 0 when there is none. No stat at all
    into a destination that was empty when the copy began (`local.fresh`), nor in
    repetitions (full copies: a file already complete is copied again, not skipped)."""
    if cfg.repeat != 1 or local.fresh:
        return 0
    try:
        st = os.stat(dst)
    except FileNotFoundError:
        return 0
    if st.st_size == entry.bytes:
        if not cfg.verify_existing:
            ok, dt = True, 0.0
        else:
            t0 = time.perf_counter()
            assert local.buf is not None
            ok = _sha256_file(dst, local.buf)[1] == entry.sha256
            dt = time.perf_counter() - t0
        if ok:
            with lock:
                counters.add(skipped_files=1, skipped_bytes=entry.bytes, verify_s=dt)
            progress.advance(entry.bytes)
            return None
    return 1


def _check_dest(dest_root: Path, need_bytes: int) -> None:
    """Create the destination, prove it writable (`outputs.probe_write`, as `writable_dir`
    does, in words of `--to`) and roomy enough for `need_bytes` (bytes)."""
    try:
        dest_root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(f"cannot create the destination {dest_root}: {e.strerror or e}; "
                           "give a writable --to") from e
    try:
        probe_write(dest_root)
    except OSError as e:
        raise StorageError(f"destination {dest_root} is not writable ({e.strerror or e}); "
                           "give a writable --to") from e
    free = os.statvfs(dest_root)
    avail = free.f_bavail * free.f_frsize
    if need_bytes > avail:
        raise StorageError(f"not enough space on {dest_root}: the files to copy need "
                           f"{need_bytes / 1e9:.3f} GB, {avail / 1e9:.3f} GB are free; free "
                           "space, stage elsewhere, or use --mode shard")


def stage_dataset(cfg: StageConfig, world: World | None = None,
                  source: DatasetRef | None = None) -> dict[str, Any]:
    """Stage the dataset; return the staging result (the `iobench.stage` v2 document).

    A collective under MPI: every rank calls it, and every rank gets the same
    result. Errors (missing source, unwritable or full destination, a checksum
    mismatch) are raised on every rank, and no half-written file is left
    under a final name. `source` is the dataset to copy, when the caller has
    resolved it already; else `cfg` names it (`StageConfig.locate_source`).

    Before each copy the source is evicted on every node (unless
    `cfg.warm_source`) and its residency measured (`source_cache`); the OS's
    count of bytes read (`os_read_bytes`, summed over ranks) shows whether the
    copy read storage. With `cfg.repeat` > 1 every file is copied again in each
    repetition (no resume), the files the previous repetition wrote are removed
    first, and `stage_s` / `stage_MBps` are the medians (`spread` has the rest).
    """
    return _stage(cfg, world or World(), source)[1]


def _stage(cfg: StageConfig, world: World, source: DatasetRef | None
           ) -> tuple[_Plan, dict[str, Any]]:
    """`stage_dataset`, with the plan it followed."""
    plan = _plan(cfg, world, source)
    node_bytes = _prepare_dest(plan, world)
    reps = _copy_repetitions(plan, world)
    error = None
    if plan.node_leader:  # manifest last: its presence means the copy is complete
        try:
            _write_dest_manifest(plan, world)
        except Exception as e:  # every rank must hear of it
            error = e
    agree(world, error, "staging")
    return plan, _document(plan, world, reps, node_bytes)


@dataclass(frozen=True)
class _Plan:
    """One rank's part of a staging: the source, its copy's folder, the rank's share."""

    cfg: StageConfig
    source: DatasetRef
    dest_root: Path
    rank: int
    ranks: list[int]  # the global ranks on this rank's node
    mine: Sequence[FileEntry]  # this rank's files (a compact table's are never listed)
    my_bytes: int
    my_need: int  # bytes of `mine` the destination lacks
    note: str | None  # why the OS cannot count the copy's storage reads, if it cannot

    @property
    def manifest(self) -> Manifest:
        return self.source.manifest

    @property
    def node_leader(self) -> bool:
        """The node's first rank: it prepares the destination and writes the manifest."""
        return self.ranks[0] == self.rank


def _plan(cfg: StageConfig, world: World, source: DatasetRef | None) -> _Plan:
    """Find the source, its copy's folder and this rank's share; raised on every rank."""
    error: BaseException | None = None
    plan = None
    ranks = cache.node_ranks(world)
    try:
        source = source or cfg.locate_source()
        _check_manifest(source.manifest, cfg)
        dest_root = staging_root(cfg.dest, source, world)
        if dest_root.resolve() == source.root.resolve():
            raise ConfigError(f"--to {cfg.dest} would stage {source.root} onto itself; give "
                              "another storage root")
        manifest = source.manifest
        if cfg.mode == "shard" and len(manifest.data_files) < world.size:
            raise ConfigError(f"--mode shard needs at least one data file per rank: "
                              f"{len(manifest.data_files)} files for {world.size} ranks; "
                              "regenerate with a smaller --samples-per-file")
        # the node's files, dealt to its ranks as eviction deals them: arithmetic slices of
        # a compact table, never a list of every file
        mine = cache.rank_share(manifest, ranks, ranks.index(world.rank), world.size,
                                cfg.shuffle_scope)
        plan = _Plan(cfg, source, dest_root, world.rank, ranks, mine, cache.share_bytes(mine),
                     need_bytes(mine, dest_root),  # each rank stats its own share
                     procio.read_bytes_unavailable(source.root))
    except Exception as e:  # whatever it is, every rank must hear of it (no rank left waiting)
        error = e
    agree(world, error, "staging")
    assert plan is not None
    check_same_dataset(world, plan.manifest)  # every node copies the same version, or none does
    return plan


def _prepare_dest(plan: _Plan, world: World) -> int:
    """The node's leader checks the destination has room for what the node's ranks copy
    and removes a manifest there (an older dataset must not pass for this one mid-way);
    the bytes of the node's share."""
    shares = world.allgather((world.node, plan.my_bytes, plan.my_need))
    error: BaseException | None = None
    if plan.node_leader:
        try:
            _check_dest(plan.dest_root, sum(n for node, _, n in shares if node == world.node))
            with contextlib.suppress(FileNotFoundError):
                (plan.dest_root / MANIFEST_NAME).unlink()
        except Exception as e:  # every rank must hear of it
            error = e
    agree(world, error, "staging")
    return sum(b for node, b, _ in shares if node == world.node)


def _copy_repetitions(plan: _Plan, world: World) -> list[dict[str, Any]]:
    """Every repetition's copy (a collective each); a cold-source warning said once, first."""
    cfg = plan.cfg
    reps: list[dict[str, Any]] = []
    warned = False
    for r in range(cfg.repeat):
        if r:  # the next repetition copies everything again, into a destination without it
            agree(world, _remove_files(cache.share_paths(plan.manifest, plan.mine,
                                                         plan.dest_root)), "staging")
        rep = _copy_once(plan, world, r)
        reps.append(rep)
        warning = rep["source_cache"]["warning"]
        if warning and not warned and world.rank == 0:  # loudly, before the figures
            print(f"iobench: WARNING: {warning}", file=sys.stderr, flush=True)
            warned = True
    return reps


def _document(plan: _Plan, world: World, reps: list[dict[str, Any]],
              node_bytes: int) -> dict[str, Any]:
    """The `iobench.stage` document of the repetitions (medians; the first one's counters)."""
    from iobench.core.sysinfo import mount_of, provenance

    cfg, manifest = plan.cfg, plan.manifest
    first = reps[0]  # the one that met the destination as it was: the resume counters
    total = first["counters"]
    figures = {"stage_s": spread(r["stage_s"] for r in reps),
               "stage_MBps": spread(r["stage_MBps"] for r in reps)}
    os_reads = [r["os_read_bytes"] for r in reps]
    source_cache = _merge_source_cache([r["source_cache"] for r in reps])
    per_node = node_stage_figures(first["per_rank_full"])
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
        "kind": "stage",
        "created": now_iso(),
        "config": {**{k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
                   "world_size": world.size, "num_nodes": world.num_nodes,
                   "launcher": world.launcher},
        "dataset": manifest.identity(),
        "mode": cfg.mode, "shuffle_scope": cfg.shuffle_scope,
        "from": {"root": str(plan.source.root.resolve()), **asdict(mount_of(plan.source.root))},
        "to": {"root": str(plan.dest_root.resolve()), **asdict(mount_of(plan.dest_root))},
        # medians over the repetitions (the value itself when there is one)
        "stage_s": figures["stage_s"]["median"] if figures["stage_s"] else None,
        "stage_bytes": first["stage_bytes"],  # per repetition; every repetition copies as much
        "stage_MBps": figures["stage_MBps"]["median"] if figures["stage_MBps"] else None,
        # the least any repetition read from storage: proof that every one of them did
        "os_read_bytes": None if plan.note or None in os_reads else min(os_reads),
        "os_read_bytes_note": plan.note,
        "source_cache": source_cache,
        "repeats": cfg.repeat,
        "spread": figures,
        "repetitions": [{k: r[k] for k in ("repeat", "stage_s", "stage_bytes", "stage_MBps",
                                           "os_read_bytes", "copied_files", "source_cache",
                                           "per_rank", "checksum_s", "checksum_share",
                                           "evict_s", "host_cpu")} for r in reps],
        "dataset_bytes": manifest.total_bytes,
        "node_bytes": node_bytes if world.num_nodes == 1 else None,
        "verified": cfg.verify,
        "verify": "full" if cfg.verify else "size",
        # medians over the repetitions, as stage_s: what verification costs (null with size)
        "checksum_s": _median_of(r["checksum_s"] for r in reps),
        "checksum_share": _median_of(r["checksum_share"] for r in reps),
        "evict_s": _median_of(r["evict_s"] for r in reps),
        "host_cpu": _median_host_cpu([r["host_cpu"] for r in reps]),
        **{k: total[k] for k in ("copied_files", "skipped_files", "skipped_bytes",
                                 "recopied_files", "removed_partials")},
        "per_rank": first["per_rank_full"],
        "per_node": per_node,
        "slowest_node": max(per_node, key=lambda n: n["seconds"])["name"],
        "warnings": [source_cache["warning"]] if source_cache["warning"] else [],
        "provenance": provenance(import_libs=False) if world.rank == 0 else None,
    }


def _median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values, or None when one of them is None (or there are none)."""
    import statistics

    got = list(values)
    return None if not got or None in got else statistics.median(
        v for v in got if v is not None)


def _median_host_cpu(values: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The document's `host_cpu`: the repetitions' median `busy_s` (CPU seconds), their
    `cpus` and `source`; None when a repetition has none."""
    got = [v for v in values if v is not None]
    busy = _median_of(v["busy_s"] for v in got)
    if busy is None or len(got) < len(values):
        return None
    return {**got[0], "busy_s": busy}


def node_stage_figures(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One repetition's copy per node: its ranks, `seconds` (its slowest rank's),
    `copied_bytes` and `MBps` (bytes over those seconds), by node index."""
    out = []
    for node in sorted({r["node"] for r in per_rank}):
        mine = [r for r in per_rank if r["node"] == node]
        seconds = max(r["seconds"] for r in mine)
        nbytes = sum(r["copied_bytes"] for r in mine)
        out.append({"node": node, "name": mine[0].get("node_name") or mine[0]["host"],
                    "host": mine[0]["host"], "ranks": [r["rank"] for r in mine],
                    "seconds": seconds, "copied_bytes": nbytes,
                    "MBps": nbytes / seconds / 1e6 if seconds > 0 else None})
    return out


def _copy_once(plan: _Plan, world: World, repeat: int) -> dict[str, Any]:
    """One repetition: evict the source (unless warm_source), then copy this rank's files, timed.

    A collective. Returns the repetition's figures, the same on every rank. The files
    are handed to the copy threads a window at a time (never a task per file up front).
    """
    cfg, mine = plan.cfg, plan.mine
    cold = _evict_before(plan, world)
    counters, lock = _Counters(), threading.Lock()
    label = "staging" + (f" {repeat + 1}/{cfg.repeat}" if cfg.repeat > 1 else "")
    progress = _Progress(cfg.progress and world.rank == 0, plan.my_bytes,
                         f"{label} (rank 0 of {world.size})" if world.size > 1 else label,
                         log=cfg.log_progress and world.rank == 0)
    pool: _stage_pool.Pool[list[FileEntry]] | None = None
    try:
        error: BaseException | None = (_clear_leftovers(plan, counters) if plan.node_leader
                                       else None)
        fresh = _empty_dir(plan.dest_root)  # nothing staged there: no stat per file
        try:
            if error is None:  # the copy workers start before the window: stage_s times the copy
                pool = _start_workers(plan, lock, fresh, cold.in_copy)
        except Exception as e:
            error = e
        agree(world, error, "starting the copy")  # every rank, or none, copies
        window = _timed_copy(plan, world, pool, counters, lock, progress, fresh, cold.in_copy)
    finally:
        progress.close()
        if pool is not None:
            pool.close()  # after the window, as their start was before it
    rank_s, stage_s, host_cpu, io = window
    counters.evict_s += _drop_pages(plan)  # untimed
    evicted = _evict_report(cold, counters, world)
    gathered = world.allgather(({"rank": world.rank, "node": world.node,
                                 "host": world.hostname, "node_name": world.node_name,
                                 "files": len(mine), "seconds": rank_s, **asdict(counters),
                                 "os_read_bytes": io.read_bytes if io is not None else None,
                                 "os_rchar": io.rchar if io is not None else None}, host_cpu))
    per_rank = [g[0] for g in gathered]
    total = {k: sum(r[k] for r in per_rank) for k in asdict(counters)}
    reads = [r["os_read_bytes"] for r in per_rank]
    stage_bytes = total["copied_bytes"]
    return {"repeat": repeat, "stage_s": stage_s, "stage_bytes": stage_bytes,
            "stage_MBps": stage_bytes / stage_s / 1e6 if stage_s > 0 else None,
            "os_read_bytes": None if None in reads else sum(reads),
            "copied_files": total["copied_files"],
            "host_cpu": gathered[0][1],  # rank 0's host, as train's epochs keep
            # hashing seconds summed over the copy workers, and their share of the workers' time
            "checksum_s": total["checksum_s"] if cfg.verify else None,
            "checksum_share": (total["checksum_s"] / total["copy_s"]
                               if cfg.verify and total["copy_s"] > 0 else None),
            "evict_s": max(r["evict_s"] for r in per_rank),  # the rank's workers', summed
            "source_cache": _source_cache(evicted, cfg.warm_source, cold.in_copy is not None),
            "per_rank": [{k: r[k] for k in ("rank", "node", "node_name", "seconds", "copied_bytes",
                                            "os_read_bytes")} for r in per_rank],
            "per_rank_full": per_rank, "counters": total}


def _timed_copy(plan: _Plan, world: World, pool: _stage_pool.Pool[list[FileEntry]] | None,
                counters: _Counters, lock: threading.Lock, progress: _Progress, fresh: bool,
                source: str | None
                ) -> tuple[float, float, dict[str, Any] | None, procio.IoCounters | None]:
    """The timed window, a collective: every rank's copy of its share, from one barrier to
    the next. This rank's seconds, `stage_s` (the slowest rank's), the host's busy CPU over
    it, and this rank's OS I/O counters over it (None: not counted). Errors are raised on
    every rank."""
    io0 = procio.tree_io() if plan.note is None else None
    world.barrier()
    cpu0 = hostcpu.read()  # the host's busy CPU over stage_s's window (rank 0's is kept)
    t0 = time.perf_counter_ns()
    io = None
    error: BaseException | None = None
    try:
        error, io_end = _copy_share(plan, pool, counters, lock, progress, fresh, source)
        io = io_end - io0 if io0 is not None and io_end is not None else None
    except Exception as e:
        error = e
    rank_s = (time.perf_counter_ns() - t0) / 1e9
    agree(world, error, "staging")
    world.barrier()
    stage_s = (time.perf_counter_ns() - t0) / 1e9  # the slowest rank sets the pace
    return rank_s, stage_s, hostcpu.record(cpu0, hostcpu.read()), io


def _start_workers(plan: _Plan, lock: threading.Lock, fresh: bool, source: str | None
                   ) -> _stage_pool.Pool[list[FileEntry]] | None:
    """This rank's copy worker processes (`_stage_pool`), forked and waiting for batches;
    None with `threads` 1 (this process copies in one thread of its own). `source` as
    `_Local.source`. Forking them costs CPU per worker, not per byte (tens of ms for 16
    on a 2-core host: docs/results.md, section 14), so they start before the timed copy."""
    cfg = plan.cfg
    if cfg.threads == 1:
        return None
    src, dst = plan.source.root, plan.dest_root
    shared = _stage_pool.Shared(cfg.threads)
    worker_local = _Local(fresh, source=source)  # each worker's own copy, from the fork

    def work(batch: list[FileEntry], slot: int) -> dict[str, float]:
        mine = _Counters()
        _stage_batch(batch, src, dst, cfg, mine, lock, _WorkerProgress(shared, slot), worker_local)
        return asdict(mine)

    try:
        return _stage_pool.Pool(cfg.threads, work, shared)
    except OSError as e:  # no fork, no memory, a process limit
        raise StorageError(f"cannot start {cfg.threads} copy worker processes ({e}): lower "
                           "--threads (1 copies in this process)") from e


def _copy_share(plan: _Plan, pool: _stage_pool.Pool[list[FileEntry]] | None,
                counters: _Counters, lock: threading.Lock, progress: _Progress,
                fresh: bool, source: str | None
                ) -> tuple[BaseException | None, procio.IoCounters | None]:
    """Copy this rank's files: in one thread of this process (`pool` None: `threads` 1),
    else in `pool`'s worker processes (`_start_workers`); `source` as `_Local.source`. The
    first error (None when all went well), and the OS's I/O counters of this process and its
    workers at the end (None: not counted)."""
    cfg = plan.cfg
    batches = _batches(plan.mine, batch_files(cfg.threads))
    if pool is None:
        src, dst = plan.source.root, plan.dest_root
        local = _Local(fresh, source=source)
        try:
            error = _copy_all(batches, lambda b: _stage_batch(b, src, dst, cfg, counters, lock,
                                                              progress, local),
                              1, progress.stop)
        finally:
            _end_sync(local)
        return error, procio.tree_io() if plan.note is None else None
    seen = [0]

    def poll() -> None:  # the bar follows the workers' bytes; an interrupt stops them
        done = pool.shared.copied()
        progress.show(done - seen[0])
        seen[0] = done
        if pending():
            pool.shared.stop()
        check()  # an interrupt whose raise Python dropped (in a weakref callback)

    error = pool.run(batches, lambda d: counters.add(**d), poll)
    poll()
    # the workers are still alive: their reads are counted with this process's
    return error, procio.tree_io() if plan.note is None else None


class _WorkerProgress:
    """A worker process's side of `_Progress`: its bytes into the shared array, and where it
    learns to stop (the parent's flag)."""

    def __init__(self, shared: Any, slot: int) -> None:
        self._shared, self._slot = shared, slot

    def advance(self, n: int) -> None:
        if self._shared.stopped:
            raise _Stopped()
        self._shared.add(self._slot, n)


def _empty_dir(path: Path) -> bool:
    """Whether `path` holds nothing (or does not exist)."""
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except (FileNotFoundError, NotADirectoryError):
        return True


def _drop_pages(plan: _Plan) -> float:
    """With --no-fsync, write back and drop the copy's pages after the copy (untimed): the
    copy workers left them dirty, which no advice drops (`_drop`). Seconds taken."""
    if plan.cfg.fsync:
        return 0.0
    t0 = time.perf_counter()
    cache.evict(cache.share_paths(plan.manifest, plan.mine, plan.dest_root))
    return time.perf_counter() - t0


def _clear_leftovers(plan: _Plan, counters: _Counters) -> StorageError | None:
    """Before any rank of the node copies, remove what an interrupted copy on this host left
    (a partial file here is a leftover); the error, if that fails."""
    try:
        counters.removed_partials = _remove_partials(plan.dest_root, plan.manifest,
                                                     socket.gethostname())
    except OSError as e:
        return StorageError(f"cannot clear leftovers of an interrupted copy in "
                            f"{plan.dest_root}: {e.strerror or e}")
    return None


def _copy_all(entries: Iterable[T], copy: Callable[[T], None], threads: int,
              stop: threading.Event) -> BaseException | None:
    """Copy `entries` (files, or batches of them) with `threads` threads; the first error
    (None when all went well).

    At most WINDOW tasks per thread are queued at a time, so a rank's share of a
    10M-file dataset is never a list of futures. After an error (or Ctrl-C) the
    others stop after their current chunk, and nothing more is submitted.
    """
    error: BaseException | None = None
    pending: set[Future[None]] = set()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="stage") as pool:
        try:
            for e in entries:
                check()  # an interrupt whose raise Python dropped (in a weakref callback)
                pending.add(pool.submit(copy, e))
                if len(pending) < WINDOW * threads:
                    continue
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                error = _first_error(done)
                if error is not None:
                    break
            while error is None and pending:  # the last ones, an interrupt checked at each
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                check()
                error = _first_error(done)
        except BaseException:  # Ctrl-C: stop the copies, remove their temporary files
            stop.set()
            for f in pending:
                f.cancel()
            raise
        if error is not None:
            stop.set()  # the others stop after their current chunk
            for f in pending:
                f.cancel()
    return error


def _first_error(done: Iterable[Future[None]]) -> BaseException | None:
    for f in done:
        exc = None if f.cancelled() else f.exception()
        if exc is not None and not isinstance(exc, _Stopped):
            return exc
    return None


def _remove_files(paths: Iterable[str | Path]) -> BaseException | None:
    """Remove files this rank staged (the previous repetition's); the error, if any."""
    try:
        for p in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
    except OSError as e:
        return StorageError(f"cannot remove {e.filename} (staged by the previous repetition) "
                            f"before the next: {e.strerror or e}")
    return None


@dataclass(frozen=True)
class _Cold:
    """How a repetition makes its source cold: the node-wide steps before the copy, and each
    file through the copy's own descriptor (`in_copy`, as `_Local.source`); or a pass over
    every file before the copy (`report`): from a local source (`IN_COPY_KINDS`), and where
    virtual nodes share a host's page cache, so that no node copies while another evicts."""

    opts: cache.EvictOptions
    in_copy: str | None
    node: cache.NodeEviction | None = None
    report: cache.EvictReport | None = None
    seconds: float = 0.0  # the node-wide steps'


# Source kinds (`sysinfo.fs_kind`) whose files are evicted inside the copy, each through the
# copy's own descriptor: there each open is a round trip to servers or a FUSE daemon, and a
# pass of opens before the copy cost more than the copy (GlusterFS, 10,000 files: 86.6 s
# evicting, 2.5 s in the copy). On a local disk the pass is the cheaper one: in the copy the
# eviction cost 11-21 % of the copy's time (docs/results.md, section 13).
IN_COPY_KINDS: frozenset[str] = sysinfo.SHARED_KINDS | {"fuse"}


def _evicts_in_copy(plan: _Plan, world: World) -> bool:
    """Whether each source file is evicted inside the copy (`IN_COPY_KINDS`), as rank 0's
    source's filesystem says, the same on every rank (a collective); a source whose mount
    cannot be found is treated as remote."""
    kind = None
    if world.rank == 0:
        with contextlib.suppress(OSError):  # StorageError is one
            kind = sysinfo.mount_of(plan.source.root).kind
    kind = world.bcast(kind)
    return kind is None or kind in IN_COPY_KINDS


def _evict_before(plan: _Plan, world: World) -> _Cold:
    """The eviction before a repetition's copy (a collective; `_Cold`)."""
    cfg = plan.cfg
    opts = cache.EvictOptions(scope=cfg.shuffle_scope, evict_pages=not cfg.warm_source,
                              loud=False, evict_cmd=cfg.evict_cmd)
    if world.num_hosts < world.num_nodes or not _evicts_in_copy(plan, world):
        return _Cold(opts, None, report=cache.evict_for_node(plan.manifest, world, opts))
    t0 = time.perf_counter()
    node = cache.evict_node_wide(plan.manifest, world, opts)
    return _Cold(opts, "measure" if cfg.warm_source else "evict", node=node,
                 seconds=time.perf_counter() - t0)


def _evict_report(cold: _Cold, counters: _Counters, world: World) -> cache.EvictReport:
    """The repetition's eviction report (a collective): the pass's, or the node-wide steps'
    with what the copy counted of each source file at its open (`_evict_source`); its
    seconds are the node-wide steps' and the per-file eviction's, summed over the
    rank's copy workers."""
    if cold.report is not None:
        return cold.report
    assert cold.node is not None
    c = counters
    ev = cache.EvictResult(c.source_files, c.source_bytes, ()) if cold.in_copy == "evict" \
        else cache.EvictResult(0, 0, ())
    res = cache.Residency(c.source_resident_bytes, c.source_bytes, c.source_unknown_files)
    return cache.eviction_report(cold.node, ev, res, cold.seconds + c.source_evict_s, world,
                                 cold.opts)


def _source_cache(rep: cache.EvictReport, warm: bool, in_copy: bool = False) -> dict[str, Any]:
    """The `source_cache` record of one repetition, from its eviction report; `in_copy`: each
    file was evicted and measured by the copy, through its descriptor, before its read."""
    worst = rep.resident_fraction
    over = [n["name"] for n in rep.per_node
            if n["resident_fraction"] is not None and n["resident_fraction"] > rep.warn_above]
    if warm:
        warning = None if rep.status == "cold" else (
            "WARM SOURCE (--warm-source): the source was not evicted, and "
            + ("its page-cache residency is unknown" if worst is None else
               f"{worst:.0%} of it was in the page cache") + " when the copy started: stage_s "
            "and stage_MBps may measure a copy from memory, not from storage")
    elif rep.status == "unverified":
        warning = (f"SOURCE CACHE UNVERIFIED: the client's pages of the source were evicted, "
                   f"but {rep.reason}. stage_s and stage_MBps may time a copy from server "
                   "memory")
    elif rep.status == "warm":
        why = ("the source is on tmpfs: its data lives in the page cache and cannot be evicted"
               if rep.storage_kind == "memory" else "the filesystem ignored "
               "POSIX_FADV_DONTNEED, or a live process keeps the source files mapped")
        warning = (f"COLD SOURCE FAILED: {worst:.0%} of the source is still in the page cache "
                   f"after eviction on node(s) {over} (threshold {rep.warn_above:.0%}); {why}. "
                   "stage_s and stage_MBps measure a copy from memory, not from storage")
    else:  # unknown residency, or files that could not be evicted
        warning = rep.warning
    return {
        "mode": "warm" if warm else "cold",
        "method": rep.method,  # "none" with --warm-source: residency measured only
        "resident_fraction_at_start": worst,  # worst node; None when a node cannot tell
        "status": rep.status, "warn_above": rep.warn_above, "storage_kind": rep.storage_kind,
        "per_node": [{"node": n["node"], "name": n["name"], "host": n["host"],
                      "files": n["files"],
                      "total_bytes": n["total_bytes"], "resident_bytes": n["resident_bytes"],
                      "unknown_files": n["unknown_files"],
                      "resident_fraction_at_start": n["resident_fraction"]}
                     for n in rep.per_node],
        "warning": warning, "errors": list(rep.errors), "seconds": rep.seconds,
        "fstype": rep.fstype, "reason": rep.reason, "evict_cmd": rep.evict_cmd,
        # "copy": each file evicted (or measured) through the copy's descriptor right before
        # its first read; "pass": a pass over every file before the copy
        "per_file": "copy" if in_copy else "pass",
    }


def _merge_source_cache(caches: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's `source_cache`: the worst repetition on each count (the only one when N=1)."""
    if len(caches) == 1:
        return caches[0]

    def worse(a: float | None, b: float | None) -> bool:  # unknown counts as the worst
        return b is not None and (a is None or a > b)

    fracs = [c["resident_fraction_at_start"] for c in caches]
    statuses = {c["status"] for c in caches}
    nodes: dict[int, dict[str, Any]] = {}
    for c in caches:
        for n in c["per_node"]:
            old = nodes.get(n["node"])
            if old is None or worse(n["resident_fraction_at_start"],
                                    old["resident_fraction_at_start"]):
                nodes[n["node"]] = n
    where: dict[str, list[int]] = {}  # the same warning once, with the repetitions it hit
    for k, c in enumerate(caches):
        if c["warning"]:
            where.setdefault(c["warning"], []).append(k + 1)
    warnings = [f"repetition(s) {', '.join(map(str, ks))} of {len(caches)}: {w}"
                for w, ks in where.items()]
    return {**caches[0],
            "resident_fraction_at_start": None if None in fracs else max(fracs),
            "status": next(s for s in ("warm", "unknown", "unverified", "cold")
                           if s in statuses),
            "per_node": [nodes[k] for k in sorted(nodes)],
            "warning": "; ".join(warnings) if warnings else None,
            "errors": [e for c in caches for e in c["errors"]],
            "seconds": sum(c["seconds"] for c in caches)}


def _write_dest_manifest(plan: _Plan, world: World) -> None:
    """The full manifest (loaders need every file's sample range), marked as staged."""
    cfg, manifest, ranks = plan.cfg, plan.manifest, plan.ranks
    present: list[str] | dict[str, Any] | None = None  # in shard mode only these are here
    if cfg.mode == "shard" and manifest.compact is not None:  # the rule, not the list
        present = {"data_files_of_ranks": list(ranks), "world_size": world.size,
                   "rule": "sampling.files_for_rank", "aux": [e.path for e in manifest.aux_files]}
    elif cfg.mode == "shard":
        present = [e.path for e in cache.files_for_node(manifest, ranks, world.size, "local")]
    extra = dict(manifest.extra)
    extra["staged"] = {
        "mode": cfg.mode, "shuffle_scope": cfg.shuffle_scope, "from": str(plan.source.root),
        "world_size": world.size, "num_nodes": world.num_nodes, "node": world.node,
        # in shard mode only these files are here: the ranks listed read nothing else
        "files_present": present,
        "ranks": list(ranks),
    }
    import dataclasses

    staged = dataclasses.replace(manifest, extra=extra, root=None)
    staged.write(plan.dest_root, indent=None)  # one line: a tenth of the time for 20k files


# what a training run records of the staging that preceded it (the result's `staging`)
STAGING_KEYS = ("stage_s", "stage_bytes", "stage_MBps", "os_read_bytes", "os_read_bytes_note",
                "source_cache", "mode", "shuffle_scope", "from", "to", "copied_files",
                "skipped_files", "skipped_bytes", "verified", "verify", "checksum_s",
                "checksum_share", "evict_s", "dataset_bytes", "per_node", "slowest_node",
                "warnings")


def stage_copy(source: DatasetRef, dest: str | Path, mode: str, world: World, *,
               progress: bool = False, warm_source: bool = False, evict_cmd: str | None = None,
               warm_cache: bool = False, log_progress: bool = False
               ) -> tuple[DatasetRef, dict[str, Any]]:
    """For `iobench train --stage-to DIR2`: stage `source` to DIR2; return the staged copy
    (this node's) and the result's `staging` section.

    The section holds stage_s, stage_bytes, stage_MBps, os_read_bytes,
    source_cache, mode, shuffle_scope and the tiers. The source is evicted before
    the copy unless `warm_source`. In `shard` mode the loaders must read with
    `scope="local"` (`staging["shuffle_scope"]`). A collective: every rank calls
    it, and a failure is raised on every rank (marked as agreed, so the CLI
    prints it once). `warm_cache` is the training run's: staging would warm it.
    """
    cfg = error = None
    try:
        cfg = StageConfig(dataset=source.dataset, format=source.format,
                          source=Path(source.storage), dest=Path(dest), mode=parse_mode(mode),
                          progress=progress, log_progress=log_progress,
                          warm_source=warm_source, evict_cmd=evict_cmd, sync="fs")
        if warm_cache:
            raise ConfigError("--stage-to with --warm-cache: staging reads the whole dataset "
                              "once, which would warm the cache; drop one of them")
    except IobenchError as e:
        error = e
    try:
        agree(world, error, "staging")  # no rank enters the copy while another has failed
        assert cfg is not None
        plan, doc = _stage(cfg, world, source)
        copy = plan.dest_root.resolve()
        staged = load_ref(copy, str(copy.parent))
    except IobenchError as e:
        e.agreed = True  # every rank raised it
        raise
    staging = {k: doc[k] for k in STAGING_KEYS}
    # needs an epoch time from the source tier, i.e. another run: `iobench report` pairs them
    staging["break_even_epochs"] = None
    return staged, staging


def stage_for_training(config: Any, dest: str | Path, mode: str, world: World,
                       progress: bool = False, warm_source: bool = False,
                       evict_cmd: str | None = None) -> tuple[Any, dict[str, Any]]:
    """`stage_copy` of a training config's dataset (resolved once, here); returns the config
    pointing at the staged copy, and the result's `staging` section."""
    import dataclasses

    from iobench.core.dataref import resolve

    source = error = None
    try:
        source = resolve(config, world)
    except IobenchError as e:
        error = e
    agree(world, error, "staging")
    assert source is not None
    staged, staging = stage_copy(source, dest, mode, world, progress=progress,
                                 warm_source=warm_source, evict_cmd=evict_cmd,
                                 warm_cache=config.warm_cache)
    return dataclasses.replace(config, storage=staged.storage), staging


@dataclass(frozen=True)
class StageOutcome:
    """What `iobench stage` did: the staging document (every rank), and where rank 0 wrote it."""

    doc: dict[str, Any]
    path: Path | None  # None on other ranks


def run_stage(cfg: StageConfig, world: World, results: str | Path,
              source: DatasetRef | None = None) -> StageOutcome:
    """`iobench stage`: stage the dataset (a collective; torch.distributed set up for it
    under torchrun), then rank 0 writes the staging result into `results`."""
    from iobench.core.results import write_document

    torchrun = world.launcher == "torchrun" and world.size > 1
    if torchrun:  # collectives go through torch.distributed there (gloo: CPU only)
        from iobench.core import distributed

        distributed.init_process_group(world, False)
    try:
        doc = stage_dataset(cfg, world, source)
    finally:
        if torchrun:
            distributed.destroy_process_group()
    path = write_document(doc, results, "stage") if world.rank == 0 else None
    return StageOutcome(doc, path)
