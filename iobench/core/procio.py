"""Bytes the OS says a process tree read from storage (`/proc/<pid>/io`).

A rank's loader workers (DataLoader or DALI processes) are its descendants.
A child's counters reach its parent's only when it is reaped, so summing the
live tree before and after an interval counts every byte exactly once: a
worker that exits inside the interval moves its total into the parent.
`read_bytes` is what the block layer fetched (0 on tmpfs and FUSE, where the
kernel does not count); `rchar` is what read() calls returned, cache or not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class IoCounters:
    read_bytes: int  # bytes fetched from storage by the block layer
    rchar: int  # bytes returned by read-like syscalls (includes page-cache hits)
    syscr: int  # read-like syscalls
    processes: int

    def __sub__(self, other: IoCounters) -> IoCounters:
        return IoCounters(self.read_bytes - other.read_bytes, self.rchar - other.rchar,
                          self.syscr - other.syscr, self.processes)


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: split after the last ')'
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def process_tree(pid: int | None = None) -> list[int]:
    """`pid` (default: this process) and all its live descendants."""
    root = os.getpid() if pid is None else pid
    kids = _children_map()
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def read_io(pid: int) -> dict[str, int] | None:
    """The counters of one process, or None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f)}
    except (OSError, ValueError):
        return None


def tree_io(pid: int | None = None) -> IoCounters:
    """Summed counters of `pid` (default: this process) and its live descendants."""
    rb = rc = sc = n = 0
    for p in process_tree(pid):
        io = read_io(p)
        if io is None:
            continue
        rb += io.get("read_bytes", 0)
        rc += io.get("rchar", 0)
        sc += io.get("syscr", 0)
        n += 1
    return IoCounters(rb, rc, sc, n)


# Storage kinds (iobench.core.sysinfo.fs_kind) whose reads the kernel does not put in
# `read_bytes`: tmpfs pages are memory, FUSE reads go through a userspace daemon.
UNCOUNTED_KINDS: dict[str, str] = {
    "memory": "tmpfs/ramfs data lives in memory: the kernel counts no storage reads",
    "fuse": "FUSE reads are served by a userspace daemon: the kernel counts no read_bytes",
    "fuse-network": "FUSE reads are served by a userspace client: the kernel counts no read_bytes",
}


def read_bytes_unavailable(path: str | os.PathLike[str]) -> str | None:
    """Why `read_bytes` cannot count storage reads under `path`, or None when it can."""
    from iobench.core.sysinfo import mount_of

    return UNCOUNTED_KINDS.get(mount_of(path).kind)


def os_read_bytes(delta: IoCounters, path: str | os.PathLike[str]) -> int | None:
    """`delta.read_bytes` for a read of data under `path`; None ("not available") where the
    OS does not count (FUSE, tmpfs), never a misleading 0."""
    return None if read_bytes_unavailable(path) else delta.read_bytes
