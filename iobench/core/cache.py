"""Page-cache control: evict a dataset's pages and measure how much is resident.

A storage benchmark that reads from the page cache measures memory, so
iobench evicts before every epoch and records the resident fraction it
*measured* afterwards (METRICS.md, "Cold cache").

Residency is measured with `cachestat(2)` (Linux >= 6.5) or `mincore(2)` on a
read-only mapping. Both only tell the truth to a process that may write the
file (owner, writer, or holder of CAP_FOWNER / CAP_DAC_OVERRIDE): `mincore`
then pretends every page is resident and `cachestat` refuses with EPERM. In
that case the answer is None ("unknown"), never a false 1.0.

`evict_for_node` is what the training loop calls before an epoch: every rank
evicts its share of the files its node reads, then the job measures what is
left, per node, and says loudly when eviction did not work.

Eviction knows the filesystem (`eviction_plan`): the page cache is what a
client empties on a local disk, plus the lock LRU on Lustre (`lctl`, root);
GPFS keeps data in its pagepool, which no fadvise reaches; and on every shared
tier the servers keep caches of their own that no client can empty. There
only the site can make an epoch cold (`--evict-cmd CMD`, run by each node's
local rank 0 first); without it a cold-looking epoch is `unverified`, with the
reason, never `cold`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from iobench.core.errors import ConfigError, StorageError, UnsupportedError
from iobench.core.launch import capture, last_line_of

if TYPE_CHECKING:
    from iobench.core.manifest import FileEntry, Manifest
    from iobench.core.sysinfo import MountInfo
    from iobench.core.world import World

PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.syscall.restype = ctypes.c_long
_SYNC_FILE_RANGE = getattr(_libc, "sync_file_range", None)
if _SYNC_FILE_RANGE is not None:
    _SYNC_FILE_RANGE.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
# SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
_SFR_WRITE_AND_WAIT = 1 | 2 | 4
_MAP_FAILED = ctypes.c_void_p(-1).value
# cachestat(2) has the same number on every architecture that uses the generic table.
_CACHESTAT_NR = {"x86_64": 451, "aarch64": 451, "ppc64le": 451, "riscv64": 451}.get(
    platform.machine())
_CAP_DAC_OVERRIDE, _CAP_FOWNER = 1, 3

# After eviction, more than this fraction still resident means eviction failed.
DEFAULT_WARN_ABOVE = 0.10


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64)]


@dataclass(frozen=True)
class EvictResult:
    """What an eviction pass did: files and bytes advised, and failures by path."""

    files: int
    bytes: int
    errors: tuple[str, ...]


def _write_back(fd: int) -> None:
    """Write the file's dirty pages and wait, without a filesystem-level sync.

    `sync_file_range` only walks the page cache: a no-op for clean files, so
    evicting a million files of a read-only dataset costs no metadata-server
    round trips (`fdatasync` may cost one per file on a parallel filesystem).
    """
    if _SYNC_FILE_RANGE is not None and _SYNC_FILE_RANGE(fd, 0, 0, _SFR_WRITE_AND_WAIT) == 0:
        return
    with contextlib.suppress(OSError):  # read-only filesystems refuse; pages are clean
        os.fdatasync(fd)


def evict(paths: Iterable[str | Path]) -> EvictResult:
    """Drop the cached pages of each file (write-back then `POSIX_FADV_DONTNEED`).

    Works without root. Dirty pages cannot be dropped, hence the write-back
    first. Some filesystems ignore the advice (tmpfs holds its data in the
    page cache; NFS may keep pages); callers measure residency afterwards.
    """
    n = nbytes = 0
    errors: list[str] = []
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            errors.append(f"{p}: {e.strerror}")
            continue
        try:
            _write_back(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            nbytes += os.fstat(fd).st_size
            n += 1
        except OSError as e:
            errors.append(f"{p}: {e.strerror}")
        finally:
            os.close(fd)
    return EvictResult(files=n, bytes=nbytes, errors=tuple(errors))


def drop_all_caches() -> None:
    """Ask the kernel to drop the whole page cache (root only; affects the whole node)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError as e:
        raise UnsupportedError(f"cannot write /proc/sys/vm/drop_caches ({e.strerror}): "
                               "dropping all caches needs root; leave out --drop-caches to "
                               "use per-file eviction") from e


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def _truthful(path: str | Path, st: os.stat_result) -> bool:
    """Whether mincore will tell this process the truth about `path` (kernel's can_do_mincore)."""
    caps = _effective_caps()
    if st.st_uid == os.geteuid() or caps & (1 << _CAP_FOWNER):
        return True
    try:
        return os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)
    except OSError:
        return False


_CACHESTAT_DENIED = -1


def _cachestat_pages(fd: int) -> int | None:
    """Pages cached, None when the kernel lacks cachestat, -1 when it refuses (EPERM)."""
    if _CACHESTAT_NR is None:
        return None
    rng, cs = _CachestatRange(0, 0), _Cachestat()
    r = _libc.syscall(_CACHESTAT_NR, fd, ctypes.byref(rng), ctypes.byref(cs), 0)
    if r != 0:
        return _CACHESTAT_DENIED if ctypes.get_errno() == errno.EPERM else None
    return int(cs.nr_cache)


def _mincore_pages(fd: int, size: int) -> int | None:
    addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    if addr in (None, _MAP_FAILED):
        return None
    try:
        npages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * npages)()
        if _libc.mincore(addr, size, vec) != 0:
            return None
        import numpy as np

        return int(np.count_nonzero(np.frombuffer(memoryview(vec), dtype=np.uint8) & 1))
    finally:
        _libc.munmap(addr, size)


def resident_bytes(path: str | Path) -> int | None:
    """Bytes of `path` in the page cache, or None when the OS will not say truthfully."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _resident_fd(fd, path, os.fstat(fd))
    finally:
        os.close(fd)


def _resident_fd(fd: int, path: str | Path, st: os.stat_result) -> int | None:
    try:
        if st.st_size == 0:
            return 0
        pages = _cachestat_pages(fd)
        if pages == _CACHESTAT_DENIED:
            return None  # mincore would answer "all resident" to this process: a lie
        if pages is None:
            if not _truthful(path, st):
                return None
            pages = _mincore_pages(fd, st.st_size)
        if pages is None:
            return None
        return min(pages * PAGE, st.st_size)
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.EACCES, errno.EPERM):
            return None
        raise


@dataclass(frozen=True)
class Residency:
    """Page-cache residency of a set of files; `fraction` is None when unknowable."""

    resident_bytes: int
    total_bytes: int
    unknown_files: int

    @property
    def fraction(self) -> float | None:
        if self.unknown_files:
            return None
        return self.resident_bytes / self.total_bytes if self.total_bytes else 0.0

    def __add__(self, other: Residency) -> Residency:
        return Residency(self.resident_bytes + other.resident_bytes,
                         self.total_bytes + other.total_bytes,
                         self.unknown_files + other.unknown_files)


def residency(paths: Iterable[str | Path]) -> Residency:
    """Resident and total bytes of the files; files the OS will not report are counted apart."""
    total = cached = unknown = 0
    for p in paths:
        try:
            size = os.stat(p).st_size
        except OSError:
            unknown += 1
            continue
        try:
            r = resident_bytes(p)
        except OSError:  # never fail a rank (its peers wait at a barrier) over a measurement
            r = None
        if r is None and size > 0:
            unknown += 1
        total += size
        cached += r or 0
    return Residency(cached, total, unknown)


def evict_and_measure(paths: Iterable[str | Path]) -> tuple[EvictResult, Residency]:
    """`evict` each file, then measure what stayed resident, with one open per file.

    One open instead of two matters on a parallel filesystem, where every open
    is a metadata-server round trip (a million-file dataset, every epoch).
    """
    n = nbytes = cached = total = unknown = 0  # plain sums, not a Residency added per file
    errors: list[str] = []
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            errors.append(f"{p}: {e.strerror}")
            unknown += 1
            continue
        try:
            _write_back(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            st = os.fstat(fd)
            nbytes += st.st_size
            n += 1
            r = _resident_fd(fd, p, st)
            cached, total = cached + (r or 0), total + st.st_size
            unknown += r is None and st.st_size > 0
        except OSError as e:
            errors.append(f"{p}: {e.strerror}")
            unknown += 1
        finally:
            os.close(fd)
    return (EvictResult(files=n, bytes=nbytes, errors=tuple(errors)),
            Residency(cached, total, unknown))


def resident_fraction(paths: Iterable[str | Path]) -> float | None:
    """Fraction of the files' bytes that are cached now; None if any file is unknowable."""
    return residency(paths).fraction



# ------------------------------------------------------------- what each filesystem allows

#: Lustre: drop the client's cached DLM locks, and with them its cached pages (root only)
LUSTRE_LRU_CLEAR = ("lctl", "set_param", "-n", "ldlm.namespaces.*.lru_size=clear")
#: the emulated tier's daemon drops its backing pages itself: no server cache to empty
_EMULATED_FSTYPE = "fuse.iobench-pfs"
#: how long a site's --evict-cmd may run (seconds)
EVICT_CMD_TIMEOUT_S = 600.0
#: how long a client command (Lustre's lock LRU clear) may run (seconds)
CLIENT_CMD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class EvictionPlan:
    """How iobench can empty the caches that hold a filesystem's data, and what it cannot.

    `client`: what iobench does on each node (fadvise = `POSIX_FADV_DONTNEED`
    per file, which empties the page cache; `fadvise+lctl` adds Lustre's lock
    LRU). `client_complete`: whether that empties the client's whole cache
    (False on GPFS: the pagepool is not the page cache, and `mincore` shows
    nothing resident while it serves reads). `server_caches`: whether the
    data sits behind servers whose caches no client can empty. `needs_site`
    is the reason an epoch cannot be verified cold without `--evict-cmd`.
    """

    fstype: str
    kind: str
    client: str
    client_complete: bool
    server_caches: bool
    needs_site: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def eviction_plan(mount: MountInfo) -> EvictionPlan:
    """The eviction that reaches a filesystem's data, from its mount (`sysinfo.mount_of`)."""
    fstype, kind = mount.fstype, mount.kind
    client, complete = "fadvise", True
    if fstype == "lustre":
        client = "fadvise+lctl" if os.geteuid() == 0 and shutil.which("lctl") else "fadvise"
    if fstype == "gpfs":
        complete = False
    server = (kind in ("parallel", "network", "fuse-network")
              or (kind == "fuse" and fstype != _EMULATED_FSTYPE))
    why = None
    if not complete:
        why = (f"{fstype} keeps file data in its own client cache (the GPFS pagepool), which "
               "POSIX_FADV_DONTNEED does not empty and mincore does not see, and its servers "
               "keep caches no client can empty")
    elif server:
        what = ("a FUSE filesystem of unknown nature, whose daemon may keep data where no "
                "page-cache eviction reaches" if kind == "fuse" else
                f"a shared filesystem ({kind}) whose servers keep caches no client can empty")
        why = f"the data is on {fstype}, {what}"
        if fstype == "lustre" and client == "fadvise":
            why += ("; and the client's lock LRU was not cleared (`lctl set_param "
                    "ldlm.namespaces.*.lru_size=clear` needs root and lctl)")
    return EvictionPlan(fstype=fstype, kind=kind, client=client, client_complete=complete,
                        server_caches=server, needs_site=why)


def client_commands(plan: EvictionPlan) -> list[tuple[str, ...]]:
    """Commands local rank 0 of each node runs, besides fadvise, to empty the client cache."""
    return [LUSTRE_LRU_CLEAR] if plan.client == "fadvise+lctl" else []


def run_evict_cmd(command: str, root: str | Path | None, node: int,
                  timeout_s: float = EVICT_CMD_TIMEOUT_S) -> dict[str, Any]:
    """Run a site's eviction command (a shell command line) and say how it went.

    The command sees IOBENCH_DATASET_ROOT (the dataset being evicted) and
    IOBENCH_NODE in its environment; it runs as every child of iobench does
    (`iobench.core.launch.capture`: its own process group, killed at `timeout_s`
    seconds, and what it leaves running killed when it exits). Returns `command`,
    `returncode`, `seconds` and the last line of its output (`output`, at most 300
    characters); a command that cannot start or runs past `timeout_s` has returncode None.
    """
    env = {**os.environ, "IOBENCH_NODE": str(node)}
    if root is not None:
        env["IOBENCH_DATASET_ROOT"] = str(root)
    r = capture(command, timeout_s, shell=True, env=env)
    if r.timed_out:
        out = f"did not finish within {timeout_s:g} s"
    elif r.ok:  # a successful command's own report is usually its last line, on either stream
        out = last_line_of((r.stderr + "\n" + r.stdout).strip(), 300) if (
            r.stderr.strip() or r.stdout.strip()) else ""
    else:
        out = r.last_line()
    return {"command": command, "returncode": r.code, "seconds": r.seconds, "output": out}


def parse_evict_cmd(command: str | None) -> str | None:
    """A site's eviction command: None, or a non-blank shell command line."""
    if command is None:
        return None
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(f"--evict-cmd {command!r} is empty; give a shell command that empties "
                          "the storage's server-side caches (e.g. `scripts/pfs/local-gluster.sh "
                          "evict`), or leave the option out")
    return command


# ---------------------------------------------------------------- per node, per job

def files_for_node(manifest: Manifest, node_ranks: Sequence[int], world_size: int,
                   scope: str = "global") -> list[FileEntry]:
    """The files the ranks `node_ranks` (global ranks on one node) read, in manifest order.

    `global` scope: every file. `local` scope (a dataset sharded per node): the
    data files `sampling.files_for_rank` gives those ranks, plus every
    auxiliary file (labels, index).
    """
    from iobench.core.sampling import SCOPES, files_for_rank

    if scope == "global":
        return list(manifest.files)
    if scope != "local":
        raise ConfigError(f"unknown shuffle scope {scope!r}; choose one of: {', '.join(SCOPES)}")
    data = manifest.data_files
    mine = {k for r in node_ranks for k in files_for_rank(len(data), r, world_size)}
    wanted = {data[k].path for k in mine}
    return [f for f in manifest.files if f.role != "data" or f.path in wanted]


def split_files(entries: Sequence[FileEntry], index: int, count: int) -> list[FileEntry]:
    """This worker's share (`index` of `count`) of `entries`, balanced by bytes.

    Largest file first to the least loaded worker; deterministic, so every
    rank computes every rank's share without talking.
    """
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"{index=} must be in [0, {count=})")
    if count == 1:  # one worker takes all, in order (no sort of a 20,000-file list)
        return list(entries)
    load = [0] * count
    out: list[list[FileEntry]] = [[] for _ in range(count)]
    order = sorted(range(len(entries)), key=lambda i: (-entries[i].bytes, i))
    for i in order:
        w = min(range(count), key=lambda k: (load[k], k))
        load[w] += entries[i].bytes
        out[w].append(entries[i])
    pos = {e.path: i for i, e in enumerate(entries)}
    return sorted(out[index], key=lambda e: pos[e.path])


class FileShare(Sequence["FileEntry"]):
    """Some data files of a compact manifest (positions `positions`, a range) and some of
    its auxiliary files: one rank's share, its entries built a chunk at a time."""

    CHUNK = 65_536

    def __init__(self, manifest: Manifest, positions: range, aux: Sequence[FileEntry]) -> None:
        assert manifest.compact is not None
        self.table = manifest.compact
        self.root = manifest.root
        self.positions = positions
        self.aux = tuple(aux)

    def __len__(self) -> int:
        return len(self.positions) + len(self.aux)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if i < len(self.positions):
            return self.table.entries_at(np.array([self.positions[i]], dtype=np.int64))[0]
        return self.aux[i - len(self.positions)]

    def __iter__(self) -> Iterator[FileEntry]:
        p = self.positions
        for c in range(0, len(p), self.CHUNK):
            part = p[c:c + self.CHUNK]
            yield from self.table.entries_at(np.arange(part.start, part.stop, part.step,
                                                       dtype=np.int64))
        yield from self.aux

    def paths(self, root: Path | None = None) -> Iterable[str]:
        """The share's absolute paths under `root` (the dataset's own by default), built as
        they are walked (re-iterable)."""
        return _Paths(self, root)

    def total_bytes(self) -> int:
        """The share's bytes, from the table's size column a chunk of rows at a time."""
        sizes = self.table.arrays()["bytes"]
        p, total = self.positions, sum(e.bytes for e in self.aux)
        for c in range(0, len(p), self.CHUNK):
            part = p[c:c + self.CHUNK]
            total += int(np.asarray(sizes[np.arange(part.start, part.stop, part.step,
                                                    dtype=np.int64)]).sum())
        return total


def share_bytes(share: Iterable[FileEntry]) -> int:
    """Bytes of a rank's share (`rank_share`): summed from the size column when compact."""
    if isinstance(share, FileShare):
        return share.total_bytes()
    return sum(e.bytes for e in share)


class _Paths:
    def __init__(self, share: FileShare, root: Path | None = None) -> None:
        self.share = share
        self.root = root

    def __iter__(self) -> Iterator[str]:
        share, root = self.share, self.root or self.share.root
        assert root is not None
        p = share.positions
        for c in range(0, len(p), share.CHUNK):
            part = p[c:c + share.CHUNK]
            yield from share.table.paths_at(root, np.arange(part.start, part.stop, part.step,
                                                            dtype=np.int64))
        yield from (str(root / e.path) for e in share.aux)

    def __len__(self) -> int:
        return len(self.share)


def rank_share(manifest: Manifest, node_ranks: Sequence[int], local_index: int,
               world_size: int, scope: str = "global") -> Sequence[FileEntry]:
    """The files the `local_index`-th of a node's ranks (`node_ranks`) evicts and measures.

    A JSON-list manifest: its share of `files_for_node`, balanced by bytes
    (`split_files`). A compact one (millions of one-sample files of near one
    size) is never listed whole: in global scope each local rank takes a
    contiguous slice of the data files (by count); in local scope each takes
    the files its own global rank reads (`sampling.files_for_rank`); the
    auxiliary files go round the local ranks. Either way the node's ranks
    cover the node's files, each once.
    """
    from iobench.core.sampling import SCOPES, files_for_rank

    if scope not in SCOPES:
        raise ConfigError(f"unknown shuffle scope {scope!r}; choose one of: {', '.join(SCOPES)}")
    count = len(node_ranks)
    if count < 1 or not 0 <= local_index < count:
        raise ConfigError(f"{local_index=} must be in [0, {count=})")
    t = manifest.compact
    if t is None:
        return split_files(files_for_node(manifest, node_ranks, world_size, scope),
                           local_index, count)
    aux = t.aux[local_index::count]
    if scope == "global":
        return FileShare(manifest, range(local_index * t.num_files // count,
                                         (local_index + 1) * t.num_files // count), aux)
    return FileShare(manifest, files_for_rank(t.num_files, node_ranks[local_index], world_size),
                     aux)


def share_paths(manifest: Manifest, share: Sequence[FileEntry],
                root: Path | None = None) -> Iterable[str | Path]:
    """Absolute paths of a rank's share under `root` (the dataset's own root by default; a
    staged copy's), re-iterable (lazy for a compact manifest's)."""
    if isinstance(share, FileShare):
        return share.paths(root)
    where = root if root is not None else manifest.root
    if where is None:
        return [manifest.path_of(e) for e in share]  # raises: no root to resolve against
    top = os.fspath(where)  # plain strings: building a Path per file costs more than the join
    return [os.path.join(top, e.path) for e in share]


def node_ranks(world: World) -> list[int]:
    """Global ranks that run on this rank's node (a collective: every rank must call it)."""
    nodes = world.allgather(world.node)
    return [r for r, n in enumerate(nodes) if n == world.node]


@dataclass(frozen=True)
class EvictReport:
    """One eviction before an epoch, over the whole job; goes into result files as is.

    `status`: "cold" (measured residency at or below `warn_above` on every
    node, and nothing left that eviction cannot reach), "unverified" (the
    client's pages are gone but the data sits where iobench cannot empty or
    see a cache: a shared filesystem's servers with no `--evict-cmd`, the GPFS
    pagepool; `reason` says which), "warm" (eviction did not work somewhere:
    the figures that follow read memory, not storage), or "unknown" (this
    process may not learn the residency, see the module docstring).
    """

    method: str  # "fadvise", "drop_caches+fadvise", "fadvise+lctl"; "evict-cmd+" in front
    files: int  # files advised, all ranks
    bytes: int  # bytes advised, all ranks (a replicated file counts once per node)
    seconds: float  # wall time of eviction plus measurement on this rank
    resident_fraction: float | None  # worst node; None when any node cannot tell
    status: str
    warn_above: float
    storage_kind: str | None
    per_node: tuple[dict[str, Any], ...]
    errors: tuple[str, ...] = ()
    warning: str | None = None
    nodes_unknown: tuple[int, ...] = field(default=())
    fstype: str | None = None
    reason: str | None = None  # why the status is "unverified"
    evict_cmd: dict[str, Any] | None = None  # the site's command and how it ran, slowest node
    plan: dict[str, Any] | None = None  # `EvictionPlan.to_dict()`

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_node"] = list(self.per_node)
        d["errors"] = list(self.errors)
        d["nodes_unknown"] = list(self.nodes_unknown)
        return d


@dataclass(frozen=True)
class EvictOptions:
    """How `evict_for_node` empties and measures the caches, validated when built.

    `scope`: the shuffle scope (`files_for_node`). `drop_caches` (root only,
    never a default): local rank 0 of each node also drops the whole page cache
    first. `measure`: measure residency afterwards. `evict_pages=False` (a
    warm-cache run): only measure. `warn_above`: the resident fraction above
    which eviction failed. `loud`: rank 0 prints a warning to stderr when
    eviction did not work. `evict_cmd` (a shell command line, the site's way to
    empty what no client can: server caches, a remount) runs first on local
    rank 0 of each node, within `evict_cmd_timeout_s` seconds; a warm-cache run
    ignores it.
    """

    scope: str = "global"
    drop_caches: bool = False
    measure: bool = True
    evict_pages: bool = True
    warn_above: float = DEFAULT_WARN_ABOVE
    loud: bool = True
    evict_cmd: str | None = None
    evict_cmd_timeout_s: float = EVICT_CMD_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0.0 <= self.warn_above <= 1.0:
            raise ConfigError(f"warn_above={self.warn_above!r} must be a fraction in [0, 1]")
        if self.drop_caches and not self.evict_pages:
            raise ConfigError("drop_caches=True contradicts evict_pages=False (a warm-cache run)")
        if self.evict_pages:
            parse_evict_cmd(self.evict_cmd)

    @property
    def site_cmd(self) -> str | None:
        """The site's command this pass runs (none in a warm-cache pass)."""
        return self.evict_cmd if self.evict_pages else None


def evict_for_node(manifest: Manifest, world: World,
                   options: EvictOptions | None = None) -> EvictReport:
    """Evict the dataset's pages on every node, then measure what stayed resident.

    A collective: every rank calls it. The ranks of a node split the files the
    node reads (`files_for_node`), evict and measure their share (one open per
    file), meet at a barrier, and gather the per-node figures, so every rank
    returns the same report (`EvictOptions` says what runs besides). A failure
    of the site's `evict_cmd` on any node raises StorageError on every rank.
    Without it, an epoch on a shared filesystem is "unverified", never "cold"
    (`eviction_plan`).
    """
    opts = options if options is not None else EvictOptions()
    t0 = time.perf_counter_ns()
    ranks = node_ranks(world)
    local_index = ranks.index(world.rank)
    paths = share_paths(manifest, rank_share(manifest, ranks, local_index, world.size,
                                             opts.scope))
    node = evict_node_wide(manifest, world, opts)
    ev, res = _evict_share(paths, world, opts)
    return eviction_report(node, ev, res, (time.perf_counter_ns() - t0) / 1e9, world, opts)


@dataclass(frozen=True)
class NodeEviction:
    """What `evict_node_wide` ran on the node, for `eviction_report`."""

    plan: EvictionPlan | None
    cmd_run: dict[str, Any] | None
    client_notes: list[str]


def evict_node_wide(manifest: Manifest, world: World, opts: EvictOptions) -> NodeEviction:
    """The node-wide steps of `evict_for_node` (a collective): the site's command, then
    drop_caches, then the filesystem's client commands. A caller that evicts each file
    through the descriptor it reads it with (`evict_fd`) runs this, then `eviction_report`."""
    leader = node_ranks(world).index(world.rank) == 0
    plan = _plan_of(manifest)
    cmd_run = _run_site_cmd(opts, manifest, world, leader)
    _drop_caches(opts, world, leader)
    client_notes = (_run_client_commands(plan)
                    if opts.evict_pages and plan is not None and leader else [])
    return NodeEviction(plan, cmd_run, client_notes)


def evict_fd(fd: int, path: str | Path, st: os.stat_result, evict_pages: bool = True
             ) -> int | None:
    """Evict one open file's pages (write-back, then `POSIX_FADV_DONTNEED`; only measure with
    `evict_pages` False) and return its bytes still resident (None: the OS will not say)."""
    if evict_pages:
        _write_back(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return _resident_fd(fd, path, st)


def eviction_report(node: NodeEviction, ev: EvictResult, res: Residency, seconds: float,
                    world: World, opts: EvictOptions) -> EvictReport:
    """The report every rank returns (a collective): each rank's files evicted `ev` and their
    residency `res` gathered per node and classified; `seconds` this rank's."""
    plan, notes0 = node.plan, node.client_notes
    everyone = world.allgather({"rank": world.rank, "node": world.node, "host": world.hostname,
                                "name": world.node_name, "files": ev.files, "bytes": ev.bytes,
                                "errors": list(ev.errors), "res": asdict(res),
                                "client_notes": notes0})
    nodes = _per_node(everyone, opts.measure)
    errors = tuple(e for m in everyone for e in m["errors"])
    notes = [n for m in everyone for n in m["client_notes"]]
    kind = plan.kind if plan is not None else None
    status, worst, warning = _classify(nodes, opts, kind)
    reason = None
    if status == "cold" and opts.evict_pages and opts.site_cmd is None and plan is not None \
            and plan.needs_site:
        status, reason = "unverified", plan.needs_site + "; " + "; ".join(notes + [
            "give --evict-cmd CMD with the site's way to empty them (run by each node's "
            "local rank 0 before every cold epoch)"])
        warning = (f"CACHE UNVERIFIED: the client's pages were evicted, but {reason}. Cold "
                   "epochs may read server memory, not storage")
    if errors and warning is None:
        warning = f"eviction failed for {len(errors)} file(s), first: {errors[0]}"
    if opts.loud and warning and world.rank == 0:
        print(f"iobench: WARNING: {warning}", file=sys.stderr, flush=True)
    return EvictReport(method=_method(opts, plan, notes),
                       files=sum(n["files"] for n in nodes), bytes=sum(n["bytes"] for n in nodes),
                       seconds=seconds, resident_fraction=worst, status=status,
                       warn_above=opts.warn_above, storage_kind=kind, per_node=tuple(nodes),
                       errors=errors, warning=warning,
                       nodes_unknown=tuple(n["node"] for n in nodes
                                           if n["resident_fraction"] is None),
                       fstype=plan.fstype if plan is not None else None, reason=reason,
                       evict_cmd=node.cmd_run, plan=plan.to_dict() if plan is not None else None)


def _plan_of(manifest: Manifest) -> EvictionPlan | None:
    """The eviction plan of the dataset's filesystem (None: no root, or its mount unknown)."""
    if manifest.root is None:
        return None
    from iobench.core.sysinfo import mount_of

    try:
        return eviction_plan(mount_of(manifest.root))
    except OSError:
        return None


def _run_site_cmd(opts: EvictOptions, manifest: Manifest, world: World,
                  leader: bool) -> dict[str, Any] | None:
    """Run the site's command on each node's local rank 0 (a collective when there is one);
    how it ran on the slowest node, with the number of nodes."""
    command = opts.site_cmd
    if command is None:
        return None
    mine = (run_evict_cmd(command, manifest.root, world.node, opts.evict_cmd_timeout_s)
            if leader else None)
    # a failure on one node must fail every rank, not hang them
    runs = [r for r in world.allgather(mine) if r is not None]
    bad = [r for r in runs if r["returncode"] != 0]
    if bad:
        r = bad[0]
        how = "" if r["returncode"] is None else f"exit status {r['returncode']}"
        raise StorageError(f"--evict-cmd {command!r} failed ({how}{': ' if how else ''}"
                           f"{r['output'] or 'no output'}); fix the command, or leave "
                           "--evict-cmd out (epochs on a shared tier are then unverified)")
    slowest: dict[str, Any] = max(runs, key=lambda r: r["seconds"])
    return slowest | {"nodes": len(runs)}


def _drop_caches(opts: EvictOptions, world: World, leader: bool) -> None:
    """With `drop_caches`, drop each node's whole page cache (a collective)."""
    if not opts.drop_caches:
        return
    error = None
    if leader:
        try:
            drop_all_caches()
        except UnsupportedError as e:
            error = str(e)
    errs = [e for e in world.allgather(error) if e]  # one rank's failure fails every rank
    if errs:
        raise UnsupportedError(errs[0])


def _run_client_commands(plan: EvictionPlan) -> list[str]:
    """Run the client commands the filesystem needs besides fadvise; what failed, in words
    (the status then says unverified: not worth failing the run)."""
    notes = []
    for cmd in client_commands(plan):
        r = capture(list(cmd), CLIENT_CMD_TIMEOUT_S)
        why = None if r.ok else (f"did not finish within {CLIENT_CMD_TIMEOUT_S:g} s"
                                 if r.timed_out else r.last_line() or f"exit status {r.code}")
        if why is not None:
            notes.append(f"`{' '.join(cmd)}` failed: {why}")
    return notes


def _evict_share(paths: Iterable[str | Path], world: World,
                 opts: EvictOptions) -> tuple[EvictResult, Residency]:
    """Evict and measure this rank's share (a collective: it ends at a barrier)."""
    # each file is evicted and measured by one rank of its node, in one open; nothing on
    # the node reads the dataset until every rank has returned. Nodes that share a host
    # (virtual nodes of a test cluster) share its page cache: one node's eviction may still
    # be writing pages back while another measures, so there all evict before any measures.
    shared_cache = world.num_hosts < world.num_nodes
    if opts.evict_pages and opts.measure and not shared_cache:
        ev, res = evict_and_measure(paths)
    else:
        ev = evict(paths) if opts.evict_pages else EvictResult(0, 0, ())
        if shared_cache:
            world.barrier()
        res = residency(paths) if opts.measure else Residency(0, 0, 0)
    world.barrier()
    return ev, res


def _per_node(everyone: list[dict[str, Any]], measure: bool) -> list[dict[str, Any]]:
    """The ranks' figures summed per node, in node order."""
    per_node: dict[int, dict[str, Any]] = {}
    for m in everyone:
        n = per_node.setdefault(m["node"], {"node": m["node"], "name": m["name"],
                                            "host": m["host"], "files": 0,
                                            "bytes": 0, "res": Residency(0, 0, 0)})
        n["files"] += m["files"]
        n["bytes"] += m["bytes"]
        n["res"] = n["res"] + Residency(**m["res"])
    nodes = []
    for k in sorted(per_node):
        n = per_node[k]
        node_res: Residency = n.pop("res")
        n["resident_bytes"], n["total_bytes"] = node_res.resident_bytes, node_res.total_bytes
        n["unknown_files"] = node_res.unknown_files
        n["resident_fraction"] = node_res.fraction if measure else None
        nodes.append(n)
    return nodes


def _classify(nodes: list[dict[str, Any]], opts: EvictOptions,
              kind: str | None) -> tuple[str, float | None, str | None]:
    """(status, the worst node's resident fraction, warning) from the nodes' residency."""
    unknown = [n["name"] for n in nodes if n["resident_fraction"] is None]
    known = [n["resident_fraction"] for n in nodes if n["resident_fraction"] is not None]
    worst = None if unknown or not opts.measure else max(known, default=0.0)
    if not opts.measure:
        return "unknown", worst, None
    if not opts.evict_pages:  # warm cache asked for: report what is resident, no alarm
        warm = worst is not None and worst > opts.warn_above
        return ("unknown" if unknown else "warm" if warm else "cold"), worst, None
    if unknown:
        return "unknown", worst, (
            f"page-cache residency after eviction is unknown on node(s) {', '.join(unknown)}: "
            "this process may not ask the kernel about files it cannot write (run as the "
            "files' owner or root to measure it)")
    if worst is not None and worst > opts.warn_above:
        why = ("the storage is tmpfs: its data lives in the page cache and cannot be evicted"
               if kind == "memory" else "a live process keeps its pages mapped (an mmap "
               "reader such as LMDB: close it between epochs), or the filesystem ignored "
               "POSIX_FADV_DONTNEED")
        warm_nodes = ", ".join(f"{n['name']} ({n['resident_fraction']:.0%})" for n in nodes
                               if n["resident_fraction"] > opts.warn_above)
        return "warm", worst, (
            f"COLD CACHE FAILED on node(s) {warm_nodes}: that much of the dataset is still in "
            f"the page cache after eviction (threshold {opts.warn_above:.0%}); {why}. Figures "
            "from this epoch measure memory, not storage")
    return "cold", worst, None


def _method(opts: EvictOptions, plan: EvictionPlan | None, notes: list[str]) -> str:
    """How the caches were emptied, as the report names it."""
    if not opts.evict_pages:
        return "none"
    method = "drop_caches+fadvise" if opts.drop_caches else "fadvise"
    if plan is not None and plan.client == "fadvise+lctl" and not notes:
        method += "+lctl"
    return "evict-cmd+" + method if opts.site_cmd is not None else method
