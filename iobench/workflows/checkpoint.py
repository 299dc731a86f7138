"""The `checkpoint` command: write N checkpoints with torch.distributed.checkpoint, then read them back cold.

Every rank saves its shard of a layout (`iobench.core.checkpoint_layout`) with DCP, one
fsync'ed file per rank, committed with a completion marker (`iobench.core.checkpoint_store`).
Then every rank evicts its shard, reads it back, and compares the OS's count of bytes read
with the checkpoint's. Per rank: seconds and GB/s; per checkpoint, MLPerf Storage's
figures: the duration is the slowest rank's, the throughput the checkpoint's bytes over
that duration, beside the slowest rank's own GB/s; over `--repeat` checkpoints, the spread.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from iobench.core import cache, distributed, faults, procio
from iobench.core.checkpoint_io import lean_dcp
from iobench.core.checkpoint_layout import (
    Layout,
    build_state,
    empty_state,
    layout_for,
    model_names,
    parse_scale,
)
from iobench.core.checkpoint_store import (
    METADATA,
    Marker,
    check_marker,
    check_tensors,
    claim,
    commit,
    forget_plans,
    fsync_dir,
    load_metadata,
    partial_dir,
    reader,
    release,
    save_planner,
    sha256_of,
    sweep_partials,
    writer,
)
from iobench.core.dataref import refuse_in_dataset
from iobench.core.errors import ConfigError, IobenchError, StorageError
from iobench.core.interrupts import Interrupted, act_now
from iobench.core.options import parse_evict_cmd, parse_repeat
from iobench.core.resilience import parse_mtbf, young
from iobench.core.results import new_run_id, now_iso, write_document
from iobench.core.schema import Count, List, Map, NonNeg, Num, Opt, SchemaError, Str, check
from iobench.core.spread import spread
from iobench.core.world import World, agree

SCHEMA = "iobench.checkpoint"
SCHEMA_VERSION = 1
GB = 1e9
ITEM_OVERHEAD = 2048  # bytes DCP adds per tensor (torch.save's record), an upper bound
READ_SHORT = 0.95  # OS read bytes below this share of the shard: part came from a cache


@dataclass(frozen=True)
class CheckpointConfig:
    """One `iobench checkpoint` run: write `repeat` checkpoints to `storage` then read them,
    or (`read`) read an existing one `repeat` times."""

    storage: str | None = None
    read: str | None = None
    model: str = "llama3-8b"
    scale: float = 1.0
    repeat: int = 1
    seed: int = 0
    results: str = "iobench-results"
    evict_cmd: str | None = None
    keep: bool = False  # keep the checkpoints written (default: removed after the reads)
    timeout_s: float = 600.0  # a collective that waits longer fails (a rank died)
    mtbf_h: float | None = None  # the job's mean time between failures: Young's interval
    interval_s: float | None = None  # the interval checkpoints are taken at now, to compare

    def __post_init__(self) -> None:
        if (self.storage is None) == (self.read is None):
            raise ConfigError("give --storage DIR (write, then read checkpoints there) or "
                              "--read DIR (read a checkpoint written before), one of them")
        parse_scale(self.scale)
        parse_repeat(self.repeat, "checkpoints written, then read (MLPerf Storage: 10)")
        parse_evict_cmd(self.evict_cmd)
        if self.model not in model_names():
            raise ConfigError(f"unknown model {self.model!r}; choose one of: "
                              f"{', '.join(model_names())}")
        if self.seed < 0:
            raise ConfigError(f"--seed {self.seed} must be >= 0")
        self._check_mtbf()

    def _check_mtbf(self) -> None:
        parse_mtbf(self.mtbf_h)
        if self.mtbf_h is not None and self.read is not None:
            raise ConfigError("--mtbf needs a checkpoint's cost, which the writes measure: "
                              "drop --read (give --storage) or drop --mtbf")
        if self.interval_s is not None and (self.mtbf_h is None or not self.interval_s > 0):
            raise ConfigError(f"--interval {self.interval_s!r}: give it in seconds (> 0), "
                              "with --mtbf HOURS")


@dataclass(frozen=True)
class CheckpointOutcome:
    """What the job did: rank 0's result document and where it went, and the exit status."""

    exit_code: int
    doc: dict[str, Any] | None = None
    path: Path | None = None
    interrupted: str | None = None


@dataclass
class _Plan:
    """Where this run's checkpoints go (or the one it reads), agreed by every rank."""

    layout: Layout
    seed: int
    run_id: str
    run_dir: Path | None  # the folder of this run's checkpoints (None: --read)
    targets: list[Path] = field(default_factory=list)  # the checkpoints to read, in order
    warnings: list[str] = field(default_factory=list)


def checkpoint_job(cfg: CheckpointConfig, world: World) -> CheckpointOutcome:
    """`iobench checkpoint` on this rank, with the job's abort policy (as `train`'s): an error
    every rank raised is raised on rank 0; one rank's own failure ends every rank (exit 3);
    an interrupt leaves the complete checkpoints and removes the one being written."""
    try:
        return run_checkpoints(cfg, world)
    except Interrupted as e:
        return CheckpointOutcome(e.exit_code, interrupted=str(e))
    except IobenchError as e:
        if e.agreed or world.size == 1:
            if world.is_root:
                raise
            return CheckpointOutcome(e.exit_code)
        world.end_job(f"rank {world.rank} failed: {e}")
    except Exception as e:
        if world.size == 1:
            raise
        world.end_job(f"rank {world.rank} failed: {type(e).__name__}: {e}")
    return CheckpointOutcome(3)


def run_checkpoints(cfg: CheckpointConfig, world: World) -> CheckpointOutcome:
    """Plan (every check before anything is written), write, read, and write rank 0's result."""
    plan = _plan(cfg, world)
    distributed.init_process_group(world, False, cfg.timeout_s)
    done = False
    try:
        state = (build_state(plan.layout, world.rank, plan.seed) if plan.run_dir is not None
                 else empty_state(plan.layout, world.rank))  # --read: loaded over
        writes = []
        if plan.run_dir is not None:
            forget_plans()  # the run's first save plans in full (DCP's plan cache)
            for k in range(cfg.repeat):
                writes.append(_write_one(plan, state, world, k))
                plan.targets.append(plan.run_dir / _name(k))
        written_ns = time.perf_counter_ns()
        reads = [_read_one(cfg, plan, state, world, k % len(plan.targets))
                 for k in range(cfg.repeat)]
        # MLPerf Storage v3.0: the reads start within 30 s of the writes' end
        gap_s = (reads[0].pop("start_ns") - written_ns) / 1e9 if writes else None
        for r in reads:
            r.pop("start_ns", None)
        done = True
    finally:
        distributed.destroy_process_group()
        _clean_up(cfg, plan, world, done)
    act_now()  # no collective is left
    if not world.is_root:
        return CheckpointOutcome(0)
    doc = _document(cfg, plan, world, writes, reads)
    doc["summary"]["read_gap_s"] = gap_s
    doc["summary"]["young"] = _young(cfg, writes, reads)
    validate(doc)
    return CheckpointOutcome(0, doc, write_document(doc, cfg.results, "checkpoint"))


@contextlib.contextmanager
def _alone_quietly(world: World) -> Iterator[None]:
    """DCP warns that a single process saves without torch.distributed: that is meant here."""
    with warnings.catch_warnings():
        if world.size == 1:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _name(k: int) -> str:
    return f"ckpt-{k:03d}"


# ------------------------------------------------------------------------------ planning

def _plan(cfg: CheckpointConfig, world: World) -> _Plan:
    """Check the request on every rank (the same error everywhere, nothing written yet)."""
    plan: _Plan | None = None
    err: BaseException | None = None
    try:
        plan = _plan_read(cfg, world) if cfg.read is not None else _plan_write(cfg, world)
    except IobenchError as e:
        err = e
    agree(world, err)
    assert plan is not None
    plan.run_id = world.bcast(new_run_id())
    if cfg.storage is not None:
        plan.run_dir = Path(cfg.storage) / f"iobench-checkpoint-{plan.run_id}"
        _make_run_dir(plan.run_dir, world)
    return plan


def _plan_read(cfg: CheckpointConfig, world: World) -> _Plan:
    path = Path(cfg.read or "")
    marker = check_marker(path, world.size)
    load_metadata(path)  # refused here, before anything starts, unless tensors only
    layout = layout_for(marker.model, marker.scale, marker.ranks)
    return _Plan(layout, marker.seed, "", None, [path], _layout_warnings(layout, world))


def _plan_write(cfg: CheckpointConfig, world: World) -> _Plan:
    storage = Path(cfg.storage or "")
    if not storage.is_dir():
        raise StorageError(f"--storage {storage}: no such directory; create it or give another")
    if not os.access(storage, os.W_OK | os.X_OK):
        raise StorageError(f"--storage {storage}: not writable by this user")
    refuse_in_dataset(storage, "--storage")  # checkpoints never go into data a run reads
    layout = layout_for(cfg.model, cfg.scale, world.size)
    left = _sweep(storage) if world.is_root else []  # before the space is counted
    _check_space(layout, storage, cfg.repeat, world)
    _check_memory(layout, world)
    return _Plan(layout, cfg.seed, "", None, warnings=[*left, *_layout_warnings(layout, world)])


def _sweep(storage: Path) -> list[str]:
    """Rank 0: remove the incomplete checkpoints (`.ckpt-NNN.partial`) that runs killed
    before their clean-up left in `storage`; name those it cannot tell are abandoned (their
    run still writes, or ran on another host), with the command that removes them."""
    out = []
    for run in sorted(p for p in storage.glob("iobench-checkpoint-*") if p.is_dir()):
        s = sweep_partials(run)
        if s.removed:
            out.append(f"removed {len(s.removed)} incomplete checkpoint folder(s) a killed "
                       f"run left in {run} ({', '.join(p.name for p in s.removed)})")
        for left, why in ((s.running, "its run is still writing"),
                          (s.unknown, "their run ran on another host, or no record says "
                                      "which")):
            if left:
                out.append(f"{run} holds incomplete checkpoint folder(s) that `--read` "
                           f"refuses ({why}); once that run is gone, remove them with: "
                           "rm -rf " + " ".join(shlex.quote(str(p)) for p in left))
    return out


def estimated_bytes(layout: Layout) -> int:
    """Bytes a checkpoint of `layout` takes on disk, all ranks (with DCP's per-tensor records)."""
    per_rank = layout.rank_bytes + ITEM_OVERHEAD * len(layout.tensors)
    return layout.ranks * per_rank + 512 * len(layout.tensors) * layout.ranks  # + .metadata


def _check_space(layout: Layout, storage: Path, repeat: int, world: World) -> None:
    """Refuse a request the filesystem cannot hold (`repeat` checkpoints, all ranks')."""
    need = estimated_bytes(layout) * repeat
    free = shutil.disk_usage(storage).free
    if need > free:
        raise StorageError(f"--storage {storage} has {_size(free)} free; {repeat} "
                           f"checkpoint(s) of {layout.model} at --scale {layout.scale:g} by "
                           f"{world.size} rank(s) need {_size(need)}: lower --scale or "
                           "--repeat, or free space")


def _check_memory(layout: Layout, world: World) -> None:
    """Refuse shards this node cannot hold in memory (every local rank holds its own)."""
    avail = _mem_available()
    need = layout.rank_bytes * world.local_size
    if avail is not None and need > 0.8 * avail:
        raise ConfigError(f"{world.local_size} rank(s) on this node would hold {_size(need)} "
                          f"of checkpoint state; {_size(avail)} of memory is available: lower "
                          "--scale")


def _size(n: float) -> str:
    return f"{n / GB:.3g} GB" if n >= GB else f"{n / 1e6:.3g} MB"


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _layout_warnings(layout: Layout, world: World) -> list[str]:
    out = []
    if layout.processes is not None and layout.processes != world.size:
        out.append(f"MLPerf Storage runs {layout.model} with {layout.processes} processes; "
                   f"this run has {world.size}: each rank saves the model's per-rank shard"
                   f"{' (scaled)' if layout.scale < 1 else ''}, so the total is {world.size} "
                   "rank(s)' worth, not the model's")
    if layout.scale < 1:
        out.append(f"--scale {layout.scale:g}: each shard is that share of {layout.model}'s "
                   "(tensor count and size mix kept); not an MLPerf-size checkpoint")
    return out


def _make_run_dir(run_dir: Path, world: World) -> None:
    """Rank 0 makes the run's folder; every rank must see it (one filesystem for all, as DCP
    needs: rank 0 alone writes the metadata every rank reads)."""
    err = None
    if world.is_root:
        try:
            run_dir.mkdir()
        except OSError as e:
            err = StorageError(f"cannot create {run_dir}: {e.strerror or e}")
    agree(world, err)
    seen = run_dir.is_dir()
    missing = [r for r, ok in enumerate(world.allgather(seen)) if not ok]
    if missing and world.is_root:
        shutil.rmtree(run_dir, ignore_errors=True)
    agree(world, None if not missing else StorageError(
        f"--storage {run_dir.parent}: rank(s) {missing} do not see the folder rank 0 made; "
        "a checkpoint needs one filesystem every rank sees (a shared tier)"))


# ------------------------------------------------------------------------------ writing

@dataclass(frozen=True)
class RankWrite:
    """One rank's write of its shard: from the ranks' common start to its shard fsync'ed
    (`write_s`), and to DCP's save returning (`save_s`, the metadata written)."""

    rank: int
    node: int
    bytes: int
    write_s: float
    save_s: float

    @property
    def gbps(self) -> float:
        return self.bytes / GB / self.write_s if self.write_s > 0 else 0.0


def _write_one(plan: _Plan, state: dict[str, Any], world: World, k: int) -> dict[str, Any]:
    """Write checkpoint `k` into its temporary folder, then commit it (a collective)."""
    from torch.distributed.checkpoint.state_dict_saver import save

    assert plan.run_dir is not None
    final = plan.run_dir / _name(k)
    tmp = partial_dir(final)
    err = None
    if world.is_root:
        try:
            tmp.mkdir()
            claim(tmp)  # a later run can tell it from one a killed run left (_sweep)
        except OSError as e:
            err = StorageError(f"cannot create {tmp}: {e.strerror or e}")
        except StorageError as e:
            err = e
    agree(world, err)  # (also a barrier: the ranks start together)
    # tests only (IOBENCH_TEST_FAULT, iobench.core.faults): `epoch` names the checkpoint,
    # step 0 is after this rank's shard is on storage and before DCP writes the metadata
    fault = faults.planned()
    _fill_disk_fault(fault, world.rank, k, tmp.parent)
    w = writer(tmp, lambda: faults.at_step(fault, world.rank, k, 0), records=True)

    def step() -> None:
        with lean_dcp():
            save(state, storage_writer=w, planner=save_planner(), no_dist=world.size == 1)
        fsync_dir(tmp)  # this rank's file's entry (rank 0 fsyncs it again in the commit)

    t0 = time.perf_counter_ns()
    t1 = _dcp(step, world, tmp, "write")
    files = {f: (tmp / f).stat().st_size for f in w.files}
    rec = RankWrite(world.rank, world.node, sum(files.values()), (w.shard_end_ns - t0) / 1e9,
                    (t1 - t0) / 1e9)
    everyone = world.allgather((asdict(rec), files))
    return _commit(plan, world, k, tmp, final, everyone, t1)


def _commit(plan: _Plan, world: World, k: int, tmp: Path, final: Path,
            everyone: list[Any], t1: int) -> dict[str, Any]:
    """Rank 0 writes the marker and renames the folder into place; every rank waits."""
    ranks = [RankWrite(**r) for r, _ in everyone]
    err, commit_s = None, 0.0
    if world.is_root:
        try:
            files = {f: n for _, fs in everyone for f, n in fs.items()}
            files[METADATA] = (tmp / METADATA).stat().st_size
            marker = Marker(model=plan.layout.model, scale=plan.layout.scale,
                            ranks=world.size, seed=plan.seed, files=files,
                            metadata_sha256=sha256_of(tmp / METADATA), created=now_iso())
            release(tmp)  # the checkpoint holds DCP's files and the marker, nothing else
            commit(tmp, final, marker)
            commit_s = (time.perf_counter_ns() - t1) / 1e9
        except (OSError, IobenchError) as e:
            err = _dcp_error(e, tmp, "commit")
    agree(world, err, "the checkpoint commit")
    return {"index": k, "path": str(final), **_phase(ranks, "write"), "commit_s": commit_s,
            "save_s": max(r.save_s for r in ranks)}


def _fill_disk_fault(fault: faults.Fault | None, rank: int, k: int, where: Path) -> None:
    """Tests only (`action=fill`): another writer fills the filesystem just before the write."""
    if fault is None or fault.action != "fill" or (fault.rank, fault.epoch) != (rank, k):
        return
    with open(where / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass


def _dcp(step: Callable[[], Any], world: World, where: Path, what: str) -> int:
    """Run a DCP save or load (a collective); the clock when it ended on this rank. A failure
    on any rank is raised on every rank, an interrupt as itself."""
    err: BaseException | None = None
    t1 = 0
    try:
        with _alone_quietly(world):
            step()
        t1 = time.perf_counter_ns()
    except (Interrupted, KeyboardInterrupt):
        raise
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        err = _dcp_error(e, where, what)
    if isinstance(err, (Interrupted, KeyboardInterrupt)):
        raise err
    agree(world, err, f"the checkpoint {what}")
    return t1


def _dcp_error(e: BaseException, where: Path, what: str) -> BaseException:
    """The error to raise for a failed DCP save or load: an interrupt as itself (DCP wraps
    whatever a rank raised, BaseExceptions too, in a CheckpointException); a full disk or
    another OSError as the user's StorageError; anything else as a RuntimeError (a bug)."""
    import errno

    causes = _causes(e)
    for c in causes:
        if isinstance(c, (Interrupted, KeyboardInterrupt, IobenchError)):
            return c
    oserr = next((c for c in causes if isinstance(c, OSError)), None)
    if oserr is not None and oserr.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageError(f"out of space during the checkpoint {what} in {where.parent}: "
                            f"{oserr.strerror}; the incomplete checkpoint is not kept")
    if oserr is not None:
        return StorageError(f"the checkpoint {what} in {where} failed: "
                            f"{oserr.strerror or oserr} ({oserr.filename or where})")
    first = causes[0]
    return RuntimeError(f"DCP {what} failed: {type(first).__name__}: {first}")


def _causes(e: BaseException) -> list[BaseException]:
    """`e`, or what DCP's CheckpointException gathered from the ranks, each with the
    exceptions it was raised from."""
    failures = getattr(e, "failures", None)  # rank -> (exception, its stack)
    roots = ([f[0] if isinstance(f, tuple) else f for f in failures.values()]
             if isinstance(failures, dict) and failures else [e])
    out: list[BaseException] = []
    for x in roots:
        cur: BaseException | None = x
        while cur is not None and cur not in out:
            out.append(cur)
            cur = cur.__cause__ or cur.__context__
    return out


# ------------------------------------------------------------------------------ reading

@dataclass(frozen=True)
class RankRead:
    """One rank's cold read of its shard, with what the OS says it read from storage."""

    rank: int
    node: int
    bytes: int
    read_s: float
    load_s: float
    os_read_bytes: int | None
    resident_fraction: float | None  # of its shard, after eviction

    @property
    def gbps(self) -> float:
        return self.bytes / GB / self.read_s if self.read_s > 0 else 0.0


def _read_one(cfg: CheckpointConfig, plan: _Plan, state: dict[str, Any], world: World,
              k: int) -> dict[str, Any]:
    """Evict checkpoint `k`, then every rank reads its shard (a collective)."""
    from torch.distributed.checkpoint.state_dict_loader import load

    path = plan.targets[k]
    metadata, mine, err = None, [], None
    try:
        marker = check_marker(path, world.size)
        metadata = load_metadata(path)
        check_tensors(metadata, state, path)
        mine = [path / f for f in marker.files if f.startswith(f"__{world.rank}_")]
    except IobenchError as e:
        err = e
    agree(world, err)
    cache_rec = _evict(cfg, path, mine + ([path / METADATA] if world.is_root else []), world)
    note = procio.read_bytes_unavailable(path)
    io0 = procio.tree_io()
    world.barrier()
    t0 = time.perf_counter_ns()
    r = reader(path, metadata)

    def step() -> None:
        with lean_dcp():
            load(state, storage_reader=r, no_dist=world.size == 1)

    t1 = _dcp(step, world, path, "read")
    delta = procio.tree_io() - io0
    rec = RankRead(world.rank, world.node, sum(f.stat().st_size for f in mine),
                   (r.read_end_ns - t0) / 1e9, (t1 - t0) / 1e9,
                   None if note else delta.read_bytes, cache_rec.pop("mine"))
    ranks = [RankRead(**x) for x in world.allgather(asdict(rec))]
    return {"index": k, "path": str(path), **_phase(ranks, "read"),
            **_os_check(ranks, note), "cache": _cache_status(cache_rec, ranks),
            "start_ns": t0}


def _evict(cfg: CheckpointConfig, path: Path, files: list[Path], world: World) -> dict[str, Any]:
    """The site's command (each node's local rank 0), then every rank evicts its files and
    measures what stayed resident (a collective)."""
    run = None
    if cfg.evict_cmd is not None and world.local_rank == 0:
        run = cache.run_evict_cmd(cfg.evict_cmd, path, world.node)
    bad = [x for x in world.allgather(run) if x is not None and x["returncode"] != 0]
    if bad:
        out = bad[0]["output"] or "no output"
        err = StorageError(f"--evict-cmd {cfg.evict_cmd!r} failed ({out}); fix the command, or "
                           "leave --evict-cmd out (reads on a shared tier are then unverified)")
        err.agreed = True
        raise err
    ev, res = cache.evict_and_measure(files)
    world.barrier()
    from iobench.core.sysinfo import mount_of

    eviction = cache.eviction_plan(mount_of(path))
    return {"mine": res.fraction, "errors": list(ev.errors), "plan": eviction,
            "evict_cmd": run}


def _cache_status(rec: dict[str, Any], ranks: list[RankRead]) -> dict[str, Any]:
    """cold / warm / unknown / unverified, as epochs say it (`iobench.core.cache`)."""
    plan: cache.EvictionPlan = rec["plan"]
    fractions = [r.resident_fraction for r in ranks]
    worst = None if None in fractions else max(f for f in fractions if f is not None)
    reason = None
    if worst is None:
        status = "unknown"
    elif worst > cache.DEFAULT_WARN_ABOVE:
        status = "warm"
        reason = ("the checkpoint is on tmpfs: its data lives in memory" if plan.kind == "memory"
                  else "POSIX_FADV_DONTNEED left the pages in the page cache")
    elif plan.needs_site and rec["evict_cmd"] is None:
        status, reason = "unverified", plan.needs_site + "; give --evict-cmd CMD"
    else:
        status = "cold"
    return {"status": status, "resident_fraction": worst, "reason": reason,
            "method": ("evict-cmd+" if rec["evict_cmd"] else "") + "fadvise",
            "fstype": plan.fstype, "errors": rec["errors"]}


def _os_check(ranks: list[RankRead], note: str | None) -> dict[str, Any]:
    """The OS's read bytes against the checkpoint's: verified, short (part of it came from a
    cache), or unverified where the kernel does not count (tmpfs, FUSE): never a guess."""
    if note is not None:
        return {"os_read_bytes": None, "os_read_check": "unverified", "os_read_note": note}
    got = sum(r.os_read_bytes or 0 for r in ranks)
    short = [r.rank for r in ranks if (r.os_read_bytes or 0) < READ_SHORT * r.bytes]
    if short:
        return {"os_read_bytes": got, "os_read_check": "short",
                "os_read_note": f"rank(s) {short} read less than {READ_SHORT:.0%} of their "
                                "shard from storage: the rest came from a cache"}
    return {"os_read_bytes": got, "os_read_check": "verified", "os_read_note": None}


# ------------------------------------------------------------------------------ figures

def _phase(ranks: list[Any], what: str) -> dict[str, Any]:
    """MLPerf's figures of one checkpoint's write or read: duration = the slowest rank's,
    throughput = all bytes over it; and the slowest rank's own GB/s (the minimum over ranks)."""
    secs = [r.write_s if what == "write" else r.read_s for r in ranks]
    duration = max(secs)
    total = sum(r.bytes for r in ranks)
    return {"bytes": total, "duration_s": duration,
            "throughput_GBps": total / GB / duration if duration > 0 else 0.0,
            "rank_GBps_min": min(r.gbps for r in ranks),
            "ranks": [asdict(r) | {"GBps": r.gbps} for r in ranks]}


PHASE_FIGURES = ("throughput_GBps", "duration_s", "rank_GBps_min")


def _document(cfg: CheckpointConfig, plan: _Plan, world: World, writes: list[dict[str, Any]],
              reads: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's result document (`iobench.checkpoint`, written by `write_document`)."""
    from iobench.core.sysinfo import provenance

    lay = plan.layout
    where = plan.run_dir.parent if plan.run_dir is not None else plan.targets[0]
    warnings = list(plan.warnings)
    for r in reads:
        if r["cache"]["status"] != "cold" and r["cache"]["reason"]:
            warnings.append(f"read {r['index']}: cache {r['cache']['status'].upper()}: "
                            f"{r['cache']['reason']}")
        if r["os_read_check"] == "short":
            warnings.append(f"read {r['index']}: {r['os_read_note']}")
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "checkpoint",
        "run_id": plan.run_id, "created": now_iso(), "status": "complete",
        "config": asdict(cfg),
        "layout": {"model": lay.model, "kind": lay.kind, "scale": lay.scale, "ranks": lay.ranks,
                   "processes": lay.processes, "tensors_per_rank": len(lay.tensors),
                   "rank_tensor_bytes": lay.rank_bytes, "about": lay.about},
        "world": {"size": world.size, "nodes": world.num_nodes, "launcher": world.launcher},
        "writes": writes, "reads": reads,
        "summary": {"write": {k: spread(w[k] for w in writes) for k in PHASE_FIGURES},
                    "read": {k: spread(r[k] for r in reads) for k in PHASE_FIGURES},
                    "read_cache": sorted({r["cache"]["status"] for r in reads}),
                    "os_read_check": sorted({r["os_read_check"] for r in reads})},
        "kept": [str(p) for p in plan.targets] if cfg.keep or cfg.read else [],
        "warnings": list(dict.fromkeys(warnings)),
        "provenance": provenance(where),
    }


def _young(cfg: CheckpointConfig, writes: list[dict[str, Any]],
           reads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """With --mtbf: Young's interval, from the median save (how long a synchronous save
    blocks training: DCP's save and the commit) and the median read (the restart)."""
    mtbf_s = parse_mtbf(cfg.mtbf_h)
    cost = spread(w["save_s"] + w["commit_s"] for w in writes)
    restart = spread(r["duration_s"] for r in reads)
    if mtbf_s is None or cost is None or restart is None:
        return None
    return young(cost["median"], restart["median"], mtbf_s, cfg.interval_s).to_dict()


_RANK = {"rank": Count, "node": Count, "bytes": Count, "GBps": NonNeg}
_PHASE = {"index": Count, "path": Str, "bytes": Count, "duration_s": NonNeg,
          "throughput_GBps": NonNeg, "rank_GBps_min": NonNeg}
_SPREADS = Map({k: Opt(Map({"median": Num, "min": Num, "max": Num, "cv": Opt(Num), "n": Count,
                            "values": List(Num)})) for k in PHASE_FIGURES})
CHECKPOINT_SPEC = Map({
    "schema": Str, "schema_version": Count, "kind": Str, "run_id": Str, "created": Str,
    "status": Str, "config": Map({}), "world": Map({"size": Count, "nodes": Count,
                                                   "launcher": Str}),
    "layout": Map({"model": Str, "kind": Str, "scale": NonNeg, "ranks": Count,
                   "processes": Opt(Count), "tensors_per_rank": Count,
                   "rank_tensor_bytes": Count, "about": Str}),
    "writes": List(Map({**_PHASE, "commit_s": NonNeg, "save_s": NonNeg, "ranks": List(Map(
        {**_RANK, "write_s": NonNeg, "save_s": NonNeg}))})),
    "reads": List(Map({**_PHASE, "os_read_bytes": Opt(Count), "os_read_check": Str,
                       "os_read_note": Opt(Str), "cache": Map({"status": Str,
                                                               "resident_fraction": Opt(Num)}),
                       "ranks": List(Map({**_RANK, "read_s": NonNeg, "load_s": NonNeg,
                                          "os_read_bytes": Opt(Count),
                                          "resident_fraction": Opt(Num)}))}), min_len=1),
    "summary": Map({"write": _SPREADS, "read": _SPREADS, "read_gap_s": Opt(Num),
                    "young": Opt(Map({"optimal_s": NonNeg, "lost_per_day_s": NonNeg}))}),
    "kept": List(Str), "warnings": List(Str), "provenance": Map({}),
})


def validate(doc: dict[str, Any], where: str = "checkpoint result") -> dict[str, Any]:
    """`doc` when it has the shape of an `iobench.checkpoint` document; else a SchemaError
    naming the first bad field (what a reader of these documents checks first)."""
    checked: dict[str, Any] = check(doc, CHECKPOINT_SPEC, where)
    if checked["schema"] != SCHEMA or checked["schema_version"] > SCHEMA_VERSION:
        raise SchemaError(f"{where}: not an {SCHEMA} document of version <= {SCHEMA_VERSION}")
    return checked


def _clean_up(cfg: CheckpointConfig, plan: _Plan, world: World, done: bool) -> None:
    """Rank 0: remove an unfinished checkpoint's temporary folder always, and the run's
    checkpoints unless --keep (a failed run keeps its complete ones only with --keep)."""
    if not world.is_root or plan.run_dir is None or not plan.run_dir.is_dir():
        return
    for p in plan.run_dir.iterdir():
        if p.name.startswith("."):
            shutil.rmtree(p, ignore_errors=True)
    if _filled():
        (plan.run_dir / "filler").unlink(missing_ok=True)
    if not cfg.keep:
        shutil.rmtree(plan.run_dir, ignore_errors=True)
    elif not done:
        print(f"iobench: the complete checkpoints so far are kept in {plan.run_dir}",
              file=sys.stderr, flush=True)


def _filled() -> bool:
    fault = faults.planned()
    return fault is not None and fault.action == "fill"


# ------------------------------------------------------------------------------ side by side

def load_result(path: Path) -> dict[str, Any]:
    """The `iobench.checkpoint` document in `path`, checked (`validate`); else a DatasetError
    (SchemaError) naming what is wrong."""
    from iobench.core.jsonio import read_json

    return validate(read_json(path, schema=SCHEMA, max_version=SCHEMA_VERSION), str(path))


def tier_of(doc: dict[str, Any]) -> str:
    """Where a checkpoint run wrote: its storage path, filesystem and kind."""
    st = doc["provenance"].get("storage") or {}
    fs = ", ".join(str(x) for x in (st.get("fstype"), st.get("kind")) if x)
    return f"{st.get('path', '?')}" + (f" ({fs})" if fs else "")


def side_by_side(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per checkpoint result: where, what, and per phase (write, read) MLPerf's
    figures over its checkpoints (throughput, duration = max over ranks, slowest rank's
    GB/s = min over ranks: each a spread), with the throughput's ratio to the first row's."""
    rows = []
    for i, d in enumerate(docs):
        s, lay = d["summary"], d["layout"]
        one = (d["writes"] or d["reads"])[0]
        row: dict[str, Any] = {
            "run": i, "tier": tier_of(d), "run_id": d["run_id"],
            "what": f"{lay['model']}" + (f" x{lay['scale']:g}" if lay["scale"] < 1 else "")
                    + f", {d['world']['size']} rank(s)",
            "GB": one["bytes"] / GB, "read_cache": ",".join(s["read_cache"]),
            "os_read_check": ",".join(s["os_read_check"])}
        for phase in ("write", "read"):
            row[phase] = s[phase]
            first = docs[0]["summary"][phase]["throughput_GBps"]
            mine = s[phase]["throughput_GBps"]
            row[f"{phase}_vs_first"] = (mine["median"] / first["median"]
                                        if mine and first and first["median"] > 0 else None)
        rows.append(row)
    return rows


SIDE_BY_SIDE_HEADER = ("run", "tier", "checkpoint", "GB", "write GB/s", "write s (max rank)",
                       "write GB/s slowest rank", "write ×run1", "read GB/s",
                       "read s (max rank)", "read GB/s slowest rank", "read ×run1", "reads")


def side_by_side_cells(row: dict[str, Any]) -> list[str]:
    """A `side_by_side` row as table cells (SIDE_BY_SIDE_HEADER): median [min-max] over the
    run's checkpoints, `-` for a phase it did not run."""
    from iobench.core.spread import fmt_spread

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    cells = [str(row["run"] + 1), row["tier"], row["what"], f"{row['GB']:.3f}"]
    for phase in ("write", "read"):
        sp = row[phase]
        cells += [fmt_spread(sp["throughput_GBps"], ".3g"), fmt_spread(sp["duration_s"], ".3g"),
                  fmt_spread(sp["rank_GBps_min"], ".3g"), ratio(row[f"{phase}_vs_first"])]
    return [*cells, f"{row['read_cache']}; OS bytes {row['os_read_check']}"]


SIDE_BY_SIDE_NOTE = ("iobench checkpoint (MLPerf Storage's figures): GB/s = a checkpoint's "
                     "bytes over its duration, the slowest rank's time; 'slowest rank' = the "
                     "minimum over ranks of each rank's GB/s; median [min-max] over the run's "
                     "checkpoints (--repeat); ×run1 = the median throughput over run 1's; "
                     "GB = 10^9 bytes per checkpoint")
