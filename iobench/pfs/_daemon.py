"""The FUSE daemon of the emulated tier: read-only pass-through with injected costs.

Run as `python -m iobench.pfs._daemon CONFIG_JSON` (that is what
`iobench.pfs.mount` does, in a new session, with its output in a log file)
or in-process by `run_daemon` (`iobench emulate-pfs --foreground`). It stays
in the foreground of its own process until the mount is unmounted or it gets
SIGTERM/SIGINT (libfuse then unmounts), writes its final stats beside the
pid file and removes the pid file.

Cost model (figures in `profiles.py`):
- metadata: `getattr` by path of a non-directory that is not open (the
  kernel's LOOKUP on each open and stat) and each `readdir` sleep
  `metadata_ms`; directories and open files are free (client-side locks);
- reads: a request arriving at t0 is ready at t0 + `read_ms` (the backing
  `preadv` overlaps with that wait); it then takes its turn on the shared
  link (`bandwidth_MBps`, strict pacing, no burst credit) and the IOPS
  schedule, and is answered when its transfer would have finished.

Client cache: data pages survive opens (`keep_cache`, as on a Lustre/GPFS
client), so only what the mount's page cache lacks reaches the daemon; they
go when iobench evicts through the mount (`POSIX_FADV_DONTNEED`). Names
still expire at once, so every open and stat is charged its round trip.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

from iobench.core.jsonio import write_json_atomic
from iobench.pfs.config import PfsConfig, state_paths
from iobench.pfs.stats import COUNTERS, NOTE, SCHEMA, SCHEMA_VERSION, STATS_NAME

PAGE = os.sysconf("SC_PAGE_SIZE")
_STATS_PATH = "/" + STATS_NAME
MAX_THREADS = 64
_VIRTUAL_FH_BASE = 1 << 48  # file handles of virtual files; real ones are fds
_STAT_KEYS = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_ino",
              "st_atime_ns", "st_mtime_ns", "st_ctime_ns")


def _import_mfusepy() -> Any:
    # libfuse 3 negotiates 1 MiB requests (max_pages) with the kernel; libfuse 2.9 stays at 128 KiB.
    if "FUSE_LIBRARY_PATH" not in os.environ and "FUSE_LIBRARY_NAME" not in os.environ:
        import ctypes.util

        if ctypes.util.find_library("fuse3"):
            os.environ["FUSE_LIBRARY_NAME"] = "fuse3"
    import mfusepy

    return mfusepy


class Pacer:
    """Shared schedule of the emulated link: latency, bandwidth cap and IOPS cap (seconds)."""

    def __init__(self, read_latency_s: float, bandwidth_Bps: float | None, iops: float | None):
        self.read_latency_s = read_latency_s
        self.bandwidth_Bps = bandwidth_Bps
        self.iops = iops
        self._lock = threading.Lock()
        self._link_free = 0.0
        self._iops_next = 0.0

    def finish_time(self, arrival: float, data_ready: float, nbytes: int) -> tuple[float, float]:
        """(time the reply is due, time the request became ready to transfer), perf_counter s."""
        start = max(arrival + self.read_latency_s, data_ready)
        ready = start
        if self.bandwidth_Bps is None and self.iops is None:
            return start, ready
        with self._lock:
            if self.iops is not None:
                start = max(start, self._iops_next)
                self._iops_next = start + 1.0 / self.iops
            if self.bandwidth_Bps is not None:
                start = max(start, self._link_free)
                start += nbytes / self.bandwidth_Bps
                self._link_free = start
        return start, ready


class PfsOperations:
    """mfusepy operations (methods named as libfuse's) over a backing directory."""

    use_ns = True

    def __init__(self, config: PfsConfig, libfuse: str):
        self.config = config
        self.libfuse = libfuse
        self.root = config.backing
        p = config.profile
        self.metadata_s = p.metadata_ms / 1000.0
        self.pacer = Pacer(p.read_ms / 1000.0,
                           None if p.bandwidth_MBps is None else p.bandwidth_MBps * 1e6, p.iops)
        self.paths = state_paths(config.mountpoint)
        self._lock = threading.Lock()
        self._c: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._virtual: dict[int, bytes] = {}
        self._open_paths: dict[str, int] = {}  # path -> open handles: attributes held "client-side"
        self.readahead_kb: int | None = None
        self._next_virtual = _VIRTUAL_FH_BASE
        self._t_start = time.perf_counter()
        self._cpu_start = time.process_time()
        self.started_unix = time.time()

    # ---- counters and the stats document ---------------------------------------------------

    def _add(self, **inc: float) -> None:
        with self._lock:
            for k, v in inc.items():
                self._c[k] += v

    def stats_doc(self) -> dict[str, Any]:
        with self._lock:
            c = dict(self._c)
        c["daemon_cpu_s"] = time.process_time() - self._cpu_start
        c["uptime_s"] = time.perf_counter() - self._t_start
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "emulated": True,
                "note": NOTE, "mount": self.config.mountpoint, "backing": self.config.backing,
                "pid": os.getpid(), "libfuse": self.libfuse, "started_unix": self.started_unix,
                "options": {"direct_io": self.config.direct_io,
                            "client_cache": self.config.keeps_pages,
                            "kernel_cache": self.config.kernel_cache,
                            "evict_backing": self.config.evict_backing,
                            "max_read_bytes": self.config.max_read_bytes,
                            "readahead_kb": self.readahead_kb},
                "profile": self.config.profile.to_dict(), "counters": c}

    # ---- lifecycle ---------------------------------------------------------------------------

    def init_with_config(self, conn: Any, config3: Any) -> None:
        entry_s, attr_s = _timeouts(self.config)
        if conn is not None and hasattr(conn, "max_read") and config3 is not None:
            conn.max_read = self.config.max_read_bytes  # libfuse 3 insists it equals -o max_read
        if config3 is not None:
            config3.entry_timeout = entry_s
            config3.attr_timeout = attr_s
            config3.negative_timeout = entry_s
            config3.kernel_cache = int(self.config.kernel_cache)
        # Touching the mount from inside `init` would deadlock: finish in a thread.
        threading.Thread(target=self._announce, name="announce", daemon=True).start()

    def _announce(self) -> None:
        """Once the mount answers: tune readahead, then write the state and pid files.

        The launcher waits for the pid file, so a mount is only reported
        live when it is fully set up.
        """
        st = None
        for _ in range(1000):
            try:
                st = os.stat(self.config.mountpoint)
                if st.st_dev != os.stat(os.path.dirname(self.config.mountpoint)).st_dev:
                    break
            except OSError:
                pass
            st = None
            time.sleep(0.01)
        if st is not None and not self.config.direct_io:
            self.readahead_kb = _tune_readahead(st.st_dev, self.config.max_read_bytes // 1024)
        state = {"schema": "iobench.pfs-state", "schema_version": 1, "pid": os.getpid(),
                 "config": self.config.to_dict(), "libfuse": self.libfuse,
                 "log": str(self.paths.log), "started_unix": self.started_unix}
        write_json_atomic(self.paths.state, state)
        tmp = self.paths.pid.with_suffix(".pid.tmp")
        tmp.write_text(f"{os.getpid()}\n")
        os.replace(tmp, self.paths.pid)

    def destroy(self, path: str) -> None:
        pass

    # ---- metadata ----------------------------------------------------------------------------

    def _full(self, path: str) -> str:
        return self.root + path if path != "/" else self.root

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        if path == _STATS_PATH:
            now = time.time_ns()
            return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": 0,
                    "st_uid": 0, "st_gid": 0, "st_atime": now, "st_mtime": now, "st_ctime": now}
        if fh is not None or path in self._open_paths:
            # An open file's attributes are held by the client (Lustre: under its lock).
            self._add(fstats=1)
            if fh is None or fh.fh >= _VIRTUAL_FH_BASE:
                return _stat_dict(os.lstat(self._full(path)))
            return _stat_dict(os.fstat(fh.fh))
        try:
            st = os.lstat(self._full(path))
        except OSError:
            self._charge_metadata()  # a miss costs a round trip too
            raise
        if not stat.S_ISDIR(st.st_mode):
            self._charge_metadata()
        return _stat_dict(st)

    def _charge_metadata(self) -> None:
        if self.metadata_s > 0:
            t0 = time.perf_counter()
            time.sleep(self.metadata_s)
            self._add(lookups=1, metadata_wait_s=time.perf_counter() - t0)
        else:
            self._add(lookups=1)

    def readdir(self, path: str, fh: Any) -> list[str]:
        if self.metadata_s > 0:
            t0 = time.perf_counter()
            time.sleep(self.metadata_s)
            self._add(readdirs=1, metadata_wait_s=time.perf_counter() - t0)
        else:
            self._add(readdirs=1)
        return [".", "..", *os.listdir(self._full(path))]

    def readlink(self, path: str) -> str:
        target = os.readlink(self._full(path))
        if os.path.isabs(target):
            # An absolute link into the backing must lead back into the mount, not around it.
            rel = os.path.relpath(target, self.root)
            if rel == ".":
                return self.config.mountpoint
            if not rel.startswith(".."):
                return os.path.join(self.config.mountpoint, rel)
        return target

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._full(path))
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree",
                                             "f_bavail", "f_files", "f_ffree", "f_favail",
                                             "f_namemax")}

    # ---- data --------------------------------------------------------------------------------

    def open(self, path: str, fi: Any) -> int:
        if fi.flags & os.O_ACCMODE != os.O_RDONLY:
            raise OSError(errno.EROFS, "the emulated parallel filesystem is read-only")
        if path == _STATS_PATH:
            data = json.dumps(self.stats_doc(), indent=1).encode() + b"\n"
            with self._lock:
                fh = self._next_virtual
                self._next_virtual += 1
                self._virtual[fh] = data
            fi.fh = fh
            fi.direct_io = 1
            fi.keep_cache = 0
            return 0
        try:
            fd = os.open(self._full(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self._add(errors=1)
            raise
        with contextlib.suppress(OSError):
            # The backing disk should not read ahead what the tier did not serve.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        fi.fh = fd
        fi.direct_io = int(self.config.direct_io)
        # The client cache: the kernel keeps this inode's pages across opens (without it,
        # every open would drop them, which no Lustre/GPFS client does).
        fi.keep_cache = int(self.config.keeps_pages)
        with self._lock:
            self._open_paths[path] = self._open_paths.get(path, 0) + 1
            self._c["opens"] += 1
        return 0

    def read_into(self, fh: int, buf: Any, size: int, offset: int) -> int:
        """Serve one read request into the kernel's buffer: the hot path."""
        if fh >= _VIRTUAL_FH_BASE:
            data = self._virtual.get(fh, b"")[offset:offset + size]
            ctypes.memmove(buf, data, len(data))
            return len(data)
        t0 = time.perf_counter()
        view = (ctypes.c_char * size).from_address(ctypes.addressof(buf.contents))
        try:
            n = os.preadv(fh, [view], offset)
        except OSError:
            self._add(errors=1)
            raise
        if n > 0 and self.config.evict_backing:
            lo = offset - offset % PAGE
            os.posix_fadvise(fh, lo, offset + n - lo, os.POSIX_FADV_DONTNEED)
        t1 = time.perf_counter()
        due, ready = self.pacer.finish_time(t0, t1, n)
        wait = due - t1
        if wait > 0:
            time.sleep(wait)
        t2 = time.perf_counter()
        # Waits by the model (what the profile imposed), not by measured sleeps, so that
        # oversleeping and the daemon's own work show up as `read_own_fraction`.
        self._add(bytes_served=n, read_requests=1, read_service_s=t2 - t0,
                  read_latency_wait_s=self.pacer.read_latency_s,
                  read_throttle_wait_s=max(due - max(ready, t1), 0.0))
        return n

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        """Copying fallback; `_ZeroCopyFUSE.read` calls `read_into` instead."""
        buf = ctypes.create_string_buffer(size)
        n = self.read_into(fi.fh, ctypes.cast(buf, ctypes.POINTER(ctypes.c_byte)), size, offset)
        return buf.raw[:n]

    def release(self, path: str, fi: Any) -> int:
        fh = fi.fh
        if fh >= _VIRTUAL_FH_BASE:
            with self._lock:
                self._virtual.pop(fh, None)
            return 0
        with self._lock:
            left = self._open_paths.get(path, 0) - 1
            if left > 0:
                self._open_paths[path] = left
            else:
                self._open_paths.pop(path, None)
        try:
            if self.config.evict_backing:
                os.posix_fadvise(fh, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fh)
        return 0


def _tune_readahead(dev: int, want_kb: int) -> int | None:
    """Let the kernel send max_read-sized requests for buffered reads (its default: 128 KiB).

    Needs root (sysfs); otherwise the default stays. Returns the value in force.
    """
    knob = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
    with contextlib.suppress(OSError), open(knob, "w") as f:
        f.write(f"{want_kb}\n")
    try:
        with open(knob) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _timeouts(config: PfsConfig) -> tuple[float, float]:
    """(entry, attribute) cache lifetimes in seconds for the kernel.

    Names expire at once, so every open and stat sends a LOOKUP (one emulated
    metadata round trip). Attributes may live 1 s: the tier is read-only, so
    they cannot go stale, and it spares the GETATTR that would otherwise
    follow each LOOKUP (a stat would cost two round trips where Lustre needs
    one). Data pages are kept apart from these (`keep_cache` at open).
    `kernel_cache` keeps both for 60 s (a warm client: opens cost nothing).
    """
    return (60.0, 60.0) if config.kernel_cache else (0.0, 1.0)


def _stat_dict(st: os.stat_result) -> dict[str, Any]:
    d = {k: getattr(st, k) for k in _STAT_KEYS}
    # Read-only tier: no write bits, whatever the backing says.
    d["st_mode"] = st.st_mode & ~0o222
    d["st_atime"], d["st_mtime"], d["st_ctime"] = (d.pop("st_atime_ns"), d.pop("st_mtime_ns"),
                                                   d.pop("st_ctime_ns"))
    return d


def _make_fuse_class(mfusepy: Any) -> type:
    class _ZeroCopyFUSE(mfusepy.FUSE):  # type: ignore[misc]  # mfusepy is untyped: FUSE is Any
        """mfusepy's FUSE, with `read` going straight into the kernel's buffer (no copy)."""

        def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
            n: int = self.operations.read_into(fip.contents.fh, buf, size, offset)
            return n

    return _ZeroCopyFUSE


def _operations_class(mfusepy: Any) -> type:
    # Subclass mfusepy.Operations so that only the methods defined here reach libfuse.
    return type("IobenchPfs", (PfsOperations, mfusepy.Operations), {})


def run_daemon(config: PfsConfig) -> int:
    """Mount and serve until unmounted (blocking); returns an exit code."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="iobench-pfs[%(process)d] %(levelname)s %(message)s")
    mfusepy = _import_mfusepy()
    libfuse = f"{mfusepy.fuse_version_major}.{mfusepy.fuse_version_minor}"
    ops = _operations_class(mfusepy)(config, libfuse)
    paths = ops.paths
    options: dict[str, Any] = {
        "foreground": True, "ro": True, "fsname": f"iobench-pfs:{config.backing}",
        "subtype": "iobench-pfs", "max_read": config.max_read_bytes,
        "entry_timeout": _timeouts(config)[0], "attr_timeout": _timeouts(config)[1],
        "negative_timeout": _timeouts(config)[0],
    }
    if os.geteuid() == 0:
        # Unprivileged training processes may read it, but only what the backing's
        # owners and modes allow them: the kernel checks, not the (root) daemon.
        options["allow_other"] = True
        options["default_permissions"] = True
    if (mfusepy.fuse_version_major, mfusepy.fuse_version_minor) >= (3, 12):
        # Each request in its emulated wait holds a thread: allow many in flight, as a
        # parallel filesystem client has many RPCs in flight (libfuse's default is 10).
        options["max_threads"] = MAX_THREADS
        options["max_idle_threads"] = MAX_THREADS
    try:
        _make_fuse_class(mfusepy)(ops, config.mountpoint, raw_fi=True, **options)
        rc = 0
    except RuntimeError as e:
        print(f"iobench-pfs: libfuse stopped with error {e}", file=sys.stderr)
        rc = 1
    finally:
        try:
            write_json_atomic(paths.final_stats, ops.stats_doc())
        finally:
            for p in (paths.pid,):
                try:
                    if p.exists() and p.read_text().strip() == str(os.getpid()):
                        p.unlink()
                except OSError:
                    pass
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m iobench.pfs._daemon CONFIG_JSON", file=sys.stderr)
        return 2
    config = PfsConfig.from_dict(json.loads(argv[0]))
    Path(state_paths(config.mountpoint).pid).parent.mkdir(parents=True, exist_ok=True)
    return run_daemon(config)


if __name__ == "__main__":
    sys.exit(main())
