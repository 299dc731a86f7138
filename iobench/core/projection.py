"""The projection model: one node's measured demand and the shared tier's limits, as queues, at N nodes.

Pure arithmetic over `iobench.core.queueing` (no files, no clocks): a node's
loader readers are the customers of a closed network whose stations are the
tier's metadata server, its aggregate read bandwidth, each node's client link
and a fixed latency; a copy thread of `iobench stage` is a customer of the
same stations plus the node's local write. docs/projection.md gives every
formula and assumption; `ASSUMPTIONS` is what the output prints beside them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from iobench.core.errors import ConfigError
from iobench.core.queueing import DELAY, Network, Solution, Station, solve

METADATA, BANDWIDTH, CLIENT, LATENCY, LOCAL = "metadata", "bandwidth", "client", "latency", "local"
REQUESTS, CPU, CPU_OTHER = "requests", "cpu", "cpu-other-cores"
RESOURCES = {METADATA: "metadata (MDS ops/s)", BANDWIDTH: "aggregate read bandwidth",
             REQUESTS: "request rate (random reads, requests/s)",
             CLIENT: "per-client limit", LOCAL: "node-local write",
             CPU: "the host's CPU (the loaders and every daemon on the host)",
             LATENCY: "latency (the fitted per-batch delay)"}
BUSY = 0.5  # a stalled step whose most-used queue is below this is the latency's doing
MAX_NODES = 10_000_000  # the saturation search's ceiling
STALLED = 1.03  # a measured step this much above the compute time counts as stalled
BISECT_STEPS = 60
SEGMENTS = 16  # parts of an epoch whose tier bytes differ (the client cache's front-loading)
PREFETCH = 2  # batches in flight per loader worker (iobench's loaders: LoaderConfig.prefetch)

ASSUMPTIONS = (
    "PROJECTION, not a measurement: a closed queueing network solved by mean-value analysis "
    "(docs/projection.md).",
    "Customers: N nodes x R readers (R = ranks per node x loader workers); each reader "
    "fetches one rank's batch per cycle; with workers, fetches overlap compute (prefetch), "
    "without them a rank computes, then reads (think time = compute per step).",
    "A cycle visits: the metadata server (ops per sample x batch / its ops/s), the aggregate "
    "bandwidth (bytes per batch / its bytes/s), the host's own client link (one per host), "
    "and a fixed latency (a delay, fitted so the model reproduces the measured node). A "
    "node that kept up (step within 3 % of compute) has no latency to fit: its step's "
    "excess over compute is the rank's own work per step, serial with compute at every N.",
    "Where the tier's random-read rate at the run's request size is known (the probe's "
    "sample-size random reads through the page cache, as the loaders read; from a probe "
    "without them, its O_DIRECT reads, with a warning; or given), a cycle also visits a "
    "request-rate queue: requests "
    "per batch (batch bytes / request bytes: the client's page cache lets neighbouring small "
    "samples share a request) x (1 / that rate - request bytes / bandwidth: a request's time "
    "net of its transfer, which the bandwidth queue charges). Staging (large sequential "
    "copies) visits no request-rate queue.",
    "Queues are single servers with exponential service (product form); the tier's limits "
    "are the same at every N (no server added, no contention outside this job).",
    "Each node reads 1/N of the epoch's samples (the dataset is fixed; each node keeps its "
    "batch size): steps per node per epoch = ceil(samples / (N x ranks per node x batch)).",
    "In a shuffled epoch a request of k samples' bytes is fetched by the first of its k "
    "samples read (the others then come from the client's page cache): the batch at "
    "fraction f of the epoch takes k x (1 - f)^(k - 1) times the mean bytes and requests "
    "from the tier (more at the start, none at the end; the epoch's total is the dataset). "
    "The model's step is the mean over 16 parts of the epoch; k is the run's measured "
    "bytes per tier request over the sample size, else the probe's request size over it, "
    "else 1 (no front-loading).",
    "Each host has its own client cache: a request whose k samples fall on several hosts "
    "is fetched by each of them, H (1 - (1 - 1/H)^k) times per epoch on H hosts (samples "
    "fall on hosts at random: a global shuffle); the tier's bytes and requests per batch "
    "grow by that factor (1 on one host, towards k on many), and each host's front-loading "
    "follows k over it.",
    "Nodes per host (--nodes-per-host; 1 on a cluster): nodes on one host share its client "
    "cache, link and local disk, and its CPU: a queue per host for the host's busy CPU per "
    "batch or staged chunk (measured at the run's node: everything on the host, the tier's "
    "daemons included) over its cores (Seidmann's multi-server approximation); its decode "
    "part is the same every batch, the rest follows the tier's requests (front-loaded, and "
    "with the fetch factor). With a host "
    "per node that load is the same at every N and no CPU station is added. A station per "
    "node or host shares its load evenly over its copies (exact on one host).",
    "With PyTorch DataLoader process workers, each rank's epoch runs through its loader "
    "(other workers, DALI's or threads: the first batch, then the mean step): the first "
    "batch and one "
    "batch a worker are read at once when the epoch starts; after them, worker w makes "
    "batches w, w + W, ... each in its part's reader cycle, with 2 batches in flight a "
    "worker, and a step takes its batch once the previous step ended and the batch is "
    "ready (docs/projection.md, 'Per epoch').",
    "All nodes progress at the mean rate: the slowest node of a synchronous job (bursts, "
    "stragglers) is what the discrete-event simulation adds, where it ran.",
    "The compute per step is the measured node's: a collective across the nodes each step "
    "(the gradients' all-reduce; with one rank measured, any per-step synchronisation at "
    "all) is added only as given (--step-sync-ms, the same at every N beyond the measured "
    "one, serial with compute), and the first step waits for the mean first batch, not the "
    "slowest rank's.",
    "The [spread] of AU and stall: the model fitted again to the fastest and the slowest "
    "measured step (over epochs and repetitions), or, with a diagnose result, with the "
    "latency of its fastest and slowest worker count; the tier's figures are taken as exact.",
    "With a diagnose result, the fixed latency comes from its storage runs (one rank, cold, "
    "no decode, each worker count): per sample, the median over the counts, times the "
    "training batch; each run's tier bytes are those of its opening steps of a shuffled "
    "epoch (front-loaded, above).",
    "Node-local storage keeps up with the accelerators (an epoch from a staged copy is "
    "compute only); the staging break-even is stage time / epoch time saved.",
)


@dataclass(frozen=True)
class Figure:
    """A model input and where it came from: measured (a document) or given (an option)."""

    value: float
    source: str
    given: bool = False
    # (least, greatest) of several measurements whose median `value` is (k probes); None: one
    span: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value) and self.value >= 0):
            raise ConfigError(f"{self.source}: {self.value!r} must be a finite number >= 0")
        if self.span is not None and not self.span[0] <= self.value <= self.span[1]:
            raise ConfigError(f"{self.source}: {self.value!r} must lie in its span "
                              f"{self.span[0]!r}-{self.span[1]!r}")

    def at(self, end: int) -> Figure:
        """This figure at the least (`end` 0) or greatest (1) of its span; itself without one."""
        return self if self.span is None else replace(self, value=self.span[end], span=None)


@dataclass(frozen=True)
class NodeFigures:
    """One node's measured run: its shape, per-step compute and step times (seconds), the
    loader's non-read work per batch, and per-sample bytes and metadata operations."""

    nodes: int  # nodes the run had (the calibration point)
    ranks_per_node: int
    batch_size: int
    workers: int
    compute_s: float  # per step per rank
    step_s: float  # measured steady step time (slowest rank)
    worker_cpu_s: float  # per batch: a loader worker's decode (not read) time
    first_batch_s: float  # measured: start-up and the first batch
    sample_bytes: float
    ops_per_sample: Figure
    epoch_samples: int  # global samples per epoch
    stall_s: float  # measured stall per epoch (max over ranks)
    au: float | None
    step_range: tuple[float, float] | None = None  # the measured step's min and max (spread)
    # k: samples one tier request holds, in a shuffled epoch (None: 1, every batch alike)
    samples_per_request: Figure | None = None
    # the host's busy CPU seconds per batch read, measured (None: no CPU station), and its
    # cores; nodes that share one host (its CPU, client cache and link, local disk)
    cpu_s: Figure | None = None
    host_cpus: int = 1
    nodes_per_host: int = 1
    # the host's busy CPU until the first step had its batch at the measured node count (the
    # loaders' start-up and first reads), measured (None: not; the first batch then follows
    # the tier's queues alone)
    first_cpu_s: float | None = None
    # given: seconds a step waits for a synchronisation of every rank (an all-reduce) that
    # the measured run, of fewer ranks, did not (None: none added)
    step_sync: Figure | None = None
    # the workers are PyTorch DataLoader processes (each makes whole batches in turn, 2 in
    # flight): what the loader's pipeline models; DALI and thread workers are not
    process_workers: bool = True

    def __post_init__(self) -> None:
        for name in ("nodes", "ranks_per_node", "batch_size", "epoch_samples", "host_cpus",
                     "nodes_per_host"):
            if getattr(self, name) < 1:
                raise ConfigError(f"node figure {name} = {getattr(self, name)} must be >= 1")
        if not self.compute_s > 0:
            raise ConfigError(f"compute per step {self.compute_s!r} s must be > 0: a run "
                              "without compute (--model none) sets no demand to project")

    @property
    def readers(self) -> int:
        """R: loader readers per node (a rank reads itself without workers)."""
        return self.ranks_per_node * max(self.workers, 1)

    @property
    def prefetch(self) -> bool:
        return self.workers > 0

    @property
    def batch_bytes(self) -> float:
        return self.batch_size * self.sample_bytes

    def sync_s(self, nodes: int) -> float:
        """The per-step synchronisation at `nodes` nodes: the given figure where the job has
        more ranks than the measured run, else none (the measured step holds its own)."""
        if self.step_sync is None or nodes <= self.nodes:
            return 0.0
        return self.step_sync.value

    @property
    def shared_cpu(self) -> bool:
        """A CPU station: the host's CPU was measured and nodes share a host."""
        return self.cpu_s is not None and self.cpu_s.value > 0 and self.nodes_per_host > 1

    def cpu_demand_s(self, share: float = 1.0) -> float | None:
        """The host's CPU per batch where a batch takes `share` of the mean tier bytes: the
        decode (`worker_cpu_s`) as it is, the rest (reads: the loaders' calls, the FUSE
        client's and any server's work on the host) with the tier's requests."""
        if self.cpu_s is None:
            return None
        decode = min(self.worker_cpu_s, self.cpu_s.value)
        return decode + (self.cpu_s.value - decode) * share

    @property
    def k(self) -> float:
        return self.samples_per_request.value if self.samples_per_request is not None else 1.0

    def hosts(self, nodes: int) -> int:
        """Hosts `nodes` nodes fill, `nodes_per_host` to a host."""
        return hosts(nodes, self.nodes_per_host)

    def fetch_factor(self, nodes: int) -> float:
        """Tier bytes per epoch over the dataset's at `nodes` nodes: each host's client cache
        fetches a request for its own samples (`fetches_per_request`)."""
        return fetches_per_request(self.k, self.hosts(nodes))

    def epoch_shares(self, nodes: int = 1) -> tuple[float, ...]:
        """Each part's tier bytes per batch over the epoch's mean (`epoch_shares`), at the k
        one host's cache sees at `nodes` nodes: k over the fetch factor."""
        return epoch_shares(max(1.0, self.k / self.fetch_factor(nodes)))


def hosts(nodes: int, per_host: int) -> int:
    """The hosts `nodes` nodes take, `per_host` to a host (at least one)."""
    return max(1, math.ceil(nodes / per_host))


def host_copies(nodes: int, per_host: int) -> float:
    """The copies of a station per host as the fullest host sees it: `nodes` over the nodes
    on one full host (a synchronous job goes at its slowest node's pace, and a part-filled
    last host is not the slowest); 1 while every node fits on one host."""
    return nodes / max(1, min(nodes, per_host))


def fetches_per_request(k: float, caches: int) -> float:
    """Mean fetches of one tier request per epoch when its `k` samples go to `caches` client
    caches at random, each cache fetching it once for its own: the distinct caches among k
    draws, caches (1 - (1 - 1/caches)^k); 1 with one cache (or k <= 1), towards k with many."""
    if caches <= 1 or k <= 1.0:
        return 1.0
    return caches * -math.expm1(k * math.log1p(-1.0 / caches))  # exact at large `caches`


def cpu_stations(cpu_s: float | None, cores: int, copies: float, nodes_per_host: int
                 ) -> list[Station]:
    """A host's CPU of `cores` cores for `cpu_s` seconds of work per cycle, `copies` of it
    (`host_copies`): Seidmann's approximation of a multi-server queue, a queue of
    `cpu_s / cores` followed by a delay of `cpu_s (cores - 1) / cores` (exact for one core).
    None without a figure, and none when every node has a host of its own: its load is then
    the same at every N, and the fitted latency holds it already."""
    if not cpu_s or nodes_per_host <= 1:
        return []
    out = [Station(CPU, cpu_s / cores, copies=copies)]
    if cores > 1:
        out.append(Station(CPU_OTHER, cpu_s * (cores - 1) / cores, kind=DELAY))
    return out


def epoch_shares(k: float, segments: int = SEGMENTS) -> tuple[float, ...]:
    """A shuffled epoch's tier bytes per batch in `segments` equal parts, over their mean:
    k (1 - f)^(k - 1) at each part's middle f, scaled to a mean of exactly 1 (k <= 1: one
    part of 1, every batch alike)."""
    if not (math.isfinite(k) and k > 0):
        raise ConfigError(f"samples per request {k!r} must be a finite number > 0")
    if k <= 1.0:
        return (1.0,)
    raw = [k * (1.0 - (j + 0.5) / segments) ** (k - 1.0) for j in range(segments)]
    mean = sum(raw) / segments
    return tuple(r / mean for r in raw)


@dataclass(frozen=True)
class TierLimits:
    """The shared tier's limits: aggregate read bytes/s, metadata ops/s, per-client bytes/s,
    and random-read requests/s at `request_bytes` a request (None: no request-rate queue)."""

    bandwidth_Bps: Figure
    metadata_ops: Figure
    client_Bps: Figure | None = None
    requests_per_s: Figure | None = None
    request_bytes: float = 4096.0

    def __post_init__(self) -> None:
        for f in (self.bandwidth_Bps, self.metadata_ops, self.client_Bps, self.requests_per_s):
            if f is not None and f.value <= 0:
                raise ConfigError(f"{f.source}: {f.value} must be > 0")
        if not (math.isfinite(self.request_bytes) and self.request_bytes > 0):
            raise ConfigError(f"request size {self.request_bytes!r} bytes must be > 0")

    def ends(self) -> tuple[TierLimits, TierLimits] | None:
        """The tier with every figure at the least, and at the greatest, of its span (the
        slowest and the fastest tier the probes measured); None when no figure has a span."""
        figs = (self.bandwidth_Bps, self.metadata_ops, self.client_Bps, self.requests_per_s)
        if all(f is None or f.span is None for f in figs):
            return None
        lo, hi = (replace(self, bandwidth_Bps=self.bandwidth_Bps.at(e),
                          metadata_ops=self.metadata_ops.at(e),
                          client_Bps=self.client_Bps.at(e) if self.client_Bps else None,
                          requests_per_s=(self.requests_per_s.at(e) if self.requests_per_s
                                          else None)) for e in (0, 1))
        return lo, hi


def requests_per_batch(node: NodeFigures, tier: TierLimits) -> float:
    """Read requests one batch makes of the tier: its bytes over the request size, at least
    one (the client's page cache lets neighbouring small samples share a request over an
    epoch that reads them all)."""
    return max(1.0, node.batch_bytes / tier.request_bytes)


def request_demand_s(node: NodeFigures, tier: TierLimits) -> float:
    """Seconds of the request station per batch: requests x (1 / rate - request / bandwidth),
    the probe's time per request net of its transfer (which the bandwidth station charges)."""
    if tier.requests_per_s is None:
        return 0.0
    per_request = 1.0 / tier.requests_per_s.value - tier.request_bytes / tier.bandwidth_Bps.value
    return requests_per_batch(node, tier) * max(0.0, per_request)


@dataclass(frozen=True)
class StagingFigures:
    """A staging to model: the dataset's bytes and files, copy threads per node, the copy's
    chunk (bytes), and the measured staging time at `nodes` nodes when there was one; the
    host's busy CPU seconds per chunk copied (None: no CPU station), its cores, and the nodes
    that share a host."""

    dataset_bytes: int
    files: int
    threads: int
    chunk_bytes: int
    measured_s: float | None = None
    measured_mode: str = "replicate"
    nodes: int = 1
    cpu_s: float | None = None
    host_cpus: int = 1
    nodes_per_host: int = 1

    @property
    def chunks(self) -> int:
        """Copy cycles for one whole copy: one per file, files larger than a chunk in chunks."""
        return max(self.files, math.ceil(self.dataset_bytes / self.chunk_bytes), 1)


def opening_share(k: float, fraction: float) -> float:
    """The mean tier bytes per batch of a shuffled epoch's first `fraction` (0-1] over the
    epoch's mean: the mean of k (1 - f)^(k - 1) over [0, fraction], (1 - (1 - a)^k) / a."""
    a = min(1.0, max(fraction, 1e-9))
    return 1.0 if k <= 1.0 else (1.0 - (1.0 - a) ** k) / a


def delivery(node: NodeFigures, tier: TierLimits, readers: int, latency_s: float,
             share: float = 1.0) -> float:
    """Batches/s that `readers` readers of one node deliver with no compute and no decode
    (an ingest run, as `iobench diagnose` measures storage): the network's throughput."""
    return solve(read_network(node, tier, 1, latency_s, 0.0, share), max(readers, 1)).throughput


def fit_delivery_latency(node: NodeFigures, tier: TierLimits, readers: int, share: float,
                         batches_per_s: float) -> float:
    """The fixed latency per batch (s) with which `delivery` is the measured `batches_per_s`;
    0 where the tier's limits alone deliver less (they are then lower bounds)."""
    if not batches_per_s > 0:
        raise ConfigError(f"a delivery of {batches_per_s!r} batches/s must be > 0")
    if delivery(node, tier, readers, 0.0, share) <= batches_per_s:
        return 0.0
    lo, hi = 0.0, max(readers, 1) / batches_per_s
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delivery(node, tier, readers, mid, share) > batches_per_s \
            else (lo, mid)
    return lo


def _queue(name: str, demand_s: float, copies: float = 1) -> Station:
    return Station(name, demand_s, copies=copies)


def read_network(node: NodeFigures, tier: TierLimits, nodes: int, latency_s: float,
                 think_s: float, share: float = 1.0) -> Network:
    """The stations one reader's batch visits with `nodes` nodes reading (module docstring);
    `share`: the batch's tier bytes and requests over the epoch's mean (`epoch_shares`)."""
    b = node.batch_bytes * share
    stations = [_queue(METADATA, node.batch_size * node.ops_per_sample.value
                       / tier.metadata_ops.value),
                _queue(BANDWIDTH, b / tier.bandwidth_Bps.value)]
    if tier.requests_per_s is not None:
        stations.append(_queue(REQUESTS, request_demand_s(node, tier) * share))
    per_host = host_copies(nodes, node.nodes_per_host)
    if tier.client_Bps is not None:
        stations.append(_queue(CLIENT, b / tier.client_Bps.value, copies=per_host))
    stations += cpu_stations(node.cpu_demand_s(share), node.host_cpus, per_host,
                             node.nodes_per_host)
    stations.append(Station(LATENCY, latency_s, kind=DELAY))
    return Network(tuple(stations), think_s=think_s)


@dataclass(frozen=True)
class Operating:
    """The model at N nodes: step time and AU, the readers' solution, per-resource use."""

    nodes: int
    step_s: float
    au: float
    solution: Solution
    utilization: dict[str, float]
    bottleneck: str  # the most used queue, or the latency when the step waits on no queue
    cycles: tuple[float, ...]  # a reader's cycle (s) in each part of the epoch


def pipeline_wall(cycles: tuple[float, ...], first_s: float, steps: int, step_floor_s: float,
                  compute_s: float, workers: int, prefetch: int = PREFETCH) -> float:
    """One rank's epoch (s) through a loader of `workers` workers (docs/projection.md, "Per
    epoch"): worker w makes batches w, w + W, ... in turn, each taking the reader cycle of
    its part of the epoch (`cycles`, equal parts; the mean of those it spans); the first W
    are ready at the first batch (every reader starts at once); batch i is asked for when
    batch i - W x prefetch is taken (that many in flight); the step takes batch i at the
    later of the previous step's end (`step_floor_s` after it: compute and the rank's own
    work) and its being ready; the epoch ends with the last step's compute.

    Inside a part every batch takes the same cycle, so the recurrence soon repeats itself
    every W batches, later by a fixed time; it then jumps to the part's end (every value it
    looks back at moves by that time a period): exact, and a part of thousands of steps
    costs a few dozen."""
    if workers < 1 or steps < 1 or not cycles:
        raise ConfigError(f"a loader pipeline needs workers ({workers}), steps ({steps}) "
                          f"and part cycles ({len(cycles)}) >= 1")
    parts, ahead = len(cycles), workers * prefetch
    back = max(ahead, workers) + workers  # how far the recurrence and the jump look back
    ready: list[float] = []
    taken: list[float] = []
    i = 0
    while i < steps:
        if i < workers:
            ready.append(first_s)
        else:
            lo = i * parts // steps
            span = cycles[lo:max(lo + 1, (i + 1) * parts // steps)]
            asked = taken[-ahead] if i >= ahead else 0.0
            ready.append(max(ready[-workers], asked) + sum(span) / len(span))
        taken.append(first_s if i == 0 else max(taken[-1] + step_floor_s, ready[-1]))
        i += 1
        # jump while the last W batches and the next ones are of one part (one cycle)
        part = i * parts // steps
        same = i >= back and (i - workers) * parts // steps == part
        part_end = -(-(part + 1) * steps // parts)  # the next part's first batch
        periods = (min(part_end, steps) - i) // workers if same else 0
        if periods > 0 and (shift := _period_shift(ready, taken, workers, back)) is not None:
            ready = [x + periods * shift for x in ready[-back:]]
            taken = [x + periods * shift for x in taken[-back:]]
            i += periods * workers
    return taken[-1] + compute_s


def _period_shift(ready: list[float], taken: list[float], workers: int, back: int
                  ) -> float | None:
    """The time by which the last `back` values of both sequences repeat those `workers`
    before them, if they all do (to 1e-12 s and a part in 10^9); else None."""
    shift = taken[-1] - taken[-1 - workers]
    tol = 1e-12 + 1e-9 * abs(shift)
    for seq in (ready, taken):
        if len(seq) < back + workers or any(
                abs(seq[-j] - seq[-j - workers] - shift) > tol for j in range(1, back + 1)):
            return None
    return shift


def _mean_step(parts: list[tuple[float, Solution]]) -> float:
    """The mean of the epoch's parts' step times (s)."""
    return sum(step for step, _ in parts) / len(parts)


def _cycles(parts: list[tuple[float, Solution]]) -> tuple[float, ...]:
    """A reader's cycle (s) in each of the epoch's parts."""
    return tuple(sol.cycle_s for _, sol in parts)


class ReadModel:
    """The read side at any N, after fitting the latency to the measured node."""

    def __init__(self, node: NodeFigures, tier: TierLimits,
                 latency: tuple[float, str] | None = None) -> None:
        """`latency`: (seconds per batch, where from) when known apart (a delivery curve,
        `fit_delivery_latency`); else fitted to the measured node's step."""
        self.node, self.tier = node, tier
        # a node that kept up: its step's small excess over the model's (with no latency) is
        # the rank's own work per step (taking the batch from its workers), serial with compute
        # and overlapped by reads; with no workers the model's step already holds the reads
        self.overhead_s = 0.0
        if node.step_s <= node.compute_s * STALLED:
            self.overhead_s = max(0.0, node.step_s - self._step(node.nodes, 0.0)[0])
        # the loader's pipeline (`pipeline_wall`) where PyTorch DataLoader process workers
        # prefetch and the measured epoch had more steps than a rank has workers: with no
        # more, every batch came in the first wave, which shows nothing of the steady reads
        # to fit it to; DALI's threads and iobench's thread pool fetch otherwise
        self.pipelined = (node.prefetch and node.process_workers
                          and self.steps_per_epoch(node.nodes) > node.workers)
        self.latency_s, self.latency_note = latency or self._fit_latency()
        self._first_io_s = self._io_time(node.nodes)

    def _think(self) -> float:
        """A reader's time outside the stations: its decode (inside the host's CPU station
        where there is one), and without workers the rank's compute."""
        n = self.node
        decode = 0.0 if n.shared_cpu else n.worker_cpu_s
        return decode if n.prefetch else n.compute_s + decode

    def _parts(self, nodes: int, latency_s: float) -> list[tuple[float, Solution]]:
        """Each part of the epoch at `nodes` nodes: its step time (s) and its solution."""
        fetched = self.node.fetch_factor(nodes)
        return [self._part_step(nodes, latency_s, share * fetched)
                for share in self.node.epoch_shares(nodes)]

    def _step(self, nodes: int, latency_s: float) -> tuple[float, Solution]:
        """Mean step time (s) over the epoch's parts at `nodes` nodes, and the first part's
        solution (the epoch's start, where the first batch is read)."""
        parts = self._parts(nodes, latency_s)
        return _mean_step(parts), parts[0][1]

    def _wall(self, nodes: int, cycles: tuple[float, ...], step_s: float,
              first_s: float) -> float:
        """The epoch's wall (s) at `nodes` nodes after a first batch of `first_s`: with
        workers, their pipeline over the parts' reader cycles (`pipeline_wall`); without
        (or `pipelined` false), the mean step `step_s` after the first."""
        n = self.node
        steps = self.steps_per_epoch(nodes)
        if not self.pipelined:
            return first_s + n.compute_s + (steps - 1) * step_s
        return pipeline_wall(cycles, first_s, steps,
                             n.compute_s + self.overhead_s + n.sync_s(nodes), n.compute_s,
                             n.workers)

    def _part_step(self, nodes: int, latency_s: float, share: float) -> tuple[float, Solution]:
        """Step time (s) where a batch takes `share` of the mean tier bytes: with prefetch,
        readers never idle when the step waits, so max(compute + the rank's overhead, cycle /
        workers); else a rank's cycle and its overhead."""
        n = self.node
        net = read_network(n, self.tier, nodes, latency_s, self._think(), share)
        sol = solve(net, nodes * n.readers)
        serial = self.overhead_s + n.sync_s(nodes)  # the rank's own, outside the readers
        if n.prefetch:
            return max(n.compute_s + serial, sol.cycle_s / n.workers), sol
        return sol.cycle_s + serial, sol

    def _fit_latency(self) -> tuple[float, str]:
        """The fixed latency per batch that makes the model's epoch at the measured node count
        the measured one (its first batch, then its steady step); 0 where the node did not
        stall (then it cannot be seen)."""
        n = self.node
        kept_up = n.step_s <= n.compute_s * STALLED
        steps = self.steps_per_epoch(n.nodes)
        measured = n.first_batch_s + steps * n.step_s  # the step: (wall - first batch) / steps

        def wall(latency_s: float) -> float:
            parts = self._parts(n.nodes, latency_s)
            return self._wall(n.nodes, _cycles(parts), _mean_step(parts), n.first_batch_s)

        alone = wall(0.0)
        if alone > measured * (1 + 1e-9) or (alone >= measured and not kept_up):
            return 0.0, ("the tier's limits alone make the measured node slower than it was "
                         f"({(alone - n.first_batch_s) / steps:.4g} s a step against "
                         f"{n.step_s:.4g} s: they are lower "
                         "bounds, e.g. one client's figures" + (
                             ", or they and the host's CPU count the same work, as where the "
                             "tier's daemons run on the host" if n.shared_cpu else "")
                         + "): latency 0 s")
        if kept_up:
            return 0.0, ("the measured node kept up (step within 3 % of compute), so its "
                         "latency cannot be fitted: 0 s (optimistic); the step's "
                         f"{self.overhead_s * 1e3:.2f} ms over compute is taken as the rank's "
                         "own work per step (serial with compute, overlapped by reads)")
        lo, hi = 0.0, n.step_s * max(n.workers, 1)
        for _ in range(BISECT_STEPS):  # the first wave's head start hides some: look further
            if wall(hi) >= measured:
                break
            lo, hi = hi, hi * 2
        else:
            return 0.0, (f"the measured epoch's {steps} step(s) a rank show no steady read to "
                         "fit (every batch came with the first): latency 0 s (optimistic)")
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if wall(mid) < measured else (lo, mid)
        return lo, ("fitted: the model's epoch at the measured node count equals the "
                    "measured one" + ("" if self.pipelined or not n.prefetch else (
                        " (steps at the mean step, not through the loader's pipeline: "
                        + (f"its {steps} step(s) a rank, no more than its {n.workers} "
                           "workers, came in the first wave)" if n.process_workers else
                           "its workers are not PyTorch DataLoader processes)"))))

    def _io_time(self, nodes: int) -> float:
        """The first batch's read time at `nodes` nodes (every reader starts at once)."""
        sol = self._step(nodes, self.latency_s)[1]
        return sol.response_s

    def at(self, nodes: int) -> Operating:
        """The model at `nodes` nodes."""
        if nodes < 1:
            raise ConfigError(f"node count {nodes} must be >= 1")
        n = self.node
        parts = self._parts(nodes, self.latency_s)
        step, sol = _mean_step(parts), parts[0][1]
        batches_per_s = nodes * n.ranks_per_node / step
        util = {s.name: batches_per_s * s.demand_s / s.copies
                for s in read_network(n, self.tier, nodes, self.latency_s, 0.0,
                                      n.fetch_factor(nodes)).queues}
        top = max(util, key=lambda k: util[k])
        if util[top] < BUSY and step > n.compute_s * STALLED:
            top = LATENCY
        return Operating(nodes=nodes, step_s=step, au=min(1.0, n.compute_s / step),
                         solution=sol, utilization=util, bottleneck=top,
                         cycles=_cycles(parts))

    def steps_per_epoch(self, nodes: int) -> int:
        n = self.node
        return max(1, math.ceil(n.epoch_samples / (nodes * n.ranks_per_node * n.batch_size)))

    def first_batch(self, nodes: int) -> float:
        """The first batch's wait (s): the measured one, moved by the change in the larger of
        the first read's time (every reader starting at once) and the host's start-up burst
        (`start_burst`) from the measured node count to `nodes`: both delay it, and they
        overlap."""
        n = self.node
        then = max(self._first_io_s, self.start_burst(n.nodes))
        return max(0.0, n.first_batch_s + max(self._io_time(nodes), self.start_burst(nodes))
                   - then)

    def start_burst(self, nodes: int) -> float:
        """Seconds the host's cores take for the start-up of the nodes on the fullest host:
        where nodes share a host they start at once, each bringing the host's CPU until the
        first batch measured per node (`first_cpu_s`, at m0 nodes on it), `m c_f / (m0 p)`
        for m nodes. 0 without a CPU station or that figure."""
        n = self.node
        if not n.shared_cpu or n.first_cpu_s is None:
            return 0.0
        m0, m = min(n.nodes, n.nodes_per_host), min(nodes, n.nodes_per_host)
        return m * n.first_cpu_s / m0 / n.host_cpus

    def epoch_step(self, op: Operating) -> float:
        """The epoch's mean step after its first batch, (wall - first batch) / steps: a
        node's step as `train` measures it (the steady step, `op.step_s`, is longer where the
        first wave's head start or the first step's compute takes some off)."""
        return (self.epoch(op)[0] - self.first_batch(op.nodes)) / self.steps_per_epoch(op.nodes)

    def epoch(self, op: Operating) -> tuple[float, float]:
        """(epoch wall, stall per epoch) in seconds at an operating point: the first batch,
        then the steps (with workers, their pipeline over the epoch's parts)."""
        wall = self._wall(op.nodes, op.cycles, op.step_s, self.first_batch(op.nodes))
        return wall, wall - self.steps_per_epoch(op.nodes) * self.node.compute_s

    def saturation(self, threshold: float) -> int | None:
        """The least node count whose AU falls below `threshold` (None: not below
        `MAX_NODES`); AU never rises with N, so a bisection finds it."""
        if self.at(1).au < threshold:
            return 1
        if self.at(MAX_NODES).au >= threshold:
            return None
        lo, hi = 1, MAX_NODES  # au(lo) >= threshold > au(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.at(mid).au >= threshold else (lo, mid)
        return hi

    def bounds(self) -> dict[str, float]:
        """Per resource, the node count where it would be 100 % busy if every node got its
        demand (the straight line; infinite: never; 1: already at one node). A station's
        load at x nodes is x over its copies (the nodes on the fullest host for one per host)
        times a node's demand of it at x, which the hosts' fetch factor raises."""
        n = self.node
        demand = n.ranks_per_node / n.compute_s  # batches/s one node asks for

        def load(name: str, x: float) -> float:
            nodes = max(1, math.ceil(x))
            net = read_network(n, self.tier, nodes, 0.0, 0.0, n.fetch_factor(nodes))
            s = next(q for q in net.queues if q.name == name)
            return min(x, nodes / s.copies) * demand * s.demand_s  # x, or the fullest host's

        out = {}
        for s in read_network(n, self.tier, 1, 0.0, 0.0).queues:
            one = load(s.name, 1.0)
            if one >= 1.0:  # full at one node; a shared station says by how much
                out[s.name] = 1.0 if s.name in PER_HOST else 1.0 / one
            else:
                out[s.name] = _straight_line(partial(load, s.name))
        return out


PER_HOST = (CLIENT, CPU)  # stations one per host in the read network


def _straight_line(load: Callable[[float], float]) -> float:
    """The node count x in (1, `MAX_NODES`] where `load(x)`, below 1 at one node and never
    falling with x, reaches 1 (bisection); infinite when it does not."""
    if load(float(MAX_NODES)) < 1.0:
        return math.inf
    lo, hi = 1.0, float(MAX_NODES)  # load(lo) < 1 <= load(hi)
    for _ in range(BISECT_STEPS * 2):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if load(mid) < 1.0 else (lo, mid)
    return hi


class StagingModel:
    """Staging to node-local storage with every node reading the tier at once."""

    def __init__(self, staging: StagingFigures, tier: TierLimits, ops_per_file: float) -> None:
        self.staging, self.tier, self.ops_per_file = staging, tier, ops_per_file
        self.local_s, self.note = self._fit_local()

    def _network(self, nodes: int, local_s: float) -> Network:
        st, t = self.staging, self.tier
        chunk = st.dataset_bytes / st.chunks
        stations = [_queue(METADATA, st.files * self.ops_per_file / st.chunks
                           / t.metadata_ops.value),
                    _queue(BANDWIDTH, chunk / t.bandwidth_Bps.value)]
        per_host = host_copies(nodes, st.nodes_per_host)
        if t.client_Bps is not None:
            stations.append(_queue(CLIENT, chunk / t.client_Bps.value, copies=per_host))
        stations += cpu_stations(st.cpu_s, st.host_cpus, per_host, st.nodes_per_host)
        stations.append(_queue(LOCAL, local_s, copies=per_host))
        return Network(tuple(stations))

    def time(self, nodes: int, mode: str, local_s: float | None = None) -> float:
        """Seconds to stage with `nodes` nodes: replicate copies the dataset to every node,
        shard one copy spread over them; throughput from the copy threads' network."""
        st = self.staging
        total = st.chunks * (nodes if mode == "replicate" else 1)
        customers = max(1, min(nodes * st.threads, total))
        sol = solve(self._network(nodes, self.local_s if local_s is None else local_s),
                    customers)
        return total / sol.throughput if sol.throughput > 0 else math.inf

    def _fit_local(self) -> tuple[float, str]:
        st = self.staging
        if st.measured_s is None:
            return 0.0, ("no stage result: node-local writes are taken as free (optimistic) "
                         f"and {st.threads} copy threads per node")

        def fit(local_s: float) -> float:
            return self.time(st.nodes, st.measured_mode, local_s)

        if fit(0.0) >= st.measured_s:
            return 0.0, ("the tier's limits alone make the measured staging slower than it "
                         "was: node-local write 0 s per chunk")
        lo, hi = 0.0, st.measured_s
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fit(mid) < st.measured_s else (lo, mid)
        return lo, ("node-local write time per chunk fitted so the model's staging at the "
                    "measured node count takes the measured time")


def break_even_epochs(stage_s: float, epoch_tier_s: float, epoch_local_s: float) -> float:
    """Epochs until staging pays: stage_s / (epoch from the tier - epoch from local);
    infinite when the local copy saves nothing (docs/metrics.md)."""
    gain = epoch_tier_s - epoch_local_s
    return stage_s / gain if gain > 0 else math.inf
