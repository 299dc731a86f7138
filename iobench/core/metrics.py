"""Step and epoch figures exactly as docs/metrics.md defines them, for the result file.

`EpochClock` records one rank's epoch from `perf_counter_ns` reads that tile
the epoch without gaps: step k's wait runs from the end of step k-1's compute
(or the epoch start) to the moment its batch is usable, its compute from
there to the end of its compute. So `stall_s + sum(compute_s) == wall_s`
holds by construction, to the nanosecond. `rank_figures` turns one rank's
record into its per-epoch figures; `epoch_summary` combines all ranks.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

MB = 1_000_000  # docs/metrics.md: MB = 10^6 bytes


class EpochClock:
    """One rank's per-step clock for one epoch (all times in integer nanoseconds)."""

    __slots__ = ("_last", "batch_bytes", "compute_ns", "excluded_ns", "samples", "start_ns",
                 "wait_ns")

    def __init__(self) -> None:
        self.start_ns: int | None = None
        self._last = 0
        self.wait_ns: list[int] = []  # per step, the first one is first_batch
        self.compute_ns: list[int] = []
        self.samples = 0
        self.batch_bytes = 0
        self.excluded_ns = 0  # time outside every step (a checkpoint blocked training)

    def start(self) -> int:
        """Mark the epoch start: call right before the first `next(iterator)`."""
        self.start_ns = self._last = time.perf_counter_ns()
        return self.start_ns

    def batch_ready(self) -> int:
        """The batch is usable on the device: closes this step's wait; returns the time."""
        now = time.perf_counter_ns()
        self.wait_ns.append(now - self._last)
        self._last = now
        return now

    def compute_done(self, samples: int, batch_bytes: int, now: int | None = None) -> None:
        """End of this step's compute (after a device synchronise on a GPU)."""
        if now is None:
            now = time.perf_counter_ns()
        self.compute_ns.append(now - self._last)
        self._last = now
        self.samples += samples
        self.batch_bytes += batch_bytes

    def exclude(self) -> int:
        """The time since the last read was neither wait nor compute (a checkpoint blocked
        training, `train --checkpoint-every`): it leaves the epoch's wall; returns it (ns)."""
        now = time.perf_counter_ns()
        gap = now - self._last
        self.excluded_ns += gap
        self._last = now
        return gap

    @property
    def last_ns(self) -> int:
        """The last clock read: the end of the last step's compute (or the epoch start)."""
        return self._last

    @property
    def end_ns(self) -> int:
        """End of the last step's compute (the epoch's end), or its start if no step ran."""
        return self._last

    @property
    def steps(self) -> int:
        return len(self.compute_ns)


def _pct(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if a.size else None


def rank_figures(clock: EpochClock) -> dict[str, Any]:
    """Per-rank epoch figures (seconds, bytes, samples) with docs/metrics.md names.

    `wait_*` percentiles are over steps 2..N (the first step's wait is
    `first_batch_s`); `None` when there is no such step. `stall_s` includes
    `first_batch_s`. Rates here are this rank's own (`rank_` prefix); the
    docs/metrics.md `samples_per_s`/`read_MBps` are global, see `epoch_summary`.
    """
    if clock.start_ns is None:
        raise RuntimeError("EpochClock.start() was never called")
    waits = np.asarray(clock.wait_ns[1:], dtype=np.int64) / 1e9
    steps = clock.steps
    wall = (clock.end_ns - clock.start_ns - clock.excluded_ns) / 1e9
    stall = sum(clock.wait_ns[:steps]) / 1e9
    compute = sum(clock.compute_ns) / 1e9
    return {
        "steps": steps,
        "samples": clock.samples,
        "batch_bytes": clock.batch_bytes,
        "wall_s": wall,
        "stall_s": stall,
        "compute_s": compute,
        "compute_mean_s": compute / steps if steps else None,
        "first_batch_s": clock.wait_ns[0] / 1e9 if clock.wait_ns else None,
        "stall_fraction": stall / wall if wall > 0 else None,
        "au": compute / wall if wall > 0 else None,
        "au_mlperf": au_mlperf(clock),
        "wait_p50_s": _pct(waits, 50),
        "wait_p95_s": _pct(waits, 95),
        "wait_p99_s": _pct(waits, 99),
        "wait_max_s": float(waits.max()) if waits.size else None,
        "rank_samples_per_s": clock.samples / wall if wall > 0 else None,
        "rank_read_MBps": clock.batch_bytes / MB / wall if wall > 0 else None,
    }


def au_mlperf(clock: EpochClock) -> float | None:
    """AU without the first step's I/O, as MLPerf Storage counts it (docs/metrics.md).

    sum(compute_s) / (wall_s - first_batch_s): the wait for the first batch
    (worker start-up, first opens) leaves the wall; every step's compute stays.
    None with no step, or when nothing is left of the wall.
    """
    if clock.start_ns is None or not clock.compute_ns:
        return None
    wall = clock.end_ns - clock.start_ns - clock.excluded_ns - clock.wait_ns[0]
    return sum(clock.compute_ns) / wall if wall > 0 else None


def _opt_sum(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def epoch_summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Across-rank figures of one epoch from every rank's `rank_figures` (plus extras).

    `wall_s` is the slowest rank's; `samples_per_s` and `read_MBps` are global
    samples and bytes over it (docs/metrics.md). Stall: mean and max over ranks
    (max is the headline: the slowest rank sets the pace).
    """
    walls = [r["wall_s"] for r in ranks]
    stalls = [r["stall_s"] for r in ranks]
    wall = max(walls)
    samples = sum(r["samples"] for r in ranks)
    nbytes = sum(r["batch_bytes"] for r in ranks)
    fracs = [r["stall_fraction"] for r in ranks if r["stall_fraction"] is not None]
    aus = [r["au"] for r in ranks if r["au"] is not None]
    aus_ml = [r["au_mlperf"] for r in ranks if r.get("au_mlperf") is not None]
    firsts = [r["first_batch_s"] for r in ranks if r["first_batch_s"] is not None]
    waits_max = [r["wait_max_s"] for r in ranks if r["wait_max_s"] is not None]
    return {
        "ranks": len(ranks),
        "steps": max(r["steps"] for r in ranks),
        "samples": samples,
        "batch_bytes": nbytes,
        "wall_s": wall,
        "wall_s_mean": float(np.mean(walls)),
        "stall_s_mean": float(np.mean(stalls)),
        "stall_s_max": max(stalls),
        "stall_fraction_mean": float(np.mean(fracs)) if fracs else None,
        "stall_fraction_max": max(fracs) if fracs else None,
        "au_mean": float(np.mean(aus)) if aus else None,
        "au_min": min(aus) if aus else None,
        "au_mlperf_mean": float(np.mean(aus_ml)) if aus_ml else None,
        "au_mlperf_min": min(aus_ml) if aus_ml else None,
        "first_batch_s_max": max(firsts) if firsts else None,
        "wait_max_s": max(waits_max) if waits_max else None,
        "samples_per_s": samples / wall if wall > 0 else None,
        "read_MBps": nbytes / MB / wall if wall > 0 else None,
        "os_read_bytes": _opt_sum([r.get("os_read_bytes") for r in ranks]),
    }


def node_summaries(ranks: list[dict[str, Any]],
                   cache_nodes: list[dict[str, Any]] | None = None,
                   warn_above: float | None = None) -> list[dict[str, Any]]:
    """One epoch's figures per node, from every rank's figures (each holding `node`,
    `node_name` and `host`) and the eviction report's `per_node` (residency).

    A node's `wall_s` and `stall_s` are its slowest rank's (the node's pace);
    `samples_per_s` and `read_MBps` are the node's samples and bytes over its own
    wall time; `cache` is `warm` when the node's measured residency after eviction
    is above `warn_above`, `unknown` when it could not be measured, else None (the
    epoch's cache status holds). Ordered by node index.
    """
    residency = {n["node"]: n for n in cache_nodes or []}
    out = []
    for node in sorted({r["node"] for r in ranks}):
        mine = [r for r in ranks if r["node"] == node]
        wall = max(r["wall_s"] for r in mine)
        samples = sum(r["samples"] for r in mine)
        nbytes = sum(r["batch_bytes"] for r in mine)
        stalls = [r["stall_s"] for r in mine]
        frac = residency.get(node, {}).get("resident_fraction")
        out.append({
            "node": node, "name": mine[0].get("node_name") or mine[0]["host"],
            "host": mine[0]["host"], "ranks": [r["rank"] for r in mine],
            "samples": samples, "batch_bytes": nbytes, "wall_s": wall,
            "stall_s": max(stalls), "stall_s_mean": float(np.mean(stalls)),
            "stall_fraction": max(stalls) / wall if wall > 0 else None,
            "samples_per_s": samples / wall if wall > 0 else None,
            "read_MBps": nbytes / MB / wall if wall > 0 else None,
            "os_read_bytes": _opt_sum([r.get("os_read_bytes") for r in mine]),
            "cache_resident_fraction_at_start": frac,
            "cache": ("unknown" if node in residency and frac is None else
                      "warm" if frac is not None and warn_above is not None
                      and frac > warn_above else None),
        })
    return out


def fmt_rate(value: float | None) -> str:
    """A rate for tables: 3 significant digits below 100 (0.412), whole numbers above."""
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
