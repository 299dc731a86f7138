"""Checkpoints inside `iobench train` (--checkpoint-every): the real model saved with DCP, the steps it blocked, a burst-buffer drain.

Every N steps each rank saves the DDP model's state dict and the optimizer's momentum with
`torch.distributed.checkpoint` (one file per rank, fsync'ed), into
`--checkpoint-to DIR/iobench-train-<run id>/ckpt-NNN`, committed whole with
`iobench.core.checkpoint_store` (a `.partial` folder, rank 0's marker, a rename, fsyncs), so
a half-written checkpoint never looks complete. Only the newest `--checkpoint-keep K`
complete checkpoints stay. `sync` saves inside the step; `async` uses DCP's `async_save`:
the step waits for the copy of the state to CPU memory (and for a previous save still in
flight), the write runs in a background thread over a process group of its own. With
`--drain-to DIR2`, rank 0 copies each committed checkpoint to DIR2 in the background and
commits it there the same way (the burst-buffer pattern). Each checkpoint also holds the
training state `--resume` carries on from (`iobench.workflows.train_resume`).

The time a step was blocked leaves the epoch's clock (`EpochClock.exclude`), so the data
stall, compute and AU keep their meaning (ingest), and the checkpoint's share is reported
beside them (docs/metrics.md, "Checkpoints in training").
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iobench.core import faults
from iobench.core.checkpoint_store import (
    MARKER,
    METADATA,
    Marker,
    check_marker,
    commit,
    fsync_dir,
    partial_dir,
    sha256_of,
    writer,
)
from iobench.core.errors import ConfigError, IobenchError, StorageError
from iobench.core.interrupts import Interrupted
from iobench.core.metrics import EpochClock
from iobench.core.resilience import parse_mtbf, young
from iobench.core.trace import Background
from iobench.core.world import World, agree
from iobench.workflows.train_resume import (
    ResumePoint,
    TrainState,
    check_against_run,
    load_into,
    model_state,
    newest_complete,
    write_state,
)
from iobench.workflows.train_resume import record as resume_record

MODES = ("sync", "async")
DEFAULT_KEEP = 2
RUN_PREFIX = "iobench-train-"
KILL_SAVE = "kill-save"  # IOBENCH_TEST_FAULT action: SIGKILL once this rank's shard is written
BLOCK = 8 << 20  # bytes per read/write of the drain's copy


@dataclass(frozen=True)
class CheckpointPlan:
    """`train --checkpoint-every N --checkpoint-to DIR` and what goes with it."""

    every_steps: int
    to: str
    mode: str = "sync"
    keep: int = DEFAULT_KEEP  # complete checkpoints kept in DIR (and DIR2)
    drain_to: str | None = None
    mtbf_h: float | None = None  # the job's mean time between failures (Young/Daly)
    resume: bool = False  # carry on from the newest complete checkpoint in `to`

    def __post_init__(self) -> None:
        if isinstance(self.every_steps, bool) or self.every_steps < 1:
            raise ConfigError(f"--checkpoint-every {self.every_steps} must be a number of "
                              "steps >= 1")
        if self.mode not in MODES:
            raise ConfigError(f"--checkpoint-mode {self.mode!r}; choose one of {MODES}")
        if self.keep < 1:
            raise ConfigError(f"--checkpoint-keep {self.keep} must be >= 1 (the newest "
                              "complete checkpoints kept)")
        parse_mtbf(self.mtbf_h)
        if self.drain_to is not None:
            a, b = Path(self.to).resolve(), Path(self.drain_to).resolve()
            if a == b or a in b.parents or b in a.parents:
                raise ConfigError(f"--drain-to {self.drain_to} and --checkpoint-to {self.to} "
                                  "must be apart (the drain copies from one tier to another)")


def plan_from_options(every: int | None, to: str | None, mode: str, keep: int,
                      drain_to: str | None, mtbf_h: float | None,
                      resume: bool = False) -> CheckpointPlan | None:
    """The checkpoint plan of train's options, None without --checkpoint-every; a one-line
    ConfigError for an option that needs another."""
    if every is None:
        given = [o for o, v in (("--checkpoint-to", to), ("--drain-to", drain_to),
                                ("--mtbf", mtbf_h)) if v is not None]
        given += ["--checkpoint-mode"] if mode != "sync" else []
        given += ["--checkpoint-keep"] if keep != DEFAULT_KEEP else []
        given += ["--resume"] if resume else []
        if given:
            raise ConfigError(f"{', '.join(given)} applies to checkpoints: add "
                              "--checkpoint-every N (steps), or drop it")
        return None
    if to is None:
        raise ConfigError("--checkpoint-every needs --checkpoint-to DIR: where the "
                          "checkpoints go (node-local storage for the burst-buffer pattern, "
                          "with --drain-to DIR2 on the shared tier)")
    return CheckpointPlan(every_steps=every, to=to, mode=mode, keep=keep, drain_to=drain_to,
                          mtbf_h=mtbf_h, resume=resume)


def check_for_run(plan: CheckpointPlan, compute_kind: str, repeat: int = 1) -> None:
    """What a checkpoint needs of the run: a real model to save; --resume carries one
    training run on."""
    if compute_kind != "model":
        raise ConfigError("--checkpoint-every saves the real model and optimizer state: it "
                          "needs a real model (--model NAME or auto), not --compute-time or "
                          "--model none")
    if plan.resume and repeat > 1:
        raise ConfigError(f"--resume carries one training run on; --repeat {repeat} trains "
                          "fresh models from the start: drop --repeat or --resume")


def check_dirs(plan: CheckpointPlan, refuse_inside: Callable[[str, str], None]) -> None:
    """Before anything runs: neither folder inside the dataset (`refuse_inside(path,
    option)`, as --results is refused), each writable or creatable."""
    from iobench.core.outputs import writable_dir

    for option, path in (("--checkpoint-to", plan.to), ("--drain-to", plan.drain_to)):
        if path is not None:
            refuse_inside(path, option)
            writable_dir(path, option)


def checkpoint_bytes(state: dict[str, Any]) -> int:
    """Tensor bytes of a state dict."""
    return sum(t.numel() * t.element_size() for t in state.values())


def _number(p: Path) -> int:
    try:
        return int(p.name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def prune(folder: Path, keep: int, protected: frozenset[str] = frozenset()) -> None:
    """Remove complete checkpoints in `folder` older than the newest `keep` (but none named in
    `protected`): each renamed to a hidden name first, so that none is ever half removed
    under its own name."""
    done = sorted((p for p in folder.iterdir() if p.name.startswith("ckpt-")
                   and (p / MARKER).is_file()), key=_number)
    for p in done[:-keep]:
        if p.name not in protected:
            gone = p.parent / f".{p.name}.removing"
            os.rename(p, gone)
            shutil.rmtree(gone, ignore_errors=True)


def stall_split(steps: list[tuple[int, int]], busy: list[tuple[int, int | None]],
                now: int) -> dict[str, Any]:
    """The data stall of steps whose wait overlapped a drain (`busy`: start, end or None
    while running; wall-clock ns) against the others: counts, sums and per step (s)."""
    n_in = n_out = 0
    s_in = s_out = 0
    for a, b in steps:
        if any(s < b and (e if e is not None else now) > a for s, e in busy):
            n_in, s_in = n_in + 1, s_in + (b - a)
        else:
            n_out, s_out = n_out + 1, s_out + (b - a)
    return split_record(n_in, s_in / 1e9, n_out, s_out / 1e9)


def split_record(n_in: int, s_in: float, n_out: int, s_out: float) -> dict[str, Any]:
    return {"steps_in_flight": n_in, "stall_in_flight_s": s_in, "steps_idle": n_out,
            "stall_idle_s": s_out,
            "stall_per_step_in_flight_s": s_in / n_in if n_in else None,
            "stall_per_step_idle_s": s_out / n_out if n_out else None}


class _Drain:
    """Rank 0's background copy of each committed checkpoint to the shared tier, committed
    there whole (`--drain-to`); one at a time, in order."""

    def __init__(self, dest: Path, keep: int, offset_ns: int) -> None:
        self.dest, self.keep, self.offset_ns = dest, keep, offset_ns
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="iobench-drain")
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.busy: list[tuple[int, int | None]] = []  # wall ns of each copy (end None: running)
        self.pending: set[str] = set()  # local checkpoints not copied yet: never pruned
        self.records: dict[int, dict[str, Any]] = {}
        self.spans: dict[int, tuple[int, int, int, int]] = {}  # --trace: queued, start, end, bytes
        self.futures: list[Future[None]] = []

    def submit(self, src: Path, index: int, after: Callable[[], None]) -> None:
        with self.lock:
            self.pending.add(src.name)
        queued = time.perf_counter_ns()
        self.futures.append(self.pool.submit(self._copy, src, index, queued, after))

    def snapshot(self) -> list[tuple[int, int | None]]:
        with self.lock:
            return list(self.busy)

    def _copy(self, src: Path, index: int, queued: int, after: Callable[[], None]) -> None:
        t0 = time.perf_counter_ns()
        with self.lock:
            self.busy.append((t0 + self.offset_ns, None))
            slot = len(self.busy) - 1
        final = self.dest / src.name
        tmp = partial_dir(final)
        try:
            marker = check_marker(src)  # a committed checkpoint, whole
            tmp.mkdir()
            copied = sum(self._file(src / name, tmp / name) for name in marker.files)
            commit(tmp, final, marker)  # the same files: the same marker
            prune(self.dest, self.keep)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            t1 = time.perf_counter_ns()
            with self.lock:
                self.busy[slot] = (t0 + self.offset_ns, t1 + self.offset_ns)
                self.pending.discard(src.name)
        self.records[index] = {"path": str(final), "bytes": copied, "drain_s": (t1 - t0) / 1e9,
                               "queued_s": (t0 - queued) / 1e9, "end_ns": t1}
        self.spans[index] = (queued, t0, t1, copied)
        after()

    def _file(self, src: Path, dst: Path) -> int:
        n = 0
        with open(src, "rb") as f, open(dst, "xb") as g:
            while block := f.read(BLOCK):
                if self.stop.is_set():
                    raise StorageError(f"the drain of {src.parent} was stopped")
                g.write(block)
                n += len(block)
            g.flush()
            os.fsync(g.fileno())
        return n

    def wait(self) -> float:
        """Wait for every copy queued (seconds waited); the first failure raised."""
        t0 = time.perf_counter_ns()
        for f in self.futures:
            f.result()
        self.futures = []
        return (time.perf_counter_ns() - t0) / 1e9

    def abort(self, timeout_s: float) -> None:
        self.stop.set()
        wait_futures(self.futures, timeout=timeout_s)
        self.pool.shutdown(wait=False, cancel_futures=True)


class TrainCheckpoints:
    """One rank's checkpoints during a training run: when to save, the save itself (sync or
    async), rank 0's commit, prune and drain, and the figures per epoch and per save."""

    def __init__(self, plan: CheckpointPlan, world: World, run_id: str, model_name: str,
                 seed: int, timeout_s: float, dataset: str = "", batch_size: int = 0) -> None:
        self.plan, self.world, self.model_name, self.seed = plan, world, model_name, seed
        self.timeout_s, self.run_id = timeout_s, run_id
        self.dataset, self.batch_size = dataset, batch_size
        self.run_dir = Path(plan.to) / f"{RUN_PREFIX}{run_id}"
        self.drain_dir = (Path(plan.drain_to) / f"{RUN_PREFIX}{run_id}"
                          if plan.drain_to is not None else None)
        self.offset_ns = time.time_ns() - time.perf_counter_ns()  # perf -> wall clock
        self.fault = faults.planned()  # tests only
        self.pg: Any = None
        self.saver = ThreadPoolExecutor(1, thread_name_prefix="iobench-ckpt") \
            if plan.mode == "async" else None
        self.inflight: Future[dict[str, Any]] | None = None
        self.drain = (_Drain(self.drain_dir, plan.keep, self.offset_ns)
                      if self.drain_dir is not None and world.is_root else None)
        self.lock = threading.Lock()
        self.index = 0  # saves over the run
        self.rep = self.steps = 0
        self.model: Any = None
        self.opt: Any = None
        self.mine: list[dict[str, Any]] = []  # this rank's saves of this repetition
        self.saves: list[dict[str, Any]] = []  # rank 0: every save's record
        self.end_waits: list[float] = []
        self.background: list[Background] = []  # rank 0: every rank's, for --trace
        self.point: ResumePoint | None = None  # --resume: the checkpoint carried on from
        self.resumed: dict[str, Any] | None = None  # the result's `checkpoint.resumed`
        self.skip = 0  # --resume: steps of the first epoch done before (not run again)
        self.done_before = 0  # steps of the epoch running done before this run (--resume)
        self.warnings: list[str] = []
        self._epoch_reset()

    # ------------------------------------------------------------------ set-up
    def open(self) -> None:
        """A collective: rank 0 makes the run's folders, every rank must see them; a process
        group of the checkpoints' own (async saves talk in a background thread)."""
        # imported now, not inside the first save's blocked time
        import torch.distributed.checkpoint.state_dict_saver  # noqa: F401

        if self.plan.resume:
            self._find_resume()
        err = None
        if self.world.is_root:
            try:
                for d in (self.run_dir, self.drain_dir):
                    if d is not None:
                        d.mkdir(parents=True)
            except OSError as e:
                err = StorageError(f"cannot create {e.filename}: {e.strerror or e}")
        agree(self.world, err)
        missing = [r for r, ok in enumerate(self.world.allgather(self.run_dir.is_dir()))
                   if not ok]
        agree(self.world, None if not missing else StorageError(
            f"--checkpoint-to {self.plan.to}: rank(s) {missing} do not see the folder rank 0 "
            "made; DCP needs one folder every rank sees (a shared tier, or one node)"))
        if self.world.size > 1:
            import datetime

            import torch.distributed as dist

            self.pg = dist.new_group(backend="gloo",
                                     timeout=datetime.timedelta(seconds=self.timeout_s))
        else:  # one process saves without torch.distributed, which DCP warns about
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")

    def _find_resume(self) -> None:
        """A collective, before this run's folder is made: rank 0 finds the newest complete
        checkpoint in DIR and checks it against the run; every rank gets it."""
        err, found = None, None
        if self.world.is_root:
            try:
                point = newest_complete(Path(self.plan.to))
                check_against_run(point, self.model_name, self.dataset, self.world.size,
                                  self.batch_size)
                found = (str(point.path), point.state.to_dict(), point.skipped)
            except IobenchError as e:
                err = e
        agree(self.world, err, "the search for a checkpoint to resume")
        path, state, skipped = self.world.bcast(found)
        self.point = ResumePoint(Path(path), TrainState.from_dict(state, path), skipped)
        self.warnings += list(skipped)

    def first_epoch(self, steps_per_epoch: int, epochs: int) -> int:
        """The epoch this run starts with (0, or the resumed checkpoint's: the next one when
        its epoch was done); `skip` its steps done. Nothing left: a ConfigError (every rank)."""
        if self.point is None:
            return 0
        s = self.point.state
        first, self.skip = ((s.epoch + 1, 0) if s.epoch_step >= steps_per_epoch
                            else (s.epoch, s.epoch_step))
        if first >= epochs:
            e = ConfigError(f"--resume: {self.point.path} was saved after step {s.step} "
                            f"(epoch {s.epoch + 1}, its last): --epochs {epochs} leaves nothing "
                            f"to train; raise --epochs above {first}")
            e.agreed = True  # every rank computes the same
            raise e
        return first

    def start_repetition(self, rep: int, model: Any, opt: Any) -> None:
        """A fresh model: its steps count from 0 (or, resumed, the checkpoint's state loaded
        and its steps counted on); the space for its checkpoints checked."""
        self.rep, self.steps, self.model, self.opt = rep, 0, model, opt
        self.mine = []
        err = None
        if self.world.is_root:
            try:
                self._check_space(checkpoint_bytes(model_state(model, opt)))
            except StorageError as e:
                err = e
        agree(self.world, err)
        if self.point is not None:
            self._load(self.point)

    def _load(self, point: ResumePoint) -> None:
        """Every rank loads the checkpoint (a collective); its steps count on from there."""
        err = None
        t0 = time.perf_counter_ns()
        nbytes = 0
        try:
            nbytes = load_into(point.path, self.model, self.opt, self.pg,
                               no_dist=self.world.size == 1)
        except (Interrupted, KeyboardInterrupt):
            raise
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            err = _save_error(e, point.path, "read")
        agree(self.world, err, "the checkpoint load")
        load_s = max(self.world.allgather((time.perf_counter_ns() - t0) / 1e9))
        self.steps = point.state.step
        self.resumed = resume_record(point, load_s, nbytes)

    def _check_space(self, state_bytes: int) -> None:
        # the optimizer's state appears with the first step: count it as the model's again
        need = int(2.2 * state_bytes + (1 << 20)) * (self.plan.keep + 1)
        for option, d in (("--checkpoint-to", self.run_dir), ("--drain-to", self.drain_dir)):
            free = shutil.disk_usage(d).free if d is not None else need
            if free < need:
                raise StorageError(f"{option} {d} has {free / 1e6:,.0f} MB free; "
                                   f"{self.plan.keep + 1} checkpoints of this model (the "
                                   f"{self.plan.keep} kept and the one being written) need "
                                   f"{need / 1e6:,.0f} MB: free space or lower "
                                   "--checkpoint-keep")

    # ------------------------------------------------------------------ per step
    def epoch_start(self) -> None:
        self._epoch_reset()
        # a resumed epoch counts on from the steps done before (not run again)
        self.done_before, self.skip = self.skip, 0
        self.epoch_steps = self.done_before

    def _epoch_reset(self) -> None:
        self.epoch_steps = 0  # steps of this epoch done (a resumed one's before included)
        # (this run's step of the epoch, ns, checkpoint index): --trace draws it
        self.blocked_log: list[tuple[int, int, int]] = []
        self.blocked_ns = 0
        self.epoch_saves = 0
        self.steps_log: list[tuple[int, int]] = []

    def after_step(self, epoch: int, clock: EpochClock) -> None:
        """Right after a step's compute: save when due; the time the step was blocked leaves
        the epoch's clock (`EpochClock.exclude`) and is counted here."""
        self.steps += 1
        self.epoch_steps += 1
        if self.plan.drain_to is not None and len(clock.wait_ns) > 1:
            ready = clock.last_ns - clock.compute_ns[-1]
            self.steps_log.append((ready - clock.wait_ns[-1] + self.offset_ns,
                                   ready + self.offset_ns))
        if self.steps % self.plan.every_steps:
            return
        rec = self._save(epoch)
        blocked = clock.exclude()
        rec["blocked_s"] = blocked / 1e9
        self.blocked_log.append((clock.steps - 1, blocked, rec["index"]))
        self.blocked_ns += blocked
        self.epoch_saves += 1

    def _save(self, epoch: int) -> dict[str, Any]:
        """Save checkpoint `index`: sync, the whole save and commit; async, the wait for the
        previous one, then the copy to CPU memory (the write goes on in the background)."""
        k = self.index
        self.index += 1
        final = self.run_dir / f"ckpt-{k:03d}"
        tmp = partial_dir(final)
        waited = self._wait_inflight()
        err = None
        if self.world.is_root:
            try:
                tmp.mkdir()
            except OSError as e:
                err = StorageError(f"cannot create {tmp}: {e.strerror or e}")
        agree(self.world, err)  # (also: every rank's state is of the same step)
        rec: dict[str, Any] = {"index": k, "repeat": self.rep, "epoch": epoch,
                               "step": self.steps, "epoch_step": self.epoch_steps,
                               "waited_s": waited, "stage_s": 0.0}
        self.mine.append(rec)
        _fill(self.fault, self.world.rank, k, Path(self.plan.to))  # tests only
        w: Any  # its files, once written, read by the callback
        w = writer(tmp, lambda: self._after_shard(tmp, k, rec, w))
        state = model_state(self.model, self.opt)
        no_dist = self.world.size == 1
        t0 = time.perf_counter_ns()
        if self.saver is not None:  # the copy to CPU memory here, the write in a thread
            from torch.distributed.checkpoint.state_dict_saver import async_save

            fut: Any = async_save(state, storage_writer=w, process_group=self.pg,
                                  no_dist=no_dist)
            staged = time.perf_counter_ns()  # the write's clock starts with the copy made
            rec["stage_s"], t0 = (staged - t0) / 1e9, staged
            self.inflight = self.saver.submit(self._job, rec, fut.result, w, t0, tmp, final)
            return rec
        from torch.distributed.checkpoint.state_dict_saver import save

        failed: BaseException | None = None
        try:
            self._job(rec, lambda: save(state, storage_writer=w, process_group=self.pg,
                                        no_dist=no_dist), w, t0, tmp, final)
        except (Interrupted, KeyboardInterrupt):
            raise
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            failed = _save_error(e, tmp)
        agree(self.world, failed, "the checkpoint save")
        return rec

    def _after_shard(self, tmp: Path, k: int, rec: dict[str, Any], w: Any) -> None:
        fsync_dir(tmp)  # this rank's file's entry, before rank 0 may commit
        # --trace: this rank's shard bytes, read before rank 0 may rename the folder
        rec["shard_bytes"] = sum((tmp / name).stat().st_size for name in w.files)
        f = self.fault
        if f is not None and f.action == KILL_SAVE and (f.rank, f.epoch) == (self.world.rank, k):
            os.kill(os.getpid(), signal.SIGKILL)

    def _job(self, rec: dict[str, Any], run_save: Callable[[], Any], w: Any, t0: int,
             tmp: Path, final: Path) -> dict[str, Any]:
        """The write (inline or in the background), then rank 0's commit, prune and drain.
        DCP's save returns on a rank once rank 0 wrote the metadata, after every rank's shard
        was fsync'ed: rank 0 may commit then."""
        run_save()
        t1 = time.perf_counter_ns()
        rec["write_s"] = max((w.shard_end_ns or t1) - t0, 0) / 1e9
        rec["save_s"] = (t1 - t0) / 1e9
        # --trace: the write's span on this rank's clock (rank 0's ends at its commit)
        rec.update(handoff_ns=t0, complete_ns=t1, shard_ns=w.shard_end_ns or 0)
        if self.world.is_root:
            write_state(tmp, self._state(rec))  # what --resume carries on from
            files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
            marker = Marker(model=self.model_name, scale=1.0, ranks=self.world.size,
                            seed=self.seed, files=files,
                            metadata_sha256=sha256_of(tmp / METADATA), created=_now())
            commit(tmp, final, marker)
            t2 = time.perf_counter_ns()
            rec.update(path=str(final), bytes=sum(files.values()), commit_s=(t2 - t1) / 1e9,
                       committed_ns=t2, complete_ns=t2)
            self._prune()
            if self.drain is not None:
                self.drain.submit(final, rec["index"], self._prune)
        return rec

    def _state(self, rec: dict[str, Any]) -> TrainState:
        return TrainState(model=self.model_name, dataset=self.dataset, ranks=self.world.size,
                          batch_size=self.batch_size, seed=self.seed, epoch=rec["epoch"],
                          epoch_step=rec["epoch_step"], step=rec["step"], run_id=self.run_id,
                          saved_ns=time.time_ns())

    def _prune(self) -> None:
        protected: frozenset[str] = frozenset()
        if self.drain is not None:
            with self.drain.lock:
                protected = frozenset(self.drain.pending)
        with self.lock:
            prune(self.run_dir, self.plan.keep, protected)

    def _wait_inflight(self) -> float:
        """Wait for the async save in flight (seconds); its failure raised on every rank."""
        if self.inflight is None:
            return 0.0
        t0 = time.perf_counter_ns()
        err = None
        try:
            self.inflight.result()
        except BaseException as e:
            err = _save_error(e, self.run_dir)
        self.inflight = None
        agree(self.world, err, "the checkpoint save")
        return (time.perf_counter_ns() - t0) / 1e9

    # ------------------------------------------------------------------ figures
    def epoch_end(self, fig: dict[str, Any]) -> dict[str, Any]:
        """This rank's checkpoint figures of the epoch (a collective with --drain-to: rank 0's
        drain spans reach every rank, which splits its own steps' stall by them)."""
        blocked = self.blocked_ns / 1e9
        wall = fig["wall_s"] + blocked
        out: dict[str, Any] = {"saves": self.epoch_saves, "blocked_s": blocked,
                               "wall_with_checkpoint_s": wall,
                               "au_with_checkpoint": fig["compute_s"] / wall if wall > 0
                               else None}
        if self.plan.drain_to is not None:
            busy = self.world.bcast(self.drain.snapshot() if self.drain is not None else None)
            out["drain"] = stall_split(self.steps_log, busy, time.time_ns())
        return out

    def end_repetition(self, epochs: list[dict[str, Any]] | None) -> None:
        """Wait for the save in flight and (rank 0) the drain; every rank's saves gathered;
        rank 0 adds each save's bytes and slowest write to its epoch's record."""
        self._wait_inflight()
        err: StorageError | None = None
        waited = None
        if self.drain is not None:
            try:
                waited = self.drain.wait()
            except Exception as e:  # a full or gone shared tier, a refused source
                err = StorageError(f"the drain to --drain-to {self.plan.drain_to} failed: {e}")
        agree(self.world, err, "the drain")
        everyone = self.world.allgather(self.mine)
        if epochs is None:
            return
        self.end_waits.append(waited or 0.0)
        saves = [_merge([ranks[i] for ranks in everyone]) for i in range(len(self.mine))]
        self.background += self._background(everyone, saves)
        self._add_drains(saves)
        self.saves += saves
        for ep in epochs:
            if ep["repeat"] == self.rep and ep.get("checkpoint") is not None:
                mine = [s for s in saves if s["epoch"] == ep["epoch"]]
                ep["checkpoint"]["bytes"] = sum(s["bytes"] for s in mine)
                ep["checkpoint"]["write_s_max"] = max((s["write_s"] for s in mine),
                                                      default=None)

    def _background(self, everyone: list[list[dict[str, Any]]], saves: list[dict[str, Any]]
                    ) -> list[Background]:
        """Rank 0: what ran beside the steps (--trace): each rank's async writes of this
        repetition, then the drain's copy of each of its saves."""
        mode = self.plan.mode
        out = [Background("checkpoint_write", rank, r["repeat"], r["epoch"], r["index"],
                          r["handoff_ns"], r["complete_ns"], r["shard_ns"],
                          r.get("shard_bytes", 0), mode)
               for rank, recs in enumerate(everyone) for r in recs
               if mode == "async" and "complete_ns" in r]
        spans = self.drain.spans if self.drain is not None else {}
        for s in saves:
            if s["index"] in spans:
                queued, t0, t1, nbytes = spans[s["index"]]
                out.append(Background("drain", self.world.rank, s["repeat"], s["epoch"],
                                      s["index"], t0, t1, queued, nbytes, mode))
        return out

    def take_background(self) -> list[Background]:
        """Rank 0: the spans beside the steps gathered since the last call (--trace)."""
        out, self.background = self.background, []
        return out

    def _add_drains(self, saves: list[dict[str, Any]]) -> None:
        """Each save's drain, and whether it kept up: done within one checkpoint interval
        (the median time between commits) of its commit."""
        ends = [s.pop("committed_ns") for s in saves]
        gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        interval = statistics.median(gaps) if gaps else None
        for s, end in zip(saves, ends, strict=True):
            d = self.drain.records.get(s["index"]) if self.drain is not None else None
            if d is not None:
                done = d.pop("end_ns")
                d["kept_up"] = None if interval is None else done - end <= interval
            s["drain"] = d

    def close(self) -> None:
        """At the end, or after a failure or an interrupt: wait (bounded) for what is in
        flight, then remove every unfinished (`.partial`) folder; never a hang."""
        if self.inflight is not None:
            wait_futures([self.inflight], timeout=self.timeout_s)
        if self.saver is not None:
            self.saver.shutdown(wait=False, cancel_futures=True)
        if self.drain is not None:
            self.drain.abort(self.timeout_s)
        if not self.world.is_root:
            return
        for d in (self.run_dir, self.drain_dir):
            if d is not None and d.is_dir():
                for p in d.iterdir():
                    if p.name.startswith("."):
                        shutil.rmtree(p, ignore_errors=True)
                if not any(d.iterdir()):
                    d.rmdir()

    def section(self, epochs: list[dict[str, Any]]) -> dict[str, Any]:
        """Rank 0: the result's `checkpoint` section (docs/metrics.md)."""
        plan = self.plan
        kept = _complete(self.run_dir)
        return {"mode": plan.mode, "every_steps": plan.every_steps, "keep": plan.keep,
                "to": str(self.run_dir), "drain_to": None if self.drain_dir is None
                else str(self.drain_dir), "saves": self.saves, "kept": kept,
                "drained": _complete(self.drain_dir) if self.drain_dir is not None else [],
                "resumed": self.resumed,
                "summary": summary(plan, epochs, self.saves,
                                   self.end_waits[-1] if self.drain is not None
                                   and self.end_waits else None)}


def _complete(folder: Path | None) -> list[str]:
    if folder is None or not folder.is_dir():
        return []
    return [str(p) for p in sorted(folder.iterdir(), key=_number)
            if p.name.startswith("ckpt-") and (p / MARKER).is_file()]


def _merge(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One save from every rank's record of it: MLPerf's duration (the slowest rank's
    write), the slowest rank's save and blocked time; rank 0's commit and bytes."""
    root = ranks[0]
    return {"index": root["index"], "repeat": root["repeat"], "epoch": root["epoch"],
            "step": root["step"], "path": root.get("path", ""), "bytes": root.get("bytes", 0),
            "write_s": max(r.get("write_s", 0.0) for r in ranks),
            "save_s": max(r.get("save_s", 0.0) for r in ranks),
            "blocked_s": max(r.get("blocked_s", 0.0) for r in ranks),
            "waited_s": max(r.get("waited_s", 0.0) for r in ranks),
            "stage_s": max(r.get("stage_s", 0.0) for r in ranks),
            "commit_s": root.get("commit_s", 0.0),
            "committed_ns": root.get("committed_ns", 0)}


def epoch_record(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """An epoch's checkpoint figures across ranks (`epochs[i].checkpoint`); `bytes` and
    `write_s_max` come once the epoch's saves are written (the repetition's end)."""
    cks = [r["checkpoint"] for r in ranks]
    aus = [c["au_with_checkpoint"] for c in cks if c["au_with_checkpoint"] is not None]
    blocked = [c["blocked_s"] for c in cks]
    out: dict[str, Any] = {
        "saves": max(c["saves"] for c in cks), "blocked_s_max": max(blocked),
        "blocked_s_mean": statistics.fmean(blocked),
        "wall_with_checkpoint_s": max(c["wall_with_checkpoint_s"] for c in cks),
        "au_with_checkpoint_mean": statistics.fmean(aus) if aus else None,
        "au_with_checkpoint_min": min(aus) if aus else None,
        "bytes": None, "write_s_max": None, "drain": None}
    splits = [c["drain"] for c in cks if c.get("drain") is not None]
    if splits:
        out["drain"] = split_record(sum(s["steps_in_flight"] for s in splits),
                                    sum(s["stall_in_flight_s"] for s in splits),
                                    sum(s["steps_idle"] for s in splits),
                                    sum(s["stall_idle_s"] for s in splits))
    return out


def summary(plan: CheckpointPlan, epochs: list[dict[str, Any]], saves: list[dict[str, Any]],
            final_drain_wait_s: float | None) -> dict[str, Any]:
    """The run's checkpoint figures: the cost of a save (the median time a step was blocked
    by it), the share of training time checkpoints took, and with --mtbf Young/Daly's
    interval in seconds and steps."""
    cks = [e["checkpoint"] for e in epochs if e.get("checkpoint") is not None]
    blocked = sum(c["blocked_s_max"] for c in cks)
    wall = sum(c["wall_with_checkpoint_s"] for c in cks)
    steps = sum(e["summary"]["steps"] for e in epochs)
    step_s = sum(e["summary"]["wall_s"] for e in epochs) / steps if steps else None
    med = _medians(saves)
    return {"saves": len(saves), "cost_s": med["blocked_s"], **{
                f"{k}_median": med[k] for k in ("save_s", "write_s", "bytes")},
            "blocked_s": blocked, "fraction": blocked / wall if wall > 0 else None,
            "interval_steps": plan.every_steps, "step_s": step_s,
            "interval_s": plan.every_steps * step_s if step_s is not None else None,
            "final_drain_wait_s": final_drain_wait_s,
            "drains_kept_up": _kept_up(saves),
            "young": _young(plan, med["blocked_s"], step_s)}


def _medians(saves: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("blocked_s", "save_s", "write_s", "bytes"):
        vals = [s[k] for s in saves]
        out[k] = statistics.median(vals) if vals else None
    return out


def _kept_up(saves: list[dict[str, Any]]) -> bool | None:
    verdicts = [s["drain"]["kept_up"] for s in saves if s.get("drain")
                and s["drain"]["kept_up"] is not None]
    return all(verdicts) if verdicts else None


def _young(plan: CheckpointPlan, cost_s: float | None, step_s: float | None
           ) -> dict[str, Any] | None:
    """Young/Daly's interval sqrt(2 C M) from the measured cost of a save, and the time lost
    per day at it and at the interval used (the restart is not measured by train: 0)."""
    mtbf = parse_mtbf(plan.mtbf_h)
    if mtbf is None or cost_s is None or not step_s:
        return None
    y = young(cost_s, 0.0, mtbf, plan.every_steps * step_s).to_dict()
    return {**y, "step_s": step_s, "used_steps": plan.every_steps,
            "optimal_steps": max(1, round(y["optimal_s"] / step_s))}


def _save_error(e: BaseException, where: Path, what: str = "write") -> BaseException:
    """A failed save (or load) as the error to raise (a full disk: one StorageError line)."""
    from iobench.workflows.checkpoint import _dcp_error

    return _dcp_error(e, where, what)


def _fill(fault: faults.Fault | None, rank: int, k: int, where: Path) -> None:
    """Tests only (IOBENCH_TEST_FAULT action `fill`, `epoch` the save's index): another
    writer fills the filesystem of --checkpoint-to just before the save."""
    if fault is not None and fault.action == "fill":
        from iobench.workflows.checkpoint import _fill_disk_fault

        _fill_disk_fault(fault, rank, k, where)


def _now() -> str:
    from iobench.core.results import now_iso

    return now_iso()


# ------------------------------------------------------------------ console words

def epoch_words(rec: dict[str, Any]) -> str:
    """The epoch line's checkpoint part: ", checkpoint 2 saves, blocked 0.41 s, AU with it 0.71"."""
    c = rec.get("checkpoint")
    if not c:
        return ""
    au = c["au_with_checkpoint_mean"]
    return (f", checkpoint {c['saves']} save(s), blocked {c['blocked_s_max']:.2f} s"
            + (f", AU with it {au:.2f}" if au is not None else ""))


def checkpoint_line(doc: dict[str, Any]) -> str | None:
    """The line `train` prints about its checkpoints before the verdict (None: none taken)."""
    c = doc.get("checkpoint")
    if not c or not c["saves"]:
        return None
    s = c["summary"]
    line = (f"checkpoints: {s['saves']} save(s) ({c['mode']}, every {c['every_steps']} "
            f"steps), {s['bytes_median'] / 1e6:,.1f} MB each, write {s['write_s_median']:.3f} s "
            f"(slowest rank), steps blocked {s['cost_s']:.3f} s per save, "
            f"{(s['fraction'] or 0):.1%} of training time; kept in {c['to']}")
    if c.get("resumed"):
        r = c["resumed"]
        line += (f"; resumed from step {r['step']} (epoch {r['epoch'] + 1}) of {r['path']}, "
                 f"loaded in {r['load_s']:.3f} s")
    if c["drain_to"] is not None:
        drains = [x["drain"] for x in c["saves"] if x.get("drain")]
        if drains:
            line += (f"; drained to {c['drain_to']} in {statistics.median(d['drain_s'] for d in drains):.3f} s "
                     f"each (kept up: {_yes(s['drains_kept_up'])}), last drain waited "
                     f"{s['final_drain_wait_s'] or 0:.3f} s at the end")
    return line


def _yes(v: bool | None) -> str:
    return "n/a" if v is None else ("yes" if v else "no")
