"""Configuration of one emulated-tier mount, and where its pid, state and log files live."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iobench.core.errors import ConfigError
from iobench.pfs.profiles import Profile

MiB = 1 << 20
#: Largest read request the kernel sends with libfuse 3 (256 pages); fewer,
#: larger requests keep a Python daemon's per-request cost low.
DEFAULT_MAX_READ_BYTES = MiB


@dataclass(frozen=True)
class PfsConfig:
    """One mount: backing directory, mount point, cost profile and cache behaviour.

    - `client_cache` (default): the mount's page cache is the client cache of
      a Lustre/GPFS node: data pages survive `open()` and `close()` and are
      dropped only by eviction (`iobench.core.cache.evict` does
      `POSIX_FADV_DONTNEED` through the mount, as before every cold epoch)
      or memory pressure. Every open and stat still costs its metadata round
      trip (names expire at once). Off: the pages are dropped at every open,
      which no real client does (it punishes open-per-sample readers).
    - `direct_io`: every read goes to the daemon exactly as the application
      issued it (no kernel readahead or page cache for the mount, so no
      client cache either), so served bytes equal requested bytes; but shared
      `mmap` (LMDB) then fails with ENODEV, as libfuse 3.14 cannot ask the
      kernel to allow it.
    - `kernel_cache`: a warm client: names and attributes are kept too (60 s),
      so repeated opens and stats of a file cost no metadata round trip.
    - `evict_backing`: drop the backing file's pages after serving them, so
      the local disk's page cache does not make the backing look faster.
    """

    backing: str
    mountpoint: str
    profile: Profile
    direct_io: bool = False
    kernel_cache: bool = False
    evict_backing: bool = True
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES
    client_cache: bool = True

    def __post_init__(self) -> None:
        if self.direct_io and self.kernel_cache:
            raise ConfigError("direct_io=True and kernel_cache=True contradict each other; "
                              "choose one")
        if self.kernel_cache and not self.client_cache:
            raise ConfigError("kernel_cache=True (a warm client) and client_cache=False (pages "
                              "dropped at every open) contradict each other; choose one")
        if not (4096 <= self.max_read_bytes <= 16 * MiB) or self.max_read_bytes % 4096:
            raise ConfigError(f"max_read_bytes={self.max_read_bytes} must be a multiple of 4096 "
                              "between 4096 and 16 MiB")
        for name in ("backing", "mountpoint"):
            if not os.path.isabs(getattr(self, name)):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be an absolute path")

    def to_dict(self) -> dict[str, Any]:
        return {"backing": self.backing, "mountpoint": self.mountpoint,
                "profile": self.profile.to_dict(), "direct_io": self.direct_io,
                "kernel_cache": self.kernel_cache, "evict_backing": self.evict_backing,
                "max_read_bytes": self.max_read_bytes, "client_cache": self.client_cache}

    @property
    def keeps_pages(self) -> bool:
        """Whether data pages survive opens (the client cache); never with direct_io."""
        return self.client_cache and not self.direct_io

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PfsConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown emulate-pfs config keys {unknown}; expected {sorted(known)}")
        d = dict(d)
        d["profile"] = Profile.from_dict(d["profile"])
        return cls(**d)


RUN_DIR_ENV = "IOBENCH_PFS_RUN_DIR"


def run_dir() -> Path:
    """Where pid, state and log files live: $IOBENCH_PFS_RUN_DIR, /run/iobench-pfs (root) or /tmp."""
    env = os.environ.get(RUN_DIR_ENV)
    if env:
        return Path(env)
    if os.geteuid() == 0 and os.access("/run", os.W_OK):
        return Path("/run/iobench-pfs")
    return Path(f"/tmp/iobench-pfs-{os.geteuid()}")


@dataclass(frozen=True)
class StatePaths:
    """The files that belong to the daemon of one mount point."""

    pid: Path
    state: Path
    log: Path
    final_stats: Path


def state_paths(mountpoint: str) -> StatePaths:
    """File names derived from the absolute mount point (readable, and unique by a hash)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", mountpoint.strip("/"))[-60:] or "root"
    key = f"{slug}-{hashlib.sha256(mountpoint.encode()).hexdigest()[:10]}"
    d = run_dir()
    return StatePaths(pid=d / f"{key}.pid", state=d / f"{key}.json", log=d / f"{key}.log",
                      final_stats=d / f"{key}.final-stats.json")
