"""The emulated tier's counters: the stats document, deltas between two reads, and the verdict.

The daemon serves its counters as a virtual read-only file at
`<mount>/.iobench-pfs-stats` (not listed by `readdir`, costs no emulated
latency, not counted in its own figures): a JSON document, schema
`iobench.pfs-stats` version 1:

- `emulated` (always true) and `note`: the tier is an emulation.
- `mount`, `backing`, `pid`, `libfuse`, `options` (direct_io, client_cache,
  kernel_cache, evict_backing, max_read_bytes, readahead_kb) and `profile`
  (see `profiles.Profile`). `client_cache` true: the mount's page cache keeps
  data across opens like a Lustre/GPFS client, so a re-read of cached pages
  never reaches the daemon (`bytes_served` does not grow) until iobench
  evicts through the mount; false: pages dropped at every open (or
  `direct_io`, no page cache at all).
- `counters`, all cumulative since the mount, flat numbers:
  `bytes_served` (bytes the daemon returned to the kernel for reads),
  `read_requests`, `opens`, `lookups` (file lookups/stats by path, each one
  emulated metadata round trip), `readdirs`, `fstats` (attribute requests on
  open files, not charged), `errors`, `metadata_wait_s` (slept for metadata
  latency), `read_service_s` (sum over read requests of arrival to reply),
  `read_latency_wait_s` (of which the emulated request latency, as the
  profile imposes it), `read_throttle_wait_s` (of which the wait for the
  bandwidth/IOPS caps, transfer time included, as the model scheduled it;
  the rest of `read_service_s` is the daemon's own work and timer slack), `daemon_cpu_s` (the daemon's CPU time, all
  threads), `uptime_s`.

The kernel's `/proc/<pid>/io` `read_bytes` is 0 for FUSE traffic, so
`bytes_served` is what a run records as the tier's read bytes. Since FUSE
requests are page-granular and the kernel may read ahead (not with
`direct_io`), it can exceed the bytes an application asked for; with the
client cache it can also be less (pages read earlier and not evicted since).
"""

from __future__ import annotations

import json
from typing import Any

from iobench.core.errors import DatasetError

SCHEMA = "iobench.pfs-stats"
SCHEMA_VERSION = 1
STATS_NAME = ".iobench-pfs-stats"
NOTE = ("EMULATED parallel filesystem: a local directory served through iobench's FUSE daemon "
        "with injected latency and bandwidth limits; not a real Lustre/GPFS")

COUNTERS: tuple[str, ...] = (
    "bytes_served", "read_requests", "opens", "lookups", "readdirs", "fstats", "errors",
    "metadata_wait_s", "read_service_s", "read_latency_wait_s", "read_throttle_wait_s",
    "daemon_cpu_s", "uptime_s",
)

#: The Python daemon holds the GIL for most of its work, so one core busy
#: (CPU seconds per wall second) means the daemon, not the profile, set the pace.
DAEMON_BUSY_FRACTION = 0.85
#: ... or more than 0.6 of a core while requests spent most of their time in the
#: daemon's own work rather than in the profile's emulated waits.
DAEMON_BUSY_FRACTION_OWN = 0.6


def parse_stats(text: str | bytes, where: str) -> dict[str, Any]:
    """Parse a stats document, checking schema, version and counters."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where} is not valid JSON ({e.msg}); is it an iobench-pfs mount?") from e
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise DatasetError(f"{where} is not an {SCHEMA!r} document")
    if not isinstance(doc.get("schema_version"), int) or doc["schema_version"] > SCHEMA_VERSION:
        raise DatasetError(f"{where} has schema_version={doc.get('schema_version')!r}; this "
                           f"iobench reads up to {SCHEMA_VERSION}: upgrade iobench")
    counters = doc.get("counters")
    missing = [k for k in COUNTERS if not isinstance(counters, dict) or k not in counters]
    if missing:
        raise DatasetError(f"{where} lacks counters {missing}")
    return doc


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the tier did between two stats documents of the same daemon, and what limited it.

    Returns the counter differences plus `served_MBps` (MB = 10^6 bytes, over
    the daemon's wall time between the two reads), `daemon_busy_fraction`
    (daemon CPU seconds per wall second), `limited_by` (one of `daemon`,
    `profile-bandwidth`, `profile-latency`, `client`, `idle`) and `verdict`,
    a sentence that says it is an emulation and what set the pace.
    """
    if before.get("pid") != after.get("pid") or before.get("mount") != after.get("mount"):
        raise DatasetError("the two stats documents come from different iobench-pfs daemons "
                           f"(pid {before.get('pid')} vs {after.get('pid')}); was it remounted?")
    d: dict[str, Any] = {k: after["counters"][k] - before["counters"][k] for k in COUNTERS}
    d.update(assess(d, after.get("profile") or {}))
    d["emulated"] = True
    d["profile"] = (after.get("profile") or {}).get("name")
    return d


def assess(c: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    """Verdict on cumulative or delta counters `c`: was the daemon or the profile the limit?"""
    wall = float(c["uptime_s"])
    out: dict[str, Any] = {
        "served_MBps": (c["bytes_served"] / wall / 1e6) if wall > 0 else 0.0,
        "requests_per_s": (c["read_requests"] / wall) if wall > 0 else 0.0,
        "daemon_busy_fraction": (c["daemon_cpu_s"] / wall) if wall > 0 else 0.0,
    }
    service = float(c["read_service_s"])
    throttle, latency = float(c["read_throttle_wait_s"]), float(c["read_latency_wait_s"])
    own = max(service - throttle - latency, 0.0)
    out["read_own_fraction"] = own / service if service > 0 else 0.0
    cap = profile.get("bandwidth_MBps")
    if c["read_requests"] == 0 and c["lookups"] == 0:
        limited, why = "idle", "no reads were served"
    elif out["daemon_busy_fraction"] >= DAEMON_BUSY_FRACTION or (
            out["daemon_busy_fraction"] >= DAEMON_BUSY_FRACTION_OWN
            and out["read_own_fraction"] >= 0.5):
        limited = "daemon"
        why = (f"the FUSE daemon itself was the limit (busy {out['daemon_busy_fraction']:.0%} of a "
               f"core, {out['served_MBps']:.0f} MB/s averaged over {wall:.1f} s"
               + (f" against a {cap:g} MB/s cap" if cap else "")
               + "): these figures understate the emulated profile; use a slower profile")
    elif service > 0 and throttle >= 0.5 * service:
        limited = "profile-bandwidth"
        why = (f"the profile's bandwidth/IOPS cap set the pace: read requests spent "
               f"{throttle / service:.0%} of their time waiting for it"
               + (f" (cap {cap:g} MB/s" if cap else " (")
               + f"; {out['served_MBps']:.1f} MB/s averaged over {wall:.1f} s)")
    elif service > 0 and latency + float(c["metadata_wait_s"]) >= 0.5 * (service + float(c["metadata_wait_s"])):
        limited = "profile-latency"
        why = "the profile's per-request and metadata latency set the pace"
    else:
        limited = "client"
        why = ("the reader asked for less than the tier could serve (compute-bound or "
               "too few requests in flight)")
    out["limited_by"] = limited
    out["verdict"] = f"{NOTE}. {why[0].upper()}{why[1:]}."
    return out
