"""The userspace daemon serving a FUSE mount on this host, and its replies counted in /proc/PID/io.

The kernel counts no storage reads on FUSE (`procio.UNCOUNTED_KINDS`), and a
FUSE tier such as GlusterFS keeps no request counters iobench can read. Its
daemon answers every kernel request (a read, a lookup, an open, a getattr,
a release) with one write to /dev/fuse, so the daemon's own `syscw` and
`wchar` count its replies and their bytes. A daemon may also write elsewhere
(GlusterFS's client writes one request to a brick for each read it cannot
serve from its own caches), so `calibrate` measures what one read of a known
size costs in writes (two rounds alike: other traffic on the mount makes
them differ), and `reads_and_bytes` turns an epoch's writes into reads.
Metadata replies (lookups, opens, getattrs, releases) count as reads there,
so the figure over-counts reads by them and under-states the bytes a read
holds; the daemon serves every process on the host that uses the mount, so
other readers' replies count too. Where no daemon is found or its /proc is
unreadable, everything here is None, and an uncalibrated cost says why:
never a guess.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

from iobench.core.procio import read_io

PAGE = 4096  # bytes one calibration read asks for: one page, one FUSE read with readahead off
CALIBRATION_READS = 32  # reads per calibration round
CALIBRATION_ROUNDS = 6  # rounds at most: it stops at the first two that agree


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


TOO_SMALL, UNREADABLE, GONE, DISAGREED = "too-small", "unreadable", "gone", "disagreed"


@dataclass(frozen=True)
class Uncalibrated:
    """Why `calibrate` found no cost a read: its kind (too-small, unreadable, gone,
    disagreed) and the reason in words, naming the value."""

    kind: str
    reason: str


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


def _round(daemon: FuseDaemon, reads: list[tuple[int, int]]) -> tuple[int, int, int] | None:
    """The daemon's writes and bytes over single-page reads at (fd, offset) `reads`, and
    the data they returned. Each file's attributes are refreshed first (an fstat), so that
    no read in the span asks for them (the kernel does once they are older than the
    mount's attribute timeout)."""
    for fd in {fd for fd, _ in reads}:
        os.fstat(fd)
    a = daemon.counters()
    got = sum(len(os.pread(fd, PAGE, off)) for fd, off in reads)
    b = daemon.counters()
    if not a or not b:
        return None
    return (b["daemon_replies"] - a["daemon_replies"],
            b["daemon_reply_bytes"] - a["daemon_reply_bytes"], got)


def _page_counts(sizes: list[int]) -> list[int]:
    """Pages each file holds at least two apart (a file under two pages: 1, an empty one 0)."""
    return [max(1, size // (2 * PAGE)) if size > 0 else 0 for size in sizes]


def _places(sizes: list[int], want: int) -> list[tuple[int, int]]:
    """`want` (file index, offset) pages spread evenly over all those pages (`_page_counts`),
    found per page by bisection over the files' running counts, never listing them all."""
    counts = _page_counts(sizes)
    ends = list(accumulate(counts))
    total = ends[-1] if ends else 0
    out = []
    for j in range(want):
        g = j * total // want
        i = bisect_right(ends, g)
        slot = g - (ends[i - 1] if i else 0)
        out.append((i, slot * (sizes[i] // counts[i]) // PAGE * PAGE))
    return out


def calibrate(daemon: FuseDaemon, files: Sequence[str | os.PathLike[str]]
              ) -> ReadCost | Uncalibrated:
    """What one read costs the daemon in writes and bytes, from rounds of single-page reads
    of `files` (on its mount: one big file, or many small ones) far apart, with readahead
    off and the files' client pages dropped, so that each read is one FUSE read; the opens
    and closes are outside the counted rounds. An idle daemon answers every round alike,
    so the cost is taken from the first two rounds with the same writes and the same bytes
    beyond the data, each with at least one write a read (fewer: another reader's pages
    served some). Other processes using the mount add their replies to some rounds, or
    pages to the client's cache, and the rounds disagree. `Uncalibrated`, with its kind
    and reason, when the files hold too few pages two apart (under 2 x 32), are
    unreadable, the daemon went away, or no two of up to 6 rounds agreed: never a guess."""
    try:
        return _calibrate(daemon, [Path(f) for f in files])
    except OSError as e:  # a file unreadable or gone
        return Uncalibrated(UNREADABLE, f"{e.filename or 'a data file'}: {e.strerror or e}")


def _calibrate(daemon: FuseDaemon, files: list[Path]) -> ReadCost | Uncalibrated:
    n = CALIBRATION_READS
    sizes = [f.stat().st_size for f in files]
    total = sum(_page_counts(sizes))
    rounds = min(CALIBRATION_ROUNDS, total // n)
    if rounds < 2:
        return Uncalibrated(TOO_SMALL, f"the {len(files)} data file(s) read hold {total} pages "
                            f"two apart: too few for two rounds of {n} reads")
    places = _places(sizes, n * rounds)  # round r reads every rounds-th from the r-th
    fds: dict[int, int] = {}
    try:
        for i in sorted({i for i, _ in places}):
            fds[i] = os.open(files[i], os.O_RDONLY)
            os.posix_fadvise(fds[i], 0, 0, os.POSIX_FADV_RANDOM)
            os.posix_fadvise(fds[i], 0, 0, os.POSIX_FADV_DONTNEED)
        return _rounds(daemon, [[(fds[i], off) for i, off in places[r::rounds]]
                                for r in range(rounds)])
    finally:
        for fd in fds.values():
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # leave no pages of ours
            finally:
                os.close(fd)


def _rounds(daemon: FuseDaemon, rounds: list[list[tuple[int, int]]]) -> ReadCost | Uncalibrated:
    """The cost a read from the first two rounds alike (module docstring)."""
    n = len(rounds[0])
    seen: list[tuple[int, int]] = []
    writes: list[int] = []
    for reads in rounds:
        got = _round(daemon, reads)
        if got is None:
            return Uncalibrated(GONE, f"the daemon (pid {daemon.pid}) went away or its "
                                "/proc/PID/io became unreadable")
        cost = (got[0], got[1] - got[2])  # writes, bytes beyond the data
        if got[0] >= n and cost in seen:
            return ReadCost(replies_per_read=got[0] / n,
                            overhead_bytes=max(0.0, cost[1] / n), read_bytes=got[2] // n)
        seen.append(cost)
        writes.append(got[0])
    return Uncalibrated(DISAGREED, f"no two of {len(rounds)} rounds of {n} reads agreed "
                        f"(daemon writes: {', '.join(map(str, writes))}): other processes "
                        f"were using {daemon.mount_point}")


def reads_and_bytes(replies: int, reply_bytes: int, cost: ReadCost) -> tuple[float, float] | None:
    """(reads, data bytes) an interval's `replies` and `reply_bytes` stand for, at `cost`
    a read; metadata replies count as reads (an over-count). None when nothing was read."""
    if cost.replies_per_read <= 0 or replies <= 0:
        return None
    reads = replies / cost.replies_per_read
    return reads, max(0.0, reply_bytes - reads * cost.overhead_bytes)
