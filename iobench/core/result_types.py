"""Typed result documents: frozen records with `from_dict`/`to_dict`, the JSON schema derived from them.

Each record's fields are the keys readers use; a field's JSON spec comes from
its type (`str`, `int` >= 0, `float` >= 0, `X | None` nullable, tuples as
lists, nested records as mappings) or from `key(spec)`. `key(optional=True)`
lets the key be absent (its default then holds); keys a record does not name
are kept in `extra`, so `to_dict` gives the document back. `from_dict` checks
the whole document against the derived spec first (a `ResultError` names the
first bad field), so a record built from it holds what its types say.
`schema_markdown()` writes the typed fields for docs/results-schema.md.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, TypeVar, get_args, get_origin, get_type_hints

from iobench.core.errors import IobenchError
from iobench.core.schema import (
    ANY,
    Bool,
    Count,
    Dict,
    Enum,
    Int,
    List,
    Map,
    NonNeg,
    Num,
    Opt,
    SchemaError,
    Spec,
    Str,
    check,
)

SCHEMA = "iobench.result"
# v2: repetitions (`config.repeat`, epochs tagged `repeat`, `summary.spread`), the loader's
# start-up apart (`loader`), user-space and server caches (`cache.user_space`,
# `cache.server_cache`), synchronised emulated steps (`compute.steps`). v3: per-node figures of each epoch
# (`epochs[i].per_node`), the batch job (`provenance.job`), node names (`world.nodes`,
# `ranks[r].node_name`), stragglers in the verdict. v4: checkpoints in training
# (`checkpoint`, `epochs[i].checkpoint`, `epochs[i].ranks[r].checkpoint`; `train
# --checkpoint-every`). v1, v2 and v3 still load.
SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)


class ResultError(IobenchError, ValueError):
    """A result document is malformed or cannot be found."""


_NUM = Opt(Num)
R = TypeVar("R", bound="Record")


def key(spec: Spec | None = None, *, default: Any = MISSING, optional: bool = False,
        name: str | None = None, min_len: int = 0) -> Any:
    """A record field: its JSON `spec` (None: derived from the field's type), whether its key
    may be absent (`optional`: `default` then holds), its JSON `name` where that is not a
    Python name, and the least items of a list (`min_len`)."""
    meta = {"spec": spec, "optional": optional, "name": name, "min_len": min_len}
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class Record:
    """A typed part of a result document; keys it does not name are kept in `extra`."""

    EXTRA: ClassVar[bool] = True  # False: a key it does not name is an error
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # optional keys the document did not have (to_dict leaves them out again)
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def spec(cls) -> Map:
        """The JSON spec of this record, derived from its fields."""
        return _spec_of(cls)

    @classmethod
    def parse(cls: type[R], doc: Mapping[str, Any]) -> R:
        """The record of a mapping already checked against `spec()`."""
        kw: dict[str, Any] = {}
        named = set()
        for f, hint in _fields(cls):
            k = _json_name(f)
            named.add(k)
            if k in doc:
                kw[f.name] = _convert(doc[k], hint)
        return cls(**kw, extra={k: v for k, v in doc.items() if k not in named},
                   absent=frozenset(named - set(doc)))

    @classmethod
    def from_dict(cls: type[R], doc: Any, where: str = "document") -> R:
        """Check `doc` against `spec()` (a ResultError names the first bad field), then type it."""
        try:
            check(doc, cls.spec(), where)
        except SchemaError as e:
            raise ResultError(str(e)) from None
        return cls.parse(doc)

    @classmethod
    def of(cls: type[R], doc: R | Mapping[str, Any]) -> R:
        """`doc` itself when typed already, else `from_dict(doc)`."""
        return doc if isinstance(doc, cls) else cls.from_dict(doc)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: the one parsed, or every field of a record built in code."""
        out: dict[str, Any] = {}
        for f, _ in _fields(type(self)):
            if _json_name(f) not in self.absent:
                out[_json_name(f)] = _jsonable(getattr(self, f.name))
        out.update(copy.deepcopy(dict(self.extra)))  # a document the caller may change
        return out


def _json_name(f: Field[Any]) -> str:
    return str(f.metadata.get("name") or f.name)


_FIELDS: dict[type[Record], tuple[tuple[Field[Any], Any], ...]] = {}
_SPECS: dict[type[Record], Map] = {}


def _fields(cls: type[Record]) -> tuple[tuple[Field[Any], Any], ...]:
    """(field, its type) of each JSON field of a record (worked out once per class)."""
    if cls not in _FIELDS:
        hints = get_type_hints(cls)
        _FIELDS[cls] = tuple((f, hints[f.name]) for f in fields(cls)
                             if f.name not in ("extra", "absent"))
    return _FIELDS[cls]


def _inner(hint: Any) -> Any | None:
    """X of `X | None`; None for any other type."""
    if get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else None
    return None


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Record)


def _convert(v: Any, hint: Any) -> Any:
    if v is None:
        return None
    inner = _inner(hint)
    if inner is not None:
        return _convert(v, inner)
    origin = get_origin(hint)
    if origin is tuple:
        return tuple(_convert(x, get_args(hint)[0]) for x in v)
    if origin is Mapping:
        return {k: _convert(x, get_args(hint)[1]) for k, x in v.items()}
    if _is_record(hint):
        return hint.parse(v)
    return v


def _jsonable(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_dict()
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


_LEAVES: dict[Any, Spec] = {str: Str, bool: Bool, int: Count, float: NonNeg, Any: ANY}


def _spec_of_type(hint: Any, min_len: int = 0) -> Spec:
    inner = _inner(hint)
    if inner is not None:
        return _NUM if inner is float else Opt(_spec_of_type(inner))
    origin = get_origin(hint)
    if origin is tuple:
        return List(_spec_of_type(get_args(hint)[0]), min_len=min_len)
    if origin is Mapping:
        value = get_args(hint)[1]
        return Map({}, extra=True) if value is Any else Dict(_spec_of_type(value))
    if _is_record(hint):
        return _spec_of(hint)
    return _LEAVES[hint]


def _spec_of(cls: type[Record]) -> Map:
    if cls not in _SPECS:
        _SPECS[cls] = _derive_spec(cls)
    return _SPECS[cls]


def _derive_spec(cls: type[Record]) -> Map:
    keys: dict[str, Spec] = {}
    optional = []
    for f, hint in _fields(cls):
        k = _json_name(f)
        keys[k] = f.metadata.get("spec") or _spec_of_type(hint, f.metadata.get("min_len", 0))
        if f.metadata.get("optional"):
            optional.append(k)
    return Map(keys, optional=optional, extra=cls.EXTRA)


# ----------------------------------------------------------------- iobench.result records

@dataclass(frozen=True, kw_only=True)
class Spread(Record):
    """A figure over repetitions (`iobench.core.spread.spread`)."""

    median: float = key(Num)
    min: float = key(Num)
    max: float = key(Num)
    cv: float | None
    n: int
    values: tuple[float, ...] = key(List(Num), default=(), optional=True)


@dataclass(frozen=True, kw_only=True)
class WorkerClock(Record):
    """One loader worker's clocks over an epoch (`worker` -1: the rank's own process)."""

    worker: int = key(Int)
    batches: int
    read_s: float
    decode_s: float
    busy_fraction: float


@dataclass(frozen=True, kw_only=True)
class LoaderClock(Record):
    """Where a rank's loader time went in an epoch, from the readers' own clocks."""

    workers: int
    batches: int
    read_s: float
    decode_s: float
    handoff_s: float = key(default=0.0, optional=True)
    per_worker: tuple[WorkerClock, ...] = key(default=(), optional=True)


@dataclass(frozen=True, kw_only=True)
class DrainSplit(Record):
    """The data stall of steps taken while a checkpoint drain ran against the others (one
    rank's, or all ranks' summed; `train --drain-to`)."""

    steps_in_flight: int
    stall_in_flight_s: float
    steps_idle: int
    stall_idle_s: float
    stall_per_step_in_flight_s: float | None
    stall_per_step_idle_s: float | None


@dataclass(frozen=True, kw_only=True)
class RankCheckpoint(Record):
    """One rank's checkpoints in one epoch (`epochs[i].ranks[r].checkpoint`, `train
    --checkpoint-every`): its steps' blocked time, outside `wall_s`."""

    saves: int
    blocked_s: float
    wall_with_checkpoint_s: float
    au_with_checkpoint: float | None
    drain: DrainSplit | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class RankRecord(Record):
    """One rank's figures for one epoch (`epochs[i].ranks[r]`)."""

    rank: int
    host: str
    steps: int
    samples: int
    batch_bytes: int
    wall_s: float
    stall_s: float
    compute_s: float
    first_batch_s: float | None
    stall_fraction: float | None
    au: float | None
    wait_p50_s: float | None
    wait_p95_s: float | None
    wait_p99_s: float | None
    wait_max_s: float | None
    os_read_bytes: int | None
    cache_resident_fraction_at_start: float | None
    loader: LoaderClock | None = key(default=None, optional=True)
    compute_mean_s: float | None = key(default=None, optional=True)
    checkpoint: RankCheckpoint | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class NodeRecord(Record):
    """One node's figures for one epoch (`epochs[i].per_node`, v3)."""

    node: int
    name: str
    host: str
    ranks: tuple[int, ...] = key(min_len=1)
    samples: int
    batch_bytes: int
    wall_s: float
    stall_s: float
    stall_s_mean: float
    stall_fraction: float | None
    samples_per_s: float | None
    read_MBps: float | None
    os_read_bytes: int | None
    cache_resident_fraction_at_start: float | None
    cache: str | None = key(Opt(Enum("warm", "unknown")))


@dataclass(frozen=True, kw_only=True)
class EpochSummary(Record):
    """An epoch's figures across ranks (`epochs[i].summary`)."""

    ranks: int
    steps: int
    samples: int
    batch_bytes: int
    wall_s: float
    stall_s_mean: float
    stall_s_max: float
    stall_fraction_mean: float | None
    stall_fraction_max: float | None
    au_mean: float | None
    au_min: float | None
    samples_per_s: float | None
    read_MBps: float | None
    os_read_bytes: int | None
    # results before au_mlperf lack them
    au_mlperf_mean: float | None = key(default=None, optional=True)
    au_mlperf_min: float | None = key(default=None, optional=True)
    first_batch_s_max: float | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class EpochCache(Record):
    """The eviction before an epoch (`epochs[i].cache`)."""

    status: str | None = key(Str, default=None, optional=True)
    resident_fraction: float | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class Training(Record):
    """What a real model learnt in an epoch (`epochs[i].training`)."""

    loss: float | None = key(default=None, optional=True)
    accuracy: float | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class EpochCheckpoint(Record):
    """An epoch's checkpoints across ranks (`epochs[i].checkpoint`): saves started in it,
    the slowest rank's blocked time, AU with the checkpoints' time in the wall."""

    saves: int
    blocked_s_max: float
    blocked_s_mean: float
    wall_with_checkpoint_s: float
    au_with_checkpoint_mean: float | None
    au_with_checkpoint_min: float | None
    bytes: int | None
    write_s_max: float | None
    drain: DrainSplit | None


@dataclass(frozen=True, kw_only=True)
class TierBytes(Record):
    """A storage tier's counters over one epoch (`epochs[i].tier_bytes`), rank 0's node.

    Deltas of a `counters()` source: the emulated parallel filesystem's daemon names the
    first two (docs/results-schema.md, `tier`); another source's are kept as they are. On a
    FUSE mount whose daemon runs on this host (`core.fusedaemon`), the daemon's writes and
    their bytes over the epoch, with what one read cost in them (calibrated before the
    first epoch) and `source`, what they count."""

    bytes_served: int | None = key(default=None, optional=True)  # bytes returned for reads
    read_requests: int | None = key(default=None, optional=True)
    daemon_replies: int | None = key(default=None, optional=True)  # its /proc/PID/io syscw
    daemon_reply_bytes: int | None = key(default=None, optional=True)  # its wchar, bytes
    replies_per_read: float | None = key(default=None, optional=True)  # calibrated
    reply_overhead_bytes: float | None = key(default=None, optional=True)  # per read, bytes
    source: str | None = key(default=None, optional=True)  # what the daemon_* figures count


@dataclass(frozen=True, kw_only=True)
class HostCpuRecord(Record):
    """The host's busy CPU over a timed window (`host_cpu`), rank 0's host (`core.hostcpu`).

    User, nice, system, irq and softirq seconds summed over the host's `cpus` online CPUs:
    every process on the host counts (a one-box tier's daemons, other work), not only
    iobench's; `source` says so."""

    busy_s: float  # CPU seconds, all CPUs summed
    cpus: int
    source: str
    # train: the part of busy_s from the epoch's start to its first step's batch on rank 0
    # (every rank's where ranks synchronise each step; the loaders' start-up, first reads)
    first_batch_busy_s: float | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class EpochResume(Record):
    """An epoch `train --resume` started part-way (`epochs[i].resumed`), figures of its steps.

    The steps run, not a whole epoch's: compare labels it beside whole epochs."""

    steps_before: int  # steps of the epoch trained before the checkpoint, not run again
    samples_skipped: int  # their samples, all ranks: the epoch's order starts after them


@dataclass(frozen=True, kw_only=True)
class Epoch(Record):
    """One epoch of one repetition (`epochs[i]`)."""

    repeat: int = key(default=0, optional=True)  # absent in v1: one repetition
    epoch: int
    summary: EpochSummary
    ranks: tuple[RankRecord, ...] = key(min_len=1)
    per_node: tuple[NodeRecord, ...] = key(default=(), optional=True, min_len=1)
    cache: EpochCache
    training: Training | None
    checkpoint: EpochCheckpoint | None = key(default=None, optional=True)
    resumed: EpochResume | None = key(default=None, optional=True)
    tier_bytes: TierBytes | None = key(default=None, optional=True)  # absent in old documents
    # the host's busy CPU over the same window as tier_bytes: absent in old documents
    host_cpu: HostCpuRecord | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class RunConfig(Record):
    """The run's `TrainConfig` (`config`)."""

    loader: str
    storage: str
    dataset: str
    workers: int
    batch_size: int
    shuffle: str
    epochs: int
    worker_type: str | None = key(Str, default=None, optional=True)
    compute_time_s: float | None = key(default=None, optional=True)
    repeat: int = key(default=1, optional=True)
    max_steps: int | None = key(default=None, optional=True)
    # what names the dataset and the run, for the commands a verdict suggests
    format: str | None = key(default=None, optional=True)
    model: str | None = key(default=None, optional=True)
    seed: int | None = key(default=None, optional=True)
    decode: bool | None = key(default=None, optional=True)
    data: str | None = key(default=None, optional=True)
    data_key: str | None = key(default=None, optional=True)
    label_key: str | None = key(default=None, optional=True)
    evict_cmd: str | None = key(default=None, optional=True)
    tier: str | None = key(default=None, optional=True)  # --tier NAME
    trace: str | None = key(default=None, optional=True)  # train --trace FILE (absolute)


@dataclass(frozen=True, kw_only=True)
class WorldInfo(Record):
    """The job's ranks and nodes (`world`)."""

    size: int = key(Int)
    num_nodes: int = key(Int)
    local_size: int | None = key(Int, default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class Device(Record):
    """Where the model ran (`compute.device`)."""

    type: str
    name: str | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class DemandInfo(Record):
    """The model's compute-only rate on this rank (`compute.demand`, `iobench.core.demand`):
    samples/s with its input resident on the device, i.e. what the accelerator asks of the
    loader."""

    samples_per_s: float
    ms_per_step: float
    batch_size: int
    device: str
    warmup: int
    steps: int


@dataclass(frozen=True, kw_only=True)
class Compute(Record):
    """What compute meant in the run (`compute`)."""

    kind: str = key(Enum("model", "emulated", "none"))
    model: str | None = key(default=None, optional=True)
    compute_time_s: float | None = key(default=None, optional=True)
    device: Device | None = key(default=None, optional=True)
    task: str | None = key(default=None, optional=True)
    decode: bool | None = key(default=None, optional=True)
    amp: bool | None = key(default=None, optional=True)
    demand: DemandInfo | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class CachePolicy(Record):
    """The run's cache policy (`cache`)."""

    mode: str = key(Enum("cold", "warm"))


@dataclass(frozen=True, kw_only=True)
class DatasetInfo(Record):
    """The dataset's identity, from its manifest (`dataset`)."""

    dataset: str
    format: str
    num_samples: int
    total_bytes: int
    root: str | None = key(default=None, optional=True)

    @property
    def sample_bytes(self) -> float | None:
        """Mean bytes per sample (None without samples)."""
        return self.total_bytes / self.num_samples if self.num_samples else None


@dataclass(frozen=True, kw_only=True)
class StorageInfo(Record):
    """The mount that held the dataset (`provenance.storage`)."""

    path: str | None = key(Str, default=None, optional=True)
    fstype: str | None = key(Str, default=None, optional=True)
    kind: str | None = key(Str, default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class Job(Record):
    """The batch job the run was part of (`provenance.job`, v3)."""

    scheduler: str
    id: str | None
    name: str | None
    nodelist: str | None
    nodes: int | None
    tasks_per_node: int | None
    partition: str | None


@dataclass(frozen=True, kw_only=True)
class Gpu(Record):
    """A GPU of the host (`provenance.gpus`)."""

    name: str


@dataclass(frozen=True, kw_only=True)
class Host(Record):
    """The machine a document was measured on (`provenance`, `iobench.core.sysinfo.provenance`)."""

    host: str | None = key(Str, default=None, optional=True)
    os: str | None = key(default=None, optional=True)
    cpu_model: str | None = key(default=None, optional=True)
    cpu_count: int | None = key(default=None, optional=True)
    memory_bytes: int | None = key(default=None, optional=True)
    gpus: tuple[Gpu, ...] | None = key(default=None, optional=True)
    versions: Mapping[str, Any] | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class Provenance(Host):
    """Where and with what the run ran (`provenance`)."""

    storage: StorageInfo = key(default=StorageInfo(), optional=True)
    job: Job | None = key(default=None, optional=True)
    cpu_affinity: int | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class Straggler(Record):
    """A node whose stall stood out (`summary.verdict.stragglers`, v3)."""

    node: int
    name: str
    stall_s: float
    median_stall_s: float
    factor: float | None


@dataclass(frozen=True, kw_only=True)
class Verdict(Record):
    """The run's verdict (`summary.verdict`; `iobench.workflows.verdict`)."""

    status: str
    au: float | None = key(default=None, optional=True)
    threshold: float
    bottleneck: str
    evidence: tuple[str, ...] = key(default=(), optional=True)
    advice: tuple[str, ...] = key(default=(), optional=True)
    line: str
    stragglers: tuple[Straggler, ...] = key(default=(), optional=True)


@dataclass(frozen=True, kw_only=True)
class Summary(Record):
    """Totals over the run (`summary`)."""

    spread: Mapping[str, Spread | None] | None = key(default=None, optional=True)
    verdict: Verdict | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class StagingSpread(Record):
    """The spread of repeated stagings (`staging.spread`)."""

    stage_s: Spread | None
    stage_MBps: Spread | None


@dataclass(frozen=True, kw_only=True)
class Staging(Record):
    """A copy of the dataset to faster storage (`staging`, or an `iobench.stage` document)."""

    stage_s: float
    stage_bytes: int
    stage_MBps: float | None = key(default=None, optional=True)
    source: Any = key(name="from")  # {root, fstype, ...} or a bare path
    dest: Any = key(name="to")
    skipped_files: int = key(default=0, optional=True)
    spread: StagingSpread | None = key(default=None, optional=True)
    repeats: int = key(default=1, optional=True)
    mode: str | None = key(default=None, optional=True)
    shuffle_scope: str | None = key(default=None, optional=True)
    # what each copy was checked by (`--verify`), and the seconds its sha256 took (copy
    # workers' time summed; null with size): absent before issue 31
    verify: str | None = key(Opt(Enum("full", "size")), default=None, optional=True)
    checksum_s: float | None = key(default=None, optional=True)
    checksum_share: float | None = key(default=None, optional=True)
    # the host's busy CPU over the copy, the median repetition's `busy_s` (each repetition's
    # is in `repetitions[i].host_cpu`): absent in older documents
    host_cpu: HostCpuRecord | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class TierProfile(Record):
    """The emulated tier's profile (`tier.profile`)."""

    name: str


@dataclass(frozen=True, kw_only=True)
class Tier(Record):
    """The emulated parallel filesystem the run read through (`tier`)."""

    profile: TierProfile


@dataclass(frozen=True, kw_only=True)
class Ceilings(Record):
    """A clockless loader's (DALI's) rates in bounded passes after the epochs (`ceilings`,
    `iobench.workflows.ceilings`): samples/s cold without decoding, in memory without and
    with decoding, with `threads` (its workers) on `device`."""

    batches: int
    threads: int
    device: str
    cold: bool
    cold_fetch_samples_per_s: float
    cold_fetch_MBps: float
    warm_fetch_samples_per_s: float
    warm_decode_samples_per_s: float
    method: str = key(default="", optional=True)


@dataclass(frozen=True, kw_only=True)
class SaveDrain(Record):
    """A checkpoint's copy to the shared tier (`checkpoint.saves[i].drain`)."""

    path: str
    bytes: int
    drain_s: float
    queued_s: float  # waiting for the drain of an earlier checkpoint
    kept_up: bool | None  # done within one checkpoint interval of the commit


@dataclass(frozen=True, kw_only=True)
class CheckpointSave(Record):
    """One checkpoint a training run saved (`checkpoint.saves[i]`): MLPerf's duration (the
    slowest rank's write), the slowest rank's blocked time, rank 0's commit."""

    index: int
    repeat: int
    epoch: int
    step: int
    path: str
    bytes: int
    write_s: float
    save_s: float
    blocked_s: float
    waited_s: float
    stage_s: float  # async: the copy of the state to CPU memory (in blocked_s)
    commit_s: float
    drain: SaveDrain | None


@dataclass(frozen=True, kw_only=True)
class CheckpointYoung(Record):
    """Young/Daly's interval from the measured cost of a save (`checkpoint.summary.young`)."""

    mtbf_s: float
    cost_s: float
    restart_s: float
    optimal_s: float
    lost_per_day_s: float
    used_s: float | None
    lost_per_day_used_s: float | None
    step_s: float
    used_steps: int
    optimal_steps: int


@dataclass(frozen=True, kw_only=True)
class CheckpointSummary(Record):
    """A training run's checkpoints in sum (`checkpoint.summary`)."""

    saves: int
    cost_s: float | None  # the median time a save blocked the steps
    save_s_median: float | None
    write_s_median: float | None
    bytes_median: float | None
    blocked_s: float
    fraction: float | None  # of training time (with the checkpoints' time)
    interval_steps: int
    step_s: float | None
    interval_s: float | None
    final_drain_wait_s: float | None
    drains_kept_up: bool | None
    young: CheckpointYoung | None


@dataclass(frozen=True, kw_only=True)
class CheckpointResume(Record):
    """The checkpoint a resumed run carried on from (`checkpoint.resumed`, `train --resume`).

    The run's figures are its own steps' alone."""

    path: str
    run_id: str  # the run that saved it
    epoch: int  # the epoch it was saved in (0-based)
    epoch_step: int  # steps of that epoch done
    step: int  # steps of the training run done
    load_s: float  # the slowest rank's load
    bytes: int
    skipped: tuple[str, ...]  # complete-looking checkpoints refused, and why


@dataclass(frozen=True, kw_only=True)
class TrainCheckpoint(Record):
    """Checkpoints saved while training (`checkpoint`, `train --checkpoint-every`)."""

    mode: str = key(Enum("sync", "async"))
    every_steps: int
    keep: int
    to: str
    drain_to: str | None
    saves: tuple[CheckpointSave, ...]
    kept: tuple[str, ...]
    drained: tuple[str, ...]
    summary: CheckpointSummary
    resumed: CheckpointResume | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class TrainResult(Record):
    """An `iobench.result` document: one `iobench train` run (v1, v2, v3 and v4 load)."""

    EXTRA: ClassVar[bool] = False

    schema: str = key(Enum(SCHEMA))
    schema_version: int = key(Enum(*READABLE_VERSIONS))
    run_id: str
    created: str
    kind: str = key(Enum("train"))
    config: RunConfig
    world: WorldInfo
    compute: Compute
    cache: CachePolicy
    dataset: DatasetInfo
    provenance: Provenance
    epochs: tuple[Epoch, ...]
    summary: Summary
    warnings: tuple[str, ...]
    staging: Staging | None = key(default=None, optional=True)
    tier: Tier | None = key(default=None, optional=True)
    loader: Mapping[str, Any] | None = key(default=None, optional=True)
    ceilings: Ceilings | None = key(default=None, optional=True)
    status: str = key(Enum("complete", "interrupted", "incomplete"), default="complete",
                      optional=True)
    status_reason: str | None = key(default=None, optional=True)
    checkpoint: TrainCheckpoint | None = key(default=None, optional=True)

    @property
    def repetitions(self) -> int:
        """How many repetitions (`--repeat N`) the result holds (1 for v1 results)."""
        return len({e.repeat for e in self.epochs}) or 1

    @property
    def complete(self) -> bool:
        """Whether the result holds a whole run (results before v2's `status` always do)."""
        return self.status == "complete"


# ------------------------------------------------------- the other workflows' documents

@dataclass(frozen=True, kw_only=True)
class StageDataset(Record):
    """What an `iobench stage` document copied (`dataset`)."""

    dataset: str
    format: str


@dataclass(frozen=True, kw_only=True)
class StageDoc(Staging):
    """An `iobench.stage` document (the fields readers use)."""

    created: str
    dataset: StageDataset
    provenance: Host | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class SampleRead(Record):
    """Random reads at one sample size (`summary.sample_reads` of a probe)."""

    sample_bytes: float = key(Num)
    MBps: float | None


@dataclass(frozen=True, kw_only=True)
class ProbeSummary(Record):
    """A probe's headline figures: the best over its reader counts."""

    seq_read_MBps: float | None
    seq_write_MBps: float | None
    rand4k_read_iops: float | None
    rand4k_read_MBps: float | None
    sample_read_MBps: float | None
    sample_bytes: int
    create_per_s: float | None
    stat_per_s: float | None
    open_read_close_per_s: float | None
    readers_max: int
    sample_reads: tuple[SampleRead, ...] = key(default=(), optional=True)
    # random sample-size reads through the page cache, as loaders read (absent before them)
    buffered_read_iops: float | None = key(default=None, optional=True)
    buffered_read_MBps: float | None = key(default=None, optional=True)
    buffered_bs_bytes: int | None = key(default=None, optional=True)
    buffered_readers: int | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class ProbeStorage(Record):
    """The probed mount (`storage`)."""

    path: str
    fstype: str
    kind: str


@dataclass(frozen=True, kw_only=True)
class ProbeDoc(Record):
    """An `iobench.probe` document (the fields readers use)."""

    label: str
    created: str
    engine: str
    direct: bool
    write_via: str | None = key(default=None, optional=True)
    storage: ProbeStorage
    summary: ProbeSummary
    warnings: tuple[str, ...] = key(default=(), optional=True)
    provenance: Host | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class SweepTier(Record):
    """A tier a sweep named (`config.tiers`)."""

    name: str
    path: str
    stage_to: str | None = key(default=None, optional=True)
    stage_name: str | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class SweepPlan(Record):
    """A sweep's configuration (`config`)."""

    tiers: tuple[SweepTier, ...] = key(default=(), optional=True)


@dataclass(frozen=True, kw_only=True)
class SweepRun(Record):
    """One run of a sweep and how it ended (`runs`)."""

    label: str
    status: str
    error: str | None = key(default=None, optional=True)


@dataclass(frozen=True, kw_only=True)
class SweepBreakEven(Record):
    """A staging's break-even after a sweep's runs (`break_evens`; a number only if it pays off).

    `outcome` is `pays off` (after `break_even_epochs`), `never`, `not
    significant` (the epoch times are within their spread over `spread_over`:
    no number) or `not computed` (`text` says why).
    """

    dataset: str
    format: str
    source: str = key(name="from")
    dest: str = key(name="to")
    run: str | None
    stage_s: float | None
    epoch_slow_s: float | None
    epoch_fast_s: float | None
    outcome: str = key(Enum("pays off", "never", "not significant", "not computed"))
    break_even_epochs: float | None
    significant: bool | None
    spread_over: str | None
    text: str


@dataclass(frozen=True, kw_only=True)
class SweepDoc(Record):
    """An `iobench.sweep` document (the fields readers use)."""

    config: SweepPlan = key(default=SweepPlan(), optional=True)
    runs: tuple[SweepRun, ...] = key(default=(), optional=True)
    break_evens: tuple[SweepBreakEven, ...] = key(default=(), optional=True)


@dataclass(frozen=True, kw_only=True)
class SearchPoint(Record):
    """One accelerator count a search measured (`points`)."""

    accelerators: int
    au: float = key(Num)
    au_min: float | None = key(default=None, optional=True)
    au_max: float | None = key(default=None, optional=True)
    samples_per_s: float | None
    read_MBps: float | None
    passed: bool


@dataclass(frozen=True, kw_only=True)
class SearchPlan(Record):
    """A search's configuration (`config`, the `SearchConfig`)."""

    workload: str
    accelerator: str
    storage: str
    repeat: int = key(default=1, optional=True)


@dataclass(frozen=True, kw_only=True)
class SearchWorkload(Record):
    """The workload a search emulated (`workload`)."""

    name: str
    accelerator: str
    demand_MBps: float


@dataclass(frozen=True, kw_only=True)
class SearchDataset(Record):
    """The dataset a search read (`dataset`)."""

    root: str


@dataclass(frozen=True, kw_only=True)
class SearchDoc(Record):
    """An `iobench.search` document (the fields readers use)."""

    run_id: str
    created: str
    status: str = key(Enum("complete", "interrupted"))
    status_reason: str | None = key(default=None, optional=True)
    config: SearchPlan
    workload: SearchWorkload
    dataset: SearchDataset
    threshold: float
    max_accelerators: int
    points: tuple[SearchPoint, ...]
    warnings: tuple[str, ...]


# ------------------------------------------------------------------------------ the docs

DOCUMENTED: tuple[tuple[str, type[Record]], ...] = (
    ("iobench.result", TrainResult), ("iobench.stage", StageDoc), ("iobench.probe", ProbeDoc),
    ("iobench.sweep", SweepDoc), ("iobench.search", SearchDoc))


def _walk(cls: type[Record], path: str) -> Iterator[tuple[str, type[Record]]]:
    yield path, cls
    for f, hint in _fields(cls):
        inner = _inner(hint) or hint
        if get_origin(inner) is tuple:
            inner, sub = get_args(inner)[0], f"{path}.{_json_name(f)}[i]"
        elif get_origin(inner) is Mapping:
            inner, sub = get_args(inner)[1], f"{path}.{_json_name(f)}.<figure>"
            inner = _inner(inner) or inner
        else:
            sub = f"{path}.{_json_name(f)}"
        if _is_record(inner):
            yield from _walk(inner, sub)


def schema_markdown() -> str:
    """The typed fields of every document, one table per record (docs/results-schema.md)."""
    out = []
    for schema, top in DOCUMENTED:
        seen: set[str] = set()
        for path, cls in _walk(top, schema):
            if path in seen:
                continue
            seen.add(path)
            spec = cls.spec()
            doc = (cls.__doc__ or "").strip().splitlines()[0]
            out += [f"#### `{path}` ({cls.__name__})", "", doc, "", "| key | type | required |",
                    "|---|---|---|"]
            out += [f"| `{k}` | {s.name} | {'no' if k in spec.optional else 'yes'} |"
                    for k, s in spec.keys.items()]
            out += ["", "Other keys: " + ("allowed, kept as they are." if spec.extra
                                          else "an error."), ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":  # the block docs/results-schema.md holds between its markers
    print(schema_markdown(), end="")
