"""Spread over repeated runs (`--repeat N`): median, min, max, coefficient of variation.

A single pass on a shared machine varies 2-4x (docs/metrics.md, "Repeats"),
so every headline figure of a repeated run is reported as a `Spread`, and
two figures are compared with `differs`: a difference no larger than the
spread of either side is not significant.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from iobench.core.result_types import Epoch

MB = 1_000_000

# The headline figures of a training run whose spread over repetitions is reported.
HEADLINE: tuple[str, ...] = ("epoch_wall_s", "stall_s", "stall_fraction", "au", "samples_per_s",
                             "read_MBps", "au_mlperf")


def spread(values: Iterable[float | None]) -> dict[str, Any] | None:
    """`{median, min, max, cv, n, values}` of the measured values (None entries are skipped).

    `cv` is the coefficient of variation (sample standard deviation / mean),
    None with fewer than two values or a zero mean. Returns None when no
    value was measured.
    """
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return None
    mean = statistics.fmean(vals)
    cv = statistics.stdev(vals) / abs(mean) if len(vals) > 1 and mean != 0 else None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "cv": cv,
            "n": len(vals), "values": vals}


def spread_of(records: Iterable[Mapping[str, Any]], keys: Iterable[str]
              ) -> dict[str, dict[str, Any] | None]:
    """`spread` of each figure in `keys` over `records` (one mapping per repetition)."""
    recs = list(records)
    return {k: spread(r.get(k) for r in recs) for k in keys}


def differs(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool | None:
    """Whether two spreads' medians differ by more than the spread (max - min) of either.

    None when it cannot be told: a side is missing, or both sides hold a
    single value (a single pass has no measured spread).
    """
    if not a or not b or (a["n"] < 2 and b["n"] < 2):
        return None
    width = max(a["max"] - a["min"], b["max"] - b["min"])
    return bool(abs(a["median"] - b["median"]) > width)


def _num(v: float, spec: str | None) -> str:
    if spec is not None:
        return format(v, spec)
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"  # 0.412, 27.6, 8994


def fmt_spread(s: Mapping[str, Any] | None, spec: str | None = None) -> str:
    """`median [min-max]` for tables (just the value when n == 1, `-` when missing).

    Without `spec`: 3 significant digits below 100, whole numbers above.
    """
    if not s:
        return "-"
    if s["n"] < 2:
        return _num(s["median"], spec)
    return f"{_num(s['median'], spec)} [{_num(s['min'], spec)}-{_num(s['max'], spec)}]"


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


class _EpochFigures(NamedTuple):
    """What the spread over repetitions reads from one epoch record."""

    repeat: int
    wall_s: float
    stall_s_max: float
    stall_fraction_max: float | None
    au_mean: float | None
    au_mlperf_mean: float | None
    samples: int
    batch_bytes: int


def _figures(e: Epoch | Mapping[str, Any]) -> _EpochFigures:
    """An epoch record's figures: typed (readers) or the dict the writer builds (train)."""
    if isinstance(e, Epoch):
        s = e.summary
        return _EpochFigures(e.repeat, s.wall_s, s.stall_s_max, s.stall_fraction_max,
                             s.au_mean, s.au_mlperf_mean, s.samples, s.batch_bytes)
    d = e["summary"]
    return _EpochFigures(int(e.get("repeat", 0)), d["wall_s"], d["stall_s_max"],
                         d["stall_fraction_max"], d["au_mean"], d.get("au_mlperf_mean"),
                         d["samples"], d["batch_bytes"])


def repetition_figures(epochs: Iterable[Epoch | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The headline figures of each repetition of a training result.

    `epochs` are the result's epoch records; they are grouped by their
    `repeat` (0 when absent: a result written before `--repeat`). Per
    repetition: the mean over its epochs of the epoch wall (`epoch_wall_s`),
    of the slowest rank's stall (`stall_s`, `stall_fraction`) and of the mean
    AU (`au`); `samples_per_s` and `read_MBps` are its samples and payload
    bytes over its summed epoch walls.
    """
    groups: dict[int, list[_EpochFigures]] = {}
    for f in map(_figures, epochs):
        groups.setdefault(f.repeat, []).append(f)
    out = []
    for r in sorted(groups):
        sums = groups[r]
        wall = sum(s.wall_s for s in sums)
        out.append({
            "repeat": r, "epochs": len(sums),
            "epoch_wall_s": wall / len(sums),
            "stall_s": _mean([s.stall_s_max for s in sums]),
            "stall_fraction": _mean([s.stall_fraction_max for s in sums]),
            "au": _mean([s.au_mean for s in sums]),
            "au_mlperf": _mean([s.au_mlperf_mean for s in sums]),
            "samples_per_s": sum(s.samples for s in sums) / wall if wall > 0 else None,
            "read_MBps": sum(s.batch_bytes for s in sums) / MB / wall if wall > 0 else None,
        })
    return out


def run_spread(epochs: Iterable[Epoch | Mapping[str, Any]]
               ) -> dict[str, dict[str, Any] | None]:
    """`spread` of each HEADLINE figure over the repetitions of a training result."""
    return spread_of(repetition_figures(epochs), HEADLINE)
