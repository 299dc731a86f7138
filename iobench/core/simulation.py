"""A small seeded discrete-event simulation of the queueing networks of `iobench.core.queueing`.

Two uses: `simulate_closed` runs the plain closed network (customers think,
then visit every station once per cycle), to check mean-value analysis where
its answer is exact; `simulate_training` runs N nodes' loaders as iobench
trains: each rank's workers fetch batches in turn (at most `prefetch` per
worker ahead of the step, as PyTorch's DataLoader), every fetch visits the
stations (a per-node station is the reader's own node's copy), and all
ranks step together (a synchronous all-reduce), so one late batch stalls
every node. Service times are exponential, fixed, or scaled by factors taken
from a `train --trace` (bursts); compute per step fixed or drawn from the
trace. Same seed, same answer.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from iobench.core.errors import ConfigError
from iobench.core.queueing import DELAY, Network, Station

EXPONENTIAL, FIXED, TRACE = "exponential", "fixed", "trace"
SERVICES = (EXPONENTIAL, FIXED, TRACE)


@dataclass(frozen=True)
class Service:
    """How long a visit takes: `exponential` (mean = demand), `fixed` (= demand), or `trace`
    (demand x a factor drawn from `factors`, fetch times over their mean). `compute_s`: compute
    per step drawn from it (a trace's compute spans); empty: the fixed compute time."""

    kind: str = EXPONENTIAL
    factors: tuple[float, ...] = ()
    compute_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in SERVICES:
            raise ConfigError(f"service {self.kind!r}; choose one of {', '.join(SERVICES)}")
        if self.kind == TRACE and not self.factors:
            raise ConfigError("a trace-driven simulation needs the trace's fetch times")


class _Engine:
    """The event loop and the stations' FCFS schedules (time in seconds)."""

    def __init__(self, network: Network, copies: Sequence[int], service: Service,
                 seed: int) -> None:
        self.stations = network.stations
        self.free = [[0.0] * c for c in copies]
        self.service = service
        self.rng = np.random.default_rng(seed)
        self.events: list[tuple[float, int, Callable[[float], None]]] = []
        self.seq = 0

    def at(self, t: float, fn: Callable[[float], None]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn))

    def _time(self, s: Station) -> float:
        if s.demand_s <= 0:
            return 0.0
        kind = self.service.kind
        if kind == FIXED or s.kind == DELAY:
            return s.demand_s
        if kind == EXPONENTIAL:
            return float(self.rng.exponential(s.demand_s))
        return s.demand_s * float(self.rng.choice(self.service.factors))

    def visit(self, t: float, copy: int, done: Callable[[float], None], i: int = 0) -> None:
        """Visit stations i, i+1, ... from time t (a queue serves arrivals in their order, as
        the event loop delivers them); `done(t)` after the last."""
        if i == len(self.stations):
            done(t)
            return
        s = self.stations[i]
        service = self._time(s)
        if s.kind == DELAY:
            self.at(t + service, lambda u: self.visit(u, copy, done, i + 1))
            return
        slot = self.free[i]
        k = copy % len(slot)
        end = max(t, slot[k]) + service
        slot[k] = end
        self.at(end, lambda u: self.visit(u, copy, done, i + 1))

    def run(self, until: Callable[[], bool]) -> float:
        t = 0.0
        while self.events and not until():
            t, _, fn = heapq.heappop(self.events)
            fn(t)
        return t


def _copies(network: Network, nodes: int) -> list[int]:
    """Each station's copies as servers: a fraction (the fullest host's share of a station
    per host) is the hosts' count, its ceiling; node i uses copy i mod copies."""
    for s in network.stations:
        if s.copies > nodes:
            raise ConfigError(f"station {s.name} has {s.copies} copies: a simulation takes "
                              f"1 (shared) to one per node ({nodes}; one per host between)")
    return [math.ceil(s.copies) for s in network.stations]


def simulate_closed(network: Network, customers: int, cycles: int, seed: int = 0,
                    service: Service = Service()) -> float:
    """Throughput (cycles/s) of `customers` in the closed network over `cycles` cycles after
    as many again of warm-up; think times exponential (mean Z) unless `fixed`."""
    if customers < 1 or cycles < 1:
        raise ConfigError(f"customers {customers} and cycles {cycles} must be >= 1")
    eng = _Engine(network, [1] * len(network.stations), service, seed)
    z = network.think_s
    count = [0]
    marks: dict[int, float] = {}

    def think(t: float) -> float:
        return float(eng.rng.exponential(z)) if z > 0 and service.kind != FIXED else z

    def finished(t: float) -> None:
        count[0] += 1
        if count[0] in (cycles, 2 * cycles):
            marks[count[0]] = t
        eng.at(t + think(t), lambda u: eng.visit(u, 0, finished))

    for _ in range(customers):
        eng.at(think(0.0), lambda u: eng.visit(u, 0, finished))
    eng.run(lambda: count[0] >= 2 * cycles)
    return cycles / (marks[2 * cycles] - marks[cycles])


@dataclass(frozen=True)
class TrainingShape:
    """The loaders to simulate: `nodes` x `ranks_per_node` ranks, `workers` each (0: the rank
    reads, then computes), `prefetch` batches per worker ahead, compute and decode per step
    and per batch (s), and steps to run."""

    nodes: int
    ranks_per_node: int
    workers: int
    compute_s: float
    worker_cpu_s: float
    steps: int
    prefetch: int = 2


class _Training:
    """The state of one training simulation (see `simulate_training`)."""

    def __init__(self, shape: TrainingShape, eng: _Engine) -> None:
        self.shape, self.eng = shape, eng
        self.ranks = shape.nodes * shape.ranks_per_node
        self.workers = max(shape.workers, 1)
        self.window = shape.workers * shape.prefetch if shape.workers else 1
        self.next = [[w for w in range(self.workers)] for _ in range(self.ranks)]
        self.busy = [[False] * self.workers for _ in range(self.ranks)]
        self.ready: dict[int, int] = {}
        self.started = 0  # steps whose compute began (their batches taken)
        self.finished = 0  # steps whose compute ended
        self.computing = False
        self.starts: list[float] = []

    def _allowed(self, k: int) -> bool:
        base = self.started if self.shape.workers else self.finished
        return k < self.shape.steps and k < base + self.window

    def kick(self, t: float) -> None:
        """Start every fetch a free worker may start now."""
        for r in range(self.ranks):
            for w in range(self.workers):
                k = self.next[r][w]
                if not self.busy[r][w] and self._allowed(k):
                    self.busy[r][w] = True
                    self.next[r][w] = k + self.workers
                    node = r // self.shape.ranks_per_node
                    self.eng.visit(t, node, self._fetched(r, w, k))

    def _fetched(self, r: int, w: int, k: int) -> Callable[[float], None]:
        def done(t: float) -> None:
            self.eng.at(t + self.shape.worker_cpu_s, lambda u: self._ready(u, r, w, k))
        return done

    def _ready(self, t: float, r: int, w: int, k: int) -> None:
        self.busy[r][w] = False
        self.ready[k] = self.ready.get(k, 0) + 1
        self._step(t)
        self.kick(t)

    def _step(self, t: float) -> None:
        k = self.started
        if self.computing or k >= self.shape.steps or self.ready.get(k, 0) < self.ranks:
            return
        self.computing = True
        self.started += 1
        self.starts.append(t)
        c = self.shape.compute_s
        if self.eng.service.compute_s:
            c = float(self.eng.rng.choice(self.eng.service.compute_s))
        self.eng.at(t + c, self._computed)

    def _computed(self, t: float) -> None:
        self.computing = False
        self.finished += 1
        self._step(t)
        self.kick(t)


def simulate_training(shape: TrainingShape, network: Network, seed: int = 0,
                      service: Service = Service()) -> float:
    """The mean steady step time (s) of synchronous training over `shape.steps` steps, the
    first quarter dropped as warm-up: from the start of a step's compute to the next's."""
    if shape.steps < 4:
        raise ConfigError(f"simulate at least 4 steps (got {shape.steps})")
    sim = _Training(shape, _Engine(network, _copies(network, shape.nodes), service, seed))
    sim.kick(0.0)
    sim.eng.run(lambda: sim.finished >= shape.steps)
    starts = sim.starts
    skip = max(1, len(starts) // 4)
    steady = starts[skip:]
    if len(steady) < 2:
        return math.nan
    return (steady[-1] - steady[0]) / (len(steady) - 1)
