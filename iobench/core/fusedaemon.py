"""The userspace daemon serving a FUSE mount on this host, and its replies counted in /proc/PID/io.

The kernel counts no storage reads on FUSE (`procio.UNCOUNTED_KINDS`), and a
FUSE tier such as GlusterFS keeps no request counters iobench can read. Its
daemon answers every kernel request (a read, a lookup, an open, a getattr,
a release) with one write to /dev/fuse, so the daemon's own `syscw` and
`wchar` count its replies and their bytes. A daemon may also write elsewhere
(GlusterFS's client writes one request to a brick for each read it cannot
serve from its own caches), so `calibrate` measures what one read of a known
size costs in writes, and `bytes_per_read` turns an epoch's writes into
reads. Metadata replies (lookups, opens, getattrs, releases) count as reads
there, so the figure over-counts reads by them and under-states the bytes a
read holds; the daemon serves every process on the host that uses the
mount, so other readers' replies count too. Where no daemon is found or its
/proc is unreadable, everything here is None: never a guess.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from iobench.core.procio import read_io

PAGE = 4096  # bytes one calibration read asks for: one page, one FUSE read with readahead off
CALIBRATION_READS = 32  # reads per calibration round
CALIBRATION_ROUNDS = 3  # rounds; the least per-read cost is kept (other traffic only adds)


@dataclass(frozen=True)
class FuseDaemon:
    """The process serving one FUSE mount: its pid, the mount point and its command name."""

    pid: int
    mount_point: str
    name: str

    def counters(self) -> dict[str, int]:
        """`daemon_replies` (writes: `syscw`) and `daemon_reply_bytes` (`wchar`) so far; {}
        when the daemon is gone or its /proc unreadable."""
        io = read_io(self.pid)
        if io is None or "syscw" not in io or "wchar" not in io:
            return {}
        return {"daemon_replies": io["syscw"], "daemon_reply_bytes": io["wchar"]}


@dataclass(frozen=True)
class ReadCost:
    """What one FUSE read of `read_bytes` cost the daemon, measured (`calibrate`)."""

    replies_per_read: float  # the daemon's writes per read (1: its reply alone)
    overhead_bytes: float  # bytes it wrote per read beyond the data (reply header, requests)
    read_bytes: int  # the data one calibration read returned


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def holds_dev_fuse(pid: int) -> bool:
    """Whether process `pid` has /dev/fuse open (False when its fds are unreadable)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse":
                return True
        except OSError:
            continue
    return False


def _named_daemons(mount_point: str) -> list[int]:
    """Processes holding /dev/fuse whose command line has the mount point as one argument
    (how GlusterFS's client, sshfs and most libfuse daemons are started)."""
    found = []
    # /dev/fuse first: it fails fast on others' processes, and only a FUSE daemon's
    # arguments are resolved (an unrelated process's path may be on a hung mount)
    for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
        if pid != os.getpid() and holds_dev_fuse(pid) and any(
                os.path.realpath(a) == mount_point for a in _cmdline(pid)[1:]
                if a.startswith("/")):
            found.append(pid)
    return found


def find_daemon(path: str | os.PathLike[str], pid: int | None = None) -> FuseDaemon | None:
    """The daemon serving the FUSE mount holding `path`, if it runs on this host and its
    /proc/PID/io is readable; None otherwise (not FUSE, none found, several candidates).

    `pid`, when the caller knows it (the emulated tier records its own), is checked and
    taken; otherwise the one process holding /dev/fuse that names the mount point."""
    from iobench.core.sysinfo import mount_of

    mount = mount_of(path)
    if not mount.fstype.startswith("fuse"):
        return None
    mp = os.path.realpath(mount.mount_point)
    given = [pid] if pid is not None and holds_dev_fuse(pid) else []
    pids = _named_daemons(mp) if pid is None else given
    if len(pids) != 1 or read_io(pids[0]) is None:
        return None
    args = _cmdline(pids[0])
    return FuseDaemon(pid=pids[0], mount_point=mp,
                      name=os.path.basename(args[0]) if args else "?")


def _round(daemon: FuseDaemon, fd: int, offsets: list[int]) -> tuple[int, int, int] | None:
    """The daemon's writes and bytes over single-page reads at `offsets`, and the data."""
    a = daemon.counters()
    got = sum(len(os.pread(fd, PAGE, off)) for off in offsets)
    b = daemon.counters()
    if not a or not b:
        return None
    return (b["daemon_replies"] - a["daemon_replies"],
            b["daemon_reply_bytes"] - a["daemon_reply_bytes"], got)


def calibrate(daemon: FuseDaemon, file: str | os.PathLike[str]) -> ReadCost | None:
    """What one read costs the daemon in writes and bytes, from single-page reads of `file`
    (on its mount) far apart, with readahead off and the file's client pages dropped, so
    that each read is one FUSE read; the open and close are outside the counted span.
    None when the file is too small (under 2 x 32 x 3 pages), unreadable, or the daemon
    went away."""
    try:
        return _calibrate(daemon, file)
    except OSError:  # the file unreadable or gone: no calibration, never a guess
        return None


def _calibrate(daemon: FuseDaemon, file: str | os.PathLike[str]) -> ReadCost | None:
    size = Path(file).stat().st_size
    step = (size // (CALIBRATION_READS * CALIBRATION_ROUNDS)) // PAGE * PAGE
    if step < 2 * PAGE:
        return None
    fd = os.open(file, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        rounds = [_round(daemon, fd, [(i * CALIBRATION_ROUNDS + r) * step
                                      for i in range(CALIBRATION_READS)])
                  for r in range(CALIBRATION_ROUNDS)]
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # leave no pages of ours behind
    finally:
        os.close(fd)
    done = [r for r in rounds if r is not None]
    if not done:
        return None
    writes, wbytes, data = min(done)
    n = CALIBRATION_READS
    return ReadCost(replies_per_read=writes / n, overhead_bytes=max(0.0, (wbytes - data) / n),
                    read_bytes=data // n)


def reads_and_bytes(replies: int, reply_bytes: int, cost: ReadCost) -> tuple[float, float] | None:
    """(reads, data bytes) an interval's `replies` and `reply_bytes` stand for, at `cost`
    a read; metadata replies count as reads (an over-count). None when nothing was read."""
    if cost.replies_per_read <= 0 or replies <= 0:
        return None
    reads = replies / cost.replies_per_read
    return reads, max(0.0, reply_bytes - reads * cost.overhead_bytes)
