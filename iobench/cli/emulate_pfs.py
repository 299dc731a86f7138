"""`iobench emulate-pfs`: mount an EMULATED parallel filesystem (FUSE) over a local directory.

Serves DIR read-only at MNT through a background FUSE daemon that adds a
metadata round trip per file open/stat, a latency per read request, a shared
bandwidth cap and an optional IOPS cap, with figures from a named profile
(`--list-profiles` shows them and their sources). It is an emulation for
machines without Lustre/GPFS, not a real parallel filesystem.

  iobench emulate-pfs --backing DIR --mount MNT [--profile lustre-light]
  iobench emulate-pfs --backing DIR --mount MNT --profile pfs-profile-....json
                                        replay a site's tier from its `iobench probe`
  iobench emulate-pfs --status MNT      counters and what limited the reads
  iobench emulate-pfs --unmount MNT     unmount, stop the daemon, print final counters
  iobench emulate-pfs --check           is FUSE usable here? (exit 0 or 1, one line)
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from iobench.core.errors import ConfigError
from iobench.pfs import control
from iobench.pfs.config import PfsConfig
from iobench.pfs.profiles import PROFILES, load_profile, parse_ms, parse_positive
from iobench.pfs.stats import NOTE, STATS_NAME, assess


def add_arguments(p: argparse.ArgumentParser) -> None:
    action = p.add_mutually_exclusive_group()
    action.add_argument("--mount", metavar="MNT", help="mount point (an empty directory; created "
                        "if missing); needs --backing")
    action.add_argument("--unmount", metavar="MNT", help="unmount MNT and stop its daemon")
    action.add_argument("--status", metavar="MNT", help="print the counters of the tier at MNT")
    action.add_argument("--list", action="store_true", help="list emulated mounts on this node")
    action.add_argument("--list-profiles", action="store_true",
                        help="list the profiles, their figures and sources")
    action.add_argument("--check", action="store_true", help="say in one line whether FUSE is "
                        "usable here (exit 0) or why not (exit 1); for scripts")
    p.add_argument("--backing", metavar="DIR", help="local directory to serve (read-only)")
    p.add_argument("--profile", default="lustre-light", metavar="NAME|FILE",
                   help=f"cost profile: one of {', '.join(sorted(PROFILES))} (default: "
                        "lustre-light), or a profile file written by `iobench probe` on a real "
                        "tier (pfs-profile-*.json, or the probe-*.json result itself)")
    p.add_argument("--open-latency", metavar="MS", help="override: metadata round trip per "
                   "file open/stat and per directory listing, in milliseconds")
    p.add_argument("--read-latency", metavar="MS", help="override: latency per read request "
                   "(up to 1 MiB each), in milliseconds")
    p.add_argument("--bandwidth", metavar="MB/s", help="override: bandwidth cap shared by all "
                   "readers of the mount, MB/s (10^6 bytes/s)")
    p.add_argument("--iops", metavar="N", help="override: cap on read requests per second")
    p.add_argument("--direct-io", action="store_true", help="no kernel page cache or readahead "
                   "for the mount: served bytes equal requested bytes, but mmap (LMDB) fails")
    p.add_argument("--kernel-cache", action="store_true", help="a warm client: also keep "
                   "names and attributes 60 s, so repeated opens/stats cost no metadata round "
                   "trip (data pages are kept across opens in any case)")
    p.add_argument("--no-client-cache", action="store_true", help="drop the mount's pages at "
                   "every open (no real client does; kept to reproduce figures measured that way)")
    p.add_argument("--no-evict-backing", action="store_true", help="keep the backing files' "
                   "pages in the page cache after serving them")
    p.add_argument("--foreground", action="store_true", help="serve in this process until "
                   "unmounted or interrupted (Ctrl-C unmounts)")
    p.add_argument("--lazy", action="store_true", help="with --unmount: detach even while "
                   "files are open (the mount goes when they are closed)")
    p.add_argument("--json", action="store_true", help="with --status/--unmount: print the "
                   "stats document as JSON")


def main(args: argparse.Namespace) -> int:
    if args.list_profiles:
        return _list_profiles()
    if args.check:
        return _check()
    if args.list:
        return _list()
    if args.unmount:
        return _unmount(args)
    if args.status:
        return _status(args)
    return _mount(args)


def _check() -> int:
    problem = control.fuse_problem()
    print(f"FUSE unusable: {problem}" if problem else
          "FUSE usable: `iobench emulate-pfs` can mount an emulated parallel filesystem")
    return 1 if problem else 0


def _list() -> int:
    mounts = control.emulated_mounts()
    for m in mounts:
        print(m)
    if not mounts:
        print("no emulated parallel filesystem is mounted on this node")
    return 0


def _unmount(args: argparse.Namespace) -> int:
    doc = control.unmount(args.unmount, lazy=args.lazy)
    if args.json and doc is not None:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"iobench: unmounted the emulated parallel filesystem at "
          f"{os.path.abspath(args.unmount)}; daemon stopped")
    if doc is not None:
        _print_counters(doc)
    return 0


def _status(args: argparse.Namespace) -> int:
    doc = control.status(args.status)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(f"{doc['mount']}: {NOTE}")
        print(f"  backing {doc['backing']}, daemon pid {doc['pid']}, libfuse {doc['libfuse']}")
        _print_counters(doc)
    return 0


def _mount_config(args: argparse.Namespace) -> PfsConfig:
    """The mount's configuration from the options, checked."""
    if not args.mount:
        raise ConfigError("give --mount MNT --backing DIR, or --unmount/--status MNT, --list, "
                          "--list-profiles (see `iobench emulate-pfs --help`)")
    if not args.backing:
        raise ConfigError("--mount needs --backing DIR, the local directory to serve")
    if args.direct_io and args.kernel_cache:
        raise ConfigError("--direct-io and --kernel-cache contradict each other; choose one")
    if args.kernel_cache and args.no_client_cache:
        raise ConfigError("--kernel-cache and --no-client-cache contradict each other; "
                          "choose one")
    return control.build_config(
        args.backing, args.mount, load_profile(args.profile),
        open_latency_ms=_opt(args.open_latency, "--open-latency", parse_ms),
        read_latency_ms=_opt(args.read_latency, "--read-latency", parse_ms),
        bandwidth_MBps=_opt(args.bandwidth, "--bandwidth", parse_positive),
        iops=_opt(args.iops, "--iops", parse_positive),
        direct_io=args.direct_io, kernel_cache=args.kernel_cache,
        evict_backing=not args.no_evict_backing, client_cache=not args.no_client_cache)


def _mount(args: argparse.Namespace) -> int:
    config = _mount_config(args)
    if args.foreground:
        from iobench.pfs._daemon import run_daemon
        from iobench.pfs.config import state_paths

        control.require_fuse()
        control.check_paths(config)
        state_paths(config.mountpoint).pid.parent.mkdir(parents=True, exist_ok=True)
        print(f"iobench: serving {config.profile.describe()}")
        print(f"  at {config.mountpoint} (backing {config.backing}) in the foreground; "
              "Ctrl-C or `iobench emulate-pfs --unmount` stops it")
        return run_daemon(config)
    handle = control.mount_config(config)
    print(f"iobench: mounted an {config.profile.describe()}")
    print(f"  at {handle.mountpoint} (backing {handle.backing}, daemon pid {handle.pid}, "
          f"log {handle.paths.log})")
    print(f"  counters: {handle.mountpoint}/{STATS_NAME} or `iobench emulate-pfs --status "
          f"{handle.mountpoint}`; stop: `iobench emulate-pfs --unmount {handle.mountpoint}`")
    return 0


def _opt(value: str | None, name: str, parse: Any) -> float | None:
    return None if value is None else parse(value, name)


def _print_counters(doc: dict[str, Any]) -> None:
    c = doc["counters"]
    prof = doc.get("profile") or {}
    a = assess(c, prof)
    print(f"  profile {prof.get('name')!r}: metadata {prof.get('metadata_ms')} ms, read request "
          f"{prof.get('read_ms')} ms, bandwidth "
          f"{prof.get('bandwidth_MBps') or 'unlimited'} MB/s, iops {prof.get('iops') or 'unlimited'}")
    print(f"  served {c['bytes_served']:,} bytes in {c['read_requests']:,} read requests, "
          f"{c['opens']:,} opens, {c['lookups']:,} lookups/stats, {c['readdirs']:,} listings "
          f"over {c['uptime_s']:.1f} s (daemon CPU {c['daemon_cpu_s']:.2f} s)")
    print(f"  waits: metadata {c['metadata_wait_s']:.3f} s, read latency "
          f"{c['read_latency_wait_s']:.3f} s, bandwidth/IOPS {c['read_throttle_wait_s']:.3f} s")
    print(f"  client cache: {_cache_mode(doc.get('options') or {})}")
    print(f"  {a['verdict']}")


def _cache_mode(opts: dict[str, Any]) -> str:
    """The mount's client-side caching in words (stats documents before issue 11 lack it)."""
    if opts.get("direct_io"):
        return "none (direct I/O: every read reaches the daemon)"
    # before issue 11 only --kernel-cache kept pages across opens
    if not opts.get("client_cache", bool(opts.get("kernel_cache"))):
        return "pages dropped at every open (--no-client-cache)"
    names = ("names and attributes kept 60 s too (--kernel-cache)" if opts.get("kernel_cache")
             else "every open/stat costs a metadata round trip")
    return f"data pages kept across opens until evicted through the mount; {names}"


def _list_profiles() -> int:
    print("Profiles of the EMULATED parallel filesystem (figures per client node):")
    for p in PROFILES.values():
        bw = "unlimited" if p.bandwidth_MBps is None else f"{p.bandwidth_MBps:g} MB/s"
        iops = "unlimited" if p.iops is None else f"{p.iops:g}/s"
        print(f"\n{p.name}: {p.imitates}")
        print(f"  metadata {p.metadata_ms:g} ms, read request {p.read_ms:g} ms, bandwidth {bw}, "
              f"read requests {iops}")
        for s in p.sources:
            print(f"  source: {s}")
    return 0
