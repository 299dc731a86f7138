"""Compare training results side by side: a per-epoch table and a stall-time bar chart.

Report code: the only place (with `iobench report`) that imports matplotlib.
Rows come from `iobench.result` documents (docs/results-schema.md); each
run's ratio is taken to the first run given, epoch by epoch.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from iobench.errors import StorageError
from iobench.metrics import fmt_rate
from iobench.results import ResultError, find_results, load_result


def load_runs(paths: list[str | Path]) -> list[tuple[Path, dict[str, Any]]]:
    """(path, document) for each result named by `paths` (files or directories)."""
    return [(p, load_result(p)) for p in find_results(paths)]


def run_label(doc: dict[str, Any]) -> str:
    """A short human label: loader, storage path and filesystem, compute kind."""
    c, comp = doc["config"], doc["compute"]
    storage = doc.get("provenance", {}).get("storage") or {}
    fs = storage.get("fstype")
    what = {"model": comp.get("model"), "emulated": f"emulated {comp.get('compute_time_s')} s",
            "none": "ingest only"}[comp["kind"]]
    where = c["storage"] + (f" ({fs})" if fs else "")
    if doc.get("tier"):
        where += f" [EMULATED pfs, {doc['tier']['profile'].get('name')}]"
    if doc.get("staging"):
        src = doc["staging"].get("from")
        where += f" [staged from {src.get('root') if isinstance(src, dict) else src}]"
    return f"{c['loader']} @ {where}, {what}"


def break_even(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each staged run, the staging cost against run 1 (in place), per METRICS.md.

    `break_even_epochs` = stage_s / (mean epoch wall of run 1 - mean epoch wall
    of the staged run); None (never pays) when staging does not make epochs faster.
    """
    if not docs:
        return []
    def mean_wall(d: dict[str, Any]) -> float:
        walls = [e["summary"]["wall_s"] for e in d["epochs"]]
        return sum(walls) / len(walls) if walls else float("nan")

    slow = mean_wall(docs[0])
    out = []
    for i, d in enumerate(docs):
        st = d.get("staging")
        if not st or i == 0:
            continue
        fast = mean_wall(d)
        saved = slow - fast
        out.append({"run": i, "stage_s": st["stage_s"], "stage_bytes": st["stage_bytes"],
                    "stage_MBps": st.get("stage_MBps"), "epoch_wall_in_place_s": slow,
                    "epoch_wall_staged_s": fast,
                    "break_even_epochs": st["stage_s"] / saved if saved > 0 else None})
    return out


def unique_labels(docs: list[dict[str, Any]]) -> list[str]:
    """Labels for `docs`, with the run id's tail appended where two would read the same."""
    labels = [run_label(d) for d in docs]
    return [f"{lab} [{d['run_id'][-6:]}]" if labels.count(lab) > 1 else lab
            for lab, d in zip(labels, docs, strict=True)]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def comparison_rows(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (run, epoch): headline figures and the ratios to the first run.

    `stall_s` is the max over ranks (the pace setter), `stall_fraction` the
    max over ranks, `au` the mean over ranks, `samples_per_s` and
    `read_MBps` global (METRICS.md). `*_vs_first` divide by the first run's
    figure for the same epoch (None when that run has no such epoch).
    """
    labels = unique_labels(docs)
    first = {e["epoch"]: e["summary"] for e in docs[0]["epochs"]} if docs else {}
    rows = []
    for i, (doc, label) in enumerate(zip(docs, labels, strict=True)):
        for e in doc["epochs"]:
            s = e["summary"]
            f = first.get(e["epoch"])
            rows.append({
                "run": i, "label": label, "run_id": doc["run_id"], "epoch": e["epoch"],
                "stall_s": s["stall_s_max"], "stall_fraction": s["stall_fraction_max"],
                "au": s["au_mean"], "samples_per_s": s["samples_per_s"],
                "read_MBps": s["read_MBps"], "wall_s": s["wall_s"],
                "cache": doc["cache"]["mode"],
                "accuracy": (e.get("training") or {}).get("accuracy"),
                "stall_vs_first": _ratio(s["stall_s_max"], f and f["stall_s_max"]),
                "samples_per_s_vs_first": _ratio(s["samples_per_s"], f and f["samples_per_s"]),
            })
    return rows


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render_table(docs: list[dict[str, Any]], console: Any = None) -> Any:
    """Print (and return) the side-by-side rich table."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    table = Table(title="iobench compare: per epoch, stall = max over ranks; ratios vs run 1")
    for col in ("run", "epoch", "stall s", "stall %", "AU", "samples/s", "MB/s", "wall s",
                "stall ×run1", "samples/s ×run1", "train acc"):
        table.add_column(col, justify="right" if col not in ("run",) else "left")
    rows = comparison_rows(docs)
    for r in rows:
        table.add_row(f"{r['run'] + 1}", str(r["epoch"] + 1), _fmt(r["stall_s"], ".2f"),
                      _fmt(r["stall_fraction"] and 100 * r["stall_fraction"], ".1f"),
                      _fmt(r["au"], ".2f"), fmt_rate(r["samples_per_s"]),
                      fmt_rate(r["read_MBps"]), _fmt(r["wall_s"], ".2f"),
                      _fmt(r["stall_vs_first"], ".2f"), _fmt(r["samples_per_s_vs_first"], ".2f"),
                      _fmt(r["accuracy"], ".3f"),
                      end_section=r is not rows[-1] and rows[rows.index(r) + 1]["run"] != r["run"])
    console.print(table)
    for i, (doc, label) in enumerate(zip(docs, unique_labels(docs), strict=True)):
        warn = f"  [bold red]{len(doc['warnings'])} warning(s)[/]" if doc["warnings"] else ""
        console.print(f"run {i + 1}: {escape(label)}; cache {doc['cache']['mode']}; "
                      f"{doc['world']['size']} rank(s); {doc['run_id']}{warn}")
    for b in break_even(docs):
        when = (f"pays for itself after {b['break_even_epochs']:.1f} epochs"
                if b["break_even_epochs"] is not None else "never pays for itself")
        console.print(f"staging (run {b['run'] + 1}): {b['stage_bytes'] / 1e6:.1f} MB in "
                      f"{b['stage_s']:.2f} s; mean epoch {b['epoch_wall_staged_s']:.2f} s vs "
                      f"{b['epoch_wall_in_place_s']:.2f} s in place (run 1): {when} "
                      "(break_even_epochs = stage_s / epoch time saved)")
    if any(d.get("tier") for d in docs):
        from iobench.pfs.stats import NOTE

        console.print(f"[yellow]{NOTE}[/]")
    return table


def _save_png(fig: Any, path: Path) -> Path:
    """Write a figure atomically (temporary name, then rename) and close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise StorageError(f"cannot write plot {path}: {e.strerror or e}") from e
    finally:
        plt.close(fig)
    return path


def plot_training(docs: list[dict[str, Any]], path: str | Path) -> Path:
    """Training accuracy (classification) or loss (regression) per epoch, one line per run.

    Runs without a real model have no curve; a ResultError says so when none has one.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = []
    for doc, label in zip(docs, unique_labels(docs), strict=True):
        pts = [(e["epoch"] + 1, e["training"]) for e in doc["epochs"] if e.get("training")]
        if pts:
            curves.append((label, doc["compute"].get("task"), pts))
    if not curves:
        raise ResultError("no run trained a real model (compute kind `model`): no accuracy or "
                          "loss curve to draw; drop --accuracy-plot")
    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    metric = "accuracy" if all(t == "classification" for _, t, _ in curves) else "loss"
    for i, (label, _, pts) in enumerate(curves):
        ys = [float("nan") if t[metric] is None else t[metric] for _, t in pts]
        ax.plot([e for e, _ in pts], ys, marker="o", label=f"{i + 1}: {label}")
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"training {metric} (all ranks)")
    ax.set_title(f"Training {metric} per epoch")
    ax.xaxis.get_major_locator().set_params(integer=True)
    if metric == "accuracy":
        from iobench.datasets import DATASETS

        classes = {DATASETS[d["config"]["dataset"]].num_classes for d in docs
                   if d["config"]["dataset"] in DATASETS and d["epochs"][0].get("training")}
        for k in sorted(c for c in classes if c > 0):
            ax.axhline(1 / k, color="grey", linestyle="--", linewidth=1)
            ax.annotate(f"chance, {k} classes", (0.01, 1 / k), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(0, 3), fontsize=8, color="grey")
        ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize=8, frameon=False)
    fig.tight_layout()
    return _save_png(fig, Path(path))


def plot_stall(docs: list[dict[str, Any]], path: str | Path) -> Path:
    """Bar chart of stall time (max over ranks) per epoch, grouped by epoch, one bar per run.

    Written atomically (temporary name, then rename) as PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    rows = comparison_rows(docs)
    labels = unique_labels(docs)
    epochs = sorted({r["epoch"] for r in rows})
    n = len(docs)
    width = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(epochs) * max(n, 2) * 0.6 + 3), 4.5))
    for i, label in enumerate(labels):
        xs, ys = [], []
        for r in rows:
            if r["run"] == i:
                xs.append(epochs.index(r["epoch"]) + (i - (n - 1) / 2) * width)
                ys.append(r["stall_s"])
        bars = ax.bar(xs, ys, width * 0.95, label=f"{i + 1}: {label}")
        ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=8, padding=2)
    ax.set_xticks(range(len(epochs)), [f"epoch {e + 1}" for e in epochs])
    ax.set_ylabel("stall time per epoch (s, max over ranks)")
    ax.set_title("Data stall per epoch (lower is better)")
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8, frameon=False)
    fig.tight_layout()
    return _save_png(fig, path)
