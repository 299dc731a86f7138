"""`train --trace FILE`: each rank's per-step spans, written as Chrome trace-event JSON (Perfetto).

The training loop keeps its clocks anyway (`EpochClock`: wait and compute
per step, which tile the epoch; `Batch.timing`: a loader worker's fetch and
decode per batch). With a trace asked for, a step appends one tuple to the
epoch's list (`StepClocks.add`: when its batch arrived, when it was on the
device, the batch's own clocks); the epoch's tuples and the
clock become one integer array per rank (`epoch_part`), gathered to rank 0
with the epoch's figures. Rank 0 keeps them (`Trace`) and writes the JSON
once, at the end of the run (`write_trace`): no string is built while a
step runs.

The file: `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData":
{"iobench": ...}}`, events `{"name", "ph": "X", "ts", "dur", "pid", "tid",
"args"}` in microseconds. `pid` is the rank; `tid` one lane per kind (epoch,
wait, host-to-device, compute, checkpoint) and one per loader worker (fetch,
decode). With `--checkpoint-every`, what ran beside the steps has lanes of its
own (`Background`, category "checkpoint"): an async save's write on each rank,
rank 0's drain to `--drain-to`; they reach rank 0 with the repetition's saves.
A kind nothing measured is absent, and `otherData.iobench.spans` says why.
Times are `perf_counter_ns` reads, one clock per host (loader workers share
it); each host's origin is the first epoch's start of its earliest rank,
which every rank reaches from the same barrier, so hosts line up to within
that barrier's skew.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from iobench.core.dataref import DatasetRef
from iobench.core.errors import ConfigError, StorageError
from iobench.core.jsonio import atomic_file
from iobench.core.metrics import EpochClock

TRACE_OPTION = "--trace"
TRACE_FORMAT = "chrome-trace-event-json"
# every kind a trace can hold, in lane order; checkpoint: the time a save blocked the steps
# (train --checkpoint-every); checkpoint_write: an async save's write after the steps went
# on; drain: rank 0's copy of a checkpoint to --drain-to. Each in its own lane, of category
# "checkpoint". A new kind is a new event name a reader may skip: the file keeps its format
KINDS = ("epoch", "wait", "h2d", "compute", "fetch", "decode", "checkpoint",
         "checkpoint_write", "drain")
LANES = {"epoch": 1, "wait": 2, "h2d": 3, "compute": 4, "checkpoint": 5,
         "checkpoint_write": 6, "drain": 7}
LANE_NAMES = {"epoch": "epoch", "wait": "wait (data stall)", "h2d": "host-to-device",
              "compute": "compute", "checkpoint": "checkpoint (steps blocked)",
              "checkpoint_write": "checkpoint write (async, in the background)",
              "drain": "checkpoint drain to --drain-to (in the background)"}
CATEGORY = "checkpoint"  # the "cat" of every checkpoint kind
WORKER_LANE = 100  # + worker id: a loader worker process (fetch, decode)
IN_PROCESS_LANE = 1000  # + lane: batches made in the rank's own process (threads, workers=0)
NO_TIMING = -1  # `read_ns` of a step whose batch carried no clock

# the columns of an epoch part: where each step's wait begins, its batch is usable (the
# wait ends, compute begins), its compute ends; when `next()` returned it, when it was on
# the device (0: no copy timed), and the batch's own clocks (Batch.timing)
COLUMNS = ("wait_start", "ready", "compute_end", "got", "h2d_end", "read_ns", "decode_ns",
           "done", "worker")


StepRow = tuple[int, int, tuple[int, int, int, int] | None]  # (got_ns, h2d_end_ns, timing)


class StepClocks:
    """One rank's per-step trace clocks over one epoch: `add((got_ns, h2d_end_ns, timing))`
    once a step, a bound `list.append` (a step's batch returned by `next()` at `got_ns`, on
    the device at `h2d_end_ns`, 0 when nothing was copied, with the loader's `Batch.timing`).
    A list cannot reserve room in Python: storing by index into one filled with None cost
    more per step than this append (0.85 against 0.55 us, timed on the loaded 2-core VM)."""

    __slots__ = ("add", "rows")

    def __init__(self) -> None:
        self.rows: list[StepRow] = []
        self.add: Callable[[StepRow], None] = self.rows.append


class EpochPart(NamedTuple):
    """One rank's spans of one epoch, as integers (ns): what rank 0 gathers."""

    rank: int
    host: str
    start_ns: int  # the epoch's clock start (before the first `next()`)
    end_ns: int  # the end of its last step's compute
    steps: np.ndarray  # int64 [steps, len(COLUMNS)]
    # (step, ns, checkpoint index): a checkpoint saved after that step blocked it ns
    blocked: tuple[tuple[int, int, int], ...] = ()


class Background(NamedTuple):
    """A checkpoint's work beside the steps on one rank (ns on that rank's host clock):
    `checkpoint_write`, an async save from its hand-off (the state copied to CPU memory,
    the steps going on) to the save complete (rank 0: committed), `mark_ns` when this
    rank's own shard was fsync'ed (0: unknown); `drain`, rank 0's copy to --drain-to from
    its start to its commit there, `mark_ns` when it was queued. `bytes`: the rank's
    shard, or the checkpoint copied."""

    kind: str  # "checkpoint_write" or "drain"
    rank: int
    repeat: int
    epoch: int  # the epoch whose step saved the checkpoint
    checkpoint: int  # the checkpoint's index over the run (its folder ckpt-NNN)
    start_ns: int
    end_ns: int
    mark_ns: int
    bytes: int
    mode: str  # the save's --checkpoint-mode


def epoch_part(rank: int, host: str, clock: EpochClock, steps: StepClocks,
               blocked: Sequence[tuple[int, int, int]] = ()) -> EpochPart:
    """The epoch's spans from its clock (wait and compute, which tile it with the time
    checkpoints blocked the steps: `blocked`, (step, ns, index) after that step's compute)
    and the steps' own clocks; only steps whose compute ended count, as in the result's
    figures."""
    if clock.start_ns is None:
        raise RuntimeError("EpochClock.start() was never called")
    n = clock.steps
    wait = np.asarray(clock.wait_ns[:n], dtype=np.int64)
    compute = np.asarray(clock.compute_ns[:n], dtype=np.int64)
    out = np.zeros((n, len(COLUMNS)), dtype=np.int64)
    shift = np.zeros(n, dtype=np.int64)  # the checkpoints' time before each step
    for k, ns, _ in blocked:
        shift[k + 1:] += ns
    out[:, 2] = clock.start_ns + np.cumsum(wait + compute) + shift
    out[:, 1] = out[:, 2] - compute
    out[:, 0] = out[:, 1] - wait
    out[:, 5] = NO_TIMING
    filled = steps.rows[:n]
    if filled:  # whole columns at once: a numpy item assignment per value costs ~1 us
        m = len(filled)
        out[:m, 3:5] = np.array([(got, h2d) for got, h2d, _ in filled], dtype=np.int64)
        out[:m, 5:9] = np.array([t[:4] if t is not None else _UNTIMED for _, _, t in filled],
                                dtype=np.int64)
    return EpochPart(rank, host, clock.start_ns, clock.end_ns, out,
                     tuple((k, ns, i) for k, ns, i in blocked if k < n))


_UNTIMED = (NO_TIMING, 0, 0, 0)


@dataclass
class Trace:
    """Every rank's epoch parts on rank 0, and what the run measured."""

    loader: str
    device: str  # "cpu" or "cuda": whether a host-to-device copy is timed
    run_id: str = ""
    checkpoints: bool = False  # the run saved checkpoints (train --checkpoint-every)
    checkpoint_mode: str = "sync"  # --checkpoint-mode
    drain: bool = False  # --drain-to: rank 0 copied each checkpoint to the shared tier
    parts: list[tuple[int, int, list[EpochPart]]] = field(default_factory=list)
    background: list[Background] = field(default_factory=list)  # every rank's, in order

    def add(self, rep: int, epoch: int, parts: Sequence[EpochPart | None]) -> None:
        """One epoch's parts, one per rank (gathered with the epoch's figures)."""
        self.parts.append((rep, epoch, [p for p in parts if p is not None]))

    def spans(self) -> dict[str, str]:
        """Each kind: "measured", or why the file holds none of it."""
        timed = any(bool((p.steps[:, 5] != NO_TIMING).any()) for _, _, ps in self.parts
                    for p in ps)
        loader_why = (f"not measured: the {self.loader} loader keeps no per-batch fetch and "
                      "decode clocks")
        return {
            "epoch": "measured", "wait": "measured",
            "h2d": "measured" if self.device == "cuda" else
                   "not measured: the batch is used where the loader left it (no device copy)",
            "compute": "measured",
            "fetch": "measured" if timed else loader_why,
            "decode": "measured" if timed else loader_why,
            "checkpoint": "measured: the time each save blocked the steps (an async "
                          "save's write and the drain go on beside them: checkpoint_write, "
                          "drain)" if self.checkpoints else _NO_CHECKPOINTS,
            **self._background_spans(),
        }

    def _background_spans(self) -> dict[str, str]:
        done = ("; a repetition's spans reach the file once its saves are complete: an "
                "interrupted repetition's are absent")
        write = (("measured: on each rank, an async save's write from its hand-off (the "
                  "state copied to CPU memory, the steps going on) to the save complete "
                  "(every rank's shard fsync'ed and DCP's metadata written; rank 0: "
                  "committed); args.shard_durable_us: when this rank's own shard was "
                  "fsync'ed (on the trace's clock, us), args.bytes: its shard's bytes"
                  + done)
                 if self.checkpoint_mode == "async" else
                 "not measured: sync saves write inside the steps' blocked time "
                 "(checkpoint)")
        drain = ("measured: on rank 0, each committed checkpoint's copy to --drain-to from "
                 "its start to its commit there; args.queued_us: when it was queued (on "
                 "the trace's clock, us; it waits behind an earlier copy), args.bytes: the "
                 "bytes copied" + done
                 if self.drain else "not measured: this run drained no checkpoints "
                 "(--drain-to)")
        if not self.checkpoints:
            write = drain = _NO_CHECKPOINTS
        return {"checkpoint_write": write, "drain": drain}


_NO_CHECKPOINTS = "not measured: this run saved no checkpoints (--checkpoint-every)"


def _origins(trace: Trace) -> dict[str, int]:
    """Each host's time origin (ns): its earliest rank's first epoch start."""
    out: dict[str, int] = {}
    for _, _, parts in trace.parts:
        for p in parts:
            out[p.host] = min(out.get(p.host, p.start_ns), p.start_ns)
    return out


def _event(name: str, start_ns: int, end_ns: int, origin: int, pid: int, tid: int,
           args: str, cat: str | None = None) -> str:
    return (f'{{"name":"{name}",' + (f'"cat":"{cat}",' if cat else "")
            + f'"ph":"X","ts":{(start_ns - origin) / 1000:.3f},'
            f'"dur":{max(end_ns - start_ns, 0) / 1000:.3f},"pid":{pid},"tid":{tid},'
            f'"args":{{{args}}}}}')


def _step_events(rep: int, epoch: int, p: EpochPart, origin: int,
                 lanes: _Lanes) -> Iterator[str]:
    """The X events of one rank's epoch: the epoch, then per step wait, h2d, compute, and
    the batch's fetch and decode in its worker's lane."""
    pid = p.rank
    tag = f'"repeat":{rep},"epoch":{epoch}'
    yield _event("epoch", p.start_ns, p.end_ns, origin, pid, LANES["epoch"],
                 f'{tag},"steps":{len(p.steps)}')
    for k, (w0, ready, c1, got, h2d, read, decode, done, worker) in enumerate(
            p.steps.tolist()):
        args = f'{tag},"step":{k}'
        yield _event("wait", w0, ready, origin, pid, LANES["wait"],
                     args + (',"first_batch":true' if k == 0 else ""))
        if h2d:
            yield _event("h2d", got, h2d, origin, pid, LANES["h2d"], args)
        yield _event("compute", ready, c1, origin, pid, LANES["compute"], args)
        if read != NO_TIMING:
            t0 = done - decode - read
            tid = lanes.lane(pid, worker, t0, done)
            yield _event("fetch", t0, done - decode, origin, pid, tid, args)
            yield _event("decode", done - decode, done, origin, pid, tid, args)
    for k, ns, index in p.blocked:
        end = int(p.steps[k, 2])
        yield _event("checkpoint", end, end + ns, origin, pid, LANES["checkpoint"],
                     f'{tag},"step":{k},"checkpoint":{index}', cat=CATEGORY)


def _background_event(b: Background, origin: int) -> str:
    """A checkpoint's write or drain, its args saying which save and how many bytes."""
    args = (f'"repeat":{b.repeat},"epoch":{b.epoch},"checkpoint":{b.checkpoint},'
            f'"bytes":{b.bytes},"mode":"{b.mode}"')
    if b.mark_ns:
        key = "shard_durable_us" if b.kind == "checkpoint_write" else "queued_us"
        args += f',"{key}":{(b.mark_ns - origin) / 1000:.3f}'
    return _event(b.kind, b.start_ns, b.end_ns, origin, b.rank, LANES[b.kind], args,
                  cat=CATEGORY)


class _Lanes:
    """Lanes of loader work per rank: one per worker process; batches made in the rank's own
    process (threads may overlap) go to the first lane free at their start."""

    def __init__(self) -> None:
        self.names: dict[tuple[int, int], str] = {}
        self.free_at: dict[int, list[int]] = {}  # rank -> each in-process lane's last end

    def lane(self, rank: int, worker: int, start: int, end: int) -> int:
        if worker >= 0:
            tid = WORKER_LANE + worker
            self.names.setdefault((rank, tid), f"loader worker {worker}: fetch, decode")
            return tid
        ends = self.free_at.setdefault(rank, [])
        k = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        if k == len(ends):
            ends.append(end)
        ends[k] = end
        tid = IN_PROCESS_LANE + k
        self.names.setdefault((rank, tid), f"loader in the rank's process, lane {k}: "
                                           "fetch, decode")
        return tid


def _meta(name: str, pid: int, tid: int | None, value: str, sort: int) -> Iterator[str]:
    """A name event for a rank (tid None) or a lane, and its place in the viewer's order."""
    where: dict[str, int] = {"pid": pid} if tid is None else {"pid": pid, "tid": tid}
    yield json.dumps({"name": name, "ph": "M", **where, "args": {"name": value}})
    sort_name = "process_sort_index" if tid is None else "thread_sort_index"
    yield json.dumps({"name": sort_name, "ph": "M", **where, "args": {"sort_index": sort}})


def trace_events(trace: Trace) -> Iterator[str]:
    """Every event of the trace as one JSON object each, metadata (names of ranks and
    lanes) last, once the lanes are known."""
    origins = _origins(trace)
    lanes = _Lanes()
    ranks: dict[int, str] = {}
    used: dict[int, set[str]] = {}
    for rep, epoch, parts in trace.parts:
        for p in parts:
            ranks[p.rank] = p.host
            used.setdefault(p.rank, set()).update(
                ["epoch", "wait", "compute"] + (["h2d"] if p.steps[:, 4].any() else [])
                + (["checkpoint"] if p.blocked else []))
            yield from _step_events(rep, epoch, p, origins[p.host], lanes)
    for b in trace.background:
        if b.rank in ranks:  # a rank with no epoch in the file has no clock origin
            used[b.rank].add(b.kind)
            yield _background_event(b, origins[ranks[b.rank]])
    for rank, host in sorted(ranks.items()):
        yield from _meta("process_name", rank, None, f"rank {rank} ({host})", rank)
        for kind in LANES:
            if kind in used[rank]:
                yield from _meta("thread_name", rank, LANES[kind], LANE_NAMES[kind],
                                 LANES[kind])
    for (rank, tid), name in sorted(lanes.names.items()):
        yield from _meta("thread_name", rank, tid, name, tid)


def other_data(trace: Trace, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """`otherData.iobench`: what the file holds and how to read it."""
    ranks = sorted({p.rank for _, _, ps in trace.parts for p in ps})
    return {"format": TRACE_FORMAT, "run_id": trace.run_id, "loader": trace.loader,
            "device": trace.device, "ranks": len(ranks), "time_unit": "us",
            "spans": trace.spans(),
            "layout": "one file for every rank: pid = rank; each rank's spans are gathered "
                      "to rank 0 with each epoch's figures and written at the end of the run",
            "clock": "perf_counter_ns per host (loader workers share it); origin: the first "
                     "epoch's start of the host's earliest rank, after the barrier every "
                     "rank starts an epoch from",
            "wait": "from the end of the previous step's compute (or the epoch's start) to "
                    "the batch usable on the device: the waits of an epoch sum to the "
                    "rank's stall_s (first_batch_s included)",
            **(extra or {})}


def write_trace(path: str | Path, trace: Trace, extra: dict[str, Any] | None = None) -> Path:
    """Write `trace` to `path` atomically (a temporary name in its folder, fsync, rename),
    streaming events so that no whole document is held as objects."""
    path = Path(path)
    try:
        with atomic_file(path, text=True) as f:
            f.write('{"traceEvents":[\n')
            for i, ev in enumerate(trace_events(trace)):
                f.write(ev if i == 0 else ",\n" + ev)
            f.write('\n],"displayTimeUnit":"ms","otherData":{"iobench":')
            f.write(json.dumps(other_data(trace, extra)))
            f.write("}}\n")
    except OSError as e:
        raise StorageError(f"{TRACE_OPTION} {path}: cannot write it ({e.strerror or e})") from e
    return path


def check_trace_path(path: str | Path, dataset: DatasetRef) -> Path:
    """`path` when a trace can be written there: not a directory, in a writable folder, and
    outside the dataset (a generated dataset's folder, or the user's `--data`)."""
    from iobench.core.outputs import writable_file

    data = Path(dataset.storage if dataset.user_data else dataset.root).resolve()
    target = Path(path).resolve()
    if target == data or (data.is_dir() and data in target.parents):
        what = f"--data {dataset.data}" if dataset.user_data else f"the dataset {dataset.root}"
        raise ConfigError(f"{TRACE_OPTION} {path} is inside {what}: iobench never writes "
                          f"into a dataset; give {TRACE_OPTION} a file outside it")
    return writable_file(path, TRACE_OPTION)
