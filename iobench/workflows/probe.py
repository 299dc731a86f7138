"""Characterise a storage tier, cold cache: the physical limits next to what loaders reach.

`probe_storage(config)` measures, in a scratch directory under the tier:
sequential write and read bandwidth, random read bandwidth and IOPS at
4 KiB and at the dataset's sample size, each with 1 and several concurrent
readers (synchronous reads, one file per reader: the same model as loader
workers), the sample sizes again read through the page cache as loaders read
them (buffered, samples back to back, at the loaders' reader counts: the
rate and the bytes the client fetched per read, which `iobench project`
takes as the tier's request rate), metadata rates (create, stat, open+stat+close, open+read+close,
unlink of small files) and first-byte latency (open to the first byte of a
cold small file). It uses `fio` (JSON output) when installed, and its own
measurement otherwise; the result says which. Reads bypass the page cache with
O_DIRECT where the filesystem allows it, else the files are evicted first and
read once (never twice, so no read is served from memory). On a shared tier a
client cannot empty the servers' caches: `evict_cmd` (the site's command) runs
before every read test, and without it the probe says its buffered figures
are unverified. Metadata is always measured by iobench itself (fio has no
portable metadata test). The result carries the emulated-tier profile derived
from these figures (`iobench.pfs.profiles.profile_from_probe`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import mmap
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from iobench.core import cache
from iobench.core.errors import ConfigError, StorageError, UnsupportedError
from iobench.core.launch import capture
from iobench.core.results import PROBE_SCHEMA, PROBE_SCHEMA_VERSION
from iobench.core.threads import run_threads

if TYPE_CHECKING:
    from iobench.core.sysinfo import MountInfo

SCHEMA, SCHEMA_VERSION = PROBE_SCHEMA, PROBE_SCHEMA_VERSION  # iobench.core.results says each version
ENGINES = ("auto", "fio", "python")
ENGINE_ENV = "IOBENCH_PROBE_ENGINE"  # "python" forces iobench's own measurement (CI, tests)
KiB, MiB = 2**10, 2**20
SEQ_BS = 4 * MiB
ALIGN = 4 * KiB  # O_DIRECT needs block-aligned sizes and offsets
BUFREAD = "bufread"  # the op of the buffered random reads (`buffered_tests`)
# the buffered reads stop after this share of a file's samples: the opening of a cold pass,
# where a read's pages are rarely fetched yet (later reads find them so: the model's k)
BUFREAD_SHARE = 0.1
IMAGENET_MEAN_JPEG = 110_000  # bytes: ILSVRC-2012 train mean, when no dataset is at hand
# FUSE clients keep names and attributes 1 s by default (GlusterFS's entry-timeout): the cold
# opens wait that out after creating the files, as an epoch opens each file once
NAME_CACHE_SETTLE_S = 1.5
FIO_OUTPUT_BYTES = 1 * MiB  # fio's JSON report of one group is a few KB: room enough
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from `123`, `4k`, `16M`, `1.5G`, `2GiB` (binary multiples)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ConfigError(f"size {text!r} is not a size; write e.g. 4096, 64k, 256M or 2G")
    mult = {"": 1, "k": KiB, "m": MiB, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def parse_readers(text: str | tuple[int, ...]) -> tuple[int, ...]:
    """`1,4` -> (1, 4): reader counts, each >= 1, sorted, distinct."""
    try:
        vals = tuple(int(x) for x in text.split(",")) if isinstance(text, str) else tuple(text)
    except ValueError:
        raise ConfigError(f"readers {text!r}: give counts separated by commas, e.g. 1,4") from None
    if not vals or min(vals) < 1 or max(vals) > 256:
        raise ConfigError(f"readers {text!r}: each count must be in [1, 256]")
    return tuple(sorted(set(vals)))


@dataclass(frozen=True)
class ProbeConfig:
    """What to measure where. Sizes in bytes, times in seconds."""

    storage: Path
    file_bytes: int = 256 * MiB  # per reader: one file each
    readers: tuple[int, ...] = (1, 4)
    runtime_s: float = 2.0  # upper bound per test
    # random reads at datasets' sample sizes (bytes); the first is the headline
    sample_bytes: int | tuple[int, ...] = IMAGENET_MEAN_JPEG
    metadata_files: int = 1000
    engine: str = "auto"
    direct: bool | None = None  # None: O_DIRECT where the filesystem allows it
    seed: int = 0
    label: str | None = None  # the tier's name in reports (default: its filesystem kind)
    # a writable directory that appears as `storage` (the backing directory of a read-only
    # mount such as `iobench emulate-pfs`): files are written there and read through `storage`
    write_via: Path | None = None
    evict_cmd: str | None = None  # the site's command emptying server caches, before reads
    # reader counts of the buffered random reads (the loaders' concurrency); None: `readers`
    buffered_readers: tuple[int, ...] | None = None

    @property
    def buffered_counts(self) -> tuple[int, ...]:
        """`buffered_readers` as a tuple (which `__post_init__` makes it)."""
        return self.buffered_readers or self.readers

    @property
    def files(self) -> int:
        """Readers' files the probe writes: one per reader of its largest count."""
        return max(self.readers + self.buffered_counts)

    @property
    def sample_sizes(self) -> tuple[int, ...]:
        """`sample_bytes` as a tuple (which `__post_init__` makes it)."""
        s = self.sample_bytes
        return (s,) if isinstance(s, int) else s

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage", Path(self.storage))
        cache.parse_evict_cmd(self.evict_cmd)
        if self.write_via is not None:
            object.__setattr__(self, "write_via", Path(self.write_via))
        object.__setattr__(self, "readers", parse_readers(self.readers))
        object.__setattr__(self, "buffered_readers", parse_readers(
            self.readers if self.buffered_readers is None else self.buffered_readers))
        if self.engine not in ENGINES:
            raise ConfigError(f"engine {self.engine!r}; choose one of: {', '.join(ENGINES)}")
        if self.file_bytes < SEQ_BS:
            raise ConfigError(f"file size {self.file_bytes} bytes is below {SEQ_BS} (4 MiB); "
                              "give --size 4M or more")
        # whole 4 MiB blocks: sequential I/O (O_DIRECT too) never writes a partial block
        object.__setattr__(self, "file_bytes", self.file_bytes // SEQ_BS * SEQ_BS)
        if not 0 < self.runtime_s <= 3600:
            raise ConfigError(f"runtime {self.runtime_s} s must be in (0, 3600]")
        sizes = ((self.sample_bytes,) if isinstance(self.sample_bytes, int)
                 else tuple(dict.fromkeys(int(x) for x in self.sample_bytes)))
        object.__setattr__(self, "sample_bytes", sizes)
        if not sizes or not all(1 <= x <= self.file_bytes for x in sizes):
            raise ConfigError(f"sample sizes {list(sizes)} must be in [1, file size "
                              f"{self.file_bytes}]")
        if self.metadata_files < 1:
            raise ConfigError(f"metadata files {self.metadata_files} must be >= 1")


def sample_size_for(dataset: str, storage: str | Path | None = None) -> int:
    """Mean stored bytes per sample of `dataset`: from a manifest under `storage` if one
    exists there, else from the dataset table (ImageNet JPEGs: 110 kB, the ILSVRC mean)."""
    from iobench.core.datasets import dataset_dirname, parse_dataset
    from iobench.core.formats import FORMATS
    from iobench.core.manifest import Manifest

    spec = parse_dataset(dataset)
    if storage is not None:
        for fmt in FORMATS:
            root = Path(storage) / dataset_dirname(dataset, fmt)
            if (root / "iobench.json").is_file():
                m = Manifest.load(root)
                data = m.data_bytes
                if m.num_samples and data:
                    return max(1, data // m.num_samples)
    return spec.sample_nbytes or IMAGENET_MEAN_JPEG


def fio_path() -> str | None:
    return shutil.which("fio")


def choose_engine(requested: str) -> str:
    """`fio` when installed (unless forced otherwise by option or $IOBENCH_PROBE_ENGINE)."""
    forced = os.environ.get(ENGINE_ENV)
    if forced:
        if forced not in ENGINES:
            raise ConfigError(f"${ENGINE_ENV}={forced!r}; choose one of: {', '.join(ENGINES)}")
        requested = forced if requested == "auto" else requested
    if requested == "fio" and fio_path() is None:
        raise UnsupportedError("--engine fio: fio is not installed (apt-get install fio, or "
                               "scripts/install-system-deps.sh); --engine python measures "
                               "without it")
    if requested == "auto":
        return "fio" if fio_path() else "python"
    return requested


def supports_direct(directory: Path, read_directory: Path | None = None) -> bool:
    """Whether files can be written with O_DIRECT in `directory` and read with O_DIRECT
    there (or through `read_directory`, where the same files appear)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    name = f".iobench-odirect-{os.getpid()}"
    path = directory / name
    buf = mmap.mmap(-1, ALIGN)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
        try:
            os.pwritev(fd, [buf], 0)
        finally:
            os.close(fd)
        fd = os.open((read_directory or directory) / name, os.O_RDONLY | os.O_DIRECT)
        try:
            os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        buf.close()


@dataclass
class TestResult:
    """One bandwidth/IOPS test: `op` is write, read or randread; bytes and seconds are totals."""

    name: str
    op: str
    bs_bytes: int
    readers: int
    bytes: int
    seconds: float
    MBps: float
    iops: float
    engine: str
    direct: bool
    note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _result(name: str, op: str, bs: int, n: int, nbytes: int, ops: int, seconds: float,
            engine: str, direct: bool, note: str | None = None) -> TestResult:
    s = max(seconds, 1e-9)
    return TestResult(name, op, bs, n, nbytes, seconds, nbytes / s / 1e6, ops / s, engine,
                      direct, note)


# ----------------------------------------------------------------- iobench's own engine

def _parallel(n: int, fn: Callable[[int], tuple[int, int]]) -> tuple[int, int, float]:
    """Run fn(i) in n threads started together; (bytes, ops, wall seconds)."""
    out, seconds = run_threads(n, fn)
    return sum(b for b, _ in out), sum(o for _, o in out), seconds


def _site_evict(cfg: ProbeConfig) -> None:
    """Run the site's eviction command (server caches) before a read test; fail in one line."""
    if cfg.evict_cmd is None:
        return
    r = cache.run_evict_cmd(cfg.evict_cmd, cfg.storage, 0)
    if r["returncode"] != 0:
        raise StorageError(f"--evict-cmd {cfg.evict_cmd!r} failed ({r['output'] or 'no output'})"
                           "; fix the command or leave it out")


class _PyEngine:
    def __init__(self, cfg: ProbeConfig, work: Path, read_work: Path, direct: bool) -> None:
        self.cfg, self.work, self.read_work, self.direct = cfg, work, read_work, direct

    def path(self, i: int, read: bool = True) -> Path:
        return (self.read_work if read else self.work) / f"probe.{i}"

    def _open(self, i: int, flags: int) -> int:
        read = flags & (os.O_WRONLY | os.O_RDWR) == 0
        return os.open(self.path(i, read), flags | (os.O_DIRECT if self.direct else 0), 0o600)

    def write(self, n: int) -> TestResult:
        cfg = self.cfg
        pattern = np.random.default_rng(cfg.seed).integers(0, 256, SEQ_BS, np.uint8).tobytes()

        def one(i: int) -> tuple[int, int]:
            buf = mmap.mmap(-1, SEQ_BS)
            buf.write(pattern)
            fd = self._open(i, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            done = ops = 0
            try:
                # like fio: at most the runtime (the files are completed untimed afterwards)
                while done < cfg.file_bytes and time.perf_counter_ns() < deadline[0]:
                    done += os.pwritev(fd, [buf], done)
                    ops += 1
                os.fsync(fd)  # bandwidth to the device, not to the page cache
            finally:
                os.close(fd)
                buf.close()
            return done, ops

        deadline = [time.perf_counter_ns() + int(cfg.runtime_s * 1e9)]
        b, o, s = _parallel(n, one)
        return _result(f"seq_write_{n}", "write", SEQ_BS, n, b, o, s, "python", self.direct,
                       "each writer writes its own file, fsync at the end (timed)")

    def _prepare_read(self, n: int) -> None:
        _site_evict(self.cfg)  # a server may answer even O_DIRECT reads from its memory
        if not self.direct:
            cache.evict([self.path(i) for i in range(n)])

    def read(self, n: int) -> TestResult:
        cfg = self.cfg
        self._prepare_read(n)
        deadline = [0]

        def one(i: int) -> tuple[int, int]:
            buf = mmap.mmap(-1, SEQ_BS)
            fd = self._open(i, os.O_RDONLY)
            done = ops = off = 0
            try:
                if not self.direct:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                while time.perf_counter_ns() < deadline[0]:
                    k = os.preadv(fd, [buf], off)
                    if k <= 0:
                        if not self.direct:
                            break  # a second pass would read the page cache
                        off = 0
                        continue
                    done, ops, off = done + k, ops + 1, off + k
            finally:
                os.close(fd)
                buf.close()
            return done, ops

        deadline[0] = time.perf_counter_ns() + int(cfg.runtime_s * 1e9) + 10**8
        b, o, s = _parallel(n, one)
        return _result(f"seq_read_{n}", "read", SEQ_BS, n, b, o, s, "python", self.direct)

    def randread(self, n: int, bs: int, tag: str) -> TestResult:
        self._prepare_read(n)
        b, o, s = self._random_reads(n, bs, bs, advise_random=not self.direct)
        return _result(f"randread_{tag}_{n}", "randread", bs, n, b, o, s, "python", self.direct)

    def bufread(self, n: int, sample: int, tag: str) -> TestResult:
        """Random `sample`-byte reads through the page cache, as the loaders read a container
        of packed samples (no O_DIRECT, no fadvise): cold (the site's command run, the files
        evicted), samples back to back, each once in a random order, the first
        `BUFREAD_SHARE` of them (the opening of a cold pass). `bs_bytes` is what the
        client fetched per read (the files' resident bytes afterwards over the reads: the
        pages neighbouring samples share and any read-ahead), the request the tier serves;
        the page-rounded sample where the kernel cannot tell residency."""
        _site_evict(self.cfg)
        paths = [self.path(i) for i in range(n)]
        cache.evict(paths)
        b, o, s = self._random_reads(n, sample, sample, advise_random=False, direct=False,
                                     share=BUFREAD_SHARE)
        fetched = cache.residency(paths)
        if fetched.fraction is not None and o > 0:
            request, how = max(sample, round(fetched.resident_bytes / o)), "measured"
        else:
            request, how = -(-sample // ALIGN) * ALIGN, "assumed: the sample in whole pages"
        r = _result(f"bufread_{tag}_{n}", BUFREAD, request, n, b, o, s, "python", False,
                    f"{sample}-byte samples back to back, at most {BUFREAD_SHARE:.0%} of them, "
                    "each read once in a random order through the page cache, cold; "
                    f"bs_bytes: bytes fetched per read ({how})")
        r.extra = {"sample_bytes": sample, "resident_bytes": fetched.resident_bytes,
                   "request_bytes_from": how}
        return r

    def _random_reads(self, n: int, block: int, nbytes: int, advise_random: bool,
                      direct: bool | None = None, share: float = 1.0
                      ) -> tuple[int, int, float]:
        """`n` threads reading `nbytes` at the start of each `block` of their file in a
        random order, each block once (a buffered re-read would hit the page cache), for at
        most the runtime and `share` of the blocks: (bytes, reads, wall seconds)."""
        cfg = self.cfg
        slots = cfg.file_bytes // block
        last = max(1, int(slots * share))
        flags = os.O_RDONLY | (os.O_DIRECT if (self.direct if direct is None else direct)
                               else 0)
        deadline = [0]

        def one(i: int) -> tuple[int, int]:
            order = np.random.default_rng([cfg.seed, i, block]).permutation(slots)[:last] * block
            buf = mmap.mmap(-1, max(block, ALIGN))
            view = memoryview(buf)[:nbytes]
            fd = os.open(self.path(i), flags)
            done = ops = 0
            try:
                if advise_random:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                for off in order.tolist():
                    if ops & 31 == 0 and time.perf_counter_ns() >= deadline[0]:
                        break
                    done += os.preadv(fd, [view], off)
                    ops += 1
            finally:
                os.close(fd)
                view.release()
                buf.close()
            return done, ops

        deadline[0] = time.perf_counter_ns() + int(cfg.runtime_s * 1e9)
        return _parallel(n, one)


# ----------------------------------------------------------------------------- fio engine

class _FioEngine:
    def __init__(self, cfg: ProbeConfig, work: Path, read_work: Path, direct: bool) -> None:
        self.cfg, self.work, self.read_work, self.direct = cfg, work, read_work, direct
        self.exe = fio_path() or "fio"

    def _run(self, name: str, rw: str, bs: int, n: int, op: str) -> TestResult:
        cfg = self.cfg
        where = self.work if rw == "write" else self.read_work
        args = [self.exe, "--output-format=json", f"--name={name}", f"--directory={where}",
                "--filename_format=probe.$jobnum", f"--numjobs={n}", "--group_reporting",
                f"--size={cfg.file_bytes}", f"--bs={bs}", f"--rw={rw}", "--ioengine=psync",
                f"--direct={int(self.direct)}", f"--runtime={max(1, int(cfg.runtime_s * 1000))}ms",
                f"--randseed={cfg.seed + 1}"]
        if rw == "write":
            args += ["--end_fsync=1"]
        else:
            _site_evict(cfg)  # a server may answer even O_DIRECT reads from its memory
            # O_DIRECT re-reads still go to the device; buffered: evicted, each block read once
            args += ["--time_based" if self.direct else "--invalidate=1", "--readonly"]
        limit_s = cfg.runtime_s * 10 + 300  # fio's own runtime, its file layout, the fsync
        proc = capture(args, limit_s, keep_bytes=FIO_OUTPUT_BYTES)
        if proc.timed_out:
            raise StorageError(f"fio did not finish {name} on {where} in {limit_s:g} s; the "
                               "storage may hang; --engine python measures without fio")
        if not proc.ok:
            raise StorageError(f"fio failed on {name} in {where}: "
                               f"{proc.last_line() or f'exit status {proc.code}'}; --engine "
                               "python measures without fio")
        if "{" not in proc.stdout or proc.truncated:
            raise StorageError(f"fio printed no JSON report for {name} in {where}: "
                               f"{proc.last_line() or 'no output'}; --engine python measures "
                               "without fio")
        text = proc.stdout[proc.stdout.index("{"):]  # fio may print notes before the JSON
        job = json.loads(text)["jobs"][0]
        side = job["write" if rw == "write" else "read"]
        seconds = side["runtime"] / 1e3
        r = _result(name, op, bs, n, int(side["io_bytes"]), int(side["total_ios"]), seconds,
                    "fio", self.direct)
        # fio's own figures (its clock): keep them next to ours
        r.extra = {"fio_bw_bytes": side["bw_bytes"], "fio_iops": side["iops"],
                   "clat_ns_mean": side.get("clat_ns", {}).get("mean"),
                   "clat_ns_p99": side.get("clat_ns", {}).get("percentile", {}).get("99.000000")}
        return r

    def write(self, n: int) -> TestResult:
        r = self._run(f"seq_write_{n}", "write", SEQ_BS, n, "write")
        r.note = "each writer writes its own file, fsync at the end (timed)"
        return r

    def read(self, n: int) -> TestResult:
        return self._run(f"seq_read_{n}", "read", SEQ_BS, n, "read")

    def randread(self, n: int, bs: int, tag: str) -> TestResult:
        return self._run(f"randread_{tag}_{n}", "randread", bs, n, "randread")


def fio_version() -> str | None:
    exe = fio_path()
    if exe is None:
        return None
    r = capture([exe, "--version"], 30)
    return (r.stdout.strip() or None) if r.ok else None


# ------------------------------------------------------------------------------- metadata

def metadata_rates(work: Path, files: int, threads: int, size: int = 4 * KiB,
                   read_work: Path | None = None,
                   evict: Callable[[], None] | None = None) -> dict[str, Any]:
    """Create, stat, open+stat+close, open+read+close, unlink `files` small files with
    `threads` threads, and the first-byte latency of the cold reads.

    Rates are operations per second over the wall time of each phase, in this
    order: create; open+read+close of the files, evicted (and `evict()`, the
    site's command, run) and after FUSE clients' name caches expired
    (`NAME_CACHE_SETTLE_S`), as an epoch opens each file once; then
    open+stat+close (what Python's `open()` costs before the first read) and
    stat, whose names and attributes the client may have cached by then (only
    dropping the node's caches clears inodes and dentries), so these two are
    upper bounds on a cold metadata server; unlink. Latencies of the
    open+read+close phase, in milliseconds, percentiles over the files: the
    first byte (from `open()` to the first byte), and apart the cold open (name
    lookup and open), the first read and the close. With `read_work` (where `work`
    appears through another mount), stat, open+stat+close and open+read+close
    go through it; create and unlink through `work`.
    """
    run = _SmallFiles(work, files, threads, size, read_work)
    out: dict[str, Any] = {"threads": threads, "files": files, "file_bytes": size}
    out["create_per_s"] = run.rate(run.create)
    os.sync()  # the files' data is on the device before it is evicted and read back
    if evict is not None:
        evict()
    cache.evict(p for d in run.rdirs for p in d.iterdir())
    time.sleep(NAME_CACHE_SETTLE_S)
    out["open_read_close_per_s"] = run.rate(run.open_read_close, through_read=True)
    out["open_stat_close_per_s"] = run.rate(_open_stat_close, through_read=True)
    out["stat_per_s"] = run.rate(_stat, through_read=True)
    out.update(run.latencies())
    out["unlink_per_s"] = run.rate(_unlink)
    shutil.rmtree(run.base, ignore_errors=True)
    return out


class _SmallFiles:
    """The metadata test's small files: one directory per thread (`dirs`, seen through
    `read_work` as `rdirs`), and the open+read+close latencies the threads measured."""

    def __init__(self, work: Path, files: int, threads: int, size: int,
                 read_work: Path | None) -> None:
        self.base = work / f"meta-{threads}"
        self.base.mkdir()
        self.threads, self.size = threads, size
        self.per = [files // threads + (1 if i < files % threads else 0) for i in range(threads)]
        self.payload = os.urandom(size)
        self.dirs = [self.base / f"t{i}" for i in range(threads)]
        for d in self.dirs:
            d.mkdir()
        self.rdirs = [(read_work or work) / d.relative_to(work) for d in self.dirs]
        # per thread (each reads its own directory, so no lock): open, first read, close, ns
        self.times: list[list[tuple[int, int, int]]] = [[] for _ in range(threads)]

    def rate(self, fn: Callable[[Path], int], through_read: bool = False) -> float:
        """Operations per second of `fn` over every file, the threads together."""
        where = self.rdirs if through_read else self.dirs

        def one(i: int) -> tuple[int, int]:
            n = 0
            for k in range(self.per[i]):
                n += fn(where[i] / f"f{k:07d}")
            return n, self.per[i]

        _nbytes, ops, seconds = _parallel(self.threads, one)
        return ops / seconds

    def create(self, p: Path) -> int:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            return os.write(fd, self.payload)
        finally:
            os.close(fd)

    def open_read_close(self, p: Path) -> int:
        t0 = time.perf_counter_ns()
        fd = os.open(p, os.O_RDONLY)
        t1 = time.perf_counter_ns()
        try:
            n = len(os.read(fd, self.size))
        finally:
            t2 = time.perf_counter_ns()
            os.close(fd)
        self.times[int(p.parent.name[1:])].append((t1 - t0, t2 - t1,
                                                   time.perf_counter_ns() - t2))
        return n

    def latencies(self) -> dict[str, dict[str, float] | None]:
        """Percentiles (milliseconds) of the open+read+close phase's parts."""
        ms = np.array([x for t in self.times for x in t], dtype=np.float64).reshape(-1, 3) / 1e6
        return {"first_byte_ms": _percentiles(ms[:, 0] + ms[:, 1]),  # open() to the first byte
                "cold_open_ms": _percentiles(ms[:, 0]),  # name lookup and open
                "cold_read_ms": _percentiles(ms[:, 1]),  # the first read of a cold small file
                "close_ms": _percentiles(ms[:, 2])}


def _stat(p: Path) -> int:
    os.stat(p)
    return 0


def _open_stat_close(p: Path) -> int:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fstat(fd)
    finally:
        os.close(fd)
    return 0


def _unlink(p: Path) -> int:
    os.unlink(p)
    return 0


def _percentiles(a: np.ndarray) -> dict[str, float] | None:
    return ({"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
             "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "n": int(a.size)}
            if a.size else None)


# ----------------------------------------------------------------------------------- probe

def _complete_files(work: Path, n: int, size: int) -> None:
    """Extend the readers' files to `size` bytes (untimed; fio stops writing at --runtime)."""
    block = os.urandom(SEQ_BS)
    for i in range(n):
        path = work / f"probe.{i}"
        with open(path, "ab") as f:
            have = f.tell()
            while have < size:
                have += f.write(block[:size - have])
            f.flush()
            os.fsync(f.fileno())


def _check_storage(storage: Path, need: int) -> None:
    if not storage.is_dir():
        raise StorageError(f"--storage {storage} is not a directory; give an existing directory "
                           "on the tier to measure")
    if not os.access(storage, os.W_OK | os.X_OK):
        raise StorageError(f"--storage {storage} is not writable; probe writes scratch files "
                           "there (and removes them)")
    st = os.statvfs(storage)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise StorageError(f"not enough space in {storage}: probe needs {need / 1e9:.2f} GB, "
                           f"{free / 1e9:.2f} GB are free; give a smaller --size or fewer "
                           "--readers")


def probe_storage(cfg: ProbeConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every test on `cfg.storage`; return the `iobench.probe` v1 document.

    Scratch files live in a hidden directory under the storage and are
    removed afterwards, also on failure or interruption.
    """
    from iobench.core.sysinfo import mount_of

    log = log or (lambda _msg: None)
    if not cfg.storage.is_dir():
        raise StorageError(f"--storage {cfg.storage} is not a directory; give an existing "
                           "directory on the tier to measure")
    writable = cfg.write_via or cfg.storage
    _check_storage(writable, cfg.files * cfg.file_bytes + cfg.metadata_files * 8 * KiB)
    engine = choose_engine(cfg.engine)
    mount = mount_of(cfg.storage)
    work = Path(tempfile.mkdtemp(prefix=f".iobench-probe-{socket.gethostname()}-",
                                 dir=writable))
    read_work = cfg.storage / work.name if cfg.write_via else work
    try:
        run = _setup(cfg, mount, work, read_work)
        eng = (_FioEngine if engine == "fio" else _PyEngine)(cfg, work, read_work, run.direct)
        run.tests = _bandwidth_tests(cfg, eng, work, run.block, log)
        run.buffered = _buffered_tests(cfg, _PyEngine(cfg, work, read_work, False), log)
        for n in cfg.readers:
            log(f"metadata: {cfg.metadata_files} small files, {n} thread(s)")
            run.meta.append(metadata_rates(work, cfg.metadata_files, n, read_work=read_work,
                                           evict=lambda: _site_evict(cfg)))
    except (StorageError, UnsupportedError):
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageError(f"out of space in {cfg.storage} while probing; give a smaller "
                               "--size") from e
        raise StorageError(f"probe failed on {cfg.storage}: {e.strerror or e}") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _document(cfg, engine, mount, run)


@dataclass
class _ProbeRun:
    """What one probe found: its read mode, block sizes, tests and notes."""

    direct: bool
    block: dict[int, int]  # sample size -> the block size its reads use
    warnings: list[str]
    notes: list[str]
    tests: list[TestResult] = field(default_factory=list)
    buffered: list[TestResult] = field(default_factory=list)  # through the page cache
    meta: list[dict[str, Any]] = field(default_factory=list)


def _setup(cfg: ProbeConfig, mount: MountInfo, work: Path, read_work: Path) -> _ProbeRun:
    """Whether reads bypass the page cache, and the block size of each sample size's reads."""
    if not read_work.is_dir():
        raise ConfigError(f"--write-via {cfg.write_via} does not appear as --storage "
                          f"{cfg.storage} (no {read_work}); give the directory that backs "
                          "the storage mount")
    can_direct = supports_direct(work, read_work)
    direct = can_direct if cfg.direct is None else cfg.direct
    if direct and not can_direct:
        raise UnsupportedError(f"{cfg.storage} ({mount.fstype}) does not allow O_DIRECT; "
                               "leave out --direct (files are then evicted and read once)")
    warnings = []
    if mount.kind == "memory":
        warnings.append(f"{cfg.storage} is {mount.fstype}: its data lives in memory, so "
                        "these figures are memory bandwidth, not storage")
    block = {s: -(-s // ALIGN) * ALIGN if direct else s for s in cfg.sample_sizes}
    notes = [f"O_DIRECT needs aligned reads: {s}-byte sample reads use {bs} bytes (rounded up "
             "to 4 KiB)" for s, bs in block.items() if bs != s]
    return _ProbeRun(direct, block, warnings, notes)


def _bandwidth_tests(cfg: ProbeConfig, eng: _PyEngine | _FioEngine, work: Path,
                     block: dict[int, int], log: Callable[[str], None]) -> list[TestResult]:
    """Sequential write and read, random 4 KiB and sample-size reads, each reader count."""
    tests: list[TestResult] = []

    def measure(what: str, fn: Callable[[], TestResult]) -> None:
        log(what)
        tests.append(fn())
        log(f"  {tests[-1].MBps:.1f} MB/s, {tests[-1].iops:.0f} IOPS")

    for n in cfg.readers:
        measure(f"sequential write, {n} writer(s)", functools.partial(eng.write, n))
    # a time-capped fio write leaves them short
    _complete_files(work, cfg.files, cfg.file_bytes)
    for n in cfg.readers:
        measure(f"sequential read, {n} reader(s)", functools.partial(eng.read, n))
    for n in cfg.readers:
        measure(f"random 4 KiB reads, {n} reader(s)",
                functools.partial(eng.randread, n, 4 * KiB, "4k"))
    for s, bs in block.items():
        for n in cfg.readers:
            measure(f"random {bs}-byte reads, {n} reader(s)",
                    functools.partial(eng.randread, n, bs, f"{s}B"))
    return tests


def _buffered_tests(cfg: ProbeConfig, eng: _PyEngine, log: Callable[[str], None]
                    ) -> list[TestResult]:
    """Random sample-size reads through the page cache at each of the loaders' reader counts
    (iobench's own engine whatever `cfg.engine`: fio reads with its own fadvise hints)."""
    tests = []
    for s in cfg.sample_sizes:
        for n in cfg.buffered_counts:
            log(f"buffered random {s}-byte reads (as loaders read), {n} reader(s)")
            tests.append(eng.bufread(n, s, f"{s}B"))
            log(f"  {tests[-1].MBps:.1f} MB/s, {tests[-1].iops:.0f} reads/s")
    return tests


def _buffered_figures(tests: list[TestResult], sample: int) -> dict[str, Any]:
    """The best buffered random-read rate at one sample size: reads/s, MB/s, the request
    (block) bytes and the reader count that reached it."""
    mine = [t for t in tests if t.name.startswith(f"{BUFREAD}_{sample}B_")]
    if not mine:
        return {"buffered_iops": None, "buffered_MBps": None, "buffered_bs_bytes": None,
                "buffered_readers": None}
    top = max(mine, key=lambda t: t.iops)
    return {"buffered_iops": top.iops, "buffered_MBps": top.MBps,
            "buffered_bs_bytes": top.bs_bytes, "buffered_readers": top.readers}


def _best(tests: list[TestResult], op: str, bs: int | None = None,
          key: str = "MBps", tag: str | None = None) -> float | None:
    """The best `key` of the `op` tests (of block size `bs`; of the tests named with `tag`,
    as `randread_<tag>_<readers>`: a sample size that O_DIRECT rounds up to 4 KiB must not
    take the 4 KiB test's figures)."""
    vals = [getattr(t, key) for t in tests if t.op == op and (bs is None or t.bs_bytes == bs)
            and (tag is None or t.name.startswith(f"{op}_{tag}_"))]
    return max(vals) if vals else None


def _summary(cfg: ProbeConfig, run: _ProbeRun) -> dict[str, Any]:
    """The headline figures: the best of each test over the reader counts."""
    tests, meta, block = run.tests, run.meta, run.block
    first_sample = cfg.sample_sizes[0]
    first = meta[0]  # one thread: the latency one loader worker sees (more queue at servers)
    head = _buffered_figures(run.buffered, first_sample)
    return {
        "seq_write_MBps": _best(tests, "write"),
        "seq_read_MBps": _best(tests, "read"),
        "rand4k_read_MBps": _best(tests, "randread", 4 * KiB),
        "rand4k_read_iops": _best(tests, "randread", 4 * KiB, "iops"),
        "sample_read_MBps": _best(tests, "randread", tag=f"{first_sample}B"),
        "sample_read_iops": _best(tests, "randread", key="iops", tag=f"{first_sample}B"),
        "sample_bytes": first_sample,
        "sample_bs_bytes": block[first_sample],
        "sample_reads": [{"sample_bytes": s, "bs_bytes": bs,
                          "MBps": _best(tests, "randread", tag=f"{s}B"),
                          "iops": _best(tests, "randread", key="iops", tag=f"{s}B"),
                          **_buffered_figures(run.buffered, s)}
                         for s, bs in block.items()],
        # the headline sample size read through the page cache, as loaders read it
        "buffered_read_iops": head["buffered_iops"],
        "buffered_read_MBps": head["buffered_MBps"],
        "buffered_bs_bytes": head["buffered_bs_bytes"],
        "buffered_readers": head["buffered_readers"],
        **{k: max(m[k] for m in meta) for k in ("create_per_s", "stat_per_s",
                                                "open_stat_close_per_s",
                                                "open_read_close_per_s")},
        "open_stat_close_1_per_s": first["open_stat_close_per_s"],
        "first_byte_ms_p50": (first["first_byte_ms"] or {}).get("p50"),
        "first_byte_ms_p99": (first["first_byte_ms"] or {}).get("p99"),
        "cold_open_ms_p50": (first["cold_open_ms"] or {}).get("p50"),
        "cold_read_ms_p50": (first["cold_read_ms"] or {}).get("p50"),
        "close_ms_p50": (first["close_ms"] or {}).get("p50"),
        "rand4k_read_iops_1": next((t.iops for t in tests if t.op == "randread"
                                    and t.bs_bytes == 4 * KiB and t.readers == min(cfg.readers)),
                                   None),
        "readers_min": min(cfg.readers),
        "readers_max": max(cfg.readers),
    }


def _cache_status(cfg: ProbeConfig, mount: MountInfo) -> tuple[str, str | None]:
    """("cold" or "unverified", the reason): whether no server cache could answer reads."""
    plan = cache.eviction_plan(mount)
    if cfg.evict_cmd is not None or plan.needs_site is None:
        return "cold", None
    # even O_DIRECT reads may be answered from a server's memory
    return "unverified", (f"{plan.needs_site}: the read figures may come from server memory; "
                          "give --evict-cmd")


def _document(cfg: ProbeConfig, engine: str, mount: MountInfo, run: _ProbeRun) -> dict[str, Any]:
    """The `iobench.probe` document of a finished run, with its emulated-tier profile."""
    from iobench.core.results import now_iso
    from iobench.core.sysinfo import provenance
    from iobench.pfs.profiles import profile_from_probe

    cache_status, cache_reason = _cache_status(cfg, mount)
    warnings = run.warnings + ([f"CACHE UNVERIFIED: {cache_reason}"] if cache_reason else [])
    via = ([f"written through {cfg.write_via} (write and create/unlink figures are of that "
            "path), read through the storage"] if cfg.write_via else [])
    doc = {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "probe",
        "created": now_iso(),
        "label": cfg.label or f"{mount.kind} ({mount.fstype})",
        "config": {**{k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
                   "readers": list(cfg.readers), "buffered_readers": list(cfg.buffered_counts)},
        "engine": engine,
        "engine_version": fio_version() if engine == "fio" else "iobench (threads, pread)",
        "metadata_engine": "iobench",
        "direct": run.direct,
        "cache": ("O_DIRECT: reads and writes bypass the page cache" if run.direct else
                  "buffered: files evicted (POSIX_FADV_DONTNEED) before each read test and "
                  "each block read once"),
        "storage": asdict(mount),
        "cache_status": cache_status, "cache_reason": cache_reason, "evict_cmd": cfg.evict_cmd,
        "summary": _summary(cfg, run),
        "tests": [asdict(t) for t in run.tests],
        "buffered_tests": [asdict(t) for t in run.buffered],
        "metadata": run.meta,
        "write_via": str(cfg.write_via) if cfg.write_via else None,
        "warnings": warnings,
        "notes": run.notes + via + ["random reads are synchronous (psync), one file per "
                                    "reader, like loader workers; metadata: inodes and "
                                    "dentries stay cached",
                                    "buffered_tests: the sample-size random reads again "
                                    "through the page cache (no O_DIRECT, no fadvise), as "
                                    "the loaders read, cold, one request per page-aligned "
                                    "block (summary buffered_read_iops); a projection takes "
                                    "its request rate from these"],
        "provenance": provenance(),
    }
    doc["emulator_profile"] = profile_from_probe(doc).to_dict()
    return doc
