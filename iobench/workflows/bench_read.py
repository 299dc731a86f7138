"""Pure-read benchmark: loaders x workers x shuffle with no model, cold cache, vs naive and dd.

Each run evicts the dataset's pages on every node (`iobench.core.cache`), records
the residency it measured, iterates `epochs` epochs of one rank's share and
times every `next()` (METRICS.md: wait per batch, first batch apart). Figures
per run: samples/s and MB/s (global samples / payload bytes over the slowest
rank's wall time), wait p50/p95/p99, `os_read_bytes` (`/proc/<pid>/io` of the
rank and its workers), and ratios to the two naive per-sample h5py baselines
(`loaders/naive.py`: file kept open per worker, and opened per sample) with
the same batch size and workers, and to `dd` with direct I/O reading the same
files in the same run (the storage's own sequential rate). With `repeat` N
the whole grid is measured N times, interleaved, and every row carries the
median and spread (`iobench.core.spread`) of its figures and paired ratios.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iobench.core import cache, procio, sampling
from iobench.core.dataref import DatasetRef, locate, user_data
from iobench.core.datasets import parse_dataset
from iobench.core.errors import ConfigError, IobenchError
from iobench.core.formats import BASELINE_FORMAT, parse_format
from iobench.core.launch import capture
from iobench.core.manifest import Manifest
from iobench.core.options import parse_evict_cmd, parse_repeat
from iobench.core.spread import fmt_spread, spread
from iobench.core.userdata import USER_DATASET
from iobench.core.world import World, agree
from iobench.loaders import LOADERS, make_loader
from iobench.loaders.base import WORKER_TYPES, Batch, LoaderConfig, batches
from iobench.loaders.naive import BASELINES

SCHEMA = "iobench.bench_read"
#: 2: the naive baseline keeps its file open per worker (the old one is
#: `naive-h5py-open-per-sample`), both ratios, `--repeat` with spread
SCHEMA_VERSION = 2
NAIVE, NAIVE_OPEN_PER_SAMPLE = BASELINES
#: row key of the ratio of samples/s to each baseline (same workers, same repetition)
RATIOS: tuple[str, ...] = ("vs_naive", "vs_naive_open_per_sample")
#: figures whose spread over repetitions each row carries
SPREAD_KEYS: tuple[str, ...] = ("samples_per_s", "read_MBps", "wait_p50_s", "wait_p99_s",
                                *RATIOS)
#: figures whose headline value is the median over repetitions
MEDIAN_KEYS: tuple[str, ...] = ("wall_s", "samples_per_s", "read_MBps", "wait_p50_s",
                                "wait_p95_s", "wait_p99_s", "wait_max_s", "first_batch_s")
#: counts: the median repetition's own value (an integer, not a mean of two)
COUNT_KEYS: tuple[str, ...] = ("epochs", "samples", "batch_bytes", "os_read_bytes")
DD_MIN_FILE = 1 << 20  # bytes; below this mean file size dd's start-up dominates
DD_TIMEOUT_S = 600.0  # how long one dd may read one file (seconds)


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
    repeat: int = 1  # cold repetitions of the whole grid, interleaved
    evict_cmd: str | None = None  # the site's command emptying server caches, before each epoch
    # the user's own data instead of a generated dataset (iobench/core/userdata.py); then
    # `dataset` is "user"
    data: str | None = None
    data_key: str | None = None
    label_key: str | None = None

    def __post_init__(self) -> None:
        if self.data is None:
            parse_dataset(self.dataset)
        elif self.dataset != USER_DATASET:
            raise ConfigError(f"--data reads your own data; dataset {self.dataset!r} is for "
                              "--storage: drop one of them")
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
        parse_repeat(self.repeat, "cold repetitions of the grid")
        parse_evict_cmd(self.evict_cmd, self.warm_cache)

    def locate(self, world: World) -> DatasetRef:
        """The dataset the grid reads (the user's data: a collective), checked to be the one
        the config names."""
        ref = (user_data(world, self.data, self.data_key, self.label_key)
               if self.data is not None else locate(self.storage, self.dataset, self.format))
        if ref.dataset != self.dataset or ref.format != self.format:
            raise ConfigError(f"{ref.root} holds {ref.dataset}/{ref.format}, not "
                              f"{self.dataset}/{self.format}")
        return ref


def _pct(a: list[float], q: float) -> float | None:
    return float(np.percentile(a, q)) if a else None


def _epoch_run(loader: Any, epoch: int, max_batches: int | None) -> dict[str, Any]:
    """Iterate one epoch; time each next() (seconds), count samples and payload bytes."""
    waits: list[float] = []
    first = None
    samples = payload = steps = 0
    # an interrupt whose raise Python dropped is raised again at the next batch (`batches`)
    it: Iterator[Batch] = batches(loader, epoch)
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
    loader = error = None
    try:
        loader = make()
    except IobenchError as err:  # e.g. a bad file in one rank's share of DALI's input check
        error = err
    agree(world, error)  # raised on every rank, before any collective of an epoch
    assert loader is not None
    epochs = []
    try:
        # workers start and import their libraries before the counters (docs/metrics.md);
        # the naive baselines' default DataLoader restarts its workers every epoch, as
        # users' code does, so their start-up stays in each epoch
        start = getattr(loader, "start", None)
        if start is not None:
            start()
        for e in range(cfg.epochs):
            ev = cache.evict_for_node(manifest, world, cache.EvictOptions(
                evict_pages=not cfg.warm_cache, loud=False, evict_cmd=cfg.evict_cmd))
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
    data = manifest.data_files
    mean = manifest.data_bytes / max(1, len(data))
    if mean < DD_MIN_FILE:
        return {"available": False,
                "why": f"data files average {mean / 1e3:.0f} kB: starting one dd per file "
                       "would dominate what it measures (reference needs files >= 1 MiB)"}
    picks = (random.Random(seed).sample(range(len(data)), max_files)
             if len(data) > max_files else range(len(data)))
    files = [data[i] for i in picks]
    paths = [str(manifest.path_of(f)) for f in files]
    probe = capture([dd, f"if={paths[0]}", "of=/dev/null", "bs=4096", "count=1",
                     "iflag=direct", "status=none"], DD_TIMEOUT_S)
    flags = ["iflag=direct"]
    mode = "direct"
    if not probe.ok:
        flags = []
        why = probe.last_line() or "?"
        mode = f"buffered after page eviction (O_DIRECT refused: {why})"
    cache.evict(paths)
    total = 0
    t0 = time.perf_counter_ns()
    for p in paths:
        r = capture([dd, f"if={p}", "of=/dev/null", "bs=16M", "status=none", *flags],
                    DD_TIMEOUT_S)
        if not r.ok:
            why = f"timed out after {DD_TIMEOUT_S:g} s" if r.timed_out else r.last_line()
            return {"available": False, "why": f"dd failed on {p}: {why}"}
        total += os.path.getsize(p)
    secs = (time.perf_counter_ns() - t0) / 1e9
    return {"available": True, "mode": mode, "files": len(paths), "bytes": total,
            "seconds": secs, "MBps": total / secs / 1e6 if secs > 0 else None}


def naive_manifest(dataset: DatasetRef) -> Manifest | None:
    """The HDF5 copy of the dataset the naive baselines read, if there is one (the user's
    data has none but itself)."""
    if dataset.format == BASELINE_FORMAT:
        return dataset.manifest
    copy = dataset.sibling(BASELINE_FORMAT)
    return copy.manifest if copy is not None else None


@dataclass(frozen=True)
class _Cell:
    """One row of the grid: what it measures and how to build its loader."""

    head: dict[str, Any]
    make: Callable[[], Any]
    manifest: Manifest


def _cells(cfg: BenchReadConfig, manifest: Manifest, nm: Manifest | None,
           world: World) -> list[_Cell]:
    """The grid in row order: per worker count, the baselines, then loaders x shuffles."""
    cells = []
    for w in cfg.workers:
        if nm is not None:
            from iobench.loaders.naive import NaiveLoader

            for base, per_sample in BASELINES.items():
                cells.append(_Cell(
                    {"loader": base, "workers": w, "worker_type": "process", "shuffle": "global"},
                    functools.partial(NaiveLoader, nm, cfg.batch_size, w, True, cfg.decode,
                                      cfg.seed, world.rank, world.size,
                                      open_per_sample=per_sample),
                    nm))
        for name in cfg.loaders:
            for shuffle in cfg.shuffles:
                lc = LoaderConfig(batch_size=cfg.batch_size, workers=w,
                                  worker_type=cfg.worker_type, shuffle=shuffle,
                                  block_size=cfg.block_size, shuffle_window=cfg.shuffle_window,
                                  seed=cfg.seed, decode=cfg.decode, device=cfg.device,
                                  library_cache=cfg.warm_cache)
                wtype = "process" if name == "dali" else cfg.worker_type  # DALI: processes
                cells.append(_Cell(
                    {"loader": name, "workers": w, "worker_type": wtype, "shuffle": shuffle},
                    functools.partial(make_loader, name, manifest, lc, world.rank, world.size),
                    manifest))
    return cells


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def combine(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One row's figures from its repetitions: the median of each headline figure.

    Residency at start is the worst repetition's, cache status and warnings
    the union; `spread` holds median/min/max/cv/values of SPREAD_KEYS (values
    in repetition order) and `per_epoch` every epoch, tagged with its `repeat`.
    """
    out: dict[str, Any] = {"repeat": len(reps)}
    for keys, median in ((MEDIAN_KEYS, statistics.median), (COUNT_KEYS, statistics.median_low)):
        for k in keys:
            vals: list[Any] = [r.get(k) for r in reps]
            out[k] = None if any(v is None for v in vals) else median(vals)
    res = [r["cache_resident_fraction_at_start"] for r in reps]
    out["cache_resident_fraction_at_start"] = None if any(v is None for v in res) else max(res)
    out["cache_status"] = sorted({s for r in reps for s in r["cache_status"]})
    out["cache_warnings"] = sorted({w for r in reps for w in r["cache_warnings"]})
    for k in RATIOS:  # paired within each repetition by `run`
        vals = [r.get(k) for r in reps]
        out[k] = None if any(v is None for v in vals) else statistics.median(vals)
    out["spread"] = {k: spread(r.get(k) for r in reps) for k in SPREAD_KEYS}
    out["significant"] = {k: _significant(out["spread"][k]) for k in RATIOS}
    out["per_epoch"] = [{"repeat": i, **ep} for i, r in enumerate(reps) for ep in r["per_epoch"]]
    return out


def _significant(s: dict[str, Any] | None) -> bool | None:
    """Whether a ratio's spread over repetitions excludes 1.0 (None: fewer than 2 values)."""
    if not s or s["n"] < 2:
        return None
    return not s["min"] <= 1.0 <= s["max"]


def run(cfg: BenchReadConfig, world: World, progress: Callable[[str], None] | None = None,
        dataset: DatasetRef | None = None) -> dict[str, Any]:
    """Measure the grid `cfg.repeat` times, interleaved; return the bench-read document.

    Repetition r measures every cell once (cold) before repetition r + 1
    starts, so drift on a shared machine hits every cell alike; each ratio
    to a baseline is taken within one repetition (paired), then summarised.
    `dataset` is the dataset read, when the caller resolved it already.
    """
    dataset = dataset or cfg.locate(world)
    manifest = dataset.manifest
    say = progress or (lambda s: None)
    nm = naive_manifest(dataset) if cfg.naive else None
    dd = None
    if cfg.dd:
        say("dd: reading the data files with direct I/O")
        dd = dd_baseline(manifest, cfg.dd_max_files, cfg.seed) if world.rank == 0 else None
        dd = world.bcast(dd)
    cells = _cells(cfg, manifest, nm, world)
    figs: list[list[dict[str, Any]]] = [[] for _ in cells]
    for rep in range(cfg.repeat):
        for cell, out in zip(cells, figs, strict=True):
            h = cell.head
            tag = f"[{rep + 1}/{cfg.repeat}] " if cfg.repeat > 1 else ""
            say(f"{tag}{h['loader']}, workers={h['workers']}, shuffle={h['shuffle']}")
            out.append(measure(cell.make, cell.manifest, cfg, world))
    # paired ratios: each repetition of a row against the same repetition of its baselines
    bases = {(c.head["loader"], c.head["workers"]): f for c, f in zip(cells, figs, strict=True)
             if c.head["loader"] in BASELINES}
    rows = []
    for cell, reps in zip(cells, figs, strict=True):
        for key, base in zip(RATIOS, BASELINES, strict=True):
            b = bases.get((base, cell.head["workers"]))
            for i, r in enumerate(reps):
                r[key] = _ratio(r["samples_per_s"], b[i]["samples_per_s"]) if b else None
        row = {**cell.head, **combine(reps)}
        ddm = dd.get("MBps") if dd else None
        row["vs_dd"] = _ratio(row["read_MBps"], ddm)
        rows.append(row)
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "config": asdict(cfg),
            "dataset": manifest.identity(), "user_data": manifest.extra.get("user_data"),
            "world": {"size": world.size, "nodes": world.num_nodes},
            "baselines": dict(zip(RATIOS, BASELINES, strict=True)),
            "dd": dd, "naive_dataset": str(nm.root) if nm is not None else None, "rows": rows}


def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def _cell(r: dict[str, Any], key: str, spec: str, scale: float = 1.0) -> str:
    """A figure for the table: `median [min-max]` over repetitions, else the value."""
    s = (r.get("spread") or {}).get(key)
    if s is None or s["n"] < 2:
        v = r.get(key)
        return _f(None if v is None else v * scale, spec)
    return fmt_spread({**s, "median": s["median"] * scale, "min": s["min"] * scale,
                       "max": s["max"] * scale}, spec)


def _ratio_cell(r: dict[str, Any], key: str, base: str) -> str:
    """A ratio for the table; `base` on the baseline's own row, `n.s.` when 1.0 is in its spread."""
    if r["loader"] == base:
        return "base"
    text = _cell(r, key, ".2f")
    return f"{text} n.s." if (r.get("significant") or {}).get(key) is False else text


def markdown_table(doc: dict[str, Any]) -> str:
    """The rows as a Markdown table (MB = 10^6 bytes; waits in milliseconds).

    With repetitions, figures read `median [min-max]`, and a ratio whose
    spread includes 1.0 is marked `n.s.` (not significantly different from
    that baseline).
    """
    head = ("| loader | workers | shuffle | samples/s | MB/s | wait p50 ms | wait p95 ms | "
            "wait p99 ms | first batch s | OS read MB | resident at start | x naive | "
            "x open-per-sample | / dd |")
    lines = [head, "|" + "---|" * 14]
    for r in doc["rows"]:
        osr = None if r["os_read_bytes"] is None else r["os_read_bytes"] / 1e6
        p95 = None if r["wait_p95_s"] is None else r["wait_p95_s"] * 1e3
        lines.append(
            f"| {r['loader']} | {r['workers']}{'t' if r['worker_type'] == 'thread' else ''} | "
            f"{r['shuffle']} | {_cell(r, 'samples_per_s', '.1f')} | "
            f"{_cell(r, 'read_MBps', '.1f')} | {_cell(r, 'wait_p50_s', '.2f', 1e3)} | "
            f"{_f(p95, '.2f')} | {_cell(r, 'wait_p99_s', '.2f', 1e3)} | "
            f"{_f(r['first_batch_s'], '.3f')} | {_f(osr, '.1f')} | "
            f"{_f(r['cache_resident_fraction_at_start'], '.2f')} | "
            f"{_ratio_cell(r, 'vs_naive', NAIVE)} | "
            f"{_ratio_cell(r, 'vs_naive_open_per_sample', NAIVE_OPEN_PER_SAMPLE)} | "
            f"{_f(r['vs_dd'], '.2f')} |")
    n = doc["config"].get("repeat", 1)
    if n > 1:
        lines.append(f"\n{n} cold repetitions of the grid, interleaved: median [min-max]; "
                     "ratios paired within each repetition; n.s. = the ratio's spread "
                     "includes 1.0 (not significantly different from that baseline). "
                     "Other columns: medians (resident at start: the worst).")
    if any(r["loader"] in BASELINES for r in doc["rows"]):
        lines.append(f"\nx naive: samples/s over {NAIVE} (h5py file opened once per worker, "
                     f"one sample per __getitem__); x open-per-sample: over "
                     f"{NAIVE_OPEN_PER_SAMPLE} (the file opened for every sample).")
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


@dataclass(frozen=True)
class BenchReadOutcome:
    """What `iobench bench-read` measured (rank 0's document) and where it was written."""

    doc: dict[str, Any]
    path: Path | None  # None without a results directory


def bench_read(cfg: BenchReadConfig, world: World, results: str | None = None,
               progress: Callable[[str], None] | None = None,
               dataset: DatasetRef | None = None) -> BenchReadOutcome | None:
    """`iobench bench-read`: find the dataset, prove `results` writable (and outside the
    user's data), measure the grid, and write the document on rank 0 (None elsewhere)."""
    from iobench.core import sysinfo
    from iobench.core.outputs import writable_dir

    error = None
    try:
        dataset = dataset or cfg.locate(world)
        if results:
            dataset.refuse_inside(results)  # never write into the user's data
            writable_dir(results, "--results")  # before measuring anything
    except IobenchError as e:
        error = e
    agree(world, error)
    assert dataset is not None
    doc = run(cfg, world, progress, dataset)
    if world.rank != 0:
        return None
    doc["provenance"] = sysinfo.provenance(dataset.storage)
    user = doc.pop("user_data", None)
    if user is not None:  # what was read: the user's own data, as detected
        doc["provenance"]["user_data"] = user
    path = None
    if results:
        from iobench.core.jsonio import write_json_atomic
        from iobench.core.results import new_run_id

        path = write_json_atomic(f"{results}/bench-read-{new_run_id()}.json", doc,
                                 exclusive=True)
    return BenchReadOutcome(doc, path)
