"""A checkpoint on disk: DCP's files, committed with a completion marker, read without trusting pickles.

A checkpoint is written into a temporary directory beside its final name
(`.NAME.partial`). Every rank's shard is fsync'ed by DCP (`sync_files`), every rank
fsyncs the directory, and after a barrier rank 0 writes the completion marker
(`iobench-checkpoint.json`: the layout, every file's size, the SHA-256 of DCP's
`.metadata`), fsyncs the directory again, renames it to its final name and fsyncs the
parent. A rank killed mid-write, a full disk or an interrupt therefore leaves the earlier
checkpoints and at most a `.partial` directory, which has no marker: `check_marker`, the
only way in for a read, refuses it.

DCP reads tensors with `torch.load(weights_only=True)`, but its `.metadata` file is a plain
pickle (`FileSystemReader.read_metadata` calls `pickle.load`), and non-tensor items go
through `torch.load(weights_only=False)`. iobench never lets either run on a file it did
not check: `.metadata` must match the marker's checksum and is unpickled by
`load_metadata`, which admits only DCP's metadata classes, torch dtypes, `torch.Size` and
paths, so a checkpoint holding anything but tensors is refused before DCP sees it.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import os
import pickle
import shlex
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from iobench.core.checkpoint_io import (
    DamagedShard,
    no_zip_crc,
    plain_transforms,
    read_ranges,
    write_behind_fs,
)
from iobench.core.checkpoint_write import fast_path, write_shard
from iobench.core.errors import DatasetError
from iobench.core.jsonio import read_json, write_json_atomic
from iobench.core.schema import Count, Dict, Map, Num, Str, check

MARKER = "iobench-checkpoint.json"
MARKER_SCHEMA = "iobench.checkpoint_marker"
MARKER_VERSION = 1
METADATA = ".metadata"  # DCP's metadata file name
PARTIAL = ".partial"


@dataclass(frozen=True)
class Marker:
    """The completion marker: what was written, so a read can tell a whole checkpoint."""

    model: str
    scale: float
    ranks: int
    seed: int
    files: dict[str, int]  # every file of the checkpoint (the marker aside) -> bytes
    metadata_sha256: str
    created: str

    def to_dict(self) -> dict[str, Any]:
        return {"schema": MARKER_SCHEMA, "schema_version": MARKER_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str) -> Marker:
        check(doc, _MARKER_SPEC, where)
        return cls(model=doc["model"], scale=float(doc["scale"]), ranks=doc["ranks"],
                   seed=doc["seed"], files=dict(doc["files"]),
                   metadata_sha256=doc["metadata_sha256"], created=doc["created"])


_MARKER_SPEC = Map({"schema": Str, "schema_version": Count, "model": Str, "scale": Num,
                    "ranks": Count, "seed": Count, "files": Dict(Count),
                    "metadata_sha256": Str, "created": Str}, extra=False)


class CheckpointRefused(DatasetError):
    """A directory that is not a complete checkpoint iobench wrote (no or a bad marker)."""


def partial_dir(final: Path) -> Path:
    """Where the checkpoint named `final` is written before it is complete."""
    return final.parent / f".{final.name}{PARTIAL}"


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (created and renamed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def commit(tmp: Path, final: Path, marker: Marker) -> None:
    """Rank 0, after every rank's shard is on storage: marker in, then the rename into place."""
    fsync_dir(tmp)
    write_json_atomic(tmp / MARKER, marker.to_dict())
    fsync_dir(tmp)
    if final.exists():  # never replace a checkpoint (os.rename would, an empty one)
        raise DatasetError(f"{final} exists already; iobench never replaces a checkpoint")
    os.rename(tmp, final)
    fsync_dir(final.parent)


OWNER = ".iobench-owner.json"  # in a folder while a run writes checkpoints into it
OWNER_SCHEMA = "iobench.checkpoint_owner"


def claim(folder: Path) -> None:
    """Record in `folder` (a `.partial` folder being written) which process writes it (host,
    boot, pid and its start time), so that a later run can tell one a killed run left from
    one still being written (`sweep_partials`); `release` removes the record (before the
    commit: a checkpoint holds no such record)."""
    write_json_atomic(folder / OWNER, {"schema": OWNER_SCHEMA, "schema_version": 1,
                                       **_this_process()})


def release(folder: Path) -> None:
    (folder / OWNER).unlink(missing_ok=True)


def _this_process() -> dict[str, Any]:
    import socket

    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": os.getpid(),
            "start": _start_time(os.getpid())}


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process), so that
    a pid reused by another process is not taken for the one recorded."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def writer_gone(folder: Path) -> bool | None:
    """Whether the run that claimed `folder` has ended: True (same host, and another boot or
    its process gone), False (it still runs), None (no readable record, or another host:
    this process cannot tell)."""
    import socket

    try:
        rec = read_json(folder / OWNER, schema=OWNER_SCHEMA, max_version=1)
    except (DatasetError, OSError):
        return None
    if rec.get("host") != socket.gethostname() or rec.get("boot_id") is None:
        return None
    if rec["boot_id"] != _boot_id():
        return True
    pid = rec.get("pid")
    return not isinstance(pid, int) or _start_time(pid) != rec.get("start")


@dataclass(frozen=True)
class Swept:
    """What `sweep_partials` did in one folder: `.partial` folders removed (their writer is
    gone), and those left: their writer still runs, or this process cannot tell."""

    folder: Path
    removed: tuple[Path, ...]
    running: tuple[Path, ...]
    unknown: tuple[Path, ...]


def sweep_partials(folder: Path) -> Swept:
    """Remove the `.partial` folders in `folder` that a killed run left (the claim inside
    each says its process has ended); leave those of a run that may still be writing."""
    removed: list[Path] = []
    running: list[Path] = []
    unknown: list[Path] = []
    for p in sorted(p for p in folder.glob(f".*{PARTIAL}") if p.is_dir()):
        gone = writer_gone(p)
        if gone:
            shutil.rmtree(p, ignore_errors=True)
        (unknown if gone is None else running if not gone
         else unknown if p.exists() else removed).append(p)
    return Swept(folder, tuple(removed), tuple(running), tuple(unknown))


def check_marker(path: Path, ranks: int | None = None) -> Marker:
    """The marker of the checkpoint at `path`, once its files match it; else
    CheckpointRefused, naming what is wrong (one line)."""
    if not path.is_dir():
        raise CheckpointRefused(f"--read {path}: no such directory")
    if not (path / MARKER).is_file():
        left = (f"; a {PARTIAL} folder is a checkpoint being written, or left by a killed "
                f"run: the next `iobench checkpoint --storage {path.parent.parent}` removes "
                f"it once that run is gone, or remove it with: rm -rf {shlex.quote(str(path))}"
                if path.name.endswith(PARTIAL) else "")
        raise CheckpointRefused(
            f"--read {path}: no completion marker ({MARKER}): not a complete checkpoint "
            "written by `iobench checkpoint` (a write that failed or was interrupted leaves "
            f"none); refusing to read it{left}")
    marker = Marker.from_dict(read_json(path / MARKER, schema=MARKER_SCHEMA,
                                        max_version=MARKER_VERSION), str(path / MARKER))
    for name, size in marker.files.items():
        f = path / name
        if "/" in name or name in ("", ".", "..") or not f.is_file():
            raise CheckpointRefused(f"--read {path}: {name!r}, named by its marker, is "
                                    "missing: the checkpoint is incomplete")
        if f.stat().st_size != size:
            raise CheckpointRefused(f"--read {path}: {name} holds {f.stat().st_size} bytes, "
                                    f"its marker says {size}: the checkpoint is damaged")
    if METADATA not in marker.files or sha256_of(path / METADATA) != marker.metadata_sha256:
        raise CheckpointRefused(f"--read {path}: {METADATA} does not match its marker's "
                                "checksum: the checkpoint was altered; refusing to unpickle it")
    if ranks is not None and marker.ranks != ranks:
        raise CheckpointRefused(f"--read {path}: written by {marker.ranks} rank(s), read by "
                                f"{ranks}: run it with {marker.ranks} (each rank reads its own "
                                "shard)")
    return marker


# What DCP's `.metadata` of a tensor-only checkpoint may name, and nothing else
_DCP_MD = "torch.distributed.checkpoint.metadata"
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    (_DCP_MD, "Metadata"), (_DCP_MD, "TensorStorageMetadata"), (_DCP_MD, "TensorProperties"),
    (_DCP_MD, "ChunkStorageMetadata"), (_DCP_MD, "MetadataIndex"), (_DCP_MD, "StorageMeta"),
    (_DCP_MD, "_MEM_FORMAT_ENCODING"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
    ("collections", "OrderedDict")})


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata of tensors, refusing every other global (no code runs)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in _ALLOWED or (module == "torch"
                                          and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise CheckpointRefused(f"the checkpoint's {METADATA} names {module}.{name}, which a "
                                "tensor-only checkpoint does not hold; refusing to load it")


def load_metadata(path: Path) -> Any:
    """DCP's metadata of the checkpoint at `path` (checked by `check_marker` first), without
    unpickling anything but DCP's own metadata records."""
    try:
        return _MetadataUnpickler(io.BytesIO((path / METADATA).read_bytes())).load()
    except CheckpointRefused:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
        raise CheckpointRefused(f"{path / METADATA} cannot be read as DCP metadata "
                                f"({type(e).__name__}: {e})") from None


def check_tensors(metadata: Any, state: dict[str, Any], path: Path) -> None:
    """CheckpointRefused unless the metadata holds every tensor of `state` (this rank's, as
    the marker's layout makes them) with its shape and dtype: DCP would fail mid-read."""
    held = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(held, dict):
        raise CheckpointRefused(f"{path / METADATA} holds no DCP state dict metadata")
    for key, t in state.items():
        md = held.get(key)
        size = getattr(md, "size", None)
        dtype = getattr(getattr(md, "properties", None), "dtype", None)
        if size is None or tuple(size) != tuple(t.shape) or dtype != t.dtype:
            raise CheckpointRefused(f"{path}: its metadata does not hold {key} as the layout its "
                                    "marker names makes it (shape, dtype): refusing to read it")


def writer(path: Path, after_shard: Any, records: bool = False) -> Any:
    """A DCP writer of one fsync'ed file per rank into `path` (written behind:
    `checkpoint_io.WriteBehindFile`), which records when this rank's shard is on storage
    (`shard_end_ns`) and its files, then calls `after_shard()`. `records`: the same file
    written by `checkpoint_write.write_shard` (no torch.save per tensor), not DCP's code."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    class _Writer(FileSystemWriter):
        shard_end_ns: int | None = None
        files: tuple[str, ...] = ()

        def write_data(self, plan: Any, planner: Any) -> Any:
            with no_zip_crc():
                fut = (write_shard(self, plan, planner) if records and fast_path(self)
                       else super().write_data(plan, planner))
            self.files = tuple(sorted({r.storage_data.relative_path for r in fut.value()}))
            self.shard_end_ns = time.perf_counter_ns()
            after_shard()
            return fut

    w = _Writer(path, single_file_per_rank=True, sync_files=True, thread_count=1,
                overwrite=False)
    w.fs = write_behind_fs()  # the same files, their write-back started as they are written
    transforms = plain_transforms()  # DCP's default (no extensions), one class less a tensor
    if transforms is not None and hasattr(w, "transforms"):
        w.transforms = transforms
    return w


_PLANNER: Any = None  # the benchmark's planner class, made when first needed
_CACHES = ("_cached_save_plan", "_cached_final_save_plan", "_cached_all_plans",
           "_cached_global_plan", "_cached_metadata")  # DCP's plan caches (SavePlanner's)


def save_planner() -> Any:
    """A DCP save planner for the benchmark's saves: DCP's default with DCP's own plan
    caching on (a save whose local plans are those of the run's save before sends no plan
    items to the coordinator and reuses the global plan and metadata DCP cached; the first
    save of a run plans in full), and without the cost of DCP's dedup where no two ranks
    plan the same item (`dedup_plans`). The plans and metadata are DCP's own. None (DCP's
    default planner) on a torch without plan caching (before 2.7)."""
    global _PLANNER
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    if "enable_plan_caching" not in inspect.signature(DefaultSavePlanner.__init__).parameters:
        return None
    if _PLANNER is None:

        class BenchmarkSavePlanner(DefaultSavePlanner):
            """(Its own class name: DCP's plan caches are keyed by it.)"""

            def _dedup_save_plans(self, all_plans: list[Any]) -> list[Any]:
                return dedup_plans(all_plans, self.dedup_save_to_lowest_rank)

        _PLANNER = BenchmarkSavePlanner
    return _PLANNER(enable_plan_caching=True)


def forget_plans() -> None:
    """Empty DCP's plan caches of `save_planner`'s saves: a run starts from a full plan
    (DCP compares a cached plan's items, not their dtypes)."""
    from torch.distributed.checkpoint.planner import SavePlanner

    planner = save_planner()
    if planner is None:
        return
    key = type(planner).__name__
    for name in _CACHES:
        getattr(SavePlanner, name, {}).pop(key, None)


def dedup_plans(all_plans: list[Any], to_lowest_rank: bool) -> list[Any]:
    """DCP's `dedup_save_plans` (each item several ranks plan kept on one), the same plans
    made without its per-item bookkeeping when no item is planned twice."""
    import dataclasses

    from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans  # torch >= 2.7

    count = sum(len(p.items) for p in all_plans)
    if len({item.index for p in all_plans for item in p.items}) != count:
        return dedup_save_plans(all_plans, to_lowest_rank)
    return [dataclasses.replace(p, items=list(p.items)) for p in all_plans]


def reader(path: Path, metadata: Any) -> Any:
    """A DCP reader of the checked checkpoint at `path` that hands DCP `metadata` (from
    `load_metadata`) instead of unpickling `.metadata` itself, reads each shard in large
    sequential ranges (`read_ranges`: O_DIRECT where the filesystem allows it, a few ranges
    in flight) and records when this rank's reads ended (`read_end_ns`)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.futures import Future

    class _Reader(FileSystemReader):
        read_end_ns: int | None = None

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("rank") is not None:  # DCP's per-rank fallback: there is none
                raise CheckpointRefused(f"{path}: no per-rank metadata")
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            if any(self.storage_data[r.storage_index].transform_descriptors
                   for r in plan.items):  # DCP's stream extensions: its own reader
                fut = super().read_data(plan, planner)
            else:
                try:
                    read_ranges(Path(self.path), self.storage_data, plan.items, planner)
                except DamagedShard as e:
                    raise CheckpointRefused(str(e)) from None
                fut = Future()
                fut.set_result(None)
            self.read_end_ns = time.perf_counter_ns()
            return fut

    return _Reader(path)
