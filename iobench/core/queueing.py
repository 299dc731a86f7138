"""Closed queueing networks: exact and approximate mean-value analysis (MVA) and asymptotic bounds.

A network is a set of stations visited once per cycle by every customer, plus a
think time. A station is a queue (one server, FCFS or processor sharing) or a
delay (as many servers as customers), and may be `copies` identical stations
over which a cycle's demand is spread evenly (one per node: a client's link).
All times are seconds; throughput is cycles per second. docs/projection.md
gives the formulas; `iobench.core.simulation` checks them by simulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from iobench.core.errors import ConfigError

QUEUE, DELAY = "queue", "delay"
EXACT_LIMIT = 2000  # customers: exact MVA up to here, Schweitzer's approximation above
SCHWEITZER_TOL = 1e-9  # relative change of the queue lengths that ends the iteration
SCHWEITZER_MAX_ITER = 10_000


@dataclass(frozen=True)
class Station:
    """One service centre: `demand_s` seconds of service per cycle of one customer, spread
    over `copies` identical stations (each then serves `demand_s / copies` per cycle; a
    fraction above 1 spreads it unevenly, as the fullest of several copies sees it)."""

    name: str
    demand_s: float
    kind: str = QUEUE
    copies: float = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.demand_s) and self.demand_s >= 0):
            raise ConfigError(f"station {self.name}: demand {self.demand_s!r} s must be a "
                              "finite number >= 0")
        if self.kind not in (QUEUE, DELAY):
            raise ConfigError(f"station {self.name}: kind {self.kind!r}; choose queue or delay")
        if self.copies < 1:
            raise ConfigError(f"station {self.name}: copies {self.copies} must be >= 1")


@dataclass(frozen=True)
class Network:
    """Stations every customer visits once per cycle, and the think time between visits."""

    stations: tuple[Station, ...]
    think_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.think_s) and self.think_s >= 0):
            raise ConfigError(f"think time {self.think_s!r} s must be a finite number >= 0")
        names = [s.name for s in self.stations]
        if len(set(names)) != len(names):
            raise ConfigError(f"station names {names} must be distinct")

    @property
    def queues(self) -> tuple[Station, ...]:
        return tuple(s for s in self.stations if s.kind == QUEUE)

    @property
    def total_demand_s(self) -> float:
        """D: the service demand of one cycle over all stations (seconds)."""
        return sum(s.demand_s for s in self.stations)

    @property
    def max_demand(self) -> Station | None:
        """The bottleneck: the queue whose one copy has the largest demand (None: no queue)."""
        return max(self.queues, key=lambda s: s.demand_s / s.copies, default=None)


@dataclass(frozen=True)
class Solution:
    """The mean-value solution at one population: throughput (cycles/s), time per cycle
    outside think (`response_s`), and per station its residence time (s per cycle), its
    mean number of customers (all copies together) and one copy's utilisation."""

    customers: int
    throughput: float
    response_s: float
    residence_s: dict[str, float]
    queue: dict[str, float]
    utilization: dict[str, float]
    method: str

    @property
    def cycle_s(self) -> float:
        """Mean time of one cycle (think included): customers / throughput."""
        return self.customers / self.throughput if self.throughput > 0 else math.inf


def _finish(net: Network, n: int, residence: Sequence[float], method: str) -> Solution:
    response = sum(residence)
    x = n / (net.think_s + response) if net.think_s + response > 0 else math.inf
    names = [s.name for s in net.stations]
    return Solution(
        customers=n, throughput=x, response_s=response,
        residence_s=dict(zip(names, residence, strict=True)),
        queue={s.name: x * r for s, r in zip(net.stations, residence, strict=True)},
        utilization={s.name: (x * s.demand_s / s.copies if s.kind == QUEUE else 0.0)
                     for s in net.stations},
        method=method)


def _residence(s: Station, q_one: float) -> float:
    """R_k = D_k (1 + Q_k) at a queue (Q_k: one copy's mean length as an arrival sees it),
    D_k at a delay."""
    return s.demand_s if s.kind == DELAY else s.demand_s * (1.0 + q_one)


def mva_exact(net: Network, customers: int) -> Solution:
    """Exact MVA (Reiser and Lavenberg), populations 1..`customers`: by the arrival theorem an
    arriving customer sees the queues of the network with one customer fewer. Copies of a
    station share the load evenly (a customer picks one at random each cycle)."""
    _check_customers(customers)
    q = [0.0] * len(net.stations)  # one copy's mean queue length at population n - 1
    residence = [0.0] * len(net.stations)
    for n in range(1, customers + 1):
        residence = [_residence(s, qk) for s, qk in zip(net.stations, q, strict=True)]
        x = n / (net.think_s + sum(residence))
        q = [x * r / s.copies for s, r in zip(net.stations, residence, strict=True)]
    return _finish(net, customers, residence, "exact MVA")


def mva_schweitzer(net: Network, customers: int) -> Solution:
    """Schweitzer's approximate MVA: an arriving customer sees the queues at its own
    population scaled by (n - 1) / n; a fixed point, iterated from an even spread."""
    _check_customers(customers)
    n = customers
    k = max(len(net.stations), 1)
    q = [n / k / s.copies for s in net.stations]
    residence = [0.0] * len(net.stations)
    for _ in range(SCHWEITZER_MAX_ITER):
        residence = [_residence(s, qk * (n - 1) / n) for s, qk in zip(net.stations, q,
                                                                      strict=True)]
        x = n / (net.think_s + sum(residence))
        new = [x * r / s.copies for s, r in zip(net.stations, residence, strict=True)]
        change = max((abs(a - b) / max(b, 1e-12) for a, b in zip(new, q, strict=True)),
                     default=0.0)
        q = new
        if change < SCHWEITZER_TOL:
            break
    return _finish(net, n, residence, "Schweitzer approximate MVA")


def solve(net: Network, customers: int) -> Solution:
    """Exact MVA up to `EXACT_LIMIT` customers, Schweitzer's approximation above (its error
    falls as the population grows); the solution names its method."""
    if customers <= EXACT_LIMIT:
        return mva_exact(net, customers)
    return mva_schweitzer(net, customers)


def _check_customers(customers: int) -> None:
    if customers < 1:
        raise ConfigError(f"customers {customers} must be >= 1")


@dataclass(frozen=True)
class Bounds:
    """Kleinrock's asymptotic bounds of a closed network: throughput <= min(n / (D + Z),
    1 / D_max), and the population `saturation` N* = (D + Z) / D_max where the two meet."""

    total_demand_s: float
    max_demand_s: float
    bottleneck: str | None
    think_s: float

    @property
    def saturation(self) -> float:
        """N* = (D + Z) / D_max customers (infinite with no queue)."""
        if self.max_demand_s <= 0:
            return math.inf
        return (self.total_demand_s + self.think_s) / self.max_demand_s

    def throughput_bound(self, customers: int) -> float:
        """The optimistic bound min(n / (D + Z), 1 / D_max), cycles/s."""
        light = customers / (self.total_demand_s + self.think_s) if (
            self.total_demand_s + self.think_s) > 0 else math.inf
        heavy = 1.0 / self.max_demand_s if self.max_demand_s > 0 else math.inf
        return min(light, heavy)


def bounds(net: Network) -> Bounds:
    """The asymptotic bounds of `net` (its bottleneck: the queue of largest demand per copy)."""
    top = net.max_demand
    return Bounds(total_demand_s=net.total_demand_s,
                  max_demand_s=top.demand_s / top.copies if top is not None else 0.0,
                  bottleneck=top.name if top is not None else None, think_s=net.think_s)
