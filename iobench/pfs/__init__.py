"""An emulated parallel-filesystem tier: a local directory served over FUSE with Lustre-like costs.

It is an EMULATION, for machines without Lustre/GPFS (workstations, CI): a
read-only pass-through FUSE filesystem that adds a metadata round trip per
file lookup/stat, a latency per read request, a bandwidth cap and an optional
IOPS cap shared by all readers of the mount. Profiles and their sources are
in `iobench.pfs.profiles`; the daemon is `iobench.pfs._daemon`.

Library API (the CLI is `iobench emulate-pfs`):

- `mount(backing, mountpoint, profile="lustre-light", *, open_latency_ms=None,
  read_latency_ms=None, bandwidth_MBps=None, iops=None, direct_io=False,
  kernel_cache=False, evict_backing=True, client_cache=True) -> PfsMount`:
  start the daemon in the background (pid file under `config.run_dir()`),
  return once the mount is live. `PfsMount` has `.stats()`, `.unmount()` and
  is a context manager. The mount's page cache is the node's client cache:
  pages survive opens and go only when iobench evicts through the mount
  (`iobench.core.cache.evict`), as on a Lustre/GPFS client (`config.PfsConfig`).
- `unmount(mountpoint, *, lazy=False) -> dict | None`: unmount, wait for the
  daemon to exit (SIGTERM/SIGKILL after a timeout), remove the pid file,
  return the daemon's final stats.
- `stats_for(path) -> dict | None`: the live counters (`stats.py` documents
  them: `counters.bytes_served`, `read_requests`, ...) of the emulated mount
  holding `path`, else None. Cheap (one mountinfo scan and one small FUSE
  read, no emulated latency): call before and after every epoch.
- `delta(before, after) -> dict`: counter differences between two
  `stats_for` documents plus `served_MBps`, `daemon_busy_fraction`,
  `limited_by` (daemon | profile-bandwidth | profile-latency | client | idle)
  and `verdict`, a sentence saying it is an emulation and what set the pace.
  `iobench train` should record `delta(...)["bytes_served"]` as the tier's
  read bytes: `/proc/<pid>/io` does not see FUSE traffic. The counters are
  per mount, i.e. per node: with several ranks on a node, record them once
  per node (e.g. local rank 0, after a barrier), never summed over its ranks.
- `is_emulated(path) -> dict | None`: mount, backing, pid, profile and note
  of the emulated tier holding `path`, else None.
- `fuse_problem() -> str | None`: why FUSE cannot be used here (one line
  with the fix), for tests and demos that skip.
- `PROFILES`, `get_profile(name)`, `Profile`.
"""

from iobench.pfs.control import (
    PfsMount,
    build_config,
    emulated_mounts,
    fuse_problem,
    is_emulated,
    mount,
    mount_config,
    read_stats,
    require_fuse,
    stats_for,
    status,
    unmount,
)
from iobench.pfs.profiles import PROFILES, Profile, get_profile
from iobench.pfs.stats import NOTE, assess, delta

__all__ = [
    "NOTE", "PROFILES", "PfsMount", "Profile", "assess", "build_config", "delta",
    "emulated_mounts", "fuse_problem", "get_profile", "is_emulated", "mount", "mount_config",
    "read_stats", "require_fuse", "stats_for", "status", "unmount",
]
