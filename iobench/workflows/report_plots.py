"""The report's plots: stall per epoch, throughput by workers, AU by tier, probe limits and
search curves, as PNG bytes (matplotlib, Agg). Only `report` and `compare` import matplotlib."""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from iobench.core.result_types import ProbeDoc, SearchDoc
from iobench.workflows.compare import error_bars, integer_ticks


def short_label(r: dict[str, Any]) -> str:
    return (f"{r['loader']} @ {r['tier']}, w{r['workers']} b{r['batch_size']} {r['shuffle']}"
            + (" staged" if r["staged"] else ""))


REPEAT_NOTE = "\nbars: min-max over repetitions"


def pooled(spreads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One point for several alike runs: the mean of their medians, from the lowest min to
    the highest max (n: the most repetitions among them, so single passes get no bar)."""
    return {"median": sum(s["median"] for s in spreads) / len(spreads),
            "min": min(s["min"] for s in spreads), "max": max(s["max"] for s in spreads),
            "n": max(s["n"] for s in spreads)}


def _legend(ax: Any, entries: int) -> None:
    if entries <= 6:
        ax.legend(fontsize=7, loc="best")
    else:  # many runs: beside the axes, not over the data
        ax.figure.set_size_inches(12, max(4.5, 0.18 * entries))
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _png(plt: Any, fig: Any) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def make_plots(rows: list[dict[str, Any]], probes: Sequence[ProbeDoc],
               searches: Sequence[SearchDoc]) -> dict[str, bytes]:
    """PNG bytes by name: stall, throughput, au, limits, search (only those with data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pngs: dict[str, bytes] = {}
    if rows:
        pngs["stall"] = _png(plt, _stall_figure(plt, rows))
        throughput = _throughput_figure(plt, rows)
        if throughput is not None:
            pngs["throughput"] = _png(plt, throughput)
        au = au_figure(plt, rows)
        if au is not None:
            pngs["au"] = _png(plt, au)
    if probes:
        pngs["limits"] = _png(plt, _limits_figure(plt, rows, probes))
    if searches:
        pngs["search"] = _png(plt, search_figure(plt, searches))
    return pngs


def _stall_figure(plt: Any, rows: Sequence[dict[str, Any]]) -> Any:
    """Stall per epoch by run, beside AU per epoch against the verdict's threshold."""
    repeated = REPEAT_NOTE if any(r["repeats"] > 1 for r in rows) else ""
    fig, (ax, ax_au) = plt.subplots(1, 2, figsize=(11, 4.5))
    for r in sorted(rows, key=short_label):
        epochs = range(1, len(r["stall_fraction_spread"]) + 1)
        pct = [{k: v * 100 if k in ("median", "min", "max") else v for k, v in sp.items()}
               for sp in r["stall_fraction_spread"]]
        line = ax.errorbar(epochs, [p["median"] for p in pct], yerr=error_bars(pct),
                           marker="o", capsize=3, label=f"{r['dataset']}: {short_label(r)}")
        ax_au.errorbar(epochs, [p["median"] for p in r["au_spread"]],
                       yerr=error_bars(r["au_spread"]), marker="o", capsize=3,
                       color=line[0].get_color())
    ax.set_xlabel("epoch")
    ax.set_ylabel("stall, % of the epoch (slowest rank)" + repeated)
    ax.set_title("Data stall per epoch, by run (cold cache)")
    ax.set_ylim(bottom=0)
    ax.xaxis.get_major_locator().set_params(integer=True)
    threshold = rows[0]["threshold"]
    ax_au.axhline(threshold, color="red", linestyle="--", linewidth=1,
                  label=f"AU {threshold:.2f}: below it storage cannot keep up")
    ax_au.set_xlabel("epoch")
    ax_au.set_ylabel("accelerator utilisation (AU)" + repeated)
    ax_au.set_ylim(0, 1.05)
    ax_au.set_title("AU per epoch, by run")
    integer_ticks(ax_au.xaxis)
    ax_au.legend(fontsize=7, loc="lower right")
    _legend(ax, len(rows))
    return fig


def _throughput_figure(plt: Any, rows: Sequence[dict[str, Any]]) -> Any | None:
    """Samples/s against the worker count, one line per alike group; None with one count."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows if len({r["workers"] for r in rows}) > 1 else ():
        groups[(r["dataset"], r["loader"], r["tier"], r["batch_size"], r["shuffle"],
                r["staged"])].append(r)
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (ds, loader, tier, bs, sh, staged), rs in sorted(groups.items(), key=str):
        by_w: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in rs:
            if r["spread"]["samples_per_s"] is not None:
                by_w[r["workers"]].append(r["spread"]["samples_per_s"])
        ws = sorted(by_w)
        pts = [pooled(by_w[w]) for w in ws]
        ax.errorbar(ws, [p["median"] for p in pts], yerr=error_bars(pts), marker="o",
                    capsize=3, label=f"{ds}: {loader} @ {tier}, b{bs} {sh}"
                    + (" staged" if staged else ""))
    ax.set_xlabel("loader workers per rank")
    ax.set_ylabel("samples/s (median over repetitions; runs alike: their mean)"
                  + (REPEAT_NOTE if any(r["repeats"] > 1 for r in rows) else ""))
    ax.set_title("Throughput by workers")
    ax.set_ylim(bottom=0)
    integer_ticks(ax.xaxis)
    _legend(ax, len(groups))
    return fig


def _like(r: Mapping[str, Any]) -> tuple[Any, ...]:
    """What runs must share to be averaged in one bar: dataset, loader, format, workers,
    batch, shuffle, ranks and compute (kind and model or step time)."""
    return (r["dataset"], r["loader"], r["format"], r["workers"], r["batch_size"],
            r["shuffle"], r["ranks"], r["compute_words"])


def _like_label(key: tuple[Any, ...], varying: Sequence[bool]) -> str:
    """A bar series' label: the parts of its `_like` key that differ between series."""
    ds, loader, fmt, workers, batch, shuffle, ranks, compute = key
    parts = [ds, loader, fmt, f"w{workers}", f"b{batch}", shuffle, f"{ranks} rank(s)", compute]
    shown = [p for p, v in zip(parts, varying, strict=True) if v]
    return ", ".join(shown or [loader, f"w{workers}", f"b{batch}", compute])


def au_figure(plt: Any, rows: Sequence[dict[str, Any]]) -> Any | None:
    """AU by storage tier: one bar per tier and kind of run (`_like`); only alike runs share
    a bar (the mean of their medians). Pure-ingest runs have no accelerator: left out."""
    runs = [r for r in rows if r["compute"] != "none" and r["spread"]["au"] is not None]
    if not runs:
        return None
    tiers = sorted({tier_words(r) for r in runs})
    series: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        series[_like(r)].append(r)
    keys = sorted(series, key=str)
    varying = [len({k[i] for k in keys}) > 1 for i in range(len(keys[0]))]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(keys)
    for k, key in enumerate(keys):
        xs, pts = [], []
        for i, t in enumerate(tiers):
            aus = [r["spread"]["au"] for r in series[key] if tier_words(r) == t]
            if aus:
                xs.append(i + k * width)
                pts.append(pooled(aus))
        ax.bar(xs, [p["median"] for p in pts], width, yerr=error_bars(pts), capsize=3,
               label=_like_label(key, varying))
    ax.axhline(rows[0]["threshold"], color="red", linestyle="--", linewidth=1,
               label=f"AU {rows[0]['threshold']:.2f} (the verdict's threshold)")
    ax.set_xticks([i + width * (len(keys) - 1) / 2 for i in range(len(tiers))])
    ax.set_xticklabels(tiers, fontsize=8)
    ax.set_ylabel("accelerator utilisation (alike runs: mean of medians)"
                  + (REPEAT_NOTE if any(r["repeats"] > 1 for r in runs) else ""))
    ax.set_ylim(0, 1.05)
    left_out = len(rows) - len(runs)
    ax.set_title("AU by storage tier, one bar per kind of run"
                 + (f" ({left_out} pure-ingest run(s) left out)" if left_out else ""))
    _legend(ax, len(keys) + 1)
    return fig


def tier_words(r: Mapping[str, Any]) -> str:
    return str(r["tier"]) + (" [staged]" if r["staged"] else "")


def _limits_figure(plt: Any, rows: Sequence[dict[str, Any]], probes: Sequence[ProbeDoc]) -> Any:
    """Each tier's probed limits beside the best loader run's MB/s there."""
    tiers = sorted({p.label for p in probes})
    latest = {t: max((p for p in probes if p.label == t), key=lambda p: p.created)
              for t in tiers}
    series = [("probe: sequential read", [latest[t].summary.seq_read_MBps for t in tiers]),
              ("probe: random reads at sample size", [latest[t].summary.sample_read_MBps
                                                      for t in tiers])]
    if rows:
        series.append(("best loader run", [max((r["read_MBps"] or 0 for r in rows
                                                if r["tier"] == t), default=0)
                                           for t in tiers]))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(series)
    for k, (name, vals) in enumerate(series):
        ax.bar([i + k * width for i in range(len(tiers))], vals, width, label=name)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(tiers))])
    ax.set_xticklabels(tiers, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("MB/s (log scale)")
    ax.set_title("Storage limits (probe) next to what the loaders reached")
    ax.legend(fontsize=7)
    return fig


def search_figure(plt: Any, searches: Sequence[SearchDoc]) -> Any:
    """AU against accelerator count per `iobench search`, with each threshold as a line."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for d in sorted(searches, key=lambda d: d.created):
        pts = sorted(d.points, key=lambda p: p.accelerators)
        w = d.workload
        xs = [p.accelerators for p in pts]
        ys = [p.au for p in pts]
        lo = [p.au - (p.au if p.au_min is None else p.au_min) for p in pts]
        hi = [(p.au if p.au_max is None else p.au_max) - p.au for p in pts]
        line = ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3,
                           label=f"{w.name}/{w.accelerator} on "
                                 f"{Path(d.config.storage).name}: "
                                 f"{d.max_accelerators} max")
        ax.axhline(d.threshold, color=line[0].get_color(), linestyle="--", linewidth=1)
    ax.set_xlabel("emulated accelerators (ranks)")
    ax.set_ylabel("AU without the first step's I/O (median over repeats)")
    ax.set_title("iobench search: AU against accelerators (dashed: each threshold)")
    ax.set_ylim(0, 1.05)
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7, loc="best")
    return fig
