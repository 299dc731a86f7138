"""Compare training results side by side (per run and per epoch), and the staging break-even.

Report code: the only place (with `iobench report`) that imports matplotlib.
Rows come from `iobench.result` documents (docs/results-schema.md); each
run's ratio is taken to the first run given. A run with `--repeat N`
repetitions shows each headline figure as median [min-max], and a
difference to the first run no larger than the spread is marked `n.s.`
(`iobench.core.spread.differs`). The staging break-even is `iobench.core.breakeven`.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iobench.core.breakeven import root_of, staging_pairs
from iobench.core.errors import IobenchError
from iobench.core.jsonio import read_json
from iobench.core.metrics import fmt_rate
from iobench.core.outputs import save_png
from iobench.core.result_types import Epoch, StageDoc, TrainResult, Verdict
from iobench.core.results import (
    STAGE_SCHEMA,
    STAGE_SCHEMA_VERSION,
    ResultError,
    find_documents,
    load_typed,
)
from iobench.core.spread import HEADLINE, differs, fmt_spread, run_spread, spread

if TYPE_CHECKING:
    from matplotlib.axis import Axis


Doc = TrainResult | Mapping[str, Any]  # a training result, typed or as a document


def typed(docs: Sequence[Doc]) -> list[TrainResult]:
    """`docs` as typed results (validated where given as documents)."""
    return [TrainResult.of(d) for d in docs]


def load_documents(paths: list[str | Path]
                   ) -> tuple[list[TrainResult], list[StageDoc], list[tuple[Path, str]]]:
    """Training results, staging results (`iobench stage`, used for the break-even of
    staging) and what was set aside with why, from files and directories (searched with
    their sub-directories)."""
    found = find_documents(paths)
    stages = []
    for p in found.stages:
        try:
            stages.append(StageDoc.from_dict(
                read_json(p, schema=STAGE_SCHEMA, max_version=STAGE_SCHEMA_VERSION), str(p)))
        except IobenchError as e:
            found.skipped.append((p, str(e)))
    return [load_typed(p) for p in found.results], stages, found.skipped


CHECKPOINT_SCHEMA = "iobench.checkpoint"  # iobench.workflows.checkpoint.SCHEMA


@dataclass
class Loaded:
    """What `load_all` found: training runs, staging results, checkpoint results (checked
    `iobench.checkpoint` documents) and what was set aside with why."""

    runs: list[TrainResult]
    stages: list[StageDoc]
    checkpoints: list[dict[str, Any]]
    skipped: list[tuple[Path, str]]


def load_all(paths: Sequence[str | Path]) -> Loaded:
    """`load_documents`, and the `iobench checkpoint` results among `paths` (files as given,
    directories searched with their sub-directories): either kind alone is enough."""
    from iobench.workflows.checkpoint import load_result

    files, rest = _checkpoint_files(paths)
    runs: list[TrainResult] = []
    stages: list[StageDoc] = []
    skipped: list[tuple[Path, str]] = []
    if rest:
        try:
            runs, stages, skipped = load_documents(rest)
        except ResultError:
            if not files:
                raise
    checkpoints = []
    for f in files:
        try:
            checkpoints.append(load_result(f))
        except IobenchError as e:
            skipped.append((f, str(e)))
    if not runs and not checkpoints:
        raise ResultError(f"no iobench training or checkpoint results among "
                          f"{', '.join(map(str, paths))}")
    return Loaded(runs, stages, checkpoints, skipped)


def _checkpoint_files(paths: Sequence[str | Path]) -> tuple[list[Path], list[str | Path]]:
    """The checkpoint result files named by `paths`, and the paths left for the training
    results (a file that is a checkpoint result is not one of them)."""
    from iobench.core.results import schema_of

    files: list[Path] = []
    rest: list[str | Path] = []
    for p in map(Path, paths):
        if p.is_file() and schema_of(p) == CHECKPOINT_SCHEMA:
            files.append(p)
            continue
        if p.is_dir():
            files += sorted(f for f in p.rglob("*.json")
                            if f.is_file() and schema_of(f) == CHECKPOINT_SCHEMA)
        rest.append(p)
    return files, rest


def render_checkpoints(docs: Sequence[Mapping[str, Any]], console: Any = None) -> Any:
    """Print (and return) the checkpoint results side by side: write and read GB/s, the
    duration (max over ranks) and the slowest rank's GB/s (min over ranks), spreads over
    each run's checkpoints, ratios to run 1 (`iobench.workflows.checkpoint.side_by_side`)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from iobench.workflows.checkpoint import (
        SIDE_BY_SIDE_HEADER,
        SIDE_BY_SIDE_NOTE,
        side_by_side,
        side_by_side_cells,
    )

    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    table = Table(title="iobench compare: checkpoints, write then cold read")
    for col in SIDE_BY_SIDE_HEADER:
        table.add_column(col, justify="left" if col in ("tier", "checkpoint") else "right")
    for row in side_by_side([dict(d) for d in docs]):
        table.add_row(*(escape(c) for c in side_by_side_cells(row)))
    console.print(table)
    console.print(escape(SIDE_BY_SIDE_NOTE))
    return table


def run_label(doc: Doc) -> str:
    """A short human label: loader, storage path and filesystem, compute kind."""
    res = TrainResult.of(doc)
    c, comp = res.config, res.compute
    fs = res.provenance.storage.fstype
    what = {"model": comp.model, "emulated": f"emulated {comp.compute_time_s} s",
            "none": "ingest only"}[comp.kind]
    where = c.storage + (f" ({fs})" if fs else "")
    if res.tier:
        where += f" [EMULATED pfs, {res.tier.profile.name}]"
    if res.staging:
        where += f" [staged from {root_of(res.staging.source)}]"
    if not res.complete:  # a part of a run: said where it shows
        where += f" [{res.status.upper()}: {len(res.epochs)} epoch(s) completed]"
    return f"{c.loader} @ {where}, {what}"


def repetitions(doc: Doc) -> int:
    """How many repetitions (`--repeat N`) a training result holds (1 for v1 results)."""
    return TrainResult.of(doc).repetitions


# ------------------------------------------------------------------------ per-run figures

def unique_labels(docs: Sequence[Doc]) -> list[str]:
    """Labels for `docs`, with the run id's tail appended where two would read the same."""
    runs = typed(docs)
    labels = [run_label(d) for d in runs]
    return [f"{lab} [{d.run_id[-6:]}]" if labels.count(lab) > 1 else lab
            for lab, d in zip(labels, runs, strict=True)]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _median(s: Mapping[str, Any] | None) -> float | None:
    return s["median"] if s else None


def run_rows(docs: Sequence[Doc]) -> list[dict[str, Any]]:
    """One row per run: the spread of each HEADLINE figure over its repetitions.

    `spread[k]` is `iobench.core.spread.run_spread`'s (median, min, max, cv, n);
    `differs[k]` is whether it differs from the first run's beyond either
    spread (None: unknown, both single passes); `samples_per_s_vs_first` the
    ratio of the medians.
    """
    runs = typed(docs)
    spreads = [run_spread(d.epochs) for d in runs]
    rows = []
    for i, (doc, label, sp) in enumerate(zip(runs, unique_labels(runs), spreads, strict=True)):
        first = spreads[0]
        rows.append({
            "run": i, "label": label, "run_id": doc.run_id, "repeats": doc.repetitions,
            "spread": sp,
            "differs": {k: None if i == 0 else differs(sp[k], first[k]) for k in HEADLINE},
            "samples_per_s_vs_first": _ratio(_median(sp["samples_per_s"]),
                                             _median(first["samples_per_s"])),
            "stall_vs_first": _ratio(_median(sp["stall_s"]), _median(first["stall_s"])),
        })
    return rows


def comparison_rows(docs: Sequence[Doc]) -> list[dict[str, Any]]:
    """One row per (run, repetition, epoch): headline figures and the ratios to the first run.

    `stall_s` is the max over ranks (the pace setter), `stall_fraction` the
    max over ranks, `au` the mean over ranks, `samples_per_s` and
    `read_MBps` global (docs/metrics.md). `*_vs_first` divide by the first run's
    figure for the same repetition and epoch (None when it has no such one).
    """
    runs = typed(docs)
    labels = unique_labels(runs)
    first = {(e.repeat, e.epoch): e.summary for e in runs[0].epochs} if runs else {}
    rows = []
    for i, (doc, label) in enumerate(zip(runs, labels, strict=True)):
        for e in doc.epochs:
            s = e.summary
            f = first.get((e.repeat, e.epoch))
            rows.append({
                "run": i, "label": label, "run_id": doc.run_id, "repeat": e.repeat,
                "epoch": e.epoch,
                # train --resume part-way: the epoch's figures are the steps from there on
                "resumed_at": e.resumed.steps_before if e.resumed is not None else None,
                "stall_s": s.stall_s_max, "stall_fraction": s.stall_fraction_max,
                "au": s.au_mean, "samples_per_s": s.samples_per_s,
                "read_MBps": s.read_MBps, "wall_s": s.wall_s,
                "cache": doc.cache.mode,
                "accuracy": e.training.accuracy if e.training else None,
                "stall_vs_first": _ratio(s.stall_s_max, f.stall_s_max if f else None),
                "samples_per_s_vs_first": _ratio(s.samples_per_s,
                                                 f.samples_per_s if f else None),
            })
    return rows


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def scaled(s: Mapping[str, Any] | None, factor: float) -> dict[str, Any] | None:
    """A spread with its median, min and max multiplied by `factor` (e.g. 100 for percent)."""
    if not s:
        return None
    return {**s, **{k: s[k] * factor for k in ("median", "min", "max")}}


def fmt_figure(s: Mapping[str, Any] | None, spec: str | None = None) -> str:
    """`median [min-max]` of a spread; rates (spec None) as `fmt_rate` writes them."""
    if spec is None:
        spec = ".0f" if s and abs(s["median"]) >= 100 else ".3g"
    return fmt_spread(s, spec)


def mark(significant: bool | None) -> str:
    """` n.s.` after a figure whose difference to the baseline is within the spread."""
    return " n.s." if significant is False else ""


# (key, column, format spec or None for a rate, scale)
RUN_COLUMNS: tuple[tuple[str, str, str | None, float], ...] = (
    ("epoch_wall_s", "epoch s", ".3g", 1.0), ("stall_s", "stall s", ".3g", 1.0),
    ("stall_fraction", "stall %", ".3g", 100.0), ("au", "AU", ".2f", 1.0),
    ("samples_per_s", "samples/s", None, 1.0), ("read_MBps", "MB/s", None, 1.0))


def render_table(docs: Sequence[Doc], console: Any = None,
                 stages: Sequence[StageDoc | Mapping[str, Any]] = ()) -> Any:
    """Print (and return) the side-by-side rich tables: per epoch, then per run with spreads."""
    from rich.console import Console

    runs = typed(docs)
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    table = epoch_table(runs)
    console.print(table)
    per_run = run_rows(runs)
    console.print(run_table(per_run))
    _print_notes(console, per_run)
    _print_runs(console, runs, stages)
    return table


def epoch_table(runs: Sequence[TrainResult]) -> Any:
    """The rich table of every (run, repetition, epoch), ratios to run 1."""
    from rich.table import Table

    repeated = any(d.repetitions > 1 for d in runs)
    table = Table(title="iobench compare: per epoch, stall = max over ranks; ratios vs run 1"
                  + (" (same repetition and epoch)" if repeated else ""))
    cols = ["run", *(["rep"] if repeated else []), "epoch", "stall s", "stall %", "AU",
            "samples/s", "MB/s", "wall s", "stall ×run1", "samples/s ×run1", "train acc"]
    for col in cols:
        table.add_column(col, justify="left" if col == "run" else "right")
    rows = comparison_rows(runs)
    for row_no, r in enumerate(rows):
        nxt = rows[row_no + 1] if row_no + 1 < len(rows) else None
        table.add_row(f"{r['run'] + 1}", *([str(r["repeat"] + 1)] if repeated else []),
                      str(r["epoch"] + 1) + (f" (resumed at step {r['resumed_at'] + 1})"
                                             if r["resumed_at"] else ""),
                      _fmt(r["stall_s"], ".2f"),
                      _fmt(r["stall_fraction"] and 100 * r["stall_fraction"], ".1f"),
                      _fmt(r["au"], ".2f"), fmt_rate(r["samples_per_s"]),
                      fmt_rate(r["read_MBps"]), _fmt(r["wall_s"], ".2f"),
                      _fmt(r["stall_vs_first"], ".2f"), _fmt(r["samples_per_s_vs_first"], ".2f"),
                      _fmt(r["accuracy"], ".3f"),
                      end_section=nxt is not None and (nxt["run"], nxt["repeat"])
                      != (r["run"], r["repeat"]))
    return table


def run_table(per_run: Sequence[Mapping[str, Any]]) -> Any:
    """The rich table of each run's headline figures, median [min-max] over repetitions."""
    from rich.markup import escape
    from rich.table import Table

    summary = Table(title=escape("iobench compare: per run, median [min-max] over "
                                 "repetitions"))
    summary.add_column("figure")
    for r in per_run:
        summary.add_column(f"run {r['run'] + 1}", justify="right")
    summary.add_row("repetitions", *(str(r["repeats"]) for r in per_run), end_section=True)
    for k, name, spec, f in RUN_COLUMNS:
        summary.add_row(name, *(fmt_figure(scaled(r["spread"][k], f), spec) + mark(r["differs"][k])
                                for r in per_run))
    summary.add_row("samples/s ×run1", *(_fmt(r["samples_per_s_vs_first"], ".2f")
                                          + mark(r["differs"]["samples_per_s"])
                                          for r in per_run))
    return summary


def _print_notes(console: Any, per_run: Sequence[Mapping[str, Any]]) -> None:
    from rich.markup import escape

    console.print(escape("per run: median [min-max] over repetitions; epoch figures: mean over "
                         "a repetition's epochs, rates over its summed epoch time; n.s. = not "
                         "significant: the difference to run 1 is within the min-max spread "
                         "of either run"))
    for r in per_run[1:]:
        if all(v is None for v in r["differs"].values()):
            console.print(f"run {r['run'] + 1} vs run 1: significance unknown (single passes: "
                          "no spread measured; `iobench train --repeat N` measures it)")


def _print_runs(console: Any, runs: Sequence[TrainResult],
                stages: Sequence[StageDoc | Mapping[str, Any]]) -> None:
    """Each run's label, node spread and verdict, then the staging break-evens."""
    from rich.markup import escape

    for i, (doc, label) in enumerate(zip(runs, unique_labels(runs), strict=True)):
        warn = f"  [bold red]{len(doc.warnings)} warning(s)[/]" if doc.warnings else ""
        reps = f"; {doc.repetitions} repetitions" if doc.repetitions > 1 else ""
        console.print(f"run {i + 1}: {escape(label)}; cache {doc.cache.mode}; "
                      f"{doc.world.size} rank(s){reps}; {doc.run_id}{warn}")
        spread = node_spread(doc)
        if spread is not None:
            console.print(f"  {escape(node_spread_line(spread))}")
        console.print(f"  {escape(run_verdict(doc).line)}")
    index = {d.run_id: i + 1 for i, d in enumerate(runs)}
    for b in staging_pairs(runs, stages):
        console.print(escape(staging_line(b, index)))
    if any(d.tier for d in runs):
        from iobench.pfs.stats import NOTE

        console.print(f"[yellow]{NOTE}[/]")


def node_spread(doc: Doc) -> dict[str, Any] | None:
    """Each node's figures over the run (`epochs[i].per_node`, v3): samples/s and MB/s over its
    summed epoch walls, and its summed stall; for each figure the `min`, `median` and `max`
    with the nodes holding the extremes. None for one node or a result before v3."""
    from iobench.workflows.verdict import node_stalls

    res = TrainResult.of(doc)
    nodes = node_stalls(res)
    if not nodes:
        return None
    nbytes: dict[int, int] = {}
    for ep in res.epochs:
        for n in ep.per_node:
            nbytes[n.node] = nbytes.get(n.node, 0) + n.batch_bytes
    figures = {"samples_per_s": {n["name"]: n["samples"] / n["wall_s"] for n in nodes
                                 if n["wall_s"] > 0},
               "read_MBps": {n["name"]: nbytes[n["node"]] / 1e6 / n["wall_s"] for n in nodes
                             if n["wall_s"] > 0},
               "stall_s": {n["name"]: n["stall_s"] for n in nodes}}
    out: dict[str, Any] = {"nodes": len(nodes)}
    for k, by_node in figures.items():
        if not by_node:
            continue
        lo, hi = min(by_node, key=by_node.__getitem__), max(by_node, key=by_node.__getitem__)
        out[k] = {"min": by_node[lo], "min_node": lo, "max": by_node[hi], "max_node": hi,
                  "median": statistics.median(by_node.values())}
    return out


def node_spread_line(spread: Mapping[str, Any]) -> str:
    """`per node (2): samples/s 4.59e3 (n2) / 4.7e3 / 4.81e3 (n1); ...` (min / median / max)."""
    parts = []
    for k, name in (("samples_per_s", "samples/s"), ("read_MBps", "MB/s"), ("stall_s", "stall s")):
        s = spread.get(k)
        if s:
            parts.append(f"{name} {fmt_rate(s['min'])} ({s['min_node']}) / "
                         f"{fmt_rate(s['median'])} / {fmt_rate(s['max'])} ({s['max_node']})")
    return f"per node ({spread['nodes']}, min / median / max): " + "; ".join(parts)


def run_verdict(doc: Doc) -> Verdict:
    """The run's verdict as `iobench train` recorded it, or worked out now for a result
    written before verdicts (the default AU threshold)."""
    from iobench.workflows.verdict import judge

    res = TrainResult.of(doc)
    return res.summary.verdict or judge(res)


def staging_line(b: Mapping[str, Any], index: Mapping[str, int]) -> str:
    """One line on a `staging_pairs` row, naming runs by their number in `index` (run id ->)."""
    staged = index.get(b["fast_run_id"]) if b["fast_run_id"] else None
    who = f"staging (run {staged})" if staged else "staging"
    if b["slow_run_id"] is None:
        return f"{who}: break-even not computed: {b['refused']} among the runs given"
    slow = index.get(b["slow_run_id"])
    if b["refused"]:
        return f"{who}: break-even vs run {slow} not computed: {b['refused']}"
    stage = fmt_figure(b["stage_spread"], ".3g") if b["stage_spread"] else f"{b['stage_s']:.2f}"
    be = b["break_even_epochs"]
    when = ("resumed staging, not a full staging cost: no break-even" if be is None else
            "never pays for itself" if math.isinf(be) else
            f"pays for itself after {be:.2f} epochs")
    if b["significant"] is False:
        when += " (n.s.: the epoch times are within their spread)"
    return (f"{who}: {b['stage_bytes'] / 1e6:.1f} MB in {stage} s; median epoch "
            f"{fmt_figure(b['epoch_fast'], '.3g')} s staged vs "
            f"{fmt_figure(b['epoch_slow'], '.3g')} s in place (run {slow}): {when} "
            "(break_even_epochs = stage_s / epoch time saved)")


# ------------------------------------------------------------------------------ plots

def epoch_spreads(doc: Doc, figure: Callable[[Epoch], float | None]
                  ) -> dict[int, dict[str, Any]]:
    """Per epoch number: the spread over repetitions of `figure(epoch record)` (None skipped)."""
    by_epoch: dict[int, list[float | None]] = {}
    for e in TrainResult.of(doc).epochs:
        by_epoch.setdefault(e.epoch, []).append(figure(e))
    out = {}
    for ep in sorted(by_epoch):
        s = spread(by_epoch[ep])
        if s:
            out[ep] = s
    return out


def error_bars(spreads: Sequence[Mapping[str, Any]]) -> list[list[float]] | None:
    """matplotlib `yerr` (below, above the median) for min-max bars; None when all are single."""
    if all(s["n"] < 2 for s in spreads):
        return None
    return [[s["median"] - s["min"] for s in spreads], [s["max"] - s["median"] for s in spreads]]


def integer_ticks(axis: Axis) -> None:
    """Whole-number ticks (epochs, workers) on `axis`, keeping its locator's other choices."""
    from matplotlib.ticker import MaxNLocator

    locator = axis.get_major_locator()
    if isinstance(locator, MaxNLocator):  # matplotlib's default, AutoLocator, is one
        locator.set_params(integer=True)


def plot_training(docs: Sequence[Doc], path: str | Path) -> Path:
    """Training accuracy (classification) or loss (regression) per epoch, one line per run;
    with repetitions, the median per epoch with min-max error bars.

    Runs without a real model have no curve; a ResultError says so when none has one.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = typed(docs)
    curves = []
    for doc, label in zip(runs, unique_labels(runs), strict=True):
        if any(e.training for e in doc.epochs):
            curves.append((label, doc.compute.task, doc))
    if not curves:
        raise ResultError("no run trained a real model (compute kind `model`): no accuracy or "
                          "loss curve to draw; drop --accuracy-plot")
    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    metric = "accuracy" if all(t == "classification" for _, t, _ in curves) else "loss"
    for i, (label, _, doc) in enumerate(curves):
        sp = epoch_spreads(doc, lambda e: _trained(e, metric))
        eps = sorted(sp)
        ax.errorbar([e + 1 for e in eps], [sp[e]["median"] for e in eps],
                    yerr=error_bars([sp[e] for e in eps]), marker="o", capsize=3,
                    label=f"{i + 1}: {label}")
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"training {metric} (all ranks)")
    ax.set_title(f"Training {metric} per epoch")
    integer_ticks(ax.xaxis)
    if metric == "accuracy":
        from iobench.core.datasets import DATASETS

        classes = {DATASETS[d.config.dataset].num_classes for d in runs
                   if d.config.dataset in DATASETS and d.epochs and d.epochs[0].training}
        for k in sorted(c for c in classes if c > 0):
            ax.axhline(1 / k, color="grey", linestyle="--", linewidth=1)
            ax.annotate(f"chance, {k} classes", (0.01, 1 / k), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(0, 3), fontsize=8, color="grey")
        ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize=8, frameon=False)
    fig.tight_layout()
    return save_png(fig, Path(path))


def _trained(e: Epoch, metric: str) -> float | None:
    """An epoch's training `metric` (accuracy or loss), None without a model."""
    if e.training is None:
        return None
    return e.training.accuracy if metric == "accuracy" else e.training.loss


def plot_stall(docs: Sequence[Doc], path: str | Path) -> Path:
    """Stall per epoch (% of the epoch, max over ranks; bars labelled with seconds), grouped
    by epoch with one bar per run, beside each run's AU against the verdict's threshold;
    with repetitions, medians over them with min-max error bars.

    Written atomically (temporary name, then rename) as PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    docs = typed(docs)
    labels = unique_labels(docs)
    fracs = [epoch_spreads(d, lambda e: 100 * (e.summary.stall_fraction_max or 0.0))
             for d in docs]
    secs = [epoch_spreads(d, lambda e: e.summary.stall_s_max) for d in docs]
    epochs = sorted({ep for sp in fracs for ep in sp})
    n = len(docs)
    width = 0.8 / max(n, 1)
    fig, (ax, ax_au) = plt.subplots(
        1, 2, figsize=(max(6.0, 1.2 * len(epochs) * max(n, 2) * 0.6 + 3) + 3, 4.5),
        gridspec_kw={"width_ratios": [3, 1]})
    for i, (label, sp, sec) in enumerate(zip(labels, fracs, secs, strict=True)):
        eps = sorted(sp)
        xs = [epochs.index(ep) + (i - (n - 1) / 2) * width for ep in eps]
        ys = [sp[ep]["median"] for ep in eps]
        bars = ax.bar(xs, ys, width * 0.95, yerr=error_bars([sp[ep] for ep in eps]), capsize=3,
                      label=f"{i + 1}: {label}")
        ax.bar_label(bars, labels=[f"{y:.3g}%\n{sec[ep]['median']:.3g} s"
                                   for y, ep in zip(ys, eps, strict=True)],
                     fontsize=7, padding=2)
    ax.set_xticks(range(len(epochs)), [f"epoch {e + 1}" for e in epochs])
    repeated = any(d.repetitions > 1 for d in docs)
    note = "\nmedian over repetitions, bars min-max" if repeated else ""
    ax.set_ylabel("stall, % of the epoch (max over ranks)" + note)
    ax.set_title("Data stall per epoch (lower is better)")
    ax.margins(y=0.2)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8, frameon=False)

    aus = [run_spread(d.epochs)["au"] for d in docs]
    au_pts = [a or {"median": 0.0, "min": 0.0, "max": 0.0, "n": 1} for a in aus]
    ax_au.bar(range(1, n + 1), [a["median"] for a in au_pts], 0.6,
              yerr=error_bars(au_pts), capsize=3, color=[f"C{i}" for i in range(n)])
    threshold = max((run_verdict(d).threshold for d in docs), default=0.9)
    ax_au.axhline(threshold, color="red", linestyle="--", linewidth=1)
    ax_au.text(0.02, threshold, f"AU {threshold:.2f}: keeps up above", color="red", fontsize=7,
               va="bottom", ha="left", transform=ax_au.get_yaxis_transform())
    ax_au.set_xticks(range(1, n + 1), [str(i) for i in range(1, n + 1)])
    ax_au.set_xlabel("run")
    ax_au.set_ylim(0, 1.1)
    ax_au.set_ylabel("accelerator utilisation (AU)" + note)
    ax_au.set_title("AU per run")
    fig.tight_layout()
    return save_png(fig, path)
