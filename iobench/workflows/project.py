"""`iobench project`: stall, AU and staging time at N nodes from one node's results, by a queueing model.

`project(cfg)` reads one node's `train` result (the demand: compute per
step, batch, readers, bytes and metadata operations per sample; the measured
step and stall), the shared tier's `probe` results or the site's figures
given as options (aggregate read bandwidth, metadata ops/s, per-client
limit), and optionally a `stage` result and the run's `--trace`. It fits
the model (`iobench.core.projection`) to the measured node, then predicts
each N: AU, stall and epoch time, staging time (replicate, shard) and its
break-even, and the node count where the tier stops keeping up and which
resource limits first; with a trace, a discrete-event simulation
(`iobench.core.simulation`) adds the bursts for small N. The document
(`iobench.projection` v1) is labelled a projection throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from iobench.core.breakeven import jsonable_break_even
from iobench.core.errors import ConfigError, IobenchError
from iobench.core.formats import FORMATS
from iobench.core.fusedaemon import ReadCost, reads_and_bytes
from iobench.core.jsonio import load_json, read_json
from iobench.core.projection import (
    ASSUMPTIONS,
    RESOURCES,
    Figure,
    NodeFigures,
    ReadModel,
    StagingFigures,
    StagingModel,
    TierLimits,
    break_even_epochs,
    delivery,
    fit_delivery_latency,
    opening_share,
    read_network,
    request_demand_s,
    requests_per_batch,
)
from iobench.core.result_types import (
    Record,
    StageDoc,
    TrainResult,
    key,
)
from iobench.core.results import (
    PROBE_SCHEMA,
    PROBE_SCHEMA_VERSION,
    STAGE_SCHEMA,
    STAGE_SCHEMA_VERSION,
    load_typed,
    now_iso,
)
from iobench.core.schema import Enum, NonNeg, Num, Opt
from iobench.core.simulation import EXPONENTIAL, TRACE, Service, TrainingShape, simulate_training

if TYPE_CHECKING:
    from iobench.workflows.diagnose import DiagnoseResult

SCHEMA, SCHEMA_VERSION = "iobench.projection", 1
DEFAULT_NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 10_000)
MAX_NODES_OPTION = 1_000_000
STAGE_THREADS = 4  # iobench stage's default copy threads per rank
STAGE_CHUNK = 16 * 2**20  # iobench stage's default buffer (bytes)
LABEL = "PROJECTION (model, not measured)"
SPREAD_STEP = "the model fitted again to the fastest and the slowest measured step."
SPREAD_CURVE = ("the model with the latency of the diagnose result's fastest and slowest "
                "worker count (per sample).")


class ProjectionInputError(IobenchError, ValueError):
    """The inputs of a projection do not fit together (`which`: the input at fault)."""

    def __init__(self, message: str, which: str) -> None:
        super().__init__(message)
        self.which = which


def parse_nodes(text: str | Sequence[int]) -> tuple[int, ...]:
    """`1,8,64` -> (1, 8, 64): node counts, each in [1, 1,000,000], sorted, distinct."""
    try:
        vals = [int(x) for x in text.split(",")] if isinstance(text, str) else list(text)
    except ValueError:
        raise ConfigError(f"--nodes {text!r}: give node counts separated by commas, e.g. "
                          "1,16,256") from None
    bad = [v for v in vals if not 1 <= v <= MAX_NODES_OPTION]
    if not vals or bad:
        raise ConfigError(f"--nodes {text!r}: each node count must be in [1, "
                          f"{MAX_NODES_OPTION:,}] (got {bad or 'none'})")
    return tuple(sorted(set(vals)))


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} {value!r} must be a finite number > 0")


@dataclass(frozen=True)
class ProjectConfig:
    """What to project from. Rates: bytes/s and operations/s; None: from the probe(s)."""

    train: Path
    probes: tuple[Path, ...] = ()
    stage: Path | None = None
    diagnose: Path | None = None  # its storage runs: the node's delivery curve
    trace: Path | None = None
    nodes: tuple[int, ...] = DEFAULT_NODES
    pfs_read_Bps: float | None = None  # given: the site's aggregate read bandwidth
    pfs_mds_ops: float | None = None  # given: the site's metadata operations/s
    pfs_iops: float | None = None  # given: the site's random-read requests/s
    client_Bps: float | None = None  # given: one client node's read ceiling
    ops_per_sample: float | None = None  # None: 1 for one file per sample, else 0
    threshold: float = 0.90  # AU below which the tier "stops keeping up" (MLPerf Storage)
    simulate_max_nodes: int = 8  # simulate N up to this (0: no simulation)
    simulate_steps: int = 200  # steps per node in a simulation
    seed: int = 0
    # nodes that share one host (its CPU, client cache and link, local disk): 1 on a
    # cluster; a one-box validation's N virtual nodes share one
    nodes_per_host: int = 1
    step_sync_s: float | None = None  # given: a per-step all-reduce beyond the measured run

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", parse_nodes(self.nodes))
        for name in ("pfs_read_Bps", "pfs_mds_ops", "client_Bps", "pfs_iops"):
            _positive(name, getattr(self, name))
        if self.ops_per_sample is not None and not (math.isfinite(self.ops_per_sample)
                                                    and self.ops_per_sample >= 0):
            raise ConfigError(f"--ops-per-sample {self.ops_per_sample!r} must be >= 0")
        if not 0 < self.threshold < 1:
            raise ConfigError(f"--threshold {self.threshold} must be in (0, 1)")
        if self.step_sync_s is not None and not (math.isfinite(self.step_sync_s)
                                                 and self.step_sync_s >= 0):
            raise ConfigError(f"--step-sync-ms {self.step_sync_s * 1e3!r} must be >= 0")
        if self.nodes_per_host < 1:
            raise ConfigError(f"--nodes-per-host {self.nodes_per_host} must be >= 1")
        if self.simulate_max_nodes < 0 or self.simulate_steps < 1:
            raise ConfigError(f"simulation of up to {self.simulate_max_nodes} nodes, "
                              f"{self.simulate_steps} steps: give >= 0 nodes and >= 1 step")


# ------------------------------------------------------------------------------ inputs

@dataclass(frozen=True, kw_only=True)
class _SampleReadFigures(Record):
    """Random reads at one sample size (`summary.sample_reads[i]` of a probe)."""

    sample_bytes: float = key(Num)
    bs_bytes: int | None = key(default=None, optional=True)
    iops: float | None = key(default=None, optional=True)
    # the same reads through the page cache, as loaders read (absent in older probes)
    buffered_iops: float | None = key(Opt(NonNeg), default=None, optional=True)
    buffered_bs_bytes: int | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class _ProbeFigures(Record):
    """The probe figures a projection reads (`summary` of an `iobench.probe` document)."""

    seq_read_MBps: float | None
    stat_per_s: float | None
    open_stat_close_per_s: float | None = key(default=None, optional=True)
    readers_max: int
    sample_bytes: float | None = key(Opt(Num), default=None, optional=True)
    sample_bs_bytes: int | None = key(default=None, optional=True)
    sample_read_iops: float | None = key(default=None, optional=True)
    sample_reads: tuple[_SampleReadFigures, ...] = key(default=(), optional=True)
    buffered_read_iops: float | None = key(Opt(NonNeg), default=None, optional=True)
    buffered_bs_bytes: int | None = key(default=None, optional=True)
    buffered_readers: int | None = key(default=None, optional=True)

    def request_rates(self) -> list[tuple[float, float, float]]:
        """(tested sample bytes, request bytes, random reads/s) of each sample-size random-read
        test it holds (O_DIRECT where the probe could, else buffered with POSIX_FADV_RANDOM)."""
        out = [(r.sample_bytes, float(r.bs_bytes or r.sample_bytes), r.iops)
               for r in self.sample_reads if r.iops]
        if self.sample_read_iops and self.sample_bytes:
            out.append((self.sample_bytes, float(self.sample_bs_bytes or self.sample_bytes),
                        self.sample_read_iops))
        return out

    def buffered_rates(self) -> list[tuple[float, float, float]]:
        """(tested sample bytes, request bytes, random reads/s) of each buffered sample-size
        random-read test (as the loaders read: through the page cache); none in a probe made
        before them."""
        out = [(r.sample_bytes, float(r.buffered_bs_bytes), r.buffered_iops)
               for r in self.sample_reads if r.buffered_iops and r.buffered_bs_bytes]
        if self.buffered_read_iops and self.buffered_bs_bytes:
            out.append((self.sample_bytes or float(self.buffered_bs_bytes),
                        float(self.buffered_bs_bytes), self.buffered_read_iops))
        return out


@dataclass(frozen=True, kw_only=True)
class _ProbeMount(Record):
    """The probed mount (`storage`), the parts that name the tier."""

    path: str
    fstype: str
    kind: str
    mount_point: str | None = key(default=None, optional=True)
    source: str | None = key(default=None, optional=True)

    def tier(self) -> tuple[str, str]:
        """(filesystem type, what is mounted): probes with the same pair measured one tier,
        from any folder of it."""
        return self.fstype, self.source or self.mount_point or self.path


@dataclass(frozen=True, kw_only=True)
class _Probe(Record):
    """An `iobench.probe` document, the parts a projection reads."""

    label: str
    direct: bool = key(default=True, optional=True)
    storage: _ProbeMount
    summary: _ProbeFigures


def _load_probe(path: Path) -> _Probe:
    return _Probe.from_dict(read_json(path, schema=PROBE_SCHEMA,
                                      max_version=PROBE_SCHEMA_VERSION), str(path))


@dataclass(frozen=True, kw_only=True)
class _StagePlan(Record):
    """A stage result's configuration (`config`), the parts a projection reads."""

    threads: int
    buffer_bytes: int
    num_nodes: int = key(default=1, optional=True)


@dataclass(frozen=True, kw_only=True)
class _Stage(StageDoc):
    """An `iobench.stage` document with its configuration and file counts."""

    config: _StagePlan
    copied_files: int = key(default=0, optional=True)


def _load_stage(path: Path) -> _Stage:
    return _Stage.from_dict(read_json(path, schema=STAGE_SCHEMA,
                                        max_version=STAGE_SCHEMA_VERSION), str(path))


@dataclass(frozen=True)
class DeliveryCurve:
    """The latency per batch (s) fitted to a `diagnose` result's storage runs (cold, no
    decode, one rank at each worker count), with its range over the worker counts and, per
    count, the measured and the model's samples/s."""

    latency_s: float
    latency_range_s: tuple[float, float]
    note: str
    points: tuple[tuple[int, float, float], ...]  # (workers, measured, model) samples/s


def _load_diagnose(path: Path, run: TrainResult) -> DiagnoseResult:
    """The diagnose result at `path`, checked to be of the training result's dataset."""
    from iobench.workflows.diagnose import load_diagnosis

    diag = load_diagnosis(path)
    c, ds = diag.config, run.dataset
    if c.dataset != ds.dataset or (c.format is not None and c.format != ds.format):
        raise ProjectionInputError(
            f"--diagnose {path} measured {c.dataset} ({c.format or 'any format'}) but the "
            f"training result read {ds.dataset} ({ds.format}): give results of one dataset",
            "diagnose")
    return diag


def delivery_curve(path: Path, diag: DiagnoseResult, node: NodeFigures,
                   tier: TierLimits) -> DeliveryCurve:
    """The fixed latency per sample that makes the model deliver what each storage run of
    the diagnosis delivered (its opening `steps` of a cold epoch, one rank, `workers`
    readers), as a latency per batch of the training result's batch: the median over the
    worker counts, their least and greatest as the range."""
    bd = diag.config.batch_size
    k = node.samples_per_request.value if node.samples_per_request else 1.0
    runs = [(m, replace(node, batch_size=bd, workers=m.workers, ranks_per_node=1),
             opening_share(k, m.steps * bd / node.epoch_samples)) for m in diag.storage]
    per_sample = [fit_delivery_latency(shape, tier, m.workers, share, m.samples_per_s / bd)
                  / bd for m, shape, share in runs]
    per = _median(per_sample)
    points = tuple((m.workers, m.samples_per_s,
                    delivery(shape, tier, m.workers, per * bd, share) * bd)
                   for m, shape, share in runs)
    counts = ", ".join(str(w) for w, _, _ in points)
    return DeliveryCurve(
        latency_s=per * node.batch_size,
        latency_range_s=(min(per_sample) * node.batch_size, max(per_sample) * node.batch_size),
        note=(f"fitted to the delivery curve of the diagnose result {path.name} (storage, "
              f"cold, no decode, {counts} worker(s), batch {bd}): {per * 1e3:.4g} ms per "
              f"sample, median over the worker counts, times the training batch "
              f"{node.batch_size}"),
        points=points)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def node_figures(run: TrainResult, ops_per_sample: float | None) -> NodeFigures:
    """One node's figures from a training result: medians over its epochs, the slowest rank's
    steady step ((wall - first batch) / steps) and the mean rank's compute per step."""
    if not run.complete or not run.epochs:
        raise ProjectionInputError(f"training result {run.run_id} is {run.status} (no whole "
                                   "epochs): project from a complete run", "train")
    if run.compute.kind == "none":
        raise ProjectionInputError("the training result has no compute (--model none): it "
                                   "sets no demand; project from a run with a model or "
                                   "--compute-time", "train")
    steps, computes, firsts, stalls, workers_cpu = [], [], [], [], []
    for e in run.epochs:
        ranks = [r for r in e.ranks if r.steps > 0]
        steps.append(max((r.wall_s - (r.first_batch_s or 0.0)) / r.steps for r in ranks))
        computes.append(sum(r.compute_s / r.steps for r in ranks) / len(ranks))
        firsts.append(max(r.first_batch_s or 0.0 for r in ranks))
        stalls.append(e.summary.stall_s_max)
        workers_cpu += [r.loader.decode_s / r.loader.batches for r in ranks
                        if r.loader is not None and r.loader.batches > 0]
    ds, world = run.dataset, run.world
    if ops_per_sample is None:
        per_file = FORMATS[ds.format].per_sample_files if ds.format in FORMATS else False
        ops = Figure(1.0 if per_file else 0.0,
                     f"format {ds.format}: " + ("one file per sample, one open each" if per_file
                                                else "container files, opens per epoch "
                                                     "negligible"))
    else:
        ops = Figure(ops_per_sample, "--ops-per-sample", given=True)
    au = [e.summary.au_min for e in run.epochs if e.summary.au_min is not None]
    return NodeFigures(
        nodes=world.num_nodes, ranks_per_node=max(1, world.size // world.num_nodes),
        batch_size=run.config.batch_size, workers=run.config.workers,
        process_workers=(run.config.loader != "dali"
                         and (run.config.worker_type or "process") == "process"),
        compute_s=_median(computes), step_s=_median(steps),
        worker_cpu_s=_median(workers_cpu) if workers_cpu else 0.0,
        first_batch_s=_median(firsts), sample_bytes=ds.total_bytes / ds.num_samples,
        ops_per_sample=ops, epoch_samples=max(e.summary.samples for e in run.epochs),
        stall_s=_median(stalls), au=_median(au) if au else None,
        step_range=(min(steps), max(steps)))


def host_cpu(run: TrainResult) -> tuple[Figure, int, float | None] | None:
    """The host's busy CPU seconds per batch read (median epoch), its cores, and its busy CPU
    until the first step's batch (median epoch; None unless every usable epoch recorded it),
    from each epoch's `host_cpu` (rank 0's host, over the epoch's steps). With the first
    batch's part the per-batch figure is the rest's, over the batches after each rank's
    first: the loaders' start-up is no steady work. None where the run has none (older
    results, no /proc/stat)."""
    usable = []  # (busy_s, first_batch_busy_s, batches, ranks on the host, cores)
    for e in run.epochs:
        h = e.host_cpu
        root = next((r for r in e.ranks if r.rank == 0), None)
        if h is None or root is None or h.cpus < 1:  # no figure, or not a usable one
            continue
        mine = [r for r in e.ranks if r.host == root.host]
        batches = sum(r.steps for r in mine)
        if batches > 0:
            usable.append((h.busy_s, h.first_batch_busy_s, batches, len(mine), h.cpus))
    if not usable:
        return None
    split = all(f is not None and 0 <= f <= b and n > r for b, f, n, r, _ in usable)
    if split:
        per_batch = [(b - (f or 0.0)) / (n - r) for b, f, n, r, _ in usable]
        whole = "the batches after each rank's first, less its CPU until the first step's batch"
    else:
        per_batch = [b / n for b, _, n, _, _ in usable]
        whole = "the batches its ranks read"
    return (Figure(_median(per_batch), "measured: the host's busy CPU over each epoch "
                   f"(/proc/stat: everything on the host, the tier's daemons included) over "
                   f"{whole} (median of {len(per_batch)} epochs)"), usable[-1][4],
            _median([f or 0.0 for _, f, _, _, _ in usable]) if split else None)


def samples_per_request(run: TrainResult, tier: TierLimits) -> Figure | None:
    """k, the samples one tier request holds in a shuffled epoch (the client cache's
    front-loading, docs/projection.md): 1 for a format of one file a sample; else the run's
    measured bytes per tier request (the emulated tier's counters, else the FUSE daemon's
    replies; median epoch) over the sample bytes, else the probe's request size over them;
    None (every batch alike) unless the run shuffled globally."""
    if run.config.shuffle != "global":
        return None
    fmt = run.dataset.format
    if fmt in FORMATS and FORMATS[fmt].per_sample_files:
        return Figure(1.0, f"format {fmt}: one file a sample, so a tier request holds one "
                      "sample at most")
    sample = run.dataset.total_bytes / run.dataset.num_samples
    sizes = [t.bytes_served / t.read_requests for t in (e.tier_bytes for e in run.epochs)
             if t is not None and t.bytes_served is not None and t.read_requests]
    if sizes:
        return Figure(max(1.0, _median(sizes) / sample),
                      f"measured: the run's tier counters, {_median(sizes):.0f} bytes per "
                      f"request over {sample:.0f}-byte samples (median epoch)")
    daemon = _daemon_request_bytes(run)
    if daemon is not None:
        size, per_read = daemon
        return Figure(max(1.0, size / sample),
                      f"measured: the FUSE daemon's replies over the run's epochs, {size:.0f} "
                      f"bytes per request over {sample:.0f}-byte samples (median epoch; "
                      f"{per_read:.2f} daemon writes a read, calibrated; its metadata replies "
                      "count as reads, so this k is a little low)")
    if tier.requests_per_s is not None:
        return Figure(max(1.0, tier.request_bytes / sample),
                      f"the probe's {tier.request_bytes:.0f}-byte requests over "
                      f"{sample:.0f}-byte samples")
    return None


def _daemon_request_bytes(run: TrainResult) -> tuple[float, float] | None:
    """The median epoch's bytes per read from the FUSE daemon's counted replies, and the
    calibrated writes per read; None where the run has no such figures."""
    sizes, costs = [], []
    for t in (e.tier_bytes for e in run.epochs):
        if (t is None or t.daemon_replies is None or t.daemon_reply_bytes is None
                or not t.replies_per_read or t.reply_overhead_bytes is None):
            continue
        cost = ReadCost(t.replies_per_read, t.reply_overhead_bytes, 0)
        found = reads_and_bytes(t.daemon_replies, t.daemon_reply_bytes, cost)
        if found is not None:
            sizes.append(found[1] / found[0])
            costs.append(t.replies_per_read)
    return (_median(sizes), _median(costs)) if sizes else None


def check_probes(probes: Sequence[tuple[Path, _Probe]]) -> None:
    """Several probes must be of one tier (filesystem type and what is mounted) and one
    dataset (the sample size their random reads tested): their medians mix nothing else."""
    tiers = sorted({d.storage.tier() for _, d in probes})
    if len(tiers) > 1:
        raise ProjectionInputError(
            "the probes measured different tiers (" + ", ".join(f"{t} {m}" for t, m in tiers)
            + "): give probes of the one tier the projection is of", "probe")
    sizes = sorted({d.summary.sample_bytes for _, d in probes
                    if d.summary.sample_bytes is not None})
    if len(sizes) > 1:
        raise ProjectionInputError(
            "the probes read samples of different datasets (" + ", ".join(
                f"{b:.0f} bytes" for b in sizes) + "): give probes made with one dataset's "
            "sample size", "probe")


def measured_figure(found: Sequence[tuple[float, Path, _Probe]], what: str, unit: str,
                    scale: float = 1.0) -> Figure | None:
    """One figure from each probe's `(value, path, probe)`: the value of one probe, else the
    median of several with their least and greatest as its span (`scale`: the value's unit
    over `unit`'s, for the words)."""
    if not found:
        return None
    if len(found) == 1:
        v, p, d = found[0]
        return Figure(v, f"measured: probe {p.name} ({d.label}), {what}")
    vals = sorted(v for v, _, _ in found)
    lo, mid, hi = vals[0], _median(vals), vals[-1]
    names = ", ".join(p.name for _, p, _ in found)
    return Figure(mid, f"measured: median of {len(found)} probes, {lo / scale:,.4g}-"
                       f"{hi / scale:,.4g} {unit} ({names}); {what}", span=(lo, hi))


def tier_limits(probes: Sequence[tuple[Path, _Probe]], cfg: ProjectConfig,
                sample_bytes: float) -> TierLimits:
    """The tier's limits: each from an option (given) or measured, each probe's best over
    its readers of one client (the aggregate is then what that client reached) and, with
    several probes of the tier, the median over them with their spread."""
    check_probes(probes)

    def each(field: Callable[[_ProbeFigures], float | None], what: str, unit: str,
             scale: float = 1.0) -> Figure | None:
        found = [(v, p, d) for p, d in probes if (v := field(d.summary)) is not None and v > 0]
        readers = max((d.summary.readers_max for _, _, d in found), default=1)
        return measured_figure(found, f"{what}, best of 1-{readers} readers of one client",
                               unit, scale)

    bw = each(lambda s: s.seq_read_MBps * 1e6 if s.seq_read_MBps else None,
              "sequential read", "MB/s", 1e6)
    md = each(lambda s: s.open_stat_close_per_s or s.stat_per_s, "open+stat+close/s", "ops/s")
    bandwidth = (Figure(cfg.pfs_read_Bps, "given: --pfs-read-gbs", given=True)
                 if cfg.pfs_read_Bps else bw)
    metadata = (Figure(cfg.pfs_mds_ops, "given: --pfs-mds-ops", given=True)
                if cfg.pfs_mds_ops else md)
    if bandwidth is None:
        raise ProjectionInputError("no read bandwidth for the tier: give --probe FILE (an "
                                   "iobench probe of it) or --pfs-read-gbs", "probe")
    if metadata is None:
        raise ProjectionInputError("no metadata rate for the tier: give --probe FILE or "
                                   "--pfs-mds-ops", "probe")
    client = (Figure(cfg.client_Bps, "given: --client-gbs", given=True) if cfg.client_Bps
              else bw if cfg.pfs_read_Bps and bw is not None else None)
    req = request_rate(probes, cfg, sample_bytes)
    return TierLimits(bandwidth_Bps=bandwidth, metadata_ops=metadata, client_Bps=client,
                      requests_per_s=req.rate, request_bytes=req.request_bytes)


BUFFERED, DIRECT = "buffered", "direct"  # how a request rate was read (`RequestRate.read`)


@dataclass(frozen=True)
class RequestRate:
    """The tier's random-read rate for the request station: the figure (None: no station),
    its request size in bytes, and how the probe read it: `BUFFERED` (through the page
    cache, as the loaders read), `DIRECT` (the probe's O_DIRECT reads: an older probe without
    buffered figures) or None (given, or no probe figure)."""

    rate: Figure | None
    request_bytes: float
    read: str | None = None


def request_rate(probes: Sequence[tuple[Path, _Probe]], cfg: ProjectConfig,
                 sample_bytes: float) -> RequestRate:
    """The request station's rate: `--pfs-iops` (requests of the probe's nearest size, else of
    the run's sample size), else the probes' random reads at the tested sample size nearest
    the run's sample (each probe's best rate at that size; over several probes the median,
    with their spread): their buffered reads, which match how the loaders read, and only in
    probes without them their O_DIRECT ones; none when no probe measured one (no station)."""
    read = BUFFERED
    found = [(size, bs, iops, p, d) for p, d in probes
             for size, bs, iops in d.summary.buffered_rates()]
    if not found:
        read = DIRECT
        found = [(size, bs, iops, p, d) for p, d in probes
                 for size, bs, iops in d.summary.request_rates()]
    if not found:
        if cfg.pfs_iops:
            return RequestRate(Figure(cfg.pfs_iops, "given: --pfs-iops", given=True),
                               max(sample_bytes, 1.0))
        return RequestRate(None, 4096.0)
    near = min(found, key=lambda f: abs(math.log(f[0] / max(sample_bytes, 1.0))))[0]
    best: dict[Path, tuple[float, float, _Probe]] = {}  # each probe's best rate at that size
    for size, bs, iops, p, d in found:
        if size == near and (p not in best or iops > best[p][1]):
            best[p] = (bs, iops, d)
    bs = _median([b for b, _, _ in best.values()])
    if cfg.pfs_iops:
        return RequestRate(Figure(cfg.pfs_iops, "given: --pfs-iops", given=True), bs)
    rate = measured_figure([(iops, p, d) for p, (_, iops, d) in best.items()],
                           _read_words(read, [d for _, _, d in best.values()], bs), "reads/s")
    return RequestRate(rate, bs, read)


def _read_words(read: str, probes: Sequence[_Probe], bs: float) -> str:
    """How the probes read the chosen request rate, for the figure's source."""
    if read == BUFFERED:
        counts = sorted({d.summary.buffered_readers for d in probes
                         if d.summary.buffered_readers})
        readers = (f"{'/'.join(map(str, counts))} readers" if counts else "its readers")
        return (f"random {bs:.0f}-byte reads through the page cache, as the loaders read "
                f"(best at {readers} of one client)")
    how = "with O_DIRECT" if all(d.direct for d in probes) else "buffered with POSIX_FADV_RANDOM"
    top = max(d.summary.readers_max for d in probes)
    return (f"random {bs:.0f}-byte reads {how}, best of 1-{top} readers of one "
            "client; this probe holds no buffered figure (made before probe measured one), "
            "so the O_DIRECT rate stands in for the loaders' buffered reads")


def staging_figures(stage: _Stage | None, run: TrainResult, nodes_per_host: int = 1
                    ) -> StagingFigures:
    """The staging to model: measured (a stage result of the same dataset) or its defaults;
    with the host's busy CPU per chunk copied, where a one-node stage result measured it."""
    ds = run.dataset
    per_file = FORMATS[ds.format].per_sample_files if ds.format in FORMATS else False
    files = ds.num_samples if per_file else 1
    if stage is None:
        return StagingFigures(dataset_bytes=ds.total_bytes, files=files,
                              threads=STAGE_THREADS, chunk_bytes=STAGE_CHUNK)
    if (stage.dataset.dataset, stage.dataset.format) != (ds.dataset, ds.format):
        raise ProjectionInputError(
            f"the stage result copied {stage.dataset.dataset} ({stage.dataset.format}) but the "
            f"training result read {ds.dataset} ({ds.format}): give results of one dataset",
            "stage")
    if stage.skipped_files:
        raise ProjectionInputError(f"the stage result was resumed ({stage.skipped_files} files "
                                   "were already there): its time is no staging cost; give a "
                                   "full staging", "stage")
    c, sp = stage.config, stage.spread
    # the median of repeated stagings, as compare's break-even takes it
    stage_s = sp.stage_s.median if sp is not None and sp.stage_s is not None else stage.stage_s
    out = StagingFigures(dataset_bytes=ds.total_bytes, files=max(files, stage.copied_files),
                         threads=c.threads, chunk_bytes=c.buffer_bytes, measured_s=stage_s,
                         measured_mode=stage.mode or "replicate", nodes=c.num_nodes,
                         nodes_per_host=nodes_per_host)
    h = stage.host_cpu
    if h is None or c.num_nodes != 1 or h.cpus < 1:
        return out
    return replace(out, cpu_s=h.busy_s / out.chunks, host_cpus=h.cpus)


# ------------------------------------------------------------------------------ the document

@dataclass(frozen=True, kw_only=True)
class InputFigure(Record):
    """One input of the model: its value, unit, and source (`given`: an option, not measured)."""

    name: str
    value: float
    unit: str
    source: str
    given: bool
    # (least, greatest) over several probes, in `unit`, when `value` is their median
    span: tuple[float, ...] = key(default=(), optional=True)


@dataclass(frozen=True, kw_only=True)
class Point(Record):
    """The projection at one node count (`points[i]`): per node and per epoch, seconds."""

    nodes: int
    readers: int
    au: float  # of the epoch: compute / wall, first batch included (as train measures it)
    au_steady: float  # of a step once the readers run: compute / step
    step_s: float
    stall_s: float  # per epoch, from the tier
    epoch_s: float
    steps_per_epoch: int
    delivered_samples_per_s: float  # per node
    demand_samples_per_s: float  # per node
    utilization: Mapping[str, float]
    bottleneck: str
    method: str
    stage_replicate_s: float
    stage_shard_s: float
    break_even_replicate: Any  # epochs, or "never"
    break_even_shard: Any
    # the model fitted to the fastest and the slowest measured step (epochs, repetitions)
    au_range: tuple[float, ...] = key(default=(), optional=True)
    stall_range_s: tuple[float, ...] = key(default=(), optional=True)
    # staging with the tier's figures at their least and greatest over several probes
    stage_replicate_range_s: tuple[float, ...] = key(default=(), optional=True)
    stage_shard_range_s: tuple[float, ...] = key(default=(), optional=True)
    simulated_au: float | None = key(default=None, optional=True)
    simulated_stall_s: float | None = key(default=None, optional=True)
    first_batch_s: float | None = key(default=None, optional=True)  # in `stall_s`


@dataclass(frozen=True, kw_only=True)
class Saturation(Record):
    """Where the tier stops keeping up: the least N with AU below `threshold` (None: not up
    to 10 million nodes) and the resource most used there; per resource, the N where it
    would be 100 % busy at the demand (the straight-line bound; "never" when it never is)."""

    threshold: float
    nodes: int | None
    resource: str | None
    bounds: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class ModelInfo(Record):
    """The model: its method, the fitted constants and every assumption (`model`)."""

    method: str
    latency_s: float
    latency_note: str
    local_write_s: float
    staging_note: str
    simulation: str
    assumptions: tuple[str, ...]
    # what the [spread] of AU and stall is (absent in the first documents: SPREAD_STEP)
    spread_note: str = key(default="", optional=True)

    def __post_init__(self) -> None:
        if not self.spread_note:
            object.__setattr__(self, "spread_note", SPREAD_STEP)


@dataclass(frozen=True, kw_only=True)
class ProjectionDoc(Record):
    """An `iobench.projection` document (a model's prediction, not a measurement)."""

    EXTRA: ClassVar[bool] = False

    schema: str = key(Enum(SCHEMA))
    schema_version: int = key(Enum(SCHEMA_VERSION))
    kind: str = key(Enum("projection"))
    label: str
    created: str
    dataset: str
    format: str
    inputs: Mapping[str, Any]
    figures: tuple[InputFigure, ...]
    model: ModelInfo
    points: tuple[Point, ...] = key(min_len=1)
    saturation: Saturation
    warnings: tuple[str, ...]


def _figures(node: NodeFigures, tier: TierLimits, staging: StagingFigures) -> list[InputFigure]:
    def fig(name: str, value: float, unit: str, source: str, given: bool = False,
            span: tuple[float, float] | None = None) -> InputFigure:
        return InputFigure(name=name, value=value, unit=unit, source=source, given=given,
                           span=span or ())

    run = "measured: the training result"
    k = node.samples_per_request
    out = [fig("compute per step", node.compute_s, "s", run + " (mean rank, median epoch)"),
           fig("step time", node.step_s, "s", run + " (slowest rank, first batch excluded)"),
           fig("first batch", node.first_batch_s, "s", run),
           fig("batch per rank", node.batch_size, "samples", run),
           fig("ranks per node", node.ranks_per_node, "ranks", run),
           fig("loader workers per rank", node.workers, "workers", run),
           fig("decode per batch", node.worker_cpu_s, "s", run + " (loader clocks)"),
           fig("bytes per sample", node.sample_bytes, "bytes", run + " (dataset manifest)"),
           fig("metadata ops per sample", node.ops_per_sample.value, "ops",
               node.ops_per_sample.source, node.ops_per_sample.given),
           fig("samples per tier request (k)", k.value if k else 1.0, "samples",
               k.source if k else "assumed: 1, every batch takes the mean bytes (no global "
                                  "shuffle, or no request size measured)"),
           fig("tier read bandwidth", tier.bandwidth_Bps.value / 1e6, "MB/s",
               tier.bandwidth_Bps.source, tier.bandwidth_Bps.given,
               _scaled(tier.bandwidth_Bps, 1e6)),
           fig("tier metadata rate", tier.metadata_ops.value, "ops/s",
               tier.metadata_ops.source, tier.metadata_ops.given, tier.metadata_ops.span)]
    if tier.requests_per_s is not None:
        r = tier.requests_per_s
        out += [fig("tier request rate", r.value, "requests/s", r.source, r.given, r.span),
                fig("request size", tier.request_bytes, "bytes", r.source, r.given),
                fig("requests per batch", requests_per_batch(node, tier), "requests",
                    "batch bytes / request size"),
                fig("request time net of transfer", request_demand_s(node, tier)
                    / requests_per_batch(node, tier), "s",
                    "1 / request rate - request size / read bandwidth")]
    if tier.client_Bps is not None:
        out.append(fig("per-client read limit", tier.client_Bps.value / 1e6, "MB/s",
                       tier.client_Bps.source, tier.client_Bps.given))
    out.append(fig("staging copy threads per node", staging.threads, "threads",
                   "measured: the stage result" if staging.measured_s is not None
                   else "assumed: iobench stage's default"))
    if staging.measured_s is not None:
        out.append(fig("staging time", staging.measured_s, "s",
                       f"measured: the stage result ({staging.measured_mode}, "
                       f"{staging.nodes} node(s))"))
    if node.step_sync is not None:
        out.append(fig("per-step synchronisation beyond the measured run", node.step_sync.value,
                       "s", node.step_sync.source, True))
    return out + _host_figures(node, staging)


def _host_figures(node: NodeFigures, staging: StagingFigures) -> list[InputFigure]:
    """The nodes per host, and the host's CPU per batch and per staged chunk where measured
    (a CPU station only where nodes share a host)."""
    shared = node.nodes_per_host > 1
    out = [InputFigure(name="nodes per host", value=node.nodes_per_host, unit="nodes",
                       given=shared, source=(
                           "--nodes-per-host: nodes share one host's CPU, client cache and "
                           "link, and local disk" if shared else
                           "assumed: every node a host of its own (its own CPU, client cache "
                           "and local disk)"))]
    use = ("; the CPU station of the host the nodes share" if shared
           else "; no station: every node has its own")
    if node.cpu_s is not None:
        out += [InputFigure(name="host CPU per batch", value=node.cpu_s.value, unit="s",
                            source=node.cpu_s.source + use, given=False),
                InputFigure(name="host cores", value=node.host_cpus, unit="cores",
                            source="measured: /proc/stat of the training's host", given=False)]
    if node.first_cpu_s is not None:
        out.append(InputFigure(
            name="host CPU until the first batch", value=node.first_cpu_s, unit="s",
            source="measured: the host's busy CPU from each epoch's start to its first step's "
                   "batch (median epoch: the loaders' start-up and first reads)"
                   + ("; nodes that share a host bring it to its cores at once"
                      if node.shared_cpu else "; not used: every node has a host of its own"
                      if not shared else "; not used: no host CPU per batch"), given=False))
    if staging.cpu_s is not None:
        out.append(InputFigure(name="host CPU per staged chunk", value=staging.cpu_s, unit="s",
                               source="measured: the stage result's host busy CPU over its "
                                      f"{staging.chunks} chunks" + use, given=False))
    return out


def _scaled(f: Figure, scale: float) -> tuple[float, float] | None:
    return None if f.span is None else (f.span[0] / scale, f.span[1] / scale)


@dataclass(frozen=True)
class _Models:
    read: ReadModel
    stage: StagingModel
    # fitted to the fastest and slowest measured step, each with the tier's figures at the
    # least and the greatest of the probes' spread
    spread: tuple[ReadModel, ...] = ()
    stage_spread: tuple[StagingModel, ...] = ()  # the tier's least and greatest figures


def _spread_models(node: NodeFigures, tier: TierLimits) -> tuple[ReadModel, ...]:
    steps = (node.step_range if node.step_range is not None
             and node.step_range[0] != node.step_range[1] else (node.step_s,))
    tiers = tier.ends() or (tier,)
    models = tuple(ReadModel(replace(node, step_s=s), t) for s in steps for t in tiers)
    return models if len(models) > 1 else ()


def _stage_spread(staging: StagingFigures, tier: TierLimits) -> tuple[StagingModel, ...]:
    ends = tier.ends()
    return () if ends is None else tuple(StagingModel(staging, t, ops_per_file=1.0)
                                         for t in ends)


def _range(m: _Models, nodes: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(AU low, high), (stall low, high) at `nodes` from the spread's models and the central
    one (a refit at an end of the spread can land on the other side of it)."""
    if not m.spread:
        return (), ()
    epochs = [r.epoch(r.at(nodes)) for r in (m.read, *m.spread)]
    compute = m.read.steps_per_epoch(nodes) * m.read.node.compute_s
    aus, stalls = [compute / wall for wall, _ in epochs], [stall for _, stall in epochs]
    return (min(aus), max(aus)), (min(stalls), max(stalls))


def _point(m: _Models, nodes: int, simulated: tuple[float, float] | None) -> Point:
    node = m.read.node
    op = m.read.at(nodes)
    epoch_s, stall_s = m.read.epoch(op)
    steps = m.read.steps_per_epoch(nodes)
    local_epoch = steps * node.compute_s
    rep, shard = m.stage.time(nodes, "replicate"), m.stage.time(nodes, "shard")
    per_step = node.ranks_per_node * node.batch_size
    au_range, stall_range = _range(m, nodes)
    rep_range, shard_range = (
        tuple(sorted(s.time(nodes, mode) for s in m.stage_spread)) if m.stage_spread else ()
        for mode in ("replicate", "shard"))
    return Point(
        nodes=nodes, readers=nodes * node.readers, au=local_epoch / epoch_s,
        au_steady=op.au, step_s=op.step_s,
        stall_s=stall_s, epoch_s=epoch_s, steps_per_epoch=steps,
        delivered_samples_per_s=per_step / op.step_s,
        demand_samples_per_s=per_step / node.compute_s,
        utilization=op.utilization, bottleneck=op.bottleneck, method=op.solution.method,
        stage_replicate_s=rep, stage_shard_s=shard,
        break_even_replicate=jsonable_break_even(break_even_epochs(rep, epoch_s, local_epoch)),
        break_even_shard=jsonable_break_even(break_even_epochs(shard, epoch_s, local_epoch)),
        au_range=au_range, stall_range_s=stall_range,
        stage_replicate_range_s=rep_range, stage_shard_range_s=shard_range,
        simulated_au=simulated[0] if simulated else None,
        simulated_stall_s=simulated[1] if simulated else None,
        first_batch_s=m.read.first_batch(nodes))


def _saturation(read: ReadModel, threshold: float) -> Saturation:
    n = read.saturation(threshold)
    bounds = {RESOURCES[k]: ("never" if math.isinf(v) else v) for k, v in read.bounds().items()}
    return Saturation(threshold=threshold, nodes=n,
                      resource=RESOURCES[read.at(n).bottleneck] if n is not None else None,
                      bounds=bounds)


def _host_warnings(run: TrainResult, node: NodeFigures, staging: StagingFigures,
                   stage: _Stage | None) -> list[str]:
    """Where nodes share a host: what its CPU figures hold beyond reads, and what is missing."""
    if node.nodes_per_host <= 1:
        return []
    out = []
    device = run.compute.device
    if run.compute.kind == "model" and (device is None or device.type == "cpu"):
        out.append("the host's busy CPU per batch includes the model's compute on the CPU "
                   "(the run trained on it), which the host's CPU station then charges as "
                   "read work too: the nodes sharing the host are projected slower than they "
                   "would be; measure with --compute-time, or on an accelerator")
    if node.cpu_s is None:
        out.append("the training result holds no host_cpu figure (made before iobench "
                   "recorded it, or /proc/stat unreadable): the nodes sharing a host share no "
                   "CPU in this projection; train again to measure it")
    if stage is not None and staging.cpu_s is None:
        out.append("the stage result gives no host CPU per chunk (made before iobench "
                   "recorded it, or on several nodes): the staging copies sharing a host "
                   "share no CPU in this projection; stage again on one node")
    return out


def _warnings(node: NodeFigures, tier: TierLimits, n_probes: int, read: str | None
              ) -> list[str]:
    out = []
    if read == DIRECT:
        out.append("the probe holds no figure of buffered random reads, as the loaders read "
                   "(made before `iobench probe` measured them): the request rate is that of "
                   "its O_DIRECT (or fadvise-random) reads, which loaders reading through the "
                   "page cache can exceed several times (the one-box GlusterFS: 4x, "
                   "docs/results.md section 14); probe the tier again or give --pfs-iops")
    if not tier.bandwidth_Bps.given and n_probes:
        out.append("the tier's bandwidth is what one client measured: the aggregate of a real "
                   "parallel filesystem is usually higher (give --pfs-read-gbs), so the "
                   "projection is pessimistic beyond one node")
    rate = tier.requests_per_s
    if rate is not None and not rate.given:
        out.append("the request rate is what the probe's few synchronous readers reached: the "
                   "servers' own rate may be higher (give --pfs-iops), so the projection is "
                   "pessimistic where the request rate limits")
    if node.au is not None and node.au < 0.5:
        out.append(f"the measured node had AU {node.au:.2f}: it was far from its demand, so "
                   "the fitted latency carries most of the step")
    return out


def project(cfg: ProjectConfig,
            simulate: Callable[[ReadModel, int], tuple[float, float]] | None = None
            ) -> ProjectionDoc:
    """The projection document of `cfg` (module docstring); `simulate(model, nodes)` gives
    (AU, stall per epoch) by simulation for node counts up to `cfg.simulate_max_nodes`."""
    run = load_typed(cfg.train)
    probes = [(p, _load_probe(p)) for p in cfg.probes]
    stage = _load_stage(cfg.stage) if cfg.stage is not None else None
    node = node_figures(run, cfg.ops_per_sample)
    tier = tier_limits(probes, cfg, node.sample_bytes)
    cpu = host_cpu(run)
    node = replace(node, samples_per_request=samples_per_request(run, tier),
                   cpu_s=cpu[0] if cpu else None, host_cpus=cpu[1] if cpu else 1,
                   first_cpu_s=cpu[2] if cpu else None,
                   nodes_per_host=cfg.nodes_per_host,
                   step_sync=None if cfg.step_sync_s is None else Figure(
                       cfg.step_sync_s, "--step-sync-ms: a synchronisation of every rank per "
                       "step beyond the measured run's, given", given=True))
    staging = staging_figures(stage, run, cfg.nodes_per_host)
    curve = (delivery_curve(cfg.diagnose, _load_diagnose(cfg.diagnose, run), node, tier)
             if cfg.diagnose is not None else None)
    read, spread = _read_models(node, tier, curve)
    models = _Models(read, StagingModel(staging, tier, ops_per_file=1.0), spread,
                     _stage_spread(staging, tier))
    points = []
    for n in cfg.nodes:
        sim = simulate(read, n) if simulate and n <= cfg.simulate_max_nodes else None
        points.append(_point(models, n, sim))
    return ProjectionDoc(
        schema=SCHEMA, schema_version=SCHEMA_VERSION, kind="projection", label=LABEL,
        created=now_iso(), dataset=run.dataset.dataset, format=run.dataset.format,
        inputs={"train": str(cfg.train), "probes": [str(p) for p in cfg.probes],
                "stage": str(cfg.stage) if cfg.stage else None,
                "trace": str(cfg.trace) if cfg.trace else None,
                "diagnose": str(cfg.diagnose) if cfg.diagnose else None},
        figures=tuple(_figures(node, tier, staging) + _curve_figures(cfg.diagnose, curve)),
        model=ModelInfo(method="closed queueing network, mean-value analysis (exact up to "
                        "2,000 readers, Schweitzer's approximation above)",
                        latency_s=read.latency_s, latency_note=read.latency_note,
                        local_write_s=models.stage.local_s, staging_note=models.stage.note,
                        simulation=_simulation_words(cfg, simulate is not None),
                        assumptions=ASSUMPTIONS + _probe_assumptions(tier, len(probes)),
                        spread_note=spread_note(tier, curve)),
        points=tuple(points), saturation=_saturation(read, cfg.threshold),
        warnings=tuple(_warnings(node, tier, len(probes),
                                 request_rate(probes, cfg, node.sample_bytes).read)
                       + _curve_warnings(read, curve) + _fit_warnings(read, curve)
                       + _host_warnings(run, node, staging, stage)))


def _read_models(node: NodeFigures, tier: TierLimits, curve: DeliveryCurve | None
                 ) -> tuple[ReadModel, tuple[ReadModel, ...]]:
    """The read model and its spread: fitted to the measured node's step (the spread: to
    its fastest and slowest), or, with a delivery curve, with the curve's latency (the
    spread: its least and greatest over the worker counts); either with the tier's figures
    at the least and the greatest of the probes' spread, when several probes gave them."""
    if curve is None:
        return ReadModel(node, tier), _spread_models(node, tier)
    read = ReadModel(node, tier, (curve.latency_s, curve.note))
    lo, hi = curve.latency_range_s
    lats = (lo, hi) if lo != hi else (curve.latency_s,)
    spread = tuple(ReadModel(node, t, (lat, curve.note)) for lat in lats
                   for t in tier.ends() or (tier,))
    return read, spread if len(spread) > 1 else ()


SPREAD_PROBES = (" With several probes of the tier, each of those with the tier's measured "
                 "figures (bandwidth, metadata rate, request rate) all at the least and all "
                 "at the greatest the probes measured; staging: the same two tiers.")


def spread_note(tier: TierLimits, curve: DeliveryCurve | None) -> str:
    """What the [spread] of AU, stall and staging is."""
    return ((SPREAD_STEP if curve is None else SPREAD_CURVE)
            + (SPREAD_PROBES if tier.ends() is not None else ""))


def _probe_assumptions(tier: TierLimits, n_probes: int) -> tuple[str, ...]:
    """The assumption several probes add: their medians and spread."""
    if tier.ends() is None:
        return ()
    return (f"The tier's measured figures are the median of {n_probes} probes (each probe's "
            "best over its readers), not the best of them; their least and greatest bound "
            "the [spread] (a probe's figure varies with the tier's other load).",)


def _curve_figures(path: Path | None, curve: DeliveryCurve | None) -> list[InputFigure]:
    if path is None or curve is None:
        return []
    return [InputFigure(name=f"delivery with {w} worker(s), cold, no decode", value=x,
                        unit="samples/s", given=False,
                        source=f"measured: the diagnose result {path.name} (storage run); "
                               f"the model with the fitted latency: {model:.4g} samples/s")
            for w, x, model in curve.points]


def _curve_warnings(read: ReadModel, curve: DeliveryCurve | None) -> list[str]:
    """With a delivery curve: whether the model's step at the measured node count agrees
    with the training result's (within 25 %)."""
    if curve is None:
        return []
    n = read.node
    model = read.epoch_step(read.at(n.nodes))
    if abs(model - n.step_s) <= 0.25 * n.step_s:
        return []
    return [f"with the delivery curve's latency the model's step at the measured node count "
            f"is {model:.4g} s, the training result measured {n.step_s:.4g} s: the diagnose "
            "and the training runs saw the tier differently (another load, another tier); "
            "project from the training result alone to fit its step"]


def _fit_warnings(read: ReadModel, curve: DeliveryCurve | None) -> list[str]:
    """Without a delivery curve: whether the tier's figures alone make the measured node
    slower than it ran (more than 10 %), so that no latency could be fitted."""
    n = read.node
    model = read.epoch_step(read.at(n.nodes))
    if curve is not None or model <= 1.1 * n.step_s:
        return []
    return [f"the tier's figures alone make the measured node's step {model:.4g} s, it ran "
            f"{n.step_s:.4g} s: the probe met a slower tier than the run did (another load, "
            "a short test)" + (", or the tier's queues and the host's CPU station count the "
                               "same work (the tier's daemons on the host)" if n.shared_cpu
                               else "") + ", so the projection is pessimistic; probe again "
            "(a longer "
            "--runtime) or give the site's figures (--pfs-iops, --pfs-read-gbs)"]


def _simulation_words(cfg: ProjectConfig, ran: bool) -> str:
    if not ran or cfg.simulate_max_nodes == 0:
        return "not run"
    src = f"driven by the trace {cfg.trace}" if cfg.trace else "exponential service times"
    return (f"discrete-event simulation, seed {cfg.seed}, {cfg.simulate_steps} steps per "
            f"node, N up to {cfg.simulate_max_nodes}, {src}; synchronous steps across nodes")


# ------------------------------------------------------------------------ simulation, output

def _trace_service(path: Path, run: TrainResult) -> Service:
    """The trace's per-step compute times and its fetch times over their mean (bursts)."""
    from iobench.workflows.timeline import load_timeline

    head = load_json(path)
    other = head.get("otherData") if isinstance(head, dict) else None
    ib = other.get("iobench") if isinstance(other, dict) else None
    run_id = ib.get("run_id") if isinstance(ib, dict) else None
    if run_id != run.run_id:
        raise ProjectionInputError(f"--trace {path} is of run {run_id}, the training result "
                                   f"of run {run.run_id}: give the trace that run wrote",
                                   "trace")
    epochs = load_timeline(path)
    compute = [d / 1e6 for ep in epochs for r in ep.ranks.values() for _, d in r.compute]
    fetch = [d for ep in epochs for r in ep.ranks.values() for lane in r.lanes.values()
             for kind, _, d in lane if kind == "fetch"]
    if not fetch or not compute:
        raise ProjectionInputError(f"--trace {path} holds no fetch or compute spans to drive "
                                   "the simulation (a DALI run has none)", "trace")
    mean = sum(fetch) / len(fetch)
    return Service(TRACE, factors=tuple(d / mean for d in fetch), compute_s=tuple(compute))


def simulator(cfg: ProjectConfig, service: Service
              ) -> Callable[[ReadModel, int], tuple[float, float]]:
    """(epoch AU, stall per epoch) at N nodes by the discrete-event simulation of `cfg`."""
    def simulate(model: ReadModel, nodes: int) -> tuple[float, float]:
        n = model.node
        serial = model.overhead_s + n.sync_s(nodes)  # the rank's own, beside the compute
        shape = TrainingShape(nodes=nodes, ranks_per_node=n.ranks_per_node, workers=n.workers,
                              compute_s=n.compute_s + serial,
                              # the decode is inside a shared host's CPU station
                              worker_cpu_s=0.0 if n.shared_cpu else n.worker_cpu_s,
                              steps=cfg.simulate_steps)
        net = read_network(n, model.tier, nodes, model.latency_s, 0.0, n.fetch_factor(nodes))
        step = simulate_training(shape, net, seed=cfg.seed, service=service)
        compute = (sum(service.compute_s) / len(service.compute_s) if service.compute_s
                   else n.compute_s)
        step = max(step, compute + serial)
        first, steps = model.first_batch(nodes), model.steps_per_epoch(nodes)
        stall = first + (steps - 1) * (step - compute)
        return steps * compute / (steps * compute + stall), stall
    return simulate


def run_projection(cfg: ProjectConfig) -> ProjectionDoc:
    """`project(cfg)` with the simulation `cfg` asks for (trace-driven when it names one)."""
    service = Service(EXPONENTIAL)
    if cfg.trace is not None:  # checked even when nothing is simulated: a wrong file is said
        service = _trace_service(cfg.trace, load_typed(cfg.train))
    if cfg.simulate_max_nodes == 0:
        return project(cfg)
    return project(cfg, simulator(cfg, service))


def _num(v: float | None, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def _be(v: Any) -> str:
    return v if isinstance(v, str) else _num(v, ".3g")


def span_text(r: Sequence[float], spec: str) -> str:
    """` [least-greatest]` of a spread in the format `spec`; nothing without one."""
    return f" [{format(r[0], spec)}-{format(r[-1], spec)}]" if r else ""


TABLE_HEADER = ("nodes", "AU [spread]", "steady AU", "stall/epoch s [spread]", "epoch s",
                "limit", "util", "sim AU", "sim stall s", "stage repl s [spread]",
                "stage shard s [spread]", "b-e repl", "b-e shard")


def point_cells(p: Point) -> tuple[str, ...]:
    """One node count's row of the table (`TABLE_HEADER`): [spread] is the model fitted to
    the fastest and the slowest measured step, with several probes each with the tier at the
    least and the greatest they measured (`ModelInfo.spread_note`); b-e: staging's
    break-even in epochs."""
    return (f"{p.nodes:,}", f"{p.au:.3f}" + span_text(p.au_range, ".2f"), f"{p.au_steady:.3f}",
            _num(p.stall_s) + span_text(p.stall_range_s, ".3g"), _num(p.epoch_s),
            RESOURCES.get(p.bottleneck, p.bottleneck),
            f"{max(p.utilization.values(), default=0):.0%}",
            _num(p.simulated_au, ".3f"), _num(p.simulated_stall_s),
            _num(p.stage_replicate_s) + span_text(p.stage_replicate_range_s, ".3g"),
            _num(p.stage_shard_s) + span_text(p.stage_shard_range_s, ".3g"),
            _be(p.break_even_replicate), _be(p.break_even_shard))


def saturation_words(doc: ProjectionDoc) -> str:
    """Where the tier stops keeping up, the resource, and each resource's straight line."""
    s = doc.saturation
    where = ("not below 10 million nodes" if s.nodes is None else
             f"already at N = 1 (the measured node: {s.resource})" if s.nodes == 1 else
             f"from N = {s.nodes:,} ({s.resource} first)")
    bounds = ", ".join(f"{k} at N = {_be(v)}" for k, v in s.bounds.items())
    return (f"the tier stops keeping up (steady AU < {s.threshold:.2f}) {where}; "
            f"straight-line bounds (100 % busy at the demand): {bounds}")


def figure_source(f: InputFigure) -> str:
    """An input's source, "GIVEN, not measured" first when it was an option."""
    return f"GIVEN, not measured; {f.source}" if f.given else f.source


def table(doc: ProjectionDoc) -> str:
    """The projection as text: a row per N, the saturation, the inputs and assumptions."""
    head = TABLE_HEADER
    rows = [point_cells(p) for p in doc.points]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    out = [f"{doc.label}: {doc.dataset} ({doc.format}) from one node to N nodes",
           line(head), *map(line, rows), "",
           "AU: of the epoch (compute / wall, first batch included, as train measures it); "
           "steady AU: compute / step once the readers run",
           saturation_words(doc), "", "inputs:"]
    out += [f"  {f.name}: {f.value:.4g}{span_text(f.span, '.4g')} {f.unit} ({figure_source(f)})"
            for f in doc.figures]
    m = doc.model
    out += ["model:", f"  {m.method}", f"  latency per batch {m.latency_s:.4g} s: "
            f"{m.latency_note}", f"  staging: {m.staging_note}", f"  simulation: {m.simulation}",
            f"  [spread]: {m.spread_note}", "assumptions:", *(f"  - {a}" for a in m.assumptions)]
    return "\n".join(out)


def plot_projection(doc: ProjectionDoc, path: Path) -> Path:
    """Draw AU and stall per epoch (model and simulation) and staging time against N (log
    axis), labelled a projection, to a PNG written atomically; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from iobench.core.outputs import save_png

    n = [p.nodes for p in doc.points]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.semilogx(n, [p.au for p in doc.points], "o-", label="AU of the epoch (MVA model)")
    a.semilogx(n, [p.au_steady for p in doc.points], ".:", label="steady AU (MVA model)")
    sim = [(p.nodes, p.simulated_au) for p in doc.points if p.simulated_au is not None]
    if sim:
        a.semilogx(*zip(*sim, strict=True), "s", label="AU of the epoch (simulation)")
    a.axhline(doc.saturation.threshold, color="grey", ls="--", lw=0.8,
              label=f"threshold {doc.saturation.threshold:.2f}")
    a.set(xlabel="nodes", ylabel="AU", ylim=(0, 1.05), title=f"{doc.label}: AU")
    a.legend(fontsize=8)
    b.loglog(n, [max(p.stall_s, 1e-6) for p in doc.points], "o-", label="stall per epoch")
    b.loglog(n, [p.stage_replicate_s for p in doc.points], "^-", label="staging, replicate")
    b.loglog(n, [p.stage_shard_s for p in doc.points], "v-", label="staging, shard")
    b.set(xlabel="nodes", ylabel="seconds", title="PROJECTION: stall and staging time")
    b.legend(fontsize=8)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for ax in (a, b):  # node counts as plain numbers, not powers of ten
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.text(0.01, -0.02, "A model's prediction from one node's measured results, not a "
             "measurement; assumptions in the result and docs/projection.md.", fontsize=8)
    return save_png(fig, path, dpi=110)
