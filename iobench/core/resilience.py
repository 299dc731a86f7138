"""How often to checkpoint: Young's interval from a checkpoint's cost and the mean time between failures.

Young (1974): with a synchronous checkpoint costing C seconds and failures arriving at a
mean interval M (M >> C), the interval between checkpoints that loses least is
tau = sqrt(2 C M). The time lost is the checkpoints' own cost, C / tau of the run, plus per
failure the work since the last checkpoint (tau / 2 on average) and the restart R (reading
the checkpoint back): (C / tau + (tau / 2 + R) / M) of the run, to first order.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from iobench.core.errors import ConfigError

DAY_S = 86_400.0


@dataclass(frozen=True)
class Interval:
    """Young's interval and the time lost per day of training, at it and (if given) at the
    interval used."""

    mtbf_s: float
    cost_s: float  # one synchronous checkpoint: how long training waits for it
    restart_s: float  # reading it back after a failure
    optimal_s: float
    lost_per_day_s: float  # at the optimal interval
    used_s: float | None = None
    lost_per_day_used_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_mtbf(hours: float | None) -> float | None:
    """`--mtbf HOURS` as seconds (None: not given); a ConfigError unless > 0."""
    if hours is None:
        return None
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not hours > 0 \
            or not math.isfinite(hours):
        raise ConfigError(f"--mtbf {hours!r}: give the job's mean time between failures in "
                          "hours, a number > 0 (e.g. 24)")
    return float(hours) * 3600.0


def lost_fraction(interval_s: float, cost_s: float, restart_s: float, mtbf_s: float) -> float:
    """Share of the run lost to checkpoints and failures, checkpointing every `interval_s`."""
    return cost_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s


def young(cost_s: float, restart_s: float, mtbf_s: float,
          used_s: float | None = None) -> Interval:
    """Young's interval sqrt(2 C M), and the time lost per day at it (and at `used_s`)."""
    optimal = math.sqrt(2 * max(cost_s, 0.0) * mtbf_s)
    lost = (DAY_S * lost_fraction(optimal, cost_s, restart_s, mtbf_s) if optimal > 0
            else DAY_S * restart_s / mtbf_s)
    used_lost = (DAY_S * lost_fraction(used_s, cost_s, restart_s, mtbf_s)
                 if used_s is not None and used_s > 0 else None)
    return Interval(mtbf_s=mtbf_s, cost_s=cost_s, restart_s=restart_s, optimal_s=optimal,
                    lost_per_day_s=lost, used_s=used_s, lost_per_day_used_s=used_lost)
