"""A self-contained report of a results directory (HTML with embedded PNGs, or Markdown).

Reads every iobench document in the directory and its sub-directories:
training results (`iobench.result`), staging results (`iobench.stage`),
storage probes (`iobench.probe`) and sweep records (`iobench.sweep`), and
opens with the answer (`lead_section`: which tier keeps up, the staging
break-even, what to do; then each run's verdict), then writes the
environment, the probe figures per tier, a table of runs per dataset (with
each run's MB/s as a fraction of its tier's probe limit), the staging cost
with break-even epochs (docs/metrics.md), and plots: stall time per epoch by run,
throughput by workers, AU by storage tier, loader MB/s next to the probe
limits (the AU plot averages only alike runs). Runs with `--repeat N`
repetitions show median [min-max] and min-max
error bars; differences within the spread are marked `n.s.`. Its plots are
`report_plots`' and its pages `report_render`'s; report code is the only place
(with `compare`) that imports matplotlib.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iobench.core.breakeven import break_even_text, outcome, real, staging_pairs
from iobench.core.errors import ConfigError, DatasetNotFoundError
from iobench.core.jsonio import write_atomic
from iobench.core.result_types import (
    Host,
    ProbeDoc,
    ProbeSummary,
    ResultError,
    SampleRead,
    SearchDoc,
    StageDoc,
    SweepDoc,
    TrainResult,
    Verdict,
)
from iobench.core.spread import differs, run_spread
from iobench.core.userdata import USER_DATASET
from iobench.workflows.compare import (
    epoch_spreads,
    fmt_figure,
    mark,
    node_spread,
)
from iobench.workflows.projection_view import (
    all_report_sections,
    find_projections,
    lead_lines,
)
from iobench.workflows.report_plots import make_plots, short_label, tier_words
from iobench.workflows.report_render import Lead, Table, render_html, render_markdown
from iobench.workflows.timeline import add_timelines
from iobench.workflows.verdict import (
    DEFAULT_THRESHOLD,
    au_words,
    judge,
    probe_for,
    probe_limit,
    under,
)


@dataclass
class Collection:
    """What a results directory holds, by kind; `skipped` lists (file, why) not read."""

    runs: list[TrainResult] = field(default_factory=list)
    stages: list[StageDoc] = field(default_factory=list)
    probes: list[ProbeDoc] = field(default_factory=list)
    sweeps: list[SweepDoc] = field(default_factory=list)
    searches: list[SearchDoc] = field(default_factory=list)  # complete `iobench search`es
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # `iobench checkpoint`s
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _known() -> dict[str, int]:
    """The newest version of each document that this reader reads: the one each writer writes
    (iobench.core.results names them all, so this reader imports no workflow that writes one)."""
    from iobench.core import results

    return {results.SCHEMA: results.SCHEMA_VERSION,
            results.STAGE_SCHEMA: results.STAGE_SCHEMA_VERSION,
            results.PROBE_SCHEMA: results.PROBE_SCHEMA_VERSION,
            results.SWEEP_SCHEMA: results.SWEEP_SCHEMA_VERSION,
            results.SEARCH_SCHEMA: results.SEARCH_SCHEMA_VERSION,
            _CHECKPOINT_SCHEMA: 1}


_CHECKPOINT_SCHEMA = "iobench.checkpoint"  # iobench.workflows.checkpoint.SCHEMA (v1)


def load_directory(results_dir: str | Path, projections: int = 0) -> Collection:
    """Read every iobench document in `results_dir` and its sub-directories (as `compare`
    searches them); damaged files are listed in `skipped` by their path under it, never
    fatal. An empty or missing directory is an error (`projections`: projection documents
    found there apart, which make it not empty)."""
    d = Path(results_dir)
    if not d.is_dir():
        raise DatasetNotFoundError(f"results directory {d} does not exist; give the --results "
                                   "directory of your runs (default ./iobench-results)")
    col = Collection()
    known = _known()
    for p in sorted(f for f in d.rglob("*.json") if not f.is_dir()):
        name = str(p.relative_to(d))
        doc = _read_document(p, known, col, name)
        if doc is not None:
            try:
                _sort_document(col, name, doc)
            except ResultError as e:
                col.skipped.append((name, str(e)))
    if not (col.runs or col.stages or col.probes or col.sweeps or col.searches
            or col.checkpoints or projections):
        raise DatasetNotFoundError(f"{d} holds no iobench results (training runs, stage or "
                                   "probe results), searched with its sub-directories; run "
                                   "`iobench train`, `stage`, `probe` or `sweep` with "
                                   "--results pointing there")
    col.runs.sort(key=lambda r: r.created)
    return col


def _read_document(p: Path, known: Mapping[str, int], col: Collection,
                   name: str) -> dict[str, Any] | None:
    """The iobench document in `p` of a version this reader reads; None (listed in
    `col.skipped` as `name` unless it is not iobench's) otherwise."""
    from iobench.core.errors import DatasetError
    from iobench.core.results import read_document

    try:
        doc = read_document(p)
    except DatasetError as e:
        col.skipped.append((name, f"unreadable: {e}"))
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str) \
            or doc["schema"] not in known:
        return None  # not ours (a manifest, someone else's JSON)
    schema, version = doc["schema"], doc.get("schema_version")
    if not isinstance(version, int) or version > known[schema]:
        col.skipped.append((name, f"{schema} v{version} is newer than this iobench reads"))
        return None
    return dict(doc)


def _sort_document(col: Collection, name: str, doc: dict[str, Any]) -> None:
    """Type `doc` by its schema into `col`; a ResultError says why it cannot be read."""
    from iobench.core import results

    schema = doc["schema"]
    if schema == _CHECKPOINT_SCHEMA:
        from iobench.workflows.checkpoint import validate

        col.checkpoints.append(validate(doc, name))
        return
    if schema == results.SCHEMA:
        run = TrainResult.from_dict(doc, name)
        if not run.complete:  # never averaged with whole runs
            col.skipped.append((name, f"{run.status} run, left out: "
                                      f"{run.status_reason or 'no reason given'}; "
                                      f"{len(run.epochs)} epoch(s) completed"))
            return
        col.runs.append(run)
    elif schema == results.STAGE_SCHEMA:
        col.stages.append(StageDoc.from_dict(doc, name))
    elif schema == results.SEARCH_SCHEMA:
        search = SearchDoc.from_dict(doc, name)
        if search.status != "complete":  # its answer covers only some points
            col.skipped.append((name, f"{search.status} search, left out: "
                                      f"{search.status_reason or 'no reason given'}"))
            return
        col.searches.append(search)
    elif schema == results.PROBE_SCHEMA:
        col.probes.append(ProbeDoc.from_dict(doc, name))
    else:
        col.sweeps.append(SweepDoc.from_dict(doc, name))


# ------------------------------------------------------------------------------ figures

def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def sweep_tier_names(sweeps: Sequence[SweepDoc]) -> list[tuple[str, str]]:
    """(real path, tier name) of every tier the sweeps in the directory named."""
    out = []
    for s in sweeps:
        for t in s.config.tiers:
            out.append((real(t.path), t.name))
            if t.stage_to:
                out.append((real(t.stage_to), t.stage_name or f"{t.name}-staged"))
    return out


def _cache_words(doc: TrainResult) -> str:
    """How cold the run's epochs were, in a word for the runs table."""
    statuses = [e.cache.status for e in doc.epochs]
    return ("warm (by choice)" if doc.cache.mode == "warm" else
            "COLD FAILED" if "warm" in statuses else
            "unknown" if "unknown" in statuses else
            "unverified" if "unverified" in statuses else "cold")


def _tier_name(doc: TrainResult, probe: ProbeDoc | None, root: str,
               names: Sequence[tuple[str, str]]) -> tuple[str, str | None]:
    """A run's tier and where it is: its `--tier` label (never told apart by place), else its
    probe's label, else a sweep's tier name, else its filesystem (at its storage directory)."""
    if doc.config.tier:
        return doc.config.tier, None
    if probe:
        return probe.label, probe.storage.path
    named = [n for n in names if under(root, n[0])]
    if named:
        path, name = max(named, key=lambda n: len(n[0]))
        return name, path
    storage = doc.provenance.storage
    place = root if doc.dataset.dataset == USER_DATASET else os.path.dirname(root)
    return f"{storage.kind or '?'} ({storage.fstype or '?'})", place or None


def tell_tiers_apart(rows: Sequence[dict[str, Any]]) -> None:
    """Where runs in different places would carry the same tier name (two ext4 directories
    both read `local (ext4)`), name each by its place too: `local (ext4) /scratch/a`."""
    places: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        if r["tier_place"]:
            places[r["tier"]].add(r["tier_place"])
    for r in rows:
        if r["tier_place"] and len(places[r["tier"]]) > 1:
            r["tier"] = f"{r['tier']} {r['tier_place']}"


def _compute_words(res: TrainResult) -> str:
    """What the run's compute was, for labels: `cnn`, `emulated 0.05 s`, `ingest only`."""
    comp = res.compute
    if comp.kind == "model":
        return comp.model or "model"
    return f"emulated {comp.compute_time_s:g} s" if comp.kind == "emulated" and \
        comp.compute_time_s is not None else "ingest only" if comp.kind == "none" else comp.kind


def run_row(doc: TrainResult | Mapping[str, Any], probes: Sequence[ProbeDoc],
            names: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """One line of a runs table: configuration and figures. The tier is named by the run's
    `--tier` label, else its probe's label, else a sweep's tier name, else its filesystem
    (`tell_tiers_apart` then adds the place where two places share a name); `verdict` is
    the run's own (`summary.verdict`), or worked out now for a result without one.

    Headline figures are `iobench.core.spread.run_spread`'s medians over the run's
    repetitions (a v1 result is one repetition: means over its epochs, rates
    over its summed epoch walls), with their spreads in `spread`; `stall_s`
    and `wall_s` are per epoch number, medians over repetitions, with spreads
    in `stall_spread`.
    """
    res = TrainResult.of(doc)
    c = res.config
    probe = probe_for(res.dataset.root or res.provenance.storage.path, probes)
    sp = run_spread(res.epochs)
    med = {k: v["median"] if v else None for k, v in sp.items()}
    stall = epoch_spreads(res, lambda e: e.summary.stall_s_max)
    wall = epoch_spreads(res, lambda e: e.summary.wall_s)
    frac = epoch_spreads(res, lambda e: e.summary.stall_fraction_max)
    au = epoch_spreads(res, lambda e: e.summary.au_mean)
    mbps = med["read_MBps"]
    limit = probe_limit(probe, res.dataset.sample_bytes) if probe else None
    root = real(res.dataset.root)
    verdict = res.summary.verdict
    tier, place = _tier_name(res, probe, root, names)
    return {
        "run_id": res.run_id, "dataset": res.dataset.dataset,
        "format": res.dataset.format, "loader": c.loader,
        "tier": tier, "tier_place": place, "storage": c.storage, "root": root,
        "workers": c.workers, "batch_size": c.batch_size,
        # a shard-staged run shuffles within each rank's own files
        "shuffle": c.shuffle + (" (local)" if res.staging is not None
                                and res.staging.shuffle_scope == "local" else ""),
        "ranks": res.world.size, "compute": res.compute.kind,
        "compute_words": _compute_words(res),
        "verdict": verdict or judge(res),
        "repeats": res.repetitions, "epochs": len(stall),
        "stall_s": [stall[e]["median"] for e in sorted(stall)],
        "stall_spread": [stall[e] for e in sorted(stall)],
        "wall_s": [wall[e]["median"] for e in sorted(wall)],
        "stall_fraction_spread": [frac[e] for e in sorted(frac)],
        "au_spread": [au[e] for e in sorted(au)],
        "threshold": (verdict.threshold if verdict else None) or DEFAULT_THRESHOLD,
        "spread": sp, "au": med["au"], "samples_per_s": med["samples_per_s"],
        "read_MBps": mbps, "limit_MBps": limit,
        "ratio": mbps / limit if mbps is not None and limit else None,
        "cache": _cache_words(res), "staged": res.staging is not None,
        "warnings": list(res.warnings), "node_spread": node_spread(res),
    }


def staging_rows(col: Collection, rows: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Staging cost next to the epoch time it saves: `break_even_epochs` per docs/metrics.md.

    `iobench.core.breakeven.staging_pairs` pairs each staging (an `iobench stage`
    result or a run's `staging` section) with the in-place runs reading its
    source and the runs of its copy, and refuses pairs that are not
    comparable. Here each staging keeps its comparable pairs, one per
    configuration; a staging without any keeps one row saying why (the pair
    with the fewest differences). `rows` is unused (kept for callers).
    """
    out: list[dict[str, Any]] = []
    by_staging: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in staging_pairs(col.runs, col.stages):
        by_staging[row["staging_index"]].append(row)
    runs = {r.run_id: r for r in col.runs}
    for _, pairs in sorted(by_staging.items()):
        good = [p for p in pairs if not p["refused"]]
        if not good:
            out.append(min(pairs, key=lambda p: p["refused"].count(" vs ")))
            continue
        seen = set()
        for p in good:
            c = runs[p["slow_run_id"]].config
            key = (c.loader, c.workers, c.batch_size, c.shuffle)
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def environment(col: Collection) -> dict[str, Any]:
    """Host, CPU, memory, GPUs and library versions, from the newest document that has them."""
    docs: list[tuple[str, Host | None]] = [
        *((d.created, d.provenance) for d in col.runs),
        *((d.created, d.provenance) for d in col.probes),
        *((d.created, d.provenance) for d in col.stages)]
    hosts = [h for _, h in sorted(docs, key=lambda d: d[0], reverse=True) if h is not None]
    prov = hosts[0] if hosts else Host()
    return {"hosts": sorted({h.host for h in hosts if h.host is not None}), "os": prov.os,
            "cpu": prov.cpu_model, "cpu_count": prov.cpu_count,
            "memory_bytes": prov.memory_bytes,
            "gpus": [g.name for g in prov.gpus or ()], "versions": prov.versions or {}}


def _f(v: Any, spec: str = ".2f", none: str = "n/a") -> str:
    if v is None:
        return none
    if isinstance(v, float) and math.isinf(v):
        return "never"
    return format(v, spec)


def _gb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e9:.1f} GB"


def _stalls(xs: list[dict[str, Any]]) -> str:
    """Every epoch's stall (median [min-max] over repetitions), or for long runs the first and
    last ones and the mean of the medians."""
    cells = [fmt_figure(x, ".2f") for x in xs]
    if len(xs) <= 8:
        return " / ".join(cells)
    meds = [x["median"] for x in xs]
    return (" / ".join(cells[:3]) + " / ... / " + " / ".join(cells[-2:])
            + f" (mean {_f(sum(meds) / len(meds))} over {len(xs)})")


def versus_best(rs: Sequence[dict[str, Any]]) -> list[str]:
    """For each run: its median samples/s over the best run's of `rs`, `n.s.` when within
    the spread of either, `?` when significance is unknown (both single passes)."""
    rated = [r for r in rs if r["samples_per_s"] is not None]
    if not rated:
        return ["n/a" for _ in rs]
    best = max(rated, key=lambda r: r["samples_per_s"])
    out = []
    for r in rs:
        if r["samples_per_s"] is None:
            out.append("n/a")
        elif r is best:
            out.append("best")
        else:
            sig = differs(r["spread"]["samples_per_s"], best["spread"]["samples_per_s"])
            out.append(_f(r["samples_per_s"] / best["samples_per_s"]) + mark(sig)
                       + (" ?" if sig is None else ""))
    return out


def build_tables(col: Collection, rows: list[dict[str, Any]]) -> list[Table]:
    """The report's tables, in order: environment, probes, runs per dataset, per-node spread,
    staging cost, searches, failed sweep runs, warnings (only those with data)."""
    tables = [environment_table(col), *run_tables(rows)]
    if col.probes:
        tables.insert(1, probe_table(col.probes))
    for table in (node_table(rows), staging_table(col, rows), checkpoint_table(col),
                  search_table(col.searches),
                  failed_sweeps_table(col.sweeps), warnings_table(col, rows)):
        if table is not None:
            tables.append(table)
    return tables


def checkpoint_table(col: Collection) -> Table | None:
    """`iobench checkpoint` results side by side (every tier, oldest first): write and cold
    read GB/s, the duration (max over ranks), the slowest rank's GB/s (min over ranks)."""
    from iobench.workflows.checkpoint import (
        SIDE_BY_SIDE_HEADER,
        SIDE_BY_SIDE_NOTE,
        side_by_side,
        side_by_side_cells,
    )

    if not col.checkpoints:
        return None
    docs = sorted(col.checkpoints, key=lambda d: str(d["created"]))
    return Table("Checkpoints: write, then cold read", list(SIDE_BY_SIDE_HEADER),
                 [side_by_side_cells(r) for r in side_by_side(docs)], SIDE_BY_SIDE_NOTE)


def environment_table(col: Collection) -> Table:
    env = environment(col)
    v = env["versions"]
    return Table("Environment", ["item", "value"], [
        ["hosts", ", ".join(env["hosts"]) or "n/a"], ["os", env["os"] or "n/a"],
        ["cpu", f"{env['cpu']} x {env['cpu_count']}"], ["memory", _gb(env["memory_bytes"])],
        ["gpus", ", ".join(env["gpus"]) or "none"],
        *[[k, str(v.get(k) or "not installed")] for k in
          ("iobench", "python", "torch", "numpy", "h5py", "hdf5", "netCDF4", "lmdb",
           "nvidia-dali", "mpi4py", "mpi")]])


def _sample_reads(s: ProbeSummary) -> str:
    reads = s.sample_reads or (SampleRead(MBps=s.sample_read_MBps, sample_bytes=s.sample_bytes),)
    return ", ".join(f"{_f(r.MBps, '.0f')} ({r.sample_bytes} B)" for r in reads)


def probe_table(probes: Sequence[ProbeDoc]) -> Table:
    trs = []
    for p in sorted(probes, key=lambda p: (p.label, p.created)):
        s, st = p.summary, p.storage
        trs.append([p.label, st.path, f"{st.fstype} ({st.kind})",
                    f"{p.engine}{', O_DIRECT' if p.direct else ', evicted'}"
                    + (f", written via {p.write_via}" if p.write_via else ""),
                    _f(s.seq_read_MBps, ".0f"), _f(s.seq_write_MBps, ".0f"),
                    _f(s.rand4k_read_iops, ".0f"), _f(s.rand4k_read_MBps, ".1f"),
                    _sample_reads(s),
                    _f(s.create_per_s, ".0f"), _f(s.stat_per_s, ".0f"),
                    _f(s.open_read_close_per_s, ".0f"), str(s.readers_max)])
    return Table("Storage tiers (iobench probe, cold cache)",
                 ["tier", "path", "filesystem", "engine", "seq read MB/s",
                  "seq write MB/s", "4 KiB rand IOPS", "4 KiB rand MB/s",
                  "sample rand MB/s", "creates/s", "stats/s", "open+read+close/s",
                  "readers"], trs,
                 "Best over the probed reader counts. Random reads: synchronous, one "
                 "file per reader, like loader workers. A tier written via another "
                 "directory (a read-only mount's backing) has write and create "
                 "figures of that directory.")


def run_tables(rows: Sequence[dict[str, Any]]) -> list[Table]:
    """One table of runs per dataset."""
    by_ds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_ds[r["dataset"]].append(r)
    tables = []
    for ds, rs in sorted(by_ds.items()):
        rs = sorted(rs, key=lambda r: (r["tier"], r["staged"], r["loader"], r["format"],
                                       r["batch_size"], r["shuffle"], r["workers"], r["ranks"]))
        trs = [[r["loader"] + (f" ({r['format']})" if r["loader"] == "dali" else ""),
                r["tier"] + (" [staged]" if r["staged"] else ""), str(r["workers"]),
                str(r["batch_size"]), r["shuffle"], str(r["ranks"]), r["compute"],
                str(r["repeats"]), _stalls(r["stall_spread"]),
                fmt_figure(r["spread"]["au"], ".2f"),
                fmt_figure(r["spread"]["samples_per_s"]), fmt_figure(r["spread"]["read_MBps"]),
                vs, _f(r["ratio"], ".2f"), r["cache"]] for r, vs in zip(rs, versus_best(rs),
                                                                          strict=True)]
        tables.append(Table(f"Runs: {ds}", ["loader", "storage tier", "workers", "batch", "shuffle",
                                            "ranks", "compute", "reps", "stall s per epoch", "AU",
                                            "samples/s", "MB/s", "samples/s vs best",
                                            "of probe limit", "cache"], trs,
                            "Figures with repetitions (reps > 1): median [min-max] over them. "
                            "Stall: slowest rank, per epoch. AU, samples/s, MB/s: per "
                            "repetition, mean over its epochs (rates: over its summed epoch "
                            "time). 'vs best': median samples/s over the fastest run's in this "
                            "table; n.s. = not significant (the difference is within the "
                            "min-max spread of either run), ? = unknown (both single passes). "
                            "'of probe limit': MB/s over the tier's random-read MB/s at the "
                            "probed sample size nearest the dataset's (n/a without a probe of "
                            "that tier)."))
    return tables


def _extremes(s: Mapping[str, Any] | None, spec: str) -> list[str]:
    if not s:
        return ["n/a"] * 3
    return [f"{_f(s['min'], spec)} ({s['min_node']})", _f(s["median"], spec),
            f"{_f(s['max'], spec)} ({s['max_node']})"]


def node_table(rows: Sequence[dict[str, Any]]) -> Table | None:
    spread_rows = [r for r in rows if r["node_spread"]]
    if not spread_rows:
        return None
    nrs = [[r["run_id"], f"{r['dataset']}/{r['loader']}", r["tier"],
            str(r["node_spread"]["nodes"]),
            *_extremes(r["node_spread"].get("samples_per_s"), ".0f"),
            *_extremes(r["node_spread"].get("read_MBps"), ".1f"),
            *_extremes(r["node_spread"].get("stall_s"), ".2f")]
           for r in sorted(spread_rows, key=lambda r: r["run_id"])]
    return Table("Per-node spread (multi-node runs)",
                 ["run", "dataset/loader", "storage tier", "nodes",
                  "samples/s min", "median", "max", "MB/s min", "median", "max",
                  "stall s min", "median", "max"], nrs,
                 "Each node's figures over the whole run (all repetitions): "
                 "samples/s and MB/s over its summed epoch walls, its summed "
                 "stall; the nodes holding the extremes in brackets. A node far "
                 "from the median is a straggler: the verdict names it.")


def staging_table(col: Collection, rows: Sequence[dict[str, Any]]) -> Table | None:
    st_rows = staging_rows(col, rows)
    if not st_rows:
        return None
    trs = [[f"{s['dataset']}/{s['format']}", s["mode"] or "n/a",
            f"{s['from']} ({s['from_kind']})", f"{s['to']} ({s['to_kind']})",
            fmt_figure(s["stage_spread"], ".2f") if s["stage_spread"] else _f(s["stage_s"]),
            _f(s["stage_bytes"] / 1e6, ".1f"), _f(s["stage_MBps"], ".1f"),
            s["run"] or "no matching runs",
            fmt_figure(s["epoch_slow"], ".2f") if s["epoch_slow"] else "n/a",
            fmt_figure(s["epoch_fast"], ".2f") if s["epoch_fast"] else "n/a",
            break_even_text(s),
            "n/a" if s["epochs"] is None else
            f"{_f(s['in_place_s'])} / {_f(s['staged_total_s'])} ({s['epochs']} epochs)"]
           for s in st_rows]
    return Table("Staging cost", ["dataset", "mode", "from", "to", "stage s", "MB",
                                  "MB/s", "compared runs", "epoch s (from)",
                                  "epoch s (staged)", "break-even epochs",
                                  "time to solution s: in place / staged"], trs,
                 "break_even_epochs = stage_s / (epoch_wall_slow - epoch_wall_fast) "
                 "(docs/metrics.md), from the medians over repetitions (stage s and epoch "
                 "s: median [min-max] where repeated): staging pays for itself after "
                 "that many epochs; never when the copy is not faster; n.s. (no "
                 "number) when the two epoch times are within their spread (over "
                 "repetitions, or over the cold epochs of single passes). Runs are compared "
                 "only when dataset, format, compute, batch, ranks, loader, workers, "
                 "shuffle, steps and cache mode match. A resumed staging copied "
                 "only part of the data: no break-even (n/a). Time to solution: "
                 "epochs x epoch time in place, against stage_s + epochs x epoch "
                 "time from the copy (epoch wall time, eviction excluded).")


def search_table(searches: Sequence[SearchDoc]) -> Table | None:
    if not searches:
        return None
    srs = []
    for d in sorted(searches, key=lambda d: d.created):
        w = d.workload
        curve = ", ".join(f"{p.accelerators}: {_f(p.au)}" for p in
                          sorted(d.points, key=lambda p: p.accelerators))
        srs.append([f"{w.name}/{w.accelerator}", d.config.storage,
                    str(d.max_accelerators), f"{d.threshold:.2f}", curve,
                    _f(w.demand_MBps, ".1f"), str(d.config.repeat)])
    return Table("Accelerators the storage keeps busy (iobench search)",
                 ["workload", "storage", "max accelerators", "AU threshold",
                  "AU per accelerator count", "demand MB/s per accelerator",
                  "repeats"], srs,
                 "Every point is a cold run of N ranks with synchronised steps; AU "
                 "excludes the first step's I/O (au_mlperf) and is the median over "
                 "repeats. Interrupted searches are left out.")


def failed_sweeps_table(sweeps: Sequence[SweepDoc]) -> Table | None:
    failed = [r for s in sweeps for r in s.runs if r.status == "failed"]
    if not failed:
        return None
    return Table("Failed sweep runs", ["run", "error"],
                 [[r.label, r.error or ""] for r in failed])


def warnings_table(col: Collection, rows: Sequence[dict[str, Any]]) -> Table | None:
    warn = sorted({(r["run_id"], w) for r in rows for w in r["warnings"]})
    warn += [(p.label, w) for p in col.probes for w in p.warnings]
    if not (warn or col.skipped):
        return None
    return Table("Warnings", ["source", "warning"],
                 [[a, b] for a, b in warn] + [[f, f"not read: {why}"] for f, why in col.skipped])


# ------------------------------------------------------------------------------ the answer

_STARVED_BY = {"storage": "storage", "cpu": "the CPU (decoding)", "loader": "the loader",
               "unknown": "an unknown cause"}
_MOST_LINES = 4  # of each point of the answer: it fits on one screen


def verdict_words(v: Verdict) -> str:
    """A verdict's head: `keeps up`, `starved by storage`, `pure ingest (no accelerator)`."""
    if v.status == "starved":
        return "starved by " + _STARVED_BY.get(v.bottleneck, v.bottleneck)
    return {"ingest": "pure ingest (no accelerator)"}.get(v.status, v.status)


def lead_section(col: Collection, rows: Sequence[dict[str, Any]]) -> Lead:
    """The answer: which tier keeps up, the staging break-even, what to do; each run's
    verdict below it."""
    stagings = staging_rows(col, rows)
    return Lead([("Which tier keeps up", tier_lines(rows)),
                 ("Staging break-even", staging_lines(stagings, rows)),
                 ("What to do", todo_lines(stagings, rows))], verdict_table(rows))


def tier_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per tier: its runs' verdicts and their AU."""
    if not rows:
        return ["no training runs here: `iobench train --results` into this directory"]
    by_tier: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_tier[tier_words(r)].append(r)
    out = []
    for tier, rs in sorted(by_tier.items()):
        words = sorted({verdict_words(r["verdict"]) for r in rs})
        runs = f"{len(rs)} run" + ("s" if len(rs) > 1 else "")
        heads = (f"{words[0]} ({runs})" if len(words) == 1 else
                 ", ".join(f"{w} ({sum(verdict_words(r['verdict']) == w for r in rs)} of "
                           f"{runs})" for w in words))
        aus = [r["au"] for r in rs if r["compute"] != "none" and r["au"] is not None]
        au = "" if not aus else f", AU {min(aus):.2f}" + (
            f"-{max(aus):.2f}" if max(aus) - min(aus) >= 0.005 else "")
        out.append(f"{tier}: {heads}{au}")
    return out


def break_even_words(s: Mapping[str, Any]) -> str:
    """A `staging_pairs` row's answer in words: after how many epochs staging pays for
    itself, never, not significant (no number), or why it was not computed."""
    what = outcome(s)
    if what == "not computed":
        return break_even_text(s)
    times = f"epoch {s['epoch_slow_s']:.3g} s in place vs {s['epoch_fast_s']:.3g} s staged"
    if what == "not significant":
        return (f"not significant: {times} are within their spread over "
                f"{s['spread_over']}; staging took {s['stage_s']:.3g} s")
    if what == "never":
        return f"never pays for itself: the copy is not faster ({times})"
    return (f"pays for itself after {s['break_even_epochs']:.2f} epochs (staging "
            f"{s['stage_s']:.3g} s; {times})"
            + (" - single passes, significance unknown: --repeat 3 tells"
               if s["significant"] is None else ""))


def staging_lines(stagings: Sequence[Mapping[str, Any]],
                  rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per staging and configuration: from which tier to which, and its answer."""
    if not stagings:
        return ["no staging measured: `iobench stage` (or `iobench train --stage-to DIR`) "
                "and a run on each tier give it"]
    name = {r["root"]: tier_words(r) for r in rows}
    out = [f"{name.get(s['from'], s['from'])} -> {name.get(s['to'], s['to'])}"
           + (f" ({s['run']})" if s["run"] else "") + f": {break_even_words(s)}"
           for s in stagings]
    more = len(out) - _MOST_LINES
    return out[:_MOST_LINES] + ([f"... {more} more under 'Staging cost'"] if more > 0 else [])


def todo_lines(stagings: Sequence[Mapping[str, Any]],
               rows: Sequence[dict[str, Any]]) -> list[str]:
    """What to do: stage where that pays off for a starved run, then the starved runs' first
    advice (each piece once, with the tiers and worker counts it is for)."""
    starved = [r for r in rows if r["verdict"].status == "starved"]
    name = {r["root"]: tier_words(r) for r in rows}
    stage: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in stagings:
        if outcome(s) == "pays off" and s["significant"] is not False \
                and any(r["root"] == s["from"] for r in starved):
            stage[(name[s["from"]], name.get(s["to"], s["to"]))].append(s["break_even_epochs"])
    out = [f"stage {a} to {b}: it pays for itself after {min(be):.2f}"
           + (f"-{max(be):.2f}" if max(be) > min(be) else "") + " epochs"
           for (a, b), be in stage.items()]
    advice: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for r in starved:
        if r["verdict"].advice:
            advice[r["verdict"].advice[0]][tier_words(r)].add(r["workers"])
    for text, tiers in advice.items():
        out.append(", ".join(f"{t} (w{', w'.join(map(str, sorted(ws)))})"
                             for t, ws in tiers.items()) + f": {text}")
    if not rows:
        out.append("run `iobench train` on each tier with --results here")
    elif not starved and all(r["compute"] == "none" for r in rows):
        out.append("pure-ingest runs only: give --compute-time SECONDS (or a model) to ask "
                   "whether the storage keeps an accelerator busy")
    elif not starved:
        out.append("nothing for the storage: every run keeps up (compute-bound)")
    more = len(out) - _MOST_LINES
    return out[:_MOST_LINES] + ([f"... {more} more under 'Verdict per run'"] if more > 0 else [])


def verdict_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Each run's verdict: what it says, its AU (or rate), why, and the first advice."""
    trs = []
    rs = sorted(rows, key=lambda r: (r["dataset"], tier_words(r), short_label(r), r["run_id"]))
    labels = [f"{r['dataset']}: {short_label(r)}, {r['compute_words']}" for r in rs]
    for r, label in zip(rs, labels, strict=True):
        v: Verdict = r["verdict"]
        if v.status == "ingest" or v.au is None:
            au = f"{_f(r['samples_per_s'], ',.0f')} samples/s"
        else:
            au = au_words(v.au, v.threshold, ">=" if v.au >= v.threshold else "<")
        why = "; ".join(v.evidence[1:3]) or (v.evidence[0] if v.evidence else "")
        trs.append([label + (f" [{r['run_id'][-6:]}]" if labels.count(label) > 1 else ""),
                    verdict_words(v),
                    au, why, v.advice[0] if v.advice else ""])
    return Table("Verdict per run", ["run", "verdict", "AU (or rate)", "why", "what to do"],
                 trs, "Each run's verdict as `iobench train` gave it (docs/metrics.md, "
                 "'Verdict'); AU: median over repetitions against the run's threshold. "
                 "Figures, spreads and the staging cost follow below.")


def write_report(results_dir: str | Path, out: str | Path, title: str | None = None) -> Path:
    """Write the report of `results_dir` to `out` (.html, or .md with PNGs next to it)."""
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm", ".md"):
        raise ConfigError(f"--out {out}: the name must end in .html or .md")
    projections, unread = find_projections([results_dir])  # issue 30: apart, labelled
    col = load_directory(results_dir, len(projections))
    col.skipped += unread
    names = sweep_tier_names(col.sweeps)
    rows = [run_row(r, col.probes, names) for r in col.runs]
    tell_tiers_apart(rows)
    lead = lead_section(col, rows)
    if projections:  # named in the answer as what they are, their tables below
        lead.points.append(("Projections (a model's prediction, not measured)",
                            lead_lines(projections)))
    tables = build_tables(col, rows)
    tables += [Table(t.title, t.header, t.rows, t.note) for t in all_report_sections(projections)]
    pngs = make_plots(rows, col.probes, col.searches)
    title = title or f"iobench report: {Path(results_dir).resolve().name}"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".md":
        png_files = {}
        for name, data in pngs.items():
            fname = f"{out.stem}-{name}.png"
            write_atomic(out.parent / fname, data)
            png_files[name] = fname
        page = render_markdown(title, tables, png_files, lead)
    else:
        page = render_html(title, tables, pngs, lead)
    # issue 28 item 6: each traced run's stall timeline per epoch (iobench.workflows.timeline)
    write_atomic(out, add_timelines(page, col.runs, out.suffix.lower() == ".md").encode())
    return out

