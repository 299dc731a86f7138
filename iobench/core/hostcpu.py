"""The whole host's busy CPU seconds (the aggregate `cpu` line of /proc/stat), for a timed window.

`read()` takes one reading; the difference of two (`after - before`) is the
host's busy CPU over the window between them, summed over its CPUs: user,
nice, system, irq and softirq jiffies (guest time is already inside user;
idle, iowait and steal are not busy). Every process on the host counts, so on
a one-box tier the filesystem's own daemons (a FUSE client, its bricks) are
inside it, and so is any other work the host was doing. `cpus` is the number
of online CPUs the kernel lists (`cpuN` lines), not this process's affinity.
A /proc/stat that cannot be read or parsed gives None, never a guess.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

PROC_STAT = "/proc/stat"  # a module constant, so tests can point it elsewhere
SOURCE = ("/proc/stat: the whole host's busy CPU (user, nice, system, irq, softirq) over the "
          "window; every process on the host counts, the tier's own daemons and other work "
          "included")
# positions of the busy fields on the `cpu` line: user nice system (idle iowait) irq softirq
_BUSY = (0, 1, 2, 5, 6)


@dataclass(frozen=True)
class HostCpu:
    """The host's busy CPU seconds (summed over its CPUs) and its online CPU count."""

    busy_s: float  # CPU seconds, all CPUs summed
    cpus: int

    def __sub__(self, other: HostCpu) -> HostCpu:
        return HostCpu(self.busy_s - other.busy_s, self.cpus)


def read() -> HostCpu | None:
    """The host's busy CPU seconds since boot and its CPU count; None where /proc/stat
    cannot be read or does not hold what it should."""
    try:
        with open(PROC_STAT) as f:
            lines = f.read().splitlines()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    total = [ln.split() for ln in lines if ln.startswith("cpu ")]
    cpus = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    if len(total) != 1 or len(total[0]) < 8 or cpus < 1 or ticks <= 0:
        return None
    try:
        jiffies = [int(total[0][1 + i]) for i in _BUSY]
    except ValueError:
        return None
    return HostCpu(sum(jiffies) / ticks, cpus)


def record(before: HostCpu | None, after: HostCpu | None) -> dict[str, Any] | None:
    """The result documents' `host_cpu` of a window between two readings: `busy_s` (CPU
    seconds, all CPUs summed), `cpus` and `source`; None when either reading is None."""
    if before is None or after is None:
        return None
    d = after - before
    return {"busy_s": d.busy_s, "cpus": d.cpus, "source": SOURCE}
