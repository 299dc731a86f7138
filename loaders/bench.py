"""Pure-read benchmark: loaders x workers x shuffle with no model, cold cache, vs naive and dd.

Each run evicts the dataset's pages on every node (`iobench.cache`), records
the residency it measured, iterates `epochs` epochs of one rank's share and
times every `next()` (METRICS.md: wait per batch, first batch apart). Figures
per run: samples/s and MB/s (global samples / payload bytes over the slowest
rank's wall time), wait p50/p95/p99, `os_read_bytes` (`/proc/<pid>/io` of the
rank and its workers), and ratios to the naive per-sample h5py baseline with
the same batch size and workers, and to `dd` with direct I/O reading the same
files in the same run (the storage's own sequential rate).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iobench import cache, procio, sampling
from iobench.datasets import dataset_dirname, parse_dataset, parse_format
from iobench.errors import ConfigError, DatasetNotFoundError
from iobench.loaders import LOADERS, make_loader
from iobench.loaders.base import WORKER_TYPES, Batch, LoaderConfig
from iobench.manifest import Manifest
from iobench.world import World

SCHEMA = "iobench.bench_read"
SCHEMA_VERSION = 1
NAIVE = "naive-h5py"
DD_MIN_FILE = 1 << 20  # bytes; below this mean file size dd's start-up dominates


@dataclass(frozen=True)
class BenchReadConfig:
    """The grid to measure. Validated when built."""

    storage: str
    dataset: str
    format: str
    loaders: tuple[str, ...]
    workers: tuple[int, ...] = (0, 2, 4)
    shuffles: tuple[str, ...] = ("global", "block", "none")
    worker_type: str = "process"
    batch_size: int = 64
    epochs: int = 1
    decode: bool = True
    warm_cache: bool = False
    block_size: int = 256
    shuffle_window: int = 16
    seed: int = 0
    naive: bool = True
    dd: bool = True
    dd_max_files: int = 64  # files dd reads (a random subset of larger datasets), for time
    device: str = "cpu"
    max_batches: int | None = None  # per epoch, to bound a run on a huge dataset

    def __post_init__(self) -> None:
        parse_dataset(self.dataset)
        parse_format(self.format)
        if not self.loaders:
            raise ConfigError("loaders=() is empty; name at least one of "
                              f"{', '.join(LOADERS)}")
        for name in self.loaders:
            if name not in LOADERS:
                raise ConfigError(f"unknown loader {name!r}; choose from {', '.join(LOADERS)}")
        if not self.workers or any(w < 0 for w in self.workers):
            raise ConfigError(f"workers={self.workers} must be one or more counts >= 0")
        if not self.shuffles:
            raise ConfigError("shuffles=() is empty; name global, block or none")
        for s in self.shuffles:
            sampling.parse_shuffle(s)
        if self.worker_type not in WORKER_TYPES:
            raise ConfigError(f"worker_type={self.worker_type!r}; choose one of {WORKER_TYPES}")
        if self.batch_size < 1 or self.epochs < 1:
            raise ConfigError(f"batch_size={self.batch_size} and epochs={self.epochs} must be >= 1")
        if self.dd_max_files < 1:
            raise ConfigError(f"dd_max_files={self.dd_max_files} must be >= 1")
        LoaderConfig(batch_size=self.batch_size, worker_type=self.worker_type,  # validates
                     block_size=self.block_size, shuffle_window=self.shuffle_window,
                     seed=self.seed, device=self.device)
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"max_batches={self.max_batches} must be >= 1 (or None)")

    @property
    def root(self) -> Path:
        return Path(self.storage) / dataset_dirname(self.dataset, self.format)


def _pct(a: list[float], q: float) -> float | None:
    return float(np.percentile(a, q)) if a else None


def _epoch_run(loader: Any, epoch: int, max_batches: int | None) -> dict[str, Any]:
    """Iterate one epoch; time each next() (seconds), count samples and payload bytes."""
    waits: list[float] = []
    first = None
    samples = payload = steps = 0
    it: Iterator[Batch] = loader.epoch(epoch)
    t0 = last = time.perf_counter_ns()
    try:
        for b in it:
            if b.samples.is_cuda:  # the batch is usable when its copy/decode is done
                torch.cuda.synchronize()
            now = time.perf_counter_ns()
            w = (now - last) / 1e9
            if first is None:
                first = w
            else:
                waits.append(w)
            samples += len(b.labels)
            payload += b.payload_bytes
            steps += 1
            last = time.perf_counter_ns()
            if max_batches is not None and steps >= max_batches:
                break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return {"wall_s": (last - t0) / 1e9, "first_batch_s": first, "steps": steps,
            "samples": samples, "batch_bytes": payload, "waits": waits}


def measure(make: Callable[[], Any], manifest: Manifest, cfg: BenchReadConfig,
            world: World) -> dict[str, Any]:
    """Build a loader, run `cfg.epochs` epochs cold (or warm), return the figures across ranks."""
    loader = make()
    epochs = []
    try:
        for e in range(cfg.epochs):
            ev = cache.evict_for_node(manifest, world, evict_pages=not cfg.warm_cache,
                                      loud=False)
            world.barrier()
            io0 = procio.tree_io()
            r = _epoch_run(loader, e, cfg.max_batches)
            io1 = procio.tree_io()
            r["os_read_bytes"] = procio.os_read_bytes(io1 - io0, manifest.root or ".")
            r["rchar"] = (io1 - io0).rchar
            ranks = world.allgather(r)
            epochs.append({"epoch": e, "cache": ev.to_dict(), "ranks": ranks})
    finally:
        loader.close()
    return summarise(epochs)


def summarise(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over all epochs and ranks (METRICS.md definitions)."""
    wall = sum(max(r["wall_s"] for r in ep["ranks"]) for ep in epochs)
    samples = sum(r["samples"] for ep in epochs for r in ep["ranks"])
    payload = sum(r["batch_bytes"] for ep in epochs for r in ep["ranks"])
    waits = [w for ep in epochs for r in ep["ranks"] for w in r["waits"]]
    osr = [r["os_read_bytes"] for ep in epochs for r in ep["ranks"]]
    res = [ep["cache"]["resident_fraction"] for ep in epochs]
    out = {
        "epochs": len(epochs), "samples": samples, "batch_bytes": payload, "wall_s": wall,
        "samples_per_s": samples / wall if wall > 0 else None,
        "read_MBps": payload / wall / 1e6 if wall > 0 else None,
        "wait_p50_s": _pct(waits, 50), "wait_p95_s": _pct(waits, 95),
        "wait_p99_s": _pct(waits, 99), "wait_max_s": max(waits) if waits else None,
        "first_batch_s": max((r["first_batch_s"] or 0.0) for ep in epochs for r in ep["ranks"]),
        "os_read_bytes": None if any(v is None for v in osr) else sum(osr),
        "cache_resident_fraction_at_start": None if any(v is None for v in res) else max(res),
        "cache_status": sorted({ep["cache"]["status"] for ep in epochs}),
        "cache_warnings": sorted({ep["cache"]["warning"] for ep in epochs if ep["cache"]["warning"]}),
    }
    for ep in epochs:
        for r in ep["ranks"]:
            r["wait_p50_s"], r["wait_p99_s"] = _pct(r["waits"], 50), _pct(r["waits"], 99)
            del r["waits"]
    out["per_epoch"] = epochs
    return out


def dd_baseline(manifest: Manifest, max_files: int, seed: int = 0) -> dict[str, Any]:
    """Read data files with `dd bs=16M iflag=direct` one after another; MB/s (10^6 B/s).

    Falls back to buffered reads after page eviction where the filesystem
    refuses O_DIRECT (tmpfs, some FUSE), and says so in `mode`.
    """
    dd = shutil.which("dd")
    if dd is None:
        return {"available": False, "why": "dd not found"}
    files = list(manifest.data_files)
    mean = sum(f.bytes for f in files) / max(1, len(files))
    if mean < DD_MIN_FILE:
        return {"available": False,
                "why": f"data files average {mean / 1e3:.0f} kB: starting one dd per file "
                       "would dominate what it measures (reference needs files >= 1 MiB)"}
    if len(files) > max_files:
        files = random.Random(seed).sample(files, max_files)
    paths = [str(manifest.path_of(f)) for f in files]
    probe = subprocess.run([dd, f"if={paths[0]}", "of=/dev/null", "bs=4096", "count=1",
                            "iflag=direct", "status=none"], capture_output=True, text=True)
    flags = ["iflag=direct"]
    mode = "direct"
    if probe.returncode != 0:
        flags = []
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        mode = f"buffered after page eviction (O_DIRECT refused: {why})"
    cache.evict(paths)
    total = 0
    t0 = time.perf_counter_ns()
    for p in paths:
        r = subprocess.run([dd, f"if={p}", "of=/dev/null", "bs=16M", "status=none", *flags],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return {"available": False, "why": f"dd failed on {p}: {r.stderr.strip()}"}
        total += os.path.getsize(p)
    secs = (time.perf_counter_ns() - t0) / 1e9
    return {"available": True, "mode": mode, "files": len(paths), "bytes": total,
            "seconds": secs, "MBps": total / secs / 1e6 if secs > 0 else None}


def naive_manifest(cfg: BenchReadConfig, manifest: Manifest) -> Manifest | None:
    """The HDF5 copy of the dataset the naive baseline reads, if there is one."""
    if manifest.format == "hdf5":
        return manifest
    root = Path(cfg.storage) / dataset_dirname(cfg.dataset, "hdf5")
    try:
        return Manifest.load(root)
    except DatasetNotFoundError:
        return None


def run(cfg: BenchReadConfig, world: World,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure the grid; return the bench-read document (rows, dd, config)."""
    manifest = Manifest.load(cfg.root)
    if manifest.dataset != cfg.dataset or manifest.format != cfg.format:
        raise ConfigError(f"{cfg.root} holds {manifest.dataset}/{manifest.format}, not "
                          f"{cfg.dataset}/{cfg.format}")
    say = progress or (lambda s: None)
    rows: list[dict[str, Any]] = []
    nm = naive_manifest(cfg, manifest) if cfg.naive else None
    naive_by_workers: dict[int, float | None] = {}
    dd = None
    if cfg.dd:
        say("dd: reading the data files with direct I/O")
        dd = dd_baseline(manifest, cfg.dd_max_files, cfg.seed) if world.rank == 0 else None
        dd = world.bcast(dd)
    for w in cfg.workers:
        if nm is not None:
            from iobench.loaders.naive import NaiveLoader

            say(f"naive baseline, workers={w}")
            fig = measure(lambda nm=nm, w=w: NaiveLoader(nm, cfg.batch_size, w, True, cfg.decode,
                                                         cfg.seed, world.rank, world.size),
                          nm, cfg, world)
            naive_by_workers[w] = fig["samples_per_s"]
            rows.append({"loader": NAIVE, "workers": w, "worker_type": "process",
                         "shuffle": "global", **fig})
        for name in cfg.loaders:
            for shuffle in cfg.shuffles:
                say(f"{name}, workers={w}, shuffle={shuffle}")
                lc = LoaderConfig(batch_size=cfg.batch_size, workers=w,
                                  worker_type=cfg.worker_type, shuffle=shuffle,
                                  block_size=cfg.block_size, shuffle_window=cfg.shuffle_window,
                                  seed=cfg.seed, decode=cfg.decode, device=cfg.device)
                fig = measure(lambda name=name, lc=lc: make_loader(name, manifest, lc,
                                                                   world.rank, world.size),
                              manifest, cfg, world)
                wtype = "process" if name == "dali" else cfg.worker_type  # DALI: processes
                rows.append({"loader": name, "workers": w, "worker_type": wtype,
                             "shuffle": shuffle, **fig})
    for r in rows:
        base = naive_by_workers.get(r["workers"])
        r["vs_naive"] = r["samples_per_s"] / base if base and r["samples_per_s"] else None
        ddm = dd.get("MBps") if dd else None
        r["vs_dd"] = r["read_MBps"] / ddm if ddm and r["read_MBps"] else None
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "config": asdict(cfg),
            "dataset": manifest.identity(), "world": {"size": world.size,
                                                      "nodes": world.num_nodes},
            "dd": dd, "naive_dataset": str(nm.root) if nm is not None else None, "rows": rows}


def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def markdown_table(doc: dict[str, Any]) -> str:
    """The rows as a Markdown table (MB = 10^6 bytes; waits in milliseconds)."""
    head = ("| loader | workers | shuffle | samples/s | MB/s | wait p50 ms | wait p95 ms | "
            "wait p99 ms | first batch s | OS read MB | resident at start | x naive | / dd |")
    lines = [head, "|" + "---|" * 13]
    for r in doc["rows"]:
        ms = [None if r[k] is None else r[k] * 1e3 for k in ("wait_p50_s", "wait_p95_s",
                                                                "wait_p99_s")]
        osr = None if r["os_read_bytes"] is None else r["os_read_bytes"] / 1e6
        lines.append(
            f"| {r['loader']} | {r['workers']}{'t' if r['worker_type'] == 'thread' else ''} | "
            f"{r['shuffle']} | {_f(r['samples_per_s'], '.1f')} | {_f(r['read_MBps'], '.1f')} | "
            f"{_f(ms[0], '.2f')} | {_f(ms[1], '.2f')} | {_f(ms[2], '.2f')} | "
            f"{_f(r['first_batch_s'], '.3f')} | {_f(osr, '.1f')} | "
            f"{_f(r['cache_resident_fraction_at_start'], '.2f')} | {_f(r['vs_naive'], '.2f')} | "
            f"{_f(r['vs_dd'], '.2f')} |")
    dd = doc.get("dd")
    if dd and dd.get("available"):
        lines.append(f"\ndd ({dd['mode']}, bs=16M, {dd['files']} files, "
                     f"{dd['bytes'] / 1e6:.1f} MB): {_f(dd['MBps'], '.1f')} MB/s")
    elif dd:
        lines.append(f"\ndd: not measured ({dd.get('why')})")
    warnings = sorted({w for r in doc["rows"] for w in r["cache_warnings"]})
    for w in warnings:
        lines.append(f"\nWARNING: {w}")
    return "\n".join(lines)
