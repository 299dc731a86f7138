"""Measure a storage tier, cold cache: sequential and random read bandwidth and IOPS (4 KiB and a
dataset's sample size, 1 and several readers), sequential write bandwidth, metadata rates.

Uses fio (JSON output) when installed, iobench's own measurement otherwise
(`--engine python`, or IOBENCH_PROBE_ENGINE=python); the result says which.
The default run takes about 20-30 s; --size and --runtime make it longer.
Writes an `iobench.probe` result into --results for `iobench report`, and a
profile of the tier for `iobench emulate-pfs --profile FILE` beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from iobench.core.datasets import DATASETS
from iobench.core.errors import ConfigError
from iobench.workflows.probe import ENGINES, ProbeConfig, parse_size, probe_storage, sample_size_for


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", required=True, metavar="DIR",
                   help="a directory on the tier to measure (scratch files go there and are "
                        "removed)")
    p.add_argument("--size", default="256M",
                   help="bytes per reader's file, e.g. 64M, 1G (default 256M); larger than "
                        "the storage's cache for honest parallel-filesystem figures")
    p.add_argument("--readers", default="1,4",
                   help="concurrent reader (and writer) counts, e.g. 1,4,16 (default 1,4)")
    p.add_argument("--buffered-readers", default=None, metavar="COUNTS",
                   help="reader counts of the buffered random reads at the sample size (as "
                        "loaders read: through the page cache), e.g. 2,8 for 2 loader workers "
                        "on 1 and 4 ranks; give the loaders' concurrency (default: --readers)")
    p.add_argument("--runtime", type=float, default=2.0, metavar="SECONDS",
                   help="upper bound per test in seconds (default 2)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--sample-size", default=None,
                       help="bytes per random read besides 4 KiB, one or more (e.g. 110k or "
                            "3072,110k); default: from --dataset, else 110 kB (an ImageNet JPEG)")
    group.add_argument("--dataset", choices=list(DATASETS), default=None,
                       help="take the random-read size from this dataset (its manifest under "
                            "--storage if there is one)")
    p.add_argument("--metadata-files", type=int, default=1000,
                   help="small files for the metadata rates (default 1000)")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="fio, python (iobench's own), or auto, the default: fio when installed")
    p.add_argument("--buffered", action="store_true",
                   help="no O_DIRECT even where allowed (files are evicted and read once)")
    p.add_argument("--write-via", default=None, metavar="DIR",
                   help="a writable directory that appears as --storage (the backing "
                        "directory of a read-only mount such as `iobench emulate-pfs`): "
                        "scratch files are written there and read through --storage")
    p.add_argument("--evict-cmd", default=None, metavar="CMD",
                   help="shell command that empties what no client can (a shared "
                        "filesystem's server caches), run before every read test; without it "
                        "the figures of a shared tier are marked unverified")
    p.add_argument("--profile-out", default=None, metavar="FILE",
                   help="where to write the emulated-tier profile (default: "
                        "pfs-profile-<time>-<host>.json in --results)")
    p.add_argument("--label", default=None,
                   help="the tier's name in reports (default: its kind and filesystem)")
    p.add_argument("--results", default="iobench-results", metavar="DIR",
                   help="directory for the probe result (default: ./iobench-results)")


def config_from_args(args: argparse.Namespace) -> ProbeConfig:
    if args.sample_size is not None:
        sample: int | tuple[int, ...] = tuple(parse_size(x) for x in args.sample_size.split(","))
    elif args.dataset is not None:
        sample = sample_size_for(args.dataset, args.storage)
    else:
        sample = sample_size_for("imagenet")
    size = parse_size(args.size)
    sizes = (sample,) if isinstance(sample, int) else sample
    if max(sizes) > size:
        raise ConfigError(f"--sample-size {max(sizes)} is larger than --size {size}")
    return ProbeConfig(storage=args.storage, file_bytes=size, readers=args.readers,
                       runtime_s=args.runtime, sample_bytes=sample,
                       metadata_files=args.metadata_files, engine=args.engine,
                       direct=False if args.buffered else None, label=args.label,
                       write_via=args.write_via, evict_cmd=args.evict_cmd,
                       buffered_readers=args.buffered_readers)


def main(args: argparse.Namespace) -> int:
    from iobench.core.results import write_document
    from iobench.core.world import get_world

    if get_world().size > 1:
        raise ConfigError("run `iobench probe` as one process (without mpiexec/srun/torchrun); "
                          "its --readers option sets the concurrency")
    cfg = config_from_args(args)
    doc = probe_storage(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
    path = write_document(doc, args.results, "probe")
    profile = _write_profile(doc, args.results, args.profile_out)
    s = doc["summary"]
    for w in doc["warnings"]:
        print(f"iobench: WARNING: {w}", file=sys.stderr)
    print(f"probe of {doc['storage']['path']} ({doc['storage']['fstype']}, engine "
          f"{doc['engine']}, {'O_DIRECT' if doc['direct'] else 'buffered, evicted'}): "
          f"seq read {s['seq_read_MBps']:.1f} MB/s, seq write {s['seq_write_MBps']:.1f} MB/s, "
          f"4 KiB random {s['rand4k_read_iops']:.0f} IOPS, {_sample_words(s)} "
          f"{s['sample_read_MBps']:.1f} MB/s ({s['sample_read_iops']:.0f}/s), "
          f"buffered as loaders read {_buffered_words(s)}, {s['create_per_s']:.0f} creates/s, "
          f"{s['stat_per_s']:.0f} stats/s, {s['open_stat_close_per_s']:.0f} open+stat+close/s, "
          f"{s['open_read_close_per_s']:.0f} open+read+close/s, first byte "
          f"{_ms(s['first_byte_ms_p50'])} ms (p50), {_ms(s['first_byte_ms_p99'])} ms (p99); "
          f"cache {doc['cache_status']}; result {path}")
    print(f"emulated-tier profile {profile} (replay it: iobench emulate-pfs --backing DIR "
          f"--mount MNT --profile {profile})")
    return 0


def _sample_words(s: dict[str, Any]) -> str:
    """What the sample-size figure read: `3080-byte random`, or, where O_DIRECT rounds the
    reads up, `3080-byte samples as 4096-byte random reads`."""
    bs = s.get("sample_bs_bytes") or s["sample_bytes"]  # (older documents lack it)
    if bs == s["sample_bytes"]:
        return f"{s['sample_bytes']}-byte random"
    return f"{s['sample_bytes']}-byte samples as {bs}-byte random reads"


def _buffered_words(s: dict[str, Any]) -> str:
    """The buffered sample-size random reads: `2110 reads/s (4096-byte requests, 8 readers)`."""
    return (f"{s['buffered_read_iops']:.0f} reads/s ({s['buffered_bs_bytes']}-byte requests, "
            f"{s['buffered_readers']} reader(s))")


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _write_profile(doc: dict[str, Any], results: str, out: str | None) -> Path:
    """Write the tier's emulated profile: to `out`, else a new name in `results`."""
    from iobench.core.jsonio import write_json_atomic
    from iobench.core.results import write_document
    from iobench.pfs.profiles import Profile, profile_document

    pdoc = profile_document(Profile.from_dict(doc["emulator_profile"]), doc)
    if out is not None:
        if not Path(out).parent.is_dir():
            from iobench.core.errors import StorageError

            raise StorageError(f"--profile-out {out}: its directory does not exist; create it "
                               "or give another path")
        return Path(write_json_atomic(out, pdoc))
    return write_document(pdoc, results, "pfs-profile")
