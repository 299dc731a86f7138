"""Start, find, query and stop emulated-tier daemons (the library behind `iobench emulate-pfs`)."""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iobench.core import launch
from iobench.core.errors import ConfigError, IobenchError, StorageError, UnsupportedError
from iobench.core.launch import python_argv
from iobench.pfs.config import RUN_DIR_ENV, PfsConfig, StatePaths, state_paths
from iobench.pfs.profiles import Profile, get_profile
from iobench.pfs.stats import STATS_NAME, parse_stats

FSTYPE = "fuse.iobench-pfs"
MOUNT_TIMEOUT_S = 20.0  # how long the daemon may take to mount (seconds)
UMOUNT_TIMEOUT_S = 60.0  # how long umount or fusermount may take (seconds)


# ---- preconditions ---------------------------------------------------------------------------

def fuse_problem() -> str | None:
    """Why FUSE mounts cannot work here (one line naming the fix), or None when they can."""
    if not sys.platform.startswith("linux"):
        return f"the emulated parallel filesystem needs Linux FUSE; this is {sys.platform}"
    if not os.path.exists("/dev/fuse"):
        return ("/dev/fuse does not exist: load the fuse kernel module (`modprobe fuse`) or, in a "
                "container, start it with `--device /dev/fuse --cap-add SYS_ADMIN`")
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return (f"cannot open /dev/fuse ({e.strerror}): on this machine it needs root "
                f"(mode {oct(os.stat('/dev/fuse').st_mode & 0o777)}); run as root or ask for "
                "access to /dev/fuse")
    if not (ctypes.util.find_library("fuse3") or ctypes.util.find_library("fuse")):
        return ("libfuse is not installed: `apt-get install fuse3` (Debian/Ubuntu; or libfuse2), "
                "`dnf install fuse3-libs` (RHEL/Fedora); or run `make system-deps` as root")
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "fusermount3 is missing (needed to mount without root): `apt-get install fuse3`"
    try:
        import mfusepy  # noqa: F401
    except ImportError:
        return "the Python FUSE binding is missing: pip install 'iobench[pfs]' (mfusepy)"
    except OSError as e:
        return f"mfusepy cannot load libfuse ({e}): `apt-get install fuse3`"
    return None


def require_fuse() -> None:
    """Raise UnsupportedError naming the fix when FUSE mounts cannot work here."""
    problem = fuse_problem()
    if problem:
        raise UnsupportedError(problem)


# ---- finding mounts --------------------------------------------------------------------------

def _unescape(s: str) -> str:
    return s.encode().decode("unicode_escape") if "\\" in s else s


def emulated_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points of every iobench-pfs mount the kernel knows (absolute paths)."""
    out = []
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == FSTYPE:
                out.append(_unescape(left.split()[4]))
    return out


def _is_mountpoint(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The fstype mounted exactly at `path`, or None."""
    fstype = None
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if _unescape(left.split()[4]) == path:
                fstype = right.split(" ", 1)[0]  # later lines are mounted on top
    return fstype


def mount_containing(path: str | Path) -> str | None:
    """The iobench-pfs mount point that holds `path`, or None. Does not touch the path itself."""
    mounts = emulated_mounts()
    if not mounts:
        return None
    def best_of(candidate: str) -> str | None:
        best = None
        for m in mounts:
            if (candidate == m or candidate.startswith(m.rstrip("/") + "/")) and (
                    best is None or len(m) > len(best)):
                best = m
        return best

    # realpath walks the path (a charged lookup for a file inside the mount): only as fallback.
    return best_of(os.path.abspath(path)) or best_of(os.path.realpath(path))


# ---- stats -----------------------------------------------------------------------------------

def read_stats(mountpoint: str) -> dict[str, Any]:
    """The live stats document of the daemon serving `mountpoint` (one small FUSE read)."""
    where = os.path.join(mountpoint, STATS_NAME)
    try:
        with open(where, "rb") as f:
            text = f.read()
    except OSError as e:
        raise StorageError(f"cannot read {where} ({e.strerror}): the iobench-pfs daemon of "
                           f"{mountpoint} is not answering; unmount it with "
                           f"`iobench emulate-pfs --unmount {mountpoint}`") from e
    return parse_stats(text, where)


def stats_for(path: str | Path) -> dict[str, Any] | None:
    """Counters of the emulated tier holding `path`, or None when `path` is not on one.

    Cheap (reads /proc/self/mountinfo and one small virtual file): call it before
    and after each epoch, and pass both to `iobench.pfs.delta`.
    """
    mp = mount_containing(path)
    return None if mp is None else read_stats(mp)


def is_emulated(path: str | Path) -> dict[str, Any] | None:
    """What emulated tier holds `path` (mount, backing, pid, profile, note), or None."""
    doc = stats_for(path)
    if doc is None:
        return None
    return {k: doc[k] for k in ("mount", "backing", "pid", "profile", "options", "note",
                                "emulated", "libfuse")}


# ---- processes -------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone; our own zombie children are reaped)."""
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _read_pid(paths: StatePaths) -> int | None:
    try:
        return int(paths.pid.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_daemon(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        # Background daemons run `-m iobench.pfs._daemon`; --foreground runs in the CLI itself.
        return b"iobench.pfs._daemon" in cmdline or b"emulate-pfs" in cmdline
    except OSError:
        return False


def _log_tail(paths: StatePaths, lines: int = 3) -> str:
    try:
        text = paths.log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


# ---- mount -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class PfsMount:
    """A running emulated tier: where, served from what, by which process, with what profile."""

    mountpoint: str
    backing: str
    pid: int
    profile: Profile
    paths: StatePaths

    def stats(self) -> dict[str, Any]:
        return read_stats(self.mountpoint)

    def unmount(self, *, lazy: bool = False, timeout_s: float = 10.0) -> dict[str, Any] | None:
        return unmount(self.mountpoint, lazy=lazy, timeout_s=timeout_s)

    def __enter__(self) -> PfsMount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount(lazy=exc[0] is not None)


def build_config(backing: str | Path, mountpoint: str | Path, profile: str | Profile = "lustre-light",
                 *, open_latency_ms: float | None = None, read_latency_ms: float | None = None,
                 bandwidth_MBps: float | None = None, iops: float | None = None,
                 direct_io: bool = False, kernel_cache: bool = False,
                 evict_backing: bool = True, client_cache: bool = True) -> PfsConfig:
    """Validate options into a PfsConfig (profile figures, then explicit overrides)."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    prof = prof.with_overrides(metadata_ms=open_latency_ms, read_ms=read_latency_ms,
                               bandwidth_MBps=bandwidth_MBps, iops=iops)
    return PfsConfig(backing=os.path.abspath(backing), mountpoint=os.path.abspath(mountpoint),
                     profile=prof, direct_io=direct_io, kernel_cache=kernel_cache,
                     evict_backing=evict_backing, client_cache=client_cache)


def check_paths(config: PfsConfig) -> bool:
    """Backing and mount point are usable; raise a one-line StorageError/ConfigError otherwise.

    A missing mount point is created (its parent must exist); returns whether it was.
    """
    b, m = config.backing, config.mountpoint
    if not os.path.exists(b):
        raise StorageError(f"backing directory {b} does not exist; give the directory that holds "
                           "the dataset (e.g. the output of `iobench generate`)")
    if not os.path.isdir(b):
        raise StorageError(f"backing {b} is not a directory; give the dataset's directory")
    rb, rm = os.path.realpath(b), os.path.realpath(m)
    if rb == rm or rm.startswith(rb.rstrip("/") + "/") or rb.startswith(rm.rstrip("/") + "/"):
        raise ConfigError(f"mount point {m} and backing {b} must not contain each other; "
                          "choose a mount point outside the dataset")
    _refuse_mounted(m)
    if os.path.lexists(m) and not os.path.isdir(m):
        raise StorageError(f"mount point {m} exists and is not a directory; give an empty directory")
    if not os.path.exists(m):
        parent = os.path.dirname(m)
        if not os.path.isdir(parent):
            raise StorageError(f"mount point {m} does not exist and neither does its parent "
                               f"{parent}; create it first")
        os.mkdir(m)
        return True
    try:
        with os.scandir(m) as it:
            entry = next(it, None)
    except OSError as e:
        raise StorageError(f"cannot list mount point {m} ({e.strerror}); is it a stale mount? "
                           f"try `iobench emulate-pfs --unmount {m}`") from e
    if entry is not None:
        raise StorageError(f"mount point {m} is not empty (it holds {entry.name!r}, ...); "
                           "FUSE would hide those files: give an empty directory")
    return False


def _refuse_mounted(m: str) -> None:
    """StorageError when a filesystem (an emulated tier or another) is mounted at `m`."""
    fstype = _is_mountpoint(m)
    if fstype is None:
        return
    if fstype == FSTYPE:
        pid = _read_pid(state_paths(m))
        raise StorageError(f"mount point {m} is busy: an emulated pfs is already mounted "
                           f"there (daemon pid {pid}); unmount it first with "
                           f"`iobench emulate-pfs --unmount {m}`")
    raise StorageError(f"mount point {m} is busy: a {fstype} filesystem is mounted there; "
                       "choose an empty directory")


def mount(backing: str | Path, mountpoint: str | Path, profile: str | Profile = "lustre-light",
          **options: Any) -> PfsMount:
    """Mount the emulated tier over `backing` at `mountpoint` in a background daemon.

    `options` are `build_config`'s keywords (latencies in ms, bandwidth in MB/s,
    iops in requests/s, direct_io, kernel_cache, evict_backing, client_cache). Returns when
    the mount is live; raises UnsupportedError (no FUSE), StorageError (paths,
    or the daemon failed: its log's last lines are in the message) or ConfigError.
    """
    return mount_config(build_config(backing, mountpoint, profile, **options))


def mount_config(config: PfsConfig) -> PfsMount:
    """`mount` for an already validated PfsConfig."""
    require_fuse()
    created = check_paths(config)
    try:
        return _start(config)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(config.mountpoint)  # leave nothing behind that we made
        raise


def _start(config: PfsConfig) -> PfsMount:
    """Start the daemon (a process group of its own, as every child: `core.launch.start`) and
    wait up to MOUNT_TIMEOUT_S for its mount; on any failure, an interrupt included, its group
    is killed and nothing is left mounted."""
    paths = _prepare_state(config)
    try:
        with open(paths.log, "w") as log:
            proc = launch.start([*python_argv("iobench.pfs._daemon"),
                                 json.dumps(config.to_dict())], stdout=log, stderr=log,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except OSError as e:
        raise _run_dir_error(paths, e) from e
    try:
        _wait_mounted(config, paths, proc)
    except BaseException:
        if proc.returncode is None:  # SIGTERM: its FUSE loop unmounts; then SIGKILL
            launch.kill_group(proc.pid, signal.SIGTERM)
            launch.wait_exit(proc.pid, 5.0)
            launch.end(proc)
        with contextlib.suppress(OSError, IobenchError):
            if _is_mountpoint(config.mountpoint) == FSTYPE:
                _umount(config.mountpoint, lazy=True)
        raise
    return PfsMount(mountpoint=config.mountpoint, backing=config.backing, pid=proc.pid,
                    profile=config.profile, paths=paths)


def _prepare_state(config: PfsConfig) -> StatePaths:
    """The daemon's pid, stats and log files (in `run_dir()`), an old daemon's left-overs
    removed; a StorageError naming IOBENCH_PFS_RUN_DIR when that folder cannot be written."""
    paths = state_paths(config.mountpoint)
    try:
        paths.pid.parent.mkdir(parents=True, exist_ok=True)
        old = _read_pid(paths)
        if old is not None:
            if _alive(old) and _is_our_daemon(old):
                raise StorageError(f"a daemon for {config.mountpoint} still runs (pid {old}) "
                                   "without a mount; stop it with "
                                   f"`iobench emulate-pfs --unmount {config.mountpoint}`")
            paths.pid.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            paths.final_stats.unlink()
    except StorageError:
        raise
    except OSError as e:
        raise _run_dir_error(paths, e) from e
    return paths


def _run_dir_error(paths: StatePaths, e: OSError) -> StorageError:
    return StorageError(f"cannot write the emulator's state in {paths.pid.parent} "
                        f"({e.strerror or e}): set {RUN_DIR_ENV} to a writable folder")


def _wait_mounted(config: PfsConfig, paths: StatePaths, proc: subprocess.Popen[bytes]) -> None:
    """Return once the daemon has mounted; a StorageError when it exits first or takes longer
    than MOUNT_TIMEOUT_S (the caller then stops it)."""
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while True:
        if launch.wait_exit(proc.pid, 0.02):
            launch.end(proc)
            raise StorageError(f"the iobench-pfs daemon exited (status {proc.returncode}) before "
                               f"mounting {config.mountpoint}: {_log_tail(paths) or 'no output'} "
                               f"(log: {paths.log})")
        if _read_pid(paths) == proc.pid and _is_mountpoint(config.mountpoint) == FSTYPE:
            return
        if time.monotonic() > deadline:
            raise StorageError(f"the iobench-pfs daemon did not mount {config.mountpoint} within "
                               f"{MOUNT_TIMEOUT_S:g} s: {_log_tail(paths) or 'no output'}")


# ---- unmount ---------------------------------------------------------------------------------

def _umount(mountpoint: str, *, lazy: bool) -> None:
    if os.geteuid() == 0 and shutil.which("umount"):
        cmd = ["umount", *(["-l"] if lazy else []), mountpoint]
    else:
        tool = shutil.which("fusermount3") or shutil.which("fusermount")
        if tool is None:
            raise UnsupportedError("neither umount (as root) nor fusermount3 is available to "
                                   f"unmount {mountpoint}: `apt-get install fuse3`")
        cmd = [tool, "-u", *(["-z"] if lazy else []), mountpoint]
    r = launch.capture(cmd, UMOUNT_TIMEOUT_S)
    if r.timed_out:
        raise OSError(errno.ETIMEDOUT, f"{cmd[0]} did not finish within {UMOUNT_TIMEOUT_S:g} s")
    if not r.ok:
        msg = r.last_line()
        raise OSError(errno.EBUSY if "busy" in msg.lower() else errno.EIO,
                      msg or f"{cmd[0]} failed with status {r.code}")


def unmount(mountpoint: str | Path, *, lazy: bool = False, timeout_s: float = 10.0
            ) -> dict[str, Any] | None:
    """Unmount an emulated tier and stop its daemon; return its final stats (or None).

    Refuses with StorageError while files under the mount are open, unless
    `lazy` (the mount then disappears when they are closed). A daemon that
    does not exit within `timeout_s` after the unmount gets SIGTERM, then SIGKILL.
    """
    mp = os.path.abspath(mountpoint)
    paths = state_paths(mp)
    pid = _read_pid(paths)
    mounted = _is_mountpoint(mp)
    if mounted is not None and mounted != FSTYPE:
        raise StorageError(f"{mp} is a {mounted} mount, not an emulated pfs; not touching it")
    if mounted is None and (pid is None or not _alive(pid)):
        paths.pid.unlink(missing_ok=True)
        raise StorageError(f"{mp} is not an iobench-pfs mount (nothing mounted there and no "
                           "daemon running); see `iobench emulate-pfs --list`")
    if mounted is not None:
        _detach(mp, pid, lazy)
    if pid is not None and _is_our_daemon(pid):
        _stop_daemon(pid, timeout_s)
    paths.pid.unlink(missing_ok=True)
    try:
        final: dict[str, Any] = json.loads(paths.final_stats.read_text())
        return final
    except (OSError, ValueError):
        return None


def _detach(mp: str, pid: int | None, lazy: bool) -> None:
    """Unmount `mp`; a stale mount (its daemon gone) is detached lazily."""
    try:
        _umount(mp, lazy=lazy)
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise StorageError(f"cannot unmount {mp}: it is busy (a process has a file or "
                               f"its working directory under it; see `fuser -vm {mp}`); "
                               "close them and retry, or use --lazy") from e
        if pid is not None and _alive(pid):
            raise StorageError(f"cannot unmount {mp}: {e.strerror}") from e
        _umount(mp, lazy=True)  # the daemon died: the mount is stale, detach it


def _stop_daemon(pid: int, timeout_s: float) -> None:
    """Wait `timeout_s` for the daemon to exit after the unmount, then SIGTERM, then SIGKILL
    (5 s each)."""
    deadline = time.monotonic() + timeout_s
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and _alive(pid):
            _signal_daemon(pid, sig)
            deadline = time.monotonic() + 5.0
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not _alive(pid):
            break


def _signal_daemon(pid: int, signum: int) -> None:
    """Signal the daemon and what it started: its process group when it leads one (it is
    started in a session of its own), else the daemon alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)


def status(mountpoint: str | Path) -> dict[str, Any]:
    """The live stats of the emulated tier at `mountpoint`; StorageError when there is none."""
    mp = os.path.abspath(mountpoint)
    if _is_mountpoint(mp) != FSTYPE:
        raise StorageError(f"{mp} is not an iobench-pfs mount; see `iobench emulate-pfs --list`")
    return read_stats(mp)
