"""Emulated parallel-filesystem profiles: what each imitates, its figures, and their sources.

A profile is the cost model the FUSE daemon adds on top of the local backing
directory. It is an *emulation*: the figures stand for what one client node
sees of a real Lustre or GPFS, scaled where needed to fit under the ceiling
of a Python FUSE daemon (about 600-700 MB/s and ~9k small reads/s on two
cores). Every figure below says where it comes from or that it is an
assumption; change a figure only together with its source line.

The model (see `iobench/pfs/_daemon.py`):
- `metadata_ms`: one metadata-server round trip, charged per lookup or
  `stat` of a file by path (the kernel revalidates the file's name on every
  `open`, as dentries expire at once) and per directory listing. An `open()`
  therefore costs one round trip, like Lustre's intent-open RPC. Directories
  along a path and `fstat` on an open file are not charged: real Lustre/GPFS
  clients keep those cached under locks.
- `read_ms`: latency of one read RPC (request to first byte), per request the
  kernel sends (up to 1 MiB each); concurrent requests overlap, as RPCs in
  flight do.
- `bandwidth_MBps`: the client's share of the servers' bandwidth, a token
  bucket shared by every reader of the mount (MB = 10^6 bytes).
- `iops`: optional cap on read requests per second across the mount.

A site's own tier becomes a profile through `iobench probe` (which writes a
profile file, `profile_from_probe`), and `iobench emulate-pfs --profile FILE`
replays it (`load_profile`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from iobench.core.errors import ConfigError, DatasetError
from iobench.core.jsonio import load_json

#: Measured on this project's 2-core development machine (issue 7): a Python
#: FUSE daemon serves about 600-700 MB/s of 1 MiB reads (and ~9k small reads/s).
#: Profiles stay below it so the profile, not the daemon, is the bottleneck.
DAEMON_CEILING_MBPS = 600.0


@dataclass(frozen=True)
class Profile:
    """A cost model for the emulated tier (milliseconds, MB/s = 10^6 bytes/s, requests/s)."""

    name: str
    imitates: str
    metadata_ms: float = 0.0
    read_ms: float = 0.0
    bandwidth_MBps: float | None = None
    iops: float | None = None
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("name", "imitates"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"profile {key}={_show(value)} must be a non-empty string")
        for key in ("metadata_ms", "read_ms", "bandwidth_MBps", "iops"):
            value = getattr(self, key)
            optional = key in ("bandwidth_MBps", "iops")
            if (value is None and not optional) or (value is not None and (
                    isinstance(value, bool) or not isinstance(value, (int, float)))):
                raise ConfigError(f"profile {self.name!r}: {key}={_show(value)} must be a "
                                  f"number{' or null' if optional else ''}, not "
                                  f"{type(value).__name__}")
        if not isinstance(self.sources, tuple) or not all(isinstance(x, str)
                                                          for x in self.sources):
            raise ConfigError(f"profile {self.name!r}: sources={_show(self.sources)} must be a "
                              "list of strings (where each figure comes from)")
        parse_ms(self.metadata_ms, "metadata_ms")
        parse_ms(self.read_ms, "read_ms")
        if self.bandwidth_MBps is not None:
            parse_positive(self.bandwidth_MBps, "bandwidth_MBps")
        if self.iops is not None:
            parse_positive(self.iops, "iops")

    def with_overrides(self, *, metadata_ms: float | None = None, read_ms: float | None = None,
                       bandwidth_MBps: float | None = None, iops: float | None = None) -> Profile:
        """This profile with the given figures replaced (None keeps the profile's own)."""
        changes: dict[str, Any] = {}
        if metadata_ms is not None:
            changes["metadata_ms"] = metadata_ms
        if read_ms is not None:
            changes["read_ms"] = read_ms
        if bandwidth_MBps is not None:
            changes["bandwidth_MBps"] = bandwidth_MBps
        if iops is not None:
            changes["iops"] = iops
        if not changes:
            return self
        return replace(self, name=f"{self.name}+custom", **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sources"] = list(self.sources)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        """Rebuild a profile; unknown keys are an error, named."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown profile keys {unknown}; expected some of {sorted(known)}")
        d = dict(d)
        sources = d.get("sources", [])
        if not isinstance(sources, list):
            raise ConfigError(f"profile {_show(d.get('name'))}: sources={_show(sources)} must "
                              "be a list of strings (where each figure comes from)")
        d["sources"] = tuple(sources)
        try:
            return cls(**d)
        except TypeError as e:  # a required key missing
            raise ConfigError(f"profile {d.get('name')!r}: {e}; a profile needs at least "
                              "'name' and 'imitates'") from None

    def describe(self) -> str:
        """One line: the figures, and that this is an emulation."""
        bw = "unlimited" if self.bandwidth_MBps is None else f"{self.bandwidth_MBps:g} MB/s"
        iops = "" if self.iops is None else f", {self.iops:g} read requests/s"
        return (f"EMULATED parallel filesystem, profile {self.name!r} ({self.imitates}): "
                f"metadata {self.metadata_ms:g} ms, read request {self.read_ms:g} ms, "
                f"bandwidth {bw}{iops}")


def _show(value: Any) -> str:
    """A value as a person reads it in one line (at most 60 characters)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_ms(value: Any, name: str) -> float:
    """A latency in milliseconds: a finite number >= 0 and below one minute."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a number; give milliseconds, e.g. 0.5") from None
    if not math.isfinite(v) or v < 0 or v > 60_000:
        raise ConfigError(f"{name}={value!r} must be between 0 and 60000 ms")
    return v


def parse_positive(value: Any, name: str) -> float:
    """A rate (MB/s or requests/s): a finite number > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a number") from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{name}={value!r} must be a finite number > 0")
    return v


_DELL_MDTEST = ("Dell HPC Lustre Storage with Intel Omni-Path / EDR InfiniBand white papers "
                "(mdtest 1.9.3, Lustre 2.7): one client thread does ~2,000 file stats/s and "
                "~1,100 creates/s on an otherwise idle system, i.e. ~0.5 ms per metadata RPC")
_LNET_RPC = ("Lustre Operations Manual, 'Tuning the Client' (max_pages_per_rpc, 1 MiB bulk RPCs); "
             "LNet over InfiniBand adds tens of microseconds, an OSS serving from SSD/cache "
             "0.1-0.5 ms: representative assumption 0.3 ms per idle read RPC")
_SCALED = (f"scaled down: a real client gets 1-10+ GB/s; the emulator keeps the cap below the "
           f"Python FUSE daemon's ceiling (~{DAEMON_CEILING_MBPS:g} MB/s on 2 cores) so the "
           "profile, not the daemon, limits reads; ratios between profiles are what matter")

# name -> profile. Adding a profile is one entry here (and a line in docs/pfs.md).
PROFILES: dict[str, Profile] = {
    "lustre-light": Profile(
        name="lustre-light",
        imitates="a lightly loaded Lustre as seen by one client node",
        metadata_ms=0.5, read_ms=0.3, bandwidth_MBps=400.0, iops=None,
        sources=(_DELL_MDTEST, _LNET_RPC, _SCALED),
    ),
    "lustre-busy": Profile(
        name="lustre-busy",
        imitates="a heavily loaded, shared production Lustre (many jobs on the same MDS/OSS)",
        metadata_ms=5.0, read_ms=3.0, bandwidth_MBps=120.0, iops=2000.0,
        sources=(
            "Dell mdtest white papers (above): file-create rate grows ~30x from 1 to 240 threads "
            "while the per-operation time of each thread grows; at saturation a queued metadata "
            "RPC waits several ms. Representative assumption: 5 ms per metadata RPC, 10x idle",
            "Representative assumption: 3 ms per read RPC when OSS queues are deep "
            "(10x the idle 0.3 ms), and a client share of 120 MB/s (under a third of "
            "lustre-light) with 2,000 read RPCs/s, as when many jobs share the OSTs",
            _SCALED,
        ),
    ),
    "gpfs": Profile(
        name="gpfs",
        imitates="IBM Spectrum Scale (GPFS) with token-cached metadata, one client node",
        metadata_ms=0.3, read_ms=0.5, bandwidth_MBps=300.0, iops=None,
        sources=(
            "Representative assumption: GPFS clients cache inodes under tokens, so a stat "
            "or open that the client holds a token for is cheaper than Lustre's MDS RPC "
            "(0.3 ms); reads go to NSD servers in filesystem blocks (often 4-16 MiB), "
            "so the per-request latency is higher (0.5 ms)",
            _SCALED,
        ),
    ),
    "passthrough": Profile(
        name="passthrough",
        imitates="nothing: no added cost; measures the FUSE daemon's own ceiling",
        sources=("no injected figures; use it to see what the daemon alone achieves",),
    ),
}


def get_profile(name: str) -> Profile:
    """The profile called `name`; an unknown name is a ConfigError listing the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)} "
                          "or give --open-latency/--read-latency/--bandwidth with "
                          "--profile passthrough") from None


# ----------------------------------------------------------- a site's tier, from its probe

PROFILE_SCHEMA = "iobench.pfs-profile"
PROFILE_SCHEMA_VERSION = 1


def profile_from_probe(doc: dict[str, Any]) -> Profile:
    """The emulated-tier profile that imitates a probed tier (an `iobench.probe` v2 document).

    - `metadata_ms`: what a file's open and close cost (a cold name lookup
      and the open, plus the close: median over cold small files, one thread);
      the emulator charges it once per open;
    - `read_ms`: one read request's latency: the first read of a cold small
      file (median, one thread), a buffered read as loaders issue them;
    - `bandwidth_MBps`: the best sequential read over reader counts;
    - no IOPS cap: concurrent readers overlap their latencies, as on the tier.
    The emulator adds its own FUSE round trips (tens of microseconds) on top.
    """
    s, st = doc.get("summary"), doc.get("storage")
    if not isinstance(s, dict) or not isinstance(st, dict):
        raise ConfigError("not an iobench probe result (no summary/storage); give a file "
                          "written by `iobench probe`")
    need = ("cold_open_ms_p50", "close_ms_p50", "cold_read_ms_p50", "seq_read_MBps")
    if not all(_figure(s.get(k)) for k in need) or not s["seq_read_MBps"]:
        raise ConfigError(f"probe result of {st.get('path')} lacks the figures a profile needs "
                          f"({', '.join(f'{k}={s.get(k)!r}' for k in need)}); probe the tier "
                          "again with this iobench")
    opened, closed, read_ms, bw = (s[k] for k in need)
    metadata_ms = opened + closed
    where = f"{st.get('fstype')} {st.get('source')} at {st.get('path')}"
    provenance = doc.get("provenance")
    host = provenance.get("host", "?") if isinstance(provenance, dict) else "?"
    label = doc.get("label") or st.get("fstype")
    sources = [
        f"iobench probe of {where} on {host}, {doc.get('created')} (engine {doc.get('engine')}"
        f", {'O_DIRECT' if doc.get('direct') else 'buffered, evicted'}, cache "
        f"{doc.get('cache_status', 'unknown')})",
        f"metadata {metadata_ms:.3f} ms = cold open {opened:.3f} ms + close {closed:.3f} ms "
        "(medians over cold small files, one thread)",
        f"read request {read_ms:.3f} ms = first read of a cold small file (median, one "
        "thread)",
        f"bandwidth {bw:.0f} MB/s = best sequential read over {s.get('readers_max')} reader(s)",
    ]
    if bw > DAEMON_CEILING_MBPS:
        sources.append(f"above the emulator's ceiling (~{DAEMON_CEILING_MBPS:g} MB/s, a Python "
                       "FUSE daemon on 2 cores): the daemon, not the profile, will limit reads")
    return Profile(name=f"probe:{label}", imitates=f"the probed tier {where}",
                   metadata_ms=_sig(metadata_ms), read_ms=_sig(read_ms),
                   bandwidth_MBps=_sig(bw), iops=None, sources=tuple(sources))


def _figure(value: Any) -> bool:
    """Whether a probe's figure is one a profile can use: a finite number >= 0."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value >= 0)


def _sig(x: float) -> float:
    """Six significant digits: a readable file that loses nothing a profile can use."""
    return float(f"{x:.6g}")


def profile_document(profile: Profile, probe: dict[str, Any] | None = None) -> dict[str, Any]:
    """The profile file `iobench probe` writes (`iobench.pfs-profile` v1)."""
    doc: dict[str, Any] = {"schema": PROFILE_SCHEMA, "schema_version": PROFILE_SCHEMA_VERSION,
                           "kind": "pfs-profile", "profile": profile.to_dict()}
    if probe is not None:
        doc["probe"] = {"label": probe.get("label"), "created": probe.get("created"),
                        "storage": probe.get("storage"), "summary": probe.get("summary"),
                        "cache_status": probe.get("cache_status")}
    return doc


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (`PROFILES`), or from a file: a profile file written by `iobench
    probe`, or a probe result itself; a one-line ConfigError otherwise."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"--profile {name_or_path!r} is neither a profile name "
                          f"({', '.join(sorted(PROFILES))}) nor a file; give a profile file "
                          "written by `iobench probe`")
    try:
        doc = load_json(path)  # a regular file, UTF-8, JSON: else one line
    except DatasetError as e:
        raise ConfigError(f"--profile {path}: cannot read it as JSON ({e}); give a profile "
                          "file written by `iobench probe`") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == PROFILE_SCHEMA:
        if doc.get("schema_version") != PROFILE_SCHEMA_VERSION:
            raise ConfigError(f"--profile {path}: {schema} v{doc.get('schema_version')}, this "
                              f"iobench reads v{PROFILE_SCHEMA_VERSION}")
        if not isinstance(doc.get("profile"), dict):
            raise ConfigError(f"--profile {path}: no 'profile' object in it")
        return Profile.from_dict(doc["profile"])
    if schema == "iobench.probe":
        return profile_from_probe(doc)
    raise ConfigError(f"--profile {path} is a {schema or 'non-iobench'} document, not a "
                      "profile; give the pfs-profile-*.json file `iobench probe` wrote (or "
                      "its probe-*.json result)")
