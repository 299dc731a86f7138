"""What machine, libraries and filesystem a run had (provenance and `iobench info`)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import shutil
import socket
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from iobench.core.errors import StorageError
from iobench.core.launch import capture

# Filesystem type (as /proc/self/mountinfo names it) -> the kind of storage tier.
FS_KINDS: dict[str, str] = {
    "lustre": "parallel", "gpfs": "parallel", "beegfs": "parallel", "wekafs": "parallel",
    "pvfs2": "parallel", "orangefs": "parallel", "cephfs": "parallel", "ceph": "parallel",
    "nfs": "network", "nfs4": "network", "cifs": "network", "smb3": "network",
    "ext4": "local", "ext3": "local", "xfs": "local", "btrfs": "local", "zfs": "local",
    "f2fs": "local", "tmpfs": "memory", "ramfs": "memory", "overlay": "overlay",
}
# FUSE clients of shared filesystems (`fuse.<subtype>` in the mount table): their data lives on
# servers, whose caches a client cannot empty. Other FUSE mounts are `fuse` (unknown).
FUSE_NETWORK: frozenset[str] = frozenset({
    "glusterfs", "ceph-fuse", "ceph", "beegfs", "lizardfs", "mfs", "moosefs", "juicefs",
    "sshfs", "s3fs", "gcsfuse", "rclone", "goofys", "blobfuse", "blobfuse2", "weka", "xtreemfs",
    "cvmfs", "seaweedfs", "alluxio-fuse"})
#: kinds whose data sits on servers other nodes share (server-side caches, network round trips)
SHARED_KINDS: frozenset[str] = frozenset({"parallel", "network", "fuse-network"})

# statfs(2) f_type magic numbers (linux/magic.h and the filesystems' own headers), named as
# `stat -f` names them: FUSE mounts all say `fuseblk`/`fuse`, whatever their server is.
STATFS_TYPES: dict[int, str] = {
    0xEF53: "ext2/ext3/ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x2FC12FC1: "zfs",
    0xF2F52010: "f2fs", 0x01021994: "tmpfs", 0x858458F6: "ramfs", 0x794C7630: "overlayfs",
    0x65735546: "fuseblk", 0x65735543: "fusectl", 0x6969: "nfs", 0xFF534D42: "cifs",
    0xFE534D42: "smb2", 0x0BD00BD0: "lustre", 0x47504653: "gpfs", 0x00C36400: "ceph",
    0x19830326: "beegfs", 0x013111A8: "ibrix", 0x73717368: "squashfs", 0x9FA0: "proc",
    0x62656572: "sysfs", 0xA501FCF5: "vxfs", 0x5346414F: "afs",
    0x6B414653: "afs", 0x01161970: "gfs2", 0x7461636F: "ocfs2", 0x24051905: "ubifs",
}


@dataclass(frozen=True)
class MountInfo:
    """The mount that holds a path, as the kernel reports it (mount table and statfs)."""

    path: str
    mount_point: str
    fstype: str  # as the mount table names it: fuse.glusterfs, ext4, lustre ...
    source: str
    options: str  # per-mount and superblock options, like `findmnt -no OPTIONS`
    kind: str  # parallel | network | fuse-network | local | memory | fuse | overlay | other
    free_bytes: int
    total_bytes: int
    statfs_type: str | None = None  # statfs(2) f_type by name (fuseblk for any FUSE), or hex
    shared: bool | None = None  # data on servers other nodes share; None: cannot tell (FUSE)


def fs_kind(fstype: str) -> str:
    """Classify a filesystem type: parallel, network, fuse-network, local, memory, fuse (a FUSE
    mount of unknown nature), overlay or other."""
    if fstype.startswith("fuse.") and fstype[5:] in FUSE_NETWORK:
        return "fuse-network"
    if fstype == "fuse" or fstype.startswith(("fuse.", "fuseblk")):
        return "fuse"
    return FS_KINDS.get(fstype, "other")


def is_shared(kind: str) -> bool | None:
    """Whether a tier of this kind is shared between nodes; None when the kind cannot say."""
    if kind in SHARED_KINDS:
        return True
    return None if kind in ("fuse", "other") else False


class _Statfs(ctypes.Structure):
    # struct statfs on 64-bit Linux: f_type first; the rest is only room for the kernel
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 160)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def statfs_type(path: str | Path) -> str | None:
    """The filesystem type statfs(2) reports for `path` (`fuseblk` for every FUSE mount),
    or its magic number in hex when unnamed; None when statfs fails."""
    buf = _Statfs()
    if _libc.statfs(os.fsencode(str(path)), ctypes.byref(buf)) != 0:
        return None
    magic = buf.f_type & 0xFFFFFFFF
    return STATFS_TYPES.get(magic, f"0x{magic:x}")


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...)
    return s.encode().decode("unicode_escape") if "\\" in s else s


def mount_of(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> MountInfo:
    """Find the mount holding `path` (which must exist)."""
    p = Path(path)
    if not p.exists():
        raise StorageError(f"path {str(path)!r} does not exist; give an existing directory")
    real = os.path.realpath(p)
    best: tuple[int, list[str]] | None = None
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            fields = left.split()
            mnt = _unescape(fields[4])
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            # Later lines are mounted on top of earlier ones: >= keeps the last.
            if inside and (best is None or len(mnt) >= best[0]):
                best = (len(mnt), fields + ["-"] + right.split())
    if best is None:
        raise StorageError(f"no mount found for {real} in {mountinfo}")
    fields = best[1]
    sep = fields.index("-")
    mnt_opts = fields[5].split(",")
    fstype, source = fields[sep + 1], _unescape(fields[sep + 2])
    super_opts = fields[sep + 3].split(",") if len(fields) > sep + 3 else []
    opts = mnt_opts + [o for o in super_opts if o not in mnt_opts and o not in ("rw", "ro")]
    usage = shutil.disk_usage(real)
    kind = fs_kind(fstype)
    return MountInfo(path=real, mount_point=_unescape(fields[4]), fstype=fstype, source=source,
                     options=",".join(opts), kind=kind, free_bytes=usage.free,
                     total_bytes=usage.total, statfs_type=statfs_type(real),
                     shared=is_shared(kind))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpus(import_libs: bool = True) -> list[dict[str, Any]]:
    """GPUs visible to this process (via torch when CUDA is usable, else nvidia-smi). Without
    `import_libs`, torch is asked only if already imported (importing it takes seconds)."""
    if import_libs or "torch" in sys.modules:
        try:
            import torch

            if torch.cuda.is_available():
                return [{"index": i, "name": torch.cuda.get_device_name(i),
                         "memory_bytes": torch.cuda.get_device_properties(i).total_memory}
                        for i in range(torch.cuda.device_count())]
        except Exception:  # a broken CUDA install must not break provenance
            pass
    if shutil.which("nvidia-smi"):
        r = capture(["nvidia-smi", "--query-gpu=index,name,memory.total",
                     "--format=csv,noheader,nounits"], 10, keep_bytes=1 << 16)
        with contextlib.suppress(ValueError):
            if r.ok:
                return [{"index": int(i), "name": n.strip(), "memory_bytes": int(m) * 2**20}
                        for i, n, m in (ln.split(",") for ln in r.stdout.strip().splitlines())]
    return []


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions(import_libs: bool = True) -> dict[str, str | None]:
    """Versions of Python and of every library whose behaviour shapes the figures. Without
    `import_libs`, a format library not imported yet gives its package's version only (no
    import, and no version of the C library under it)."""
    v: dict[str, str | None] = {"python": platform.python_version(), "iobench": None}
    from iobench import __version__

    v["iobench"] = __version__
    v["numpy"] = _dist_version("numpy")
    v["torch"] = _dist_version("torch")
    if not import_libs:  # a command that reads no format (stage copies bytes)
        for name, lib in (("h5py", "hdf5"), ("netCDF4", "netcdf-c"), ("lmdb", "liblmdb")):
            if name not in sys.modules:
                v[name], v[lib] = _dist_version(name), None
        if "netCDF4" not in sys.modules:
            v["netCDF4-hdf5"] = None
    _format_libraries(v)
    v["nvidia-dali"] = next((x for x in (_dist_version("nvidia-dali-cuda130"),
                                         _dist_version("nvidia-dali-cuda120"),
                                         _dist_version("nvidia-dali-cuda110")) if x), None)
    v["mpi4py"] = _dist_version("mpi4py")
    v["mpi"] = mpi_library_version()
    v["simplejpeg"] = _dist_version("simplejpeg")
    v["zarr"] = _dist_version("zarr")  # metadata only: importing zarr costs a third of a second
    return v


def _format_libraries(v: dict[str, str | None]) -> None:
    """The format libraries' versions and their C libraries' into `v`, importing each one
    that `v` has no entry for yet."""
    if "h5py" not in v:
        try:
            import h5py

            v["h5py"], v["hdf5"] = h5py.__version__, h5py.version.hdf5_version
        except ImportError:
            v["h5py"] = v["hdf5"] = None
    if "netCDF4" not in v:
        try:
            import netCDF4

            v["netCDF4"], v["netcdf-c"] = netCDF4.__version__, netCDF4.__netcdf4libversion__
            v["netCDF4-hdf5"] = netCDF4.__hdf5libversion__
        except ImportError:
            v["netCDF4"] = v["netcdf-c"] = None
    if "lmdb" not in v:
        try:
            import lmdb

            v["lmdb"], v["liblmdb"] = lmdb.__version__, ".".join(map(str, lmdb.version()))
        except ImportError:
            v["lmdb"] = v["liblmdb"] = None


def mpi_library_version() -> str | None:
    """First line of the MPI library's version string, without initialising MPI."""
    try:
        import mpi4py

        from iobench.core.world import launched_by_mpi

        if "mpi4py.MPI" not in sys.modules and not launched_by_mpi():
            mpi4py.rc.initialize = False  # a plain run must not start MPI just to ask
        from mpi4py import MPI

        return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    except Exception:  # mpi4py absent, or no MPI library it can load
        return None


def code_version() -> dict[str, Any] | None:
    """The git commit iobench runs from and whether its tracked files differ from it
    (`dirty`); None when iobench is not installed from a git checkout."""
    here = Path(__file__).resolve().parent
    git = shutil.which("git")
    if git is None:
        return None
    head = capture([git, "-C", str(here), "rev-parse", "HEAD"], 10)
    if not head.ok:
        return None
    status = capture([git, "-C", str(here), "status", "--porcelain", "--untracked-files=no"], 30)
    return {"commit": head.stdout.strip(),
            "dirty": bool(status.stdout.strip()) if status.ok else None}


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _tasks_per_node(value: str | None) -> int | None:
    """Slurm's SLURM_TASKS_PER_NODE (`2(x3),1`): the count when every node has the same,
    else None."""
    if not value:
        return None
    counts = {part.split("(")[0] for part in value.split(",")}
    return _int(counts.pop()) if len(counts) == 1 else None


def _pbs_nodes(nodefile: str | None) -> list[str] | None:
    """The distinct hosts of a PBS node file (one line per task slot), in order."""
    if not nodefile:
        return None
    try:
        with open(nodefile) as f:
            hosts = [line.strip() for line in f if line.strip()]
    except OSError:
        return None
    return list(dict.fromkeys(hosts))


def job_identity(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The batch job this process runs in, from the scheduler's environment: `scheduler`
    (slurm, pbs, flux, or pals/pmi for a bare MPI launcher), `id`, `name`, `nodelist`,
    `nodes`, `tasks_per_node`, `partition`; a field the scheduler does not give is None.
    None outside any job."""
    env = dict(os.environ if env is None else env)
    job: dict[str, Any]
    if env.get("SLURM_JOB_ID"):
        nodes = _int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES"))
        tpn = (_int(env.get("SLURM_NTASKS_PER_NODE"))
               or _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE")
                                  or env.get("SLURM_TASKS_PER_NODE")))
        job = {"scheduler": "slurm", "id": env["SLURM_JOB_ID"],
               "name": env.get("SLURM_JOB_NAME"),
               "nodelist": env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"),
               "nodes": nodes, "tasks_per_node": tpn,
               "partition": env.get("SLURM_JOB_PARTITION")}
    elif env.get("PBS_JOBID"):
        hosts = _pbs_nodes(env.get("PBS_NODEFILE"))
        job = {"scheduler": "pbs", "id": env["PBS_JOBID"], "name": env.get("PBS_JOBNAME"),
               "nodelist": ",".join(hosts) if hosts else None,
               "nodes": len(hosts) if hosts else None,
               "tasks_per_node": _int(env.get("PALS_LOCAL_SIZE") or env.get("MPI_LOCALNRANKS")),
               "partition": env.get("PBS_QUEUE")}
    elif env.get("FLUX_JOB_ID"):
        nodes = _int(env.get("FLUX_JOB_NNODES"))
        size = _int(env.get("FLUX_JOB_SIZE"))
        job = {"scheduler": "flux", "id": env["FLUX_JOB_ID"], "name": None, "nodelist": None,
               "nodes": nodes,
               "tasks_per_node": size // nodes if size and nodes and size % nodes == 0 else None,
               "partition": env.get("FLUX_JOB_QUEUE")}
    elif env.get("PALS_APID") or env.get("PALS_RANKID"):
        job = {"scheduler": "pals", "id": env.get("PALS_APID"), "name": None, "nodelist": None,
               "nodes": None, "tasks_per_node": _int(env.get("PALS_LOCAL_SIZE")),
               "partition": None}
    elif env.get("PMI_RANK") or env.get("PMI_SIZE"):
        job = {"scheduler": "pmi", "id": None, "name": None, "nodelist": None, "nodes": None,
               "tasks_per_node": _int(env.get("MPI_LOCALNRANKS")), "partition": None}
    else:
        return None
    return job


def provenance(storage: str | Path | None = None, import_libs: bool = True) -> dict[str, Any]:
    """Everything a result file records about where it was measured. A command that uses
    neither torch nor a format library passes `import_libs=False`: torch and the format
    libraries are then asked only if imported already (`gpus`, `library_versions`)."""
    doc: dict[str, Any] = {
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": memory_bytes(),
        "gpus": gpus(import_libs),
        "versions": library_versions(import_libs),
        "code": code_version(),
        "argv": sys.argv,
        "job": job_identity(),
    }
    if storage is not None:
        doc["storage"] = asdict(mount_of(storage))
    return doc
