"""Dataset generation: one writer per format, registered in one table.

`generate_dataset(GenerateConfig(...), world)` writes `<storage>/<dataset>-<format>/`
in parallel (MPI ranks, or `jobs` worker processes), deterministically (the
same seed and options give byte-identical files whatever the parallelism),
resumably, and writes the manifest last. See docs/design.md for the layouts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iobench import __version__
from iobench.core.dataref import dataset_root
from iobench.core.datasets import DatasetSpec, parse_dataset
from iobench.core.errors import ConfigError, DatasetError, IobenchError, StorageError
from iobench.core.formats import DEFAULT_FORMAT, FORMATS, NPZ, parse_compression, parse_format
from iobench.core.interrupts import check
from iobench.core.jsonio import write_json_atomic
from iobench.core.manifest import MANIFEST_NAME, FileEntry, Manifest
from iobench.core.world import World, sleep_until, wait_politely
from iobench.generators import get_writer, synthesis_version
from iobench.generators.base import Task, Writer, sha256_file
from iobench.generators.synth import SYNTHESIS_VERSION, has_depth_spread, synthesis_version_of

TaskDone = tuple[int, int, int, bool]  # (task id, files, bytes, resumed): entries in its journal

JOURNAL = ".iobench-partial"  # per-task completion records while generation runs
SCALES = ("small", "full")

__all__ = ["SYNTHESIS_VERSION", "GenerateConfig", "GenerateStats", "generate_dataset",
           "get_writer", "synthesis_version"]


@dataclass(frozen=True)
class GenerateConfig:
    """What to generate and where. `samples`/`samples_per_file` None: the dataset's default."""

    dataset: str = "cifar10"
    format: str = DEFAULT_FORMAT
    storage: Path = Path("./iobench-data")
    samples: int | None = None
    samples_per_file: int | None = None
    compression: str = "none"
    seed: int = 0
    jobs: int = 1
    force: bool = False
    scale: str = "small"

    def __post_init__(self) -> None:
        spec = parse_dataset(self.dataset)
        parse_format(self.format)
        object.__setattr__(self, "storage", Path(self.storage))
        if self.scale not in SCALES:
            raise ConfigError(f"--scale {self.scale!r}; choose one of: {', '.join(SCALES)}")
        if self.samples is not None and self.samples < 1:
            raise ConfigError(f"--samples {self.samples} must be >= 1")
        if self.samples_per_file is not None and self.samples_per_file < 1:
            raise ConfigError(f"--samples-per-file {self.samples_per_file} must be >= 1")
        parse_compression(self.format, self.compression, spec.sample_kind)
        if has_depth_spread(spec) and self.format != NPZ:
            raise ConfigError(f"--format {self.format}: {self.dataset} samples vary in size "
                              "(MLPerf's spread), which only one file per sample stores; "
                              "use --format npz")
        if self.seed < 0:
            raise ConfigError(f"--seed {self.seed} must be >= 0")
        if self.jobs < 1:
            raise ConfigError(f"--jobs {self.jobs} must be >= 1")
        if self.samples is None:
            n = spec.full_samples if self.scale == "full" else spec.default_samples
            object.__setattr__(self, "samples", n)
        if self.samples_per_file is None:
            object.__setattr__(self, "samples_per_file", spec.default_samples_per_file)

    @property
    def num_samples(self) -> int:
        """`samples`, which `__post_init__` resolves (never None after it)."""
        assert self.samples is not None
        return self.samples

    @property
    def per_file(self) -> int:
        """`samples_per_file`, which `__post_init__` resolves (never None after it)."""
        assert self.samples_per_file is not None
        return self.samples_per_file

    @property
    def spec(self) -> DatasetSpec:
        return parse_dataset(self.dataset)

    @property
    def root(self) -> Path:
        """Where the dataset is written: `iobench.core.dataref.dataset_root` of the request."""
        return dataset_root(self.storage, self.dataset, self.format)

    def identity(self) -> dict[str, Any]:
        """What makes two generations the same dataset (parallelism excluded)."""
        return {"dataset": self.dataset, "format": self.format, "samples": self.samples,
                "samples_per_file": self.samples_per_file, "compression": self.compression,
                "seed": self.seed, "synthesis_version": synthesis_version_of(self.dataset)}


@dataclass
class GenerateStats:
    """What a generation did: bytes and files written (resumed ones apart), seconds."""

    bytes_written: int = 0
    files_written: int = 0
    files_resumed: int = 0
    seconds: float = 0.0
    already_complete: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 1e6 / self.seconds if self.seconds > 0 else 0.0




# ------------------------------------------------------------------ target checks

def _replacement_dir(root: Path) -> Path:
    """Where `--force` builds a dataset that replaces `root`: beside it, swapped in when done."""
    return root.with_name(f".{root.name}.iobench-replacement")


def _prepare_target(cfg: GenerateConfig) -> tuple[bool, Path]:
    """Create or validate the target; return (it already holds this dataset, where to write).

    A dataset that `--force` replaces stays whole until its replacement is complete: the
    new one is written beside it (resumable there) and swapped in by `_swap_in`.
    """
    root, ident = cfg.root, cfg.identity()
    try:
        cfg.storage.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(f"cannot create --storage {cfg.storage}: {e.strerror}") from e
    if not os.access(cfg.storage, os.W_OK | os.X_OK):
        raise StorageError(f"--storage {cfg.storage} is not writable; choose another directory")
    if root.exists() and not root.is_dir():
        raise StorageError(f"{root} exists and is not a directory; remove it or choose "
                           "another --storage")
    work = _replacement_dir(root)
    if work.exists() and not (root.is_dir() and any(root.iterdir())):
        # an interrupted replacement whose old dataset is gone since: resume it in place
        if _existing_identity(work) == ident:
            if root.is_dir():
                root.rmdir()
            os.rename(work, root)
        else:
            shutil.rmtree(work)
    if root.is_dir() and any(root.iterdir()):
        found = _existing_identity(root)
        if found != ident:
            if not cfg.force:
                old, new = (found or {}).get("synthesis_version"), ident["synthesis_version"]
                if found and old != new and {**found, "synthesis_version": new} == ident:
                    raise DatasetError(
                        f"{root} holds this dataset from synthesis version {old}, whose "
                        f"samples differ from the version {new} this iobench "
                        "writes (it can still be read and verified); pass --force to "
                        "replace it, or choose another --storage")
                what = ("a different dataset" if found else "files that are not an iobench "
                        "dataset")
                raise DatasetError(f"{root} already holds {what} "
                                   f"({_describe(found)}); pass --force to replace it, or "
                                   "choose another --storage")
            if work.exists() and _existing_identity(work) != ident:
                shutil.rmtree(work)  # an interrupted replacement by another dataset
            _check_space(cfg, work)
            (work / JOURNAL).mkdir(parents=True, exist_ok=True)
            write_json_atomic(work / JOURNAL / "config.json", ident)
            return False, work
        elif (root / MANIFEST_NAME).is_file() and not (root / JOURNAL).exists():
            if work.exists():  # a replacement by this same dataset, no longer needed
                shutil.rmtree(work)
            return True, root
    _check_space(cfg, root)
    (root / JOURNAL).mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / JOURNAL / "config.json", ident)
    return False, root


def _check_space(cfg: GenerateConfig, root: Path) -> None:
    """Refuse, before writing anything, a request the storage cannot hold (bytes, files)."""
    # compressed samples may take less: the writers' own out-of-space error covers them
    need = _estimate_bytes(cfg) if cfg.compression == "none" else 0
    if need and root.is_dir():  # resuming: what earlier runs wrote counts
        need = max(0, need - _bytes_under(root))
    st = os.statvfs(cfg.storage)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise StorageError(
            f"--samples {cfg.samples} of {cfg.dataset} needs about {_size(need)} and "
            f"{cfg.storage} has {_size(free)} free; choose fewer --samples or another "
            "--storage")
    per_sample = parse_format(cfg.format).per_sample_files
    if cfg.spec.sample_kind == "jpeg" and not per_sample:
        # a container's JPEGs are encoded into memory, then written: per file and job
        per_job = min(cfg.num_samples, cfg.per_file) * 110_000 * 2
        avail = _memory_available()
        if avail and per_job * cfg.jobs > avail:
            raise ConfigError(
                f"--samples-per-file {cfg.samples_per_file} of {cfg.dataset} builds about "
                f"{_size(per_job)} in memory per file in each of {cfg.jobs} job(s), and this "
                f"machine has {_size(avail)} available; choose fewer --samples-per-file or "
                "--jobs")
    files = -(-cfg.num_samples // cfg.per_file) if not per_sample else cfg.num_samples
    if st.f_files and files + 16 > st.f_favail:
        records = ", ".join(n for n, f in FORMATS.items() if not f.per_sample_files)
        raise StorageError(
            f"--samples {cfg.samples} as {cfg.format} needs about {files:,} files and "
            f"{cfg.storage} has {st.f_favail:,} inodes free; choose fewer --samples, a "
            f"record format ({records}), or another --storage")


def _memory_available() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _bytes_under(root: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


def _size(n: int) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= div:
            return f"{n / div:,.1f} {unit}"
    return f"{n:,} bytes"


def _swap_in(work: Path, root: Path, entries: Iterable[FileEntry]) -> None:
    """Put the complete replacement at `root`, once each of its files is there with the
    size (and checksum, recorded while writing) its manifest lists; the old dataset goes
    only after that."""
    for e in entries:
        try:
            size = (work / e.path).stat().st_size
        except OSError:
            size = -1
        if size != e.bytes:
            raise StorageError(f"the replacement of {root} is not whole ({e.path}: {size} bytes, "
                               f"{e.bytes} written); the old dataset is kept: rerun to resume")
    old = root.with_name(f".{root.name}.iobench-replaced")
    if old.exists():
        shutil.rmtree(old)
    os.rename(root, old)
    os.rename(work, root)
    shutil.rmtree(old, ignore_errors=True)


def _existing_identity(root: Path) -> dict[str, Any] | None:
    try:
        # datasets from before synthesis versions were recorded are version 1
        if (root / JOURNAL / "config.json").is_file():
            return {"synthesis_version": 1,
                    **json.loads((root / JOURNAL / "config.json").read_text())}
        if (root / MANIFEST_NAME).is_file():
            m = Manifest.load(root)
            return {"dataset": m.dataset, "format": m.format, "samples": m.num_samples,
                    "samples_per_file": m.layout.get("generated_samples_per_file",
                                                     m.layout.get("samples_per_file")),
                    "compression": m.layout.get("compression"), "seed": m.seed,
                    "synthesis_version": synthesis_version(m)}
    except (OSError, ValueError, IobenchError):
        return None
    return None




def _describe(ident: dict[str, Any] | None) -> str:
    if not ident:
        return "no manifest"
    return ", ".join(f"{k}={v}" for k, v in ident.items())


# ------------------------------------------------------------------ one task

def _journal_path(root: Path, task: Task) -> Path:
    return root / JOURNAL / f"task-{task.id:07d}.json"


def _resumable(root: Path, task: Task) -> list[FileEntry] | None:
    """The task's entries if its files are complete and correct (size and sha256)."""
    jp = _journal_path(root, task)
    if not jp.is_file():
        return None
    try:
        entries = [FileEntry(**e) for e in json.loads(jp.read_text())]
        for e in entries:
            p = root / e.path
            if not p.is_file() or p.stat().st_size != e.bytes or sha256_file(p) != e.sha256:
                return None
    except (OSError, ValueError, TypeError):
        return None
    return entries


def _run_task(writer: Writer, root: Path, task: Task) -> TaskDone:
    """Write (or keep) one task's files; returns (task id, files, bytes, resumed). The
    files' entries are in the task's journal, where the manifest is built from: no
    process holds every task's entries while the others are written."""
    entries = _resumable(root, task)
    if entries is not None:
        return task.id, len(entries), sum(e.bytes for e in entries), True
    try:
        entries = writer.write(root, task)
    except IobenchError:
        raise
    except Exception as e:
        if not writer.is_storage_failure(e):
            raise
        # netCDF-C and LMDB report a full disk as "HDF error" or EIO: ask the disk
        free = shutil.disk_usage(root).free
        if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) \
                or free < 2 * _estimate_task_bytes(writer, task) + (1 << 20):
            raise StorageError(f"out of space on {root} while writing {task.files[0]} "
                               f"({free} bytes free); free space or choose another "
                               "--storage, then rerun to resume") from None
        why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        raise StorageError(f"cannot write {root / task.files[0]}: {why}") from None
    write_json_atomic(_journal_path(root, task), [e.as_dict() for e in entries], indent=None)
    return task.id, len(entries), sum(e.bytes for e in entries), False


def _estimate_task_bytes(writer: Writer, task: Task) -> int:
    return (writer.spec.sample_nbytes or 110_000) * task.count


_POOL_STATE: dict[str, Any] = {}


def _pool_init(writer: Writer, root: Path) -> None:
    import signal

    _POOL_STATE.update(writer=writer, root=root)
    # Ctrl-C reaches the whole process group: the main process stops the pool in order,
    # and a worker whose main process died (killed, or its grace timer) ends quietly
    # instead of printing a broken pipe's traceback for each result it cannot hand over
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: Pool.terminate
    _die_with_parent()


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent exits (prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)


def _pool_task(task: Task) -> TaskDone | IobenchError:
    try:
        return _run_task(_POOL_STATE["writer"], _POOL_STATE["root"], task)
    except IobenchError as e:
        return e


# ------------------------------------------------------------------ the job

Progress = Callable[[int, int], None]  # (bytes done so far, bytes expected)


def generate_dataset(cfg: GenerateConfig, world: World | None = None, *,
                     progress: Progress | None = None,
                     stats: GenerateStats | None = None) -> Manifest:
    """Generate (or resume, or find complete) the dataset; return its manifest on every rank.

    Under MPI (`world.size > 1`) rank r writes tasks r, r + R, ...; otherwise
    `cfg.jobs` processes share the tasks. Rank 0 writes the manifest last.
    """
    world = world or World()
    lock = _WriterLock(cfg.root) if world.is_root else None
    try:
        return _generate(cfg, world, progress, stats, lock)
    finally:
        if lock is not None:
            lock.release()


class _WriterLock:
    """One writer per dataset folder: `.<name>.iobench-lock` beside it, created with O_EXCL,
    holding the writer's host, pid and start time (works on filesystems without flock).
    A lock whose process is gone from this host is stale and taken over."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root.with_name(f".{root.name}.iobench-lock")
        self.held = False

    def acquire(self) -> None:
        import socket

        me = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                other = self._holder()
                if other and other.get("host") == me["host"] and not _alive(other.get("pid")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path)  # stale: its process is gone
                    continue
                who = (f"pid {other.get('pid')} on {other.get('host')} since "
                       f"{other.get('started')}" if other else "another process")
                raise DatasetError(f"{self.root} is being written "
                                   f"by {who}; wait for it, or if no generate runs there any "
                                   f"more, remove {self.path}") from None
            except OSError as e:
                raise StorageError(f"cannot create {self.path}: {e.strerror}") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return

    def _holder(self) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.path.read_text())
            return doc if isinstance(doc, dict) else None
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.held:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.held = False


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _generate(cfg: GenerateConfig, world: World, progress: Progress | None,
              stats: GenerateStats | None, lock: _WriterLock | None) -> Manifest:
    stats = stats if stats is not None else GenerateStats()
    writer = get_writer(cfg.format, cfg.spec, cfg.seed, cfg.compression)
    done, work = _claim_target(cfg, world, lock)
    final = cfg.root.resolve()
    if done:
        stats.already_complete = True
        return Manifest.load(final)
    root = work.resolve()
    tasks = writer.plan(cfg.num_samples, cfg.per_file)
    est = _estimate_bytes(cfg)
    t0 = time.perf_counter()
    if progress and world.is_root:  # the size to expect, before the first file is done
        progress(0, est)
    if world.size > 1:
        results, err = _run_mpi(writer, root, tasks, world, progress, est)
    else:
        results, err = _run_local(writer, root, tasks, cfg.jobs, progress, est)
    if err is not None:
        raise err
    if not world.is_root:
        world.barrier()
        stats.seconds = time.perf_counter() - t0
        return Manifest.load(final)
    for _tid, nfiles, nbytes, resumed in results:
        if resumed:
            stats.files_resumed += nfiles
        else:
            stats.files_written += nfiles
            stats.bytes_written += nbytes
    stats.seconds = time.perf_counter() - t0
    files = _manifest_files(root, tasks, cfg.num_samples)
    stats.extra = _statistics(cfg, writer, root, files)
    _manifest(cfg, writer, files, stats.extra).write(root, form="auto")  # compact when large
    shutil.rmtree(root / JOURNAL, ignore_errors=True)
    if root != final:
        _swap_in(root, final, files)
    world.barrier()
    return Manifest.load(final)


def _claim_target(cfg: GenerateConfig, world: World,
                  lock: _WriterLock | None) -> tuple[bool, Path]:
    """(whether the dataset is there already, the folder to write into), decided by rank 0
    under the writer lock and given to every rank (a collective; raises on every rank)."""
    err: IobenchError | None = None
    done, work = False, cfg.root
    if world.is_root:
        try:
            cfg.storage.mkdir(parents=True, exist_ok=True)
            assert lock is not None
            lock.acquire()
            done, work = _prepare_target(cfg)
        except IobenchError as e:  # first: StorageError is an OSError too
            err = e
        except OSError as e:
            err = StorageError(f"cannot create --storage {cfg.storage}: {e.strerror or e}")
    err, done, work = world.bcast((err, done, work))
    if err is not None:
        raise err
    return done, work


def _manifest(cfg: GenerateConfig, writer: Writer, files: Sequence[FileEntry],
              extra: dict[str, Any]) -> Manifest:
    """The generated dataset's manifest."""
    spec = cfg.spec
    return Manifest(
        dataset=cfg.dataset, format=cfg.format, num_samples=cfg.num_samples,
        num_classes=spec.num_classes,
        sample={"kind": spec.sample_kind, "shape": list(spec.sample_shape)
                if spec.sample_shape else None, "dtype": spec.sample_dtype},
        label={"shape": list(spec.label_shape), "dtype": spec.label_dtype},
        layout={**writer.layout(cfg.per_file),
                "generated_samples_per_file": cfg.samples_per_file},
        files=files, seed=cfg.seed, iobench_version=__version__,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), extra=extra)


def _journal_entries(root: Path, tasks: list[Task]) -> Iterator[FileEntry]:
    """Every task's entries, in task (so file) order, read back from the journals."""
    for t in tasks:
        path = _journal_path(root, t)
        try:
            rows = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot read {path} back ({e}): the dataset's record of "
                               "what was written is damaged; rerun to resume") from None
        yield from (FileEntry(**row) for row in rows)


def _manifest_files(root: Path, tasks: list[Task], num_samples: int) -> Sequence[FileEntry]:
    """The manifest's file table, from the journals: beyond COMPACT_FILES data files the
    compact table, built row by row into arrays (never a list of every entry), when the
    files follow one naming pattern; else the entries as a tuple."""
    from iobench.core import manifest

    count = sum(len(t.files) for t in tasks if t.count > 0)
    if count > manifest.COMPACT_FILES:
        table = manifest.compact_files(_journal_entries(root, tasks), num_samples, count)
        if table is not None:
            return table
    return tuple(_journal_entries(root, tasks))


def _estimate_bytes(cfg: GenerateConfig) -> int:
    """The dataset's bytes, roughly (a JPEG sample counts ImageNet's mean, 110 kB)."""
    per = cfg.spec.sample_nbytes or 110_000
    return per * cfg.num_samples


def _run_local(writer: Writer, root: Path, tasks: list[Task], jobs: int,
               progress: Progress | None, est: int) -> tuple[list[TaskDone], IobenchError | None]:
    results: list[TaskDone] = []
    done_bytes = 0
    if jobs == 1:
        for t in tasks:
            check()  # an interrupt whose raise Python dropped (in a weakref callback)
            try:
                r = _run_task(writer, root, t)
            except IobenchError as e:
                return results, e
            results.append(r)
            done_bytes += r[2]
            if progress:
                progress(done_bytes, est)
        return results, None
    ctx = mp.get_context("fork")
    err: IobenchError | None = None
    writer.prepare()  # the workers inherit the synthesis tables instead of each building them
    with ctx.Pool(jobs, initializer=_pool_init, initargs=(writer, root)) as pool:
        for done in pool.imap_unordered(_pool_task, tasks):
            check()
            if isinstance(done, IobenchError):
                err = err or done
                continue
            results.append(done)
            done_bytes += done[2]
            if progress:
                progress(done_bytes, est)
    return results, err


_TAG_TASK, _TAG_DONE = 71, 72


def _run_mpi(writer: Writer, root: Path, tasks: list[Task], world: World,
             progress: Progress | None, est: int) -> tuple[list[TaskDone], IobenchError | None]:
    """Rank r writes tasks r::R; non-root ranks stream results to rank 0 as they finish."""
    comm = world.comm
    mine = tasks[world.rank::world.size]
    err: IobenchError | None = None
    if not world.is_root:
        for t in mine:
            check()
            try:
                comm.send(_run_task(writer, root, t), dest=0, tag=_TAG_TASK)
            except IobenchError as e:
                err = e
                break
        comm.send(err, dest=0, tag=_TAG_DONE)
        wait_politely(comm)  # asleep while rank 0 finishes (a blocking bcast spins a core)
        err = comm.bcast(None, root=0)
        return [], err
    from mpi4py import MPI

    results: list[TaskDone] = []
    done_bytes, pending = 0, world.size - 1

    def drain(block: bool) -> None:
        """Take the other ranks' messages that came; with `block`, until every rank is done,
        sleeping between looks (a blocking receive polls at a full core, which the ranks
        still writing on this host need)."""
        nonlocal done_bytes, pending, err
        st = MPI.Status()
        def came() -> bool:
            return bool(comm.iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG))

        while pending:
            if not came():
                if not block:
                    return
                sleep_until(came)
            msg = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
            if st.Get_tag() == _TAG_DONE:
                pending -= 1
                err = err or msg
            else:
                results.append(msg)
                done_bytes += msg[2]
                if progress:
                    progress(done_bytes, est)

    for t in mine:
        check()
        if err is None:
            try:
                r = _run_task(writer, root, t)
            except IobenchError as e:
                err = e
                continue
            results.append(r)
            done_bytes += r[2]
            if progress:
                progress(done_bytes, est)
        drain(block=False)
    drain(block=True)
    wait_politely(comm)
    comm.bcast(err, root=0)
    return results, err


def _statistics(cfg: GenerateConfig, writer: Writer, root: Path,
                files: Sequence[FileEntry]) -> dict[str, Any]:
    """Generation statistics kept in the manifest (JPEG size distribution for imagenet)."""
    import itertools

    import numpy as np

    from iobench.core.manifest import CompactFiles

    table = files if isinstance(files, CompactFiles) else None
    data = table.data if table is not None else [e for e in files if e.role == "data"]
    total = (table.data_bytes + sum(e.bytes for e in table.aux) if table is not None
             else sum(e.bytes for e in files))
    out: dict[str, Any] = {"synthesis_version": synthesis_version_of(cfg.dataset),
                           "total_bytes": total}
    if has_depth_spread(cfg.spec):  # one sample per file: the files' sizes are the samples'
        b = (np.asarray(table.arrays()["bytes"][:], dtype=np.float64) if table is not None
             else np.array([e.bytes for e in data], dtype=np.float64))
        out["sample_bytes"] = {"mean": float(b.mean()), "std": float(b.std()),
                               "min": int(b.min()), "max": int(b.max()), "count": int(b.size)}
    if cfg.spec.sample_kind != "jpeg":
        return out

    s = np.fromiter(itertools.chain.from_iterable(writer.jpeg_sizes(root / e.path, e)
                                                  for e in data), dtype=np.float64)
    out["jpeg_bytes"] = {"mean": float(s.mean()), "std": float(s.std()),
                         "p5": float(np.percentile(s, 5)), "p50": float(np.median(s)),
                         "p95": float(np.percentile(s, 95)), "min": int(s.min()),
                         "max": int(s.max()), "count": int(s.size)}
    return out
