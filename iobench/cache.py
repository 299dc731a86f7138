"""Page-cache control: evict a dataset's pages and measure how much is resident.

A storage benchmark that reads from the page cache measures memory, so
iobench evicts before every epoch and records the resident fraction it
*measured* afterwards (METRICS.md, "Cold cache").

Residency is measured with `cachestat(2)` (Linux >= 6.5) or `mincore(2)` on a
read-only mapping. Both only tell the truth to a process that may write the
file (owner, writer or root): `mincore` then pretends every page is resident
and `cachestat` refuses. In that case the answer is None ("unknown"), never
a false 1.0.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.syscall.restype = ctypes.c_long
_MAP_FAILED = ctypes.c_void_p(-1).value
_CACHESTAT_NR = {"x86_64": 451, "aarch64": 451, "ppc64le": 451}.get(platform.machine())


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64)]


@dataclass(frozen=True)
class EvictResult:
    """What an eviction pass did: files and bytes advised, and failures by path."""

    files: int
    bytes: int
    errors: tuple[str, ...]


def evict(paths: Iterable[str | Path]) -> EvictResult:
    """Drop the cached pages of each file (`fdatasync` then `POSIX_FADV_DONTNEED`).

    Works without root. Dirty pages cannot be dropped, hence the sync first.
    Some filesystems ignore the advice (e.g. FUSE without kernel caching has
    nothing to drop; NFS may keep pages); callers measure residency afterwards.
    """
    n = nbytes = 0
    errors: list[str] = []
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError as e:
            errors.append(f"{p}: {e.strerror}")
            continue
        try:
            with contextlib.suppress(OSError):  # read-only filesystems refuse; pages are clean
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            nbytes += os.fstat(fd).st_size
            n += 1
        except OSError as e:
            errors.append(f"{p}: {e.strerror}")
        finally:
            os.close(fd)
    return EvictResult(files=n, bytes=nbytes, errors=tuple(errors))


def drop_all_caches() -> None:
    """Ask the kernel to drop the whole page cache (root only; affects the whole node)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError as e:
        from iobench.errors import UnsupportedError

        raise UnsupportedError(f"cannot write /proc/sys/vm/drop_caches ({e.strerror}): "
                               "dropping all caches needs root; use per-file eviction") from e


def _truthful(path: str | Path, st: os.stat_result) -> bool:
    # mincore/cachestat only tell the truth to owner, writer or root.
    return os.geteuid() == 0 or st.st_uid == os.geteuid() or os.access(path, os.W_OK)


def _cachestat_pages(fd: int) -> int | None:
    if _CACHESTAT_NR is None:
        return None
    rng, cs = _CachestatRange(0, 0), _Cachestat()
    r = _libc.syscall(_CACHESTAT_NR, fd, ctypes.byref(rng), ctypes.byref(cs), 0)
    if r != 0:
        return None  # ENOSYS on older kernels, EPERM without write access
    return int(cs.nr_cache)


def _mincore_pages(fd: int, size: int) -> int | None:
    addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    if addr in (None, _MAP_FAILED):
        return None
    try:
        npages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * npages)()
        if _libc.mincore(addr, size, vec) != 0:
            return None
        import numpy as np

        return int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1))
    finally:
        _libc.munmap(addr, size)


def resident_bytes(path: str | Path) -> int | None:
    """Bytes of `path` in the page cache, or None when the OS will not say truthfully."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_size == 0:
            return 0
        if not _truthful(path, st):
            return None
        pages = _cachestat_pages(fd)
        if pages is None:
            pages = _mincore_pages(fd, st.st_size)
        if pages is None:
            return None
        return min(pages * PAGE, st.st_size)
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.EACCES):
            return None
        raise
    finally:
        os.close(fd)


def resident_fraction(paths: Iterable[str | Path]) -> float | None:
    """Fraction of the files' bytes that are cached now; None if any file is unknowable."""
    total = cached = 0
    for p in paths:
        size = os.stat(p).st_size
        r = resident_bytes(p)
        if r is None and size > 0:
            return None
        total += size
        cached += r or 0
    return cached / total if total else 0.0
