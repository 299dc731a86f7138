"""Tests of the emulated parallel-filesystem tier (FUSE): fidelity, costs, counters, cleanup.

Tests that mount are marked `fuse` and skip with the reason when FUSE is not
usable here (no /dev/fuse, not root, no libfuse, or a trial mount fails).
Every mount is unmounted by a fixture finaliser, even when a test fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import h5py
import lmdb
import netCDF4
import numpy as np
import pytest

from conftest import cli
from iobench.core import cache
from iobench.core.errors import ConfigError, DatasetError, StorageError, UnsupportedError
from iobench.pfs import (
    PROFILES,
    Profile,
    assess,
    delta,
    emulated_mounts,
    fuse_problem,
    get_profile,
    is_emulated,
    mount,
    stats_for,
    unmount,
)
from iobench.pfs import control as pfs_control
from iobench.pfs.profiles import DAEMON_CEILING_MBPS
from iobench.pfs.stats import COUNTERS, STATS_NAME

MB = 1_000_000


# ---- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def fuse_usable(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip (with the reason) unless a trial mount works on this machine."""
    problem = fuse_problem()
    if problem:
        pytest.skip(f"FUSE unusable: {problem}")
    d = tmp_path_factory.mktemp("pfs-probe")
    (d / "b").mkdir()
    run = d / "run"
    old = os.environ.get("IOBENCH_PFS_RUN_DIR")
    os.environ["IOBENCH_PFS_RUN_DIR"] = str(run)
    try:
        h = mount(d / "b", d / "m", "passthrough")
        _force_unmount(str(d / "m"), h.pid, run)
    except (StorageError, UnsupportedError) as e:
        _force_unmount(str(d / "m"), None, run)
        pytest.skip(f"FUSE unusable: a trial mount failed: {e}")
    finally:
        if old is None:
            os.environ.pop("IOBENCH_PFS_RUN_DIR", None)
        else:
            os.environ["IOBENCH_PFS_RUN_DIR"] = old


def _force_unmount(mp: str, pid: int | None, run_dir: Path) -> None:
    """Finaliser: leave no mount and no daemon behind, whatever state the test left."""
    old = os.environ.get("IOBENCH_PFS_RUN_DIR")
    os.environ["IOBENCH_PFS_RUN_DIR"] = str(run_dir)
    try:
        with contextlib.suppress(Exception):
            unmount(mp, lazy=True, timeout_s=5)
    finally:
        if old is None:
            os.environ.pop("IOBENCH_PFS_RUN_DIR", None)
        else:
            os.environ["IOBENCH_PFS_RUN_DIR"] = old
    if mp in emulated_mounts():
        for cmd in (["umount", "-l", mp], ["fusermount3", "-uz", mp]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0:
                    break
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            if pfs_control._alive(pid):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.fixture
def pfs(fuse_usable: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Factory: `pfs(backing, profile, **options) -> PfsMount`, all unmounted at the end."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("IOBENCH_PFS_RUN_DIR", str(run_dir))
    made: list[tuple[str, int | None]] = []

    def _mount(backing: Path, profile: str = "passthrough", mp: Path | None = None, **opts):
        mp = mp or tmp_path / f"mnt{len(made)}"
        made.append((str(mp), None))
        h = mount(backing, mp, profile, **opts)
        made[-1] = (str(mp), h.pid)
        return h

    yield _mount
    for mp, pid in made:
        _force_unmount(mp, pid, run_dir)


def _alive(pid: int) -> bool:
    return pfs_control._alive(pid)


def _mounted(mp: str | Path) -> bool:
    return str(mp) in emulated_mounts()


def _write_backing(root: Path) -> dict[str, np.ndarray]:
    """Binary files of awkward sizes plus HDF5, NetCDF-4 and LMDB files made by those libraries."""
    rng = np.random.default_rng(7)
    (root / "sub" / "deeper").mkdir(parents=True)
    for name, size in [("empty.bin", 0), ("one.bin", 1), ("page.bin", 4096),
                       ("odd.bin", 1_048_576 + 13), ("sub/a.bin", 300_001),
                       ("sub/deeper/b.bin", 2_500_000)]:
        (root / name).write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    arrays = {"samples": rng.integers(-2000, 2000, (16, 8, 8, 4), dtype=np.int16),
              "labels": rng.random((16, 4), dtype=np.float32)}
    with h5py.File(root / "part-00000.h5", "w") as f:
        f.create_dataset("samples", data=arrays["samples"])
        f.create_dataset("labels", data=arrays["labels"], chunks=(4, 4), compression="gzip")
    with netCDF4.Dataset(root / "part-00000.nc", "w", format="NETCDF4") as ds:
        for dim, n in zip(("sample", "d0", "d1", "c"), arrays["samples"].shape, strict=True):
            ds.createDimension(dim, n)
        ds.createDimension("param", 4)
        v = ds.createVariable("samples", "i2", ("sample", "d0", "d1", "c"), zlib=True)
        v[:] = arrays["samples"]
        ds.createVariable("labels", "f4", ("sample", "param"))[:] = arrays["labels"]
    env = lmdb.open(str(root / "part-00000.lmdb"), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(16):
            txn.put(i.to_bytes(8, "big"), arrays["samples"][i].tobytes())
    env.close()
    for lock in root.glob("*-lock"):
        lock.unlink()
    return arrays


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# ---- behaviour through a mount ---------------------------------------------------------------

@pytest.mark.fuse
def test_files_and_formats_are_byte_identical_through_the_mount(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    arrays = _write_backing(backing)
    h = pfs(backing, "lustre-light")
    mp = Path(h.mountpoint)
    assert _files(mp) == _files(backing)  # same tree; the stats file is not listed
    assert STATS_NAME not in os.listdir(mp)

    def same(rel: str) -> bool:
        return (mp / rel).read_bytes() == (backing / rel).read_bytes()

    # Many readers at once: the daemon is multi-threaded.
    results: dict[str, bool] = {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, same(r)))
               for r in _files(backing)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == dict.fromkeys(_files(backing), True)

    with h5py.File(mp / "part-00000.h5", "r", locking=False) as f:
        np.testing.assert_array_equal(f["samples"][...], arrays["samples"])
        np.testing.assert_array_equal(f["labels"][...], arrays["labels"])
    with netCDF4.Dataset(mp / "part-00000.nc", "r") as ds:
        np.testing.assert_array_equal(ds["samples"][...], arrays["samples"])
        np.testing.assert_array_equal(ds["labels"][...], arrays["labels"])
    env = lmdb.open(str(mp / "part-00000.lmdb"), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            for i in range(16):
                assert txn.get(i.to_bytes(8, "big")) == arrays["samples"][i].tobytes()
    finally:
        env.close()

    # Symbolic links stay inside the tier, absolute ones included.
    (backing / "rel-link").symlink_to("sub/a.bin")
    (backing / "abs-link").symlink_to(backing / "sub" / "a.bin")
    before = stats_for(mp)
    for link in ("rel-link", "abs-link"):
        cache.evict([mp / "sub" / "a.bin"])  # the client cache holds it from the reads above
        assert (mp / link).read_bytes() == (backing / "sub" / "a.bin").read_bytes()
    assert os.readlink(mp / "abs-link") == str(mp / "sub" / "a.bin")
    assert delta(before, stats_for(mp))["bytes_served"] == 2 * 300_001

    info = is_emulated(mp / "sub")
    assert info is not None and info["emulated"] is True and "EMULATED" in info["note"]
    assert info["profile"]["name"] == "lustre-light" and info["backing"] == str(backing)
    assert is_emulated(backing) is None and stats_for(backing) is None


@pytest.mark.fuse
def test_writes_are_refused_read_only(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "x").write_bytes(b"abc")
    mp = Path(pfs(backing).mountpoint)
    for action in (lambda: os.open(mp / "x", os.O_RDWR),
                   lambda: os.open(mp / "new", os.O_WRONLY | os.O_CREAT),
                   lambda: os.mkdir(mp / "d"), lambda: os.unlink(mp / "x")):
        with pytest.raises(OSError) as e:
            action()
        assert e.value.errno == errno.EROFS
    assert (backing / "x").read_bytes() == b"abc" and not (backing / "new").exists()


@pytest.mark.fuse
def test_open_latency_shows_per_open(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    (backing / "d").mkdir(parents=True)
    n, lat_ms = 12, 30.0
    for i in range(n):
        (backing / "d" / f"f{i}").write_bytes(b"x" * 100)
    mp = Path(pfs(backing, "passthrough", open_latency_ms=lat_ms).mountpoint)
    before = stats_for(mp)
    t0 = time.perf_counter()
    for i in range(n):
        os.close(os.open(mp / "d" / f"f{i}", os.O_RDONLY))
    per_open_ms = (time.perf_counter() - t0) / n * 1000
    d = delta(before, stats_for(mp))
    # Generous: the machine is shared; each open is one metadata round trip.
    assert 0.9 * lat_ms <= per_open_ms <= lat_ms + 25, per_open_ms
    assert d["opens"] == n and d["lookups"] == n
    assert d["metadata_wait_s"] == pytest.approx(n * lat_ms / 1000, rel=0.25)
    t0 = time.perf_counter()
    os.stat(mp / "d" / "f0")
    assert (time.perf_counter() - t0) * 1000 >= 0.9 * lat_ms  # a stat is a round trip too


@pytest.mark.fuse
def test_bandwidth_cap_is_shared_by_all_readers(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    size, cap = 6 * MB, 30.0
    for name in ("a", "b"):
        (backing / name).write_bytes(os.urandom(size))
    mp = Path(pfs(backing, "passthrough", bandwidth_MBps=cap).mountpoint)

    t0 = time.perf_counter()
    assert len((mp / "a").read_bytes()) == size
    one = size / (time.perf_counter() - t0) / MB
    assert 0.75 * cap <= one <= 1.25 * cap, one

    def read(name: str) -> None:
        (mp / name).read_bytes()

    cache.evict([mp / "a"])  # else the client cache serves it
    threads = [threading.Thread(target=read, args=(n,)) for n in ("a", "b")]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    both = 2 * size / (time.perf_counter() - t0) / MB
    assert 0.75 * cap <= both <= 1.25 * cap, both  # shared, not per reader
    st = stats_for(mp)
    assert st["counters"]["read_throttle_wait_s"] > 0.5 * st["counters"]["read_service_s"]
    assert assess(st["counters"], st["profile"])["limited_by"] == "profile-bandwidth"


@pytest.mark.fuse
def test_stats_count_exactly_the_bytes_read(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    data = os.urandom(3 * MB + 1234)
    (backing / "f").write_bytes(data)
    (backing / "g").write_bytes(data[:777_777])

    # Page-cache mode: whole-file reads are served exactly once per cold read (readahead
    # stops at EOF); eviction through the mount empties the client cache in between.
    mp = Path(pfs(backing).mountpoint)
    before = stats_for(mp)
    for _ in range(2):
        assert (mp / "f").read_bytes() == data
        assert (mp / "g").read_bytes() == data[:777_777]
        cache.evict([mp / "f", mp / "g"])
    d = delta(before, stats_for(mp))
    assert d["bytes_served"] == 2 * (len(data) + 777_777)
    assert d["opens"] == 4 + 4  # reads and evictions: each open is one
    assert d["read_requests"] >= 2 * (3 + 1)  # at most 1 MiB (2^20 bytes) per request

    # direct_io mode: every byte of every pread, unaligned, and nothing more.
    mp2 = Path(pfs(backing, direct_io=True).mountpoint)
    before = stats_for(mp2)
    want = 0
    fd = os.open(mp2 / "f", os.O_RDONLY)
    try:
        for off, n in [(0, 10), (4095, 2), (1_000_001, 65_537), (len(data) - 5, 100)]:
            got = os.pread(fd, n, off)
            assert got == data[off:off + n]
            want += len(got)
    finally:
        os.close(fd)
    d = delta(before, stats_for(mp2))
    assert d["bytes_served"] == want and d["read_requests"] == 4


@pytest.mark.fuse
def test_backing_pages_are_evicted_after_serving(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    f = backing / "f"
    f.write_bytes(os.urandom(2 * MB))
    os.sync()
    cache.evict([f])
    mp = Path(pfs(backing).mountpoint)
    (mp / "f").read_bytes()
    resident = cache.resident_bytes(f)
    assert resident is not None and resident <= 2 * 4096, resident  # evicted after serving


@pytest.mark.fuse
def test_client_cache_survives_opens_and_empties_on_eviction(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    f = backing / "f"
    size = 2 * MB + 4321
    f.write_bytes(os.urandom(size))
    os.sync()
    cache.evict([f])
    h = pfs(backing, "lustre-light")
    mp = Path(h.mountpoint)

    # (1) A second open is served by the client cache, as on a Lustre/GPFS client; it
    # still costs its metadata round trip (one lookup per open).
    s0 = stats_for(mp)
    data = (mp / "f").read_bytes()
    s1 = stats_for(mp)
    assert (mp / "f").read_bytes() == data
    s2 = stats_for(mp)
    assert delta(s0, s1)["bytes_served"] == size
    assert delta(s1, s2)["bytes_served"] == 0
    assert delta(s1, s2)["opens"] == 1 and delta(s1, s2)["lookups"] == 1
    assert cache.resident_bytes(mp / "f") == size  # the client holds it
    backing_resident = cache.resident_bytes(f)
    assert backing_resident is not None and backing_resident <= 2 * 4096  # the server does not

    # (2) iobench's eviction through the mount empties the client cache: the next read
    # is served by the daemon again, and the backing is cold too.
    ev, res = cache.evict_and_measure([mp / "f"])
    assert ev.files == 1 and res.fraction is not None and res.fraction <= 0.01, res
    assert cache.resident_fraction([mp / "f"]) == 0.0
    s3 = stats_for(mp)
    assert (mp / "f").read_bytes() == data
    assert delta(s3, stats_for(mp))["bytes_served"] >= size
    backing_resident = cache.resident_bytes(f)
    assert backing_resident is not None and backing_resident <= 2 * 4096

    assert h.stats()["options"]["client_cache"] is True

    # --no-client-cache: the behaviour before issue 11, pages dropped at every open.
    mp2 = Path(pfs(backing, client_cache=False).mountpoint)
    assert stats_for(mp2)["options"]["client_cache"] is False
    s4 = stats_for(mp2)
    for _ in range(2):
        (mp2 / "f").read_bytes()
    assert delta(s4, stats_for(mp2))["bytes_served"] == 2 * size


def _sample_reads(path: Path, order: list[int], sample: int, open_per_sample: bool) -> bytes:
    """Read fixed-size samples in `order`: one open each, or through one kept handle."""
    out = []
    fd = None if open_per_sample else os.open(path, os.O_RDONLY)
    try:
        for i in order:
            if open_per_sample:
                with open(path, "rb") as f:
                    f.seek(i * sample)
                    out.append(f.read(sample))
            else:
                out.append(os.pread(fd, sample, i * sample))
    finally:
        if fd is not None:
            os.close(fd)
    return b"".join(out)


@pytest.mark.fuse
def test_open_per_sample_costs_opens_not_bytes(pfs, tmp_path: Path) -> None:
    """(3) Opening the file for every sample fetches about the bytes one kept handle does."""
    backing = tmp_path / "backing"
    backing.mkdir()
    n, sample = 600, 3072  # cifar10-sized samples
    data = os.urandom(n * sample)
    (backing / "part.bin").write_bytes(data)
    mp = Path(pfs(backing).mountpoint)
    order = np.random.default_rng(3).permutation(n).tolist()
    want = b"".join(data[i * sample:(i + 1) * sample] for i in order)
    served = {}
    for open_per_sample in (False, True):
        cache.evict([mp / "part.bin"])
        s0 = stats_for(mp)
        assert _sample_reads(mp / "part.bin", order, sample, open_per_sample) == want
        d = delta(s0, stats_for(mp))
        served[open_per_sample] = d["bytes_served"]
        assert d["opens"] == (n if open_per_sample else 1)
    print(f"served bytes, kept handle {served[False]:,}, open per sample {served[True]:,} "
          f"(file {len(data):,})")
    assert served[False] <= len(data)  # page-granular reads of cached pages are free
    # The same pages are fetched either way; only readahead windows may differ.
    assert 0.75 * served[False] <= served[True] <= 1.25 * served[False] + 256 * 1024, served


@pytest.mark.fuse
def test_unmount_leaves_no_process_and_no_mount(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "f").write_bytes(b"y" * 5000)
    h = pfs(backing)
    assert _mounted(h.mountpoint) and _alive(h.pid) and h.paths.pid.exists()
    fd = os.open(Path(h.mountpoint) / "f", os.O_RDONLY)
    try:
        with pytest.raises(StorageError, match="busy"):
            unmount(h.mountpoint)
        assert _mounted(h.mountpoint)
    finally:
        os.close(fd)
    (Path(h.mountpoint) / "f").read_bytes()
    final = unmount(h.mountpoint)
    assert not _mounted(h.mountpoint) and not _alive(h.pid) and not h.paths.pid.exists()
    assert final is not None and final["counters"]["bytes_served"] == 5000
    assert os.listdir(h.mountpoint) == []
    with pytest.raises(StorageError, match="not an iobench-pfs mount"):
        unmount(h.mountpoint)


@pytest.mark.fuse
def test_killed_daemon_is_cleaned_up(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    h = pfs(backing)
    os.kill(h.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(h.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(StorageError, match="not answering"):
        stats_for(h.mountpoint)
    unmount(h.mountpoint)
    assert not _mounted(h.mountpoint) and not h.paths.pid.exists()
    h2 = pfs(backing, mp=Path(h.mountpoint))  # the mount point is usable again
    assert _mounted(h2.mountpoint)


@pytest.mark.fuse
def test_mount_refuses_busy_and_bad_mount_points(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    h = pfs(backing)
    with pytest.raises(StorageError, match="busy: an emulated pfs is already mounted"):
        mount(backing, h.mountpoint)
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").touch()
    with pytest.raises(StorageError, match="not empty"):
        mount(backing, full)
    with pytest.raises(StorageError, match="not a directory"):
        mount(backing, full / "x")
    with pytest.raises(StorageError, match="does not exist"):
        mount(tmp_path / "missing", tmp_path / "m2")
    with pytest.raises(ConfigError, match="must not contain each other"):
        mount(backing, backing / "inside")
    assert not (backing / "inside").exists()


@pytest.mark.fuse
def test_cli_mount_status_unmount(fuse_usable: None, tmp_path: Path, capsys,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOBENCH_PFS_RUN_DIR", str(tmp_path / "run"))
    backing, mp = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    (backing / "f").write_bytes(b"z" * 10_000)
    try:
        assert cli("emulate-pfs", "--backing", backing, "--mount", mp, "--profile",
                   "lustre-busy", "--bandwidth", "50") == 0
        out = capsys.readouterr().out
        assert "EMULATED parallel filesystem" in out and "lustre-busy+custom" in out
        assert (mp / "f").read_bytes() == b"z" * 10_000
        assert cli("emulate-pfs", "--status", mp) == 0
        out = capsys.readouterr().out
        assert "EMULATED" in out and "served 10,000 bytes" in out
        assert "client cache: data pages kept across opens until evicted" in out
        assert cli("emulate-pfs", "--list") == 0
        assert str(mp) in capsys.readouterr().out
        assert cli("emulate-pfs", "--unmount", mp) == 0
        assert "unmounted the emulated parallel filesystem" in capsys.readouterr().out
        assert not _mounted(mp)
        assert cli("emulate-pfs", "--status", mp) == 2
        assert "not an iobench-pfs mount" in capsys.readouterr().err
    finally:
        _force_unmount(str(mp), None, tmp_path / "run")


# ---- without FUSE: configuration, errors, verdicts ----------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--backing", "/x"], "give --mount MNT --backing DIR"),
    (["--mount", "/tmp/somewhere"], "--mount needs --backing"),
    (["--mount", "/m", "--backing", "/b", "--bandwidth", "0"], "--bandwidth='0' must be"),
    (["--mount", "/m", "--backing", "/b", "--bandwidth", "fast"], "is not a number"),
    (["--mount", "/m", "--backing", "/b", "--read-latency", "-1"], "between 0 and 60000"),
    (["--mount", "/m", "--backing", "/b", "--iops", "nan"], "--iops='nan' must be"),
    (["--mount", "/m", "--backing", "/b", "--profile", "lustre-huge"], "neither a profile name"),
    (["--mount", "/m", "--backing", "/b", "--direct-io", "--kernel-cache"], "contradict"),
    (["--mount", "/m", "--backing", "/b", "--kernel-cache", "--no-client-cache"], "contradict"),
])
def test_cli_rejects_bad_input_in_one_line(argv: list[str], message: str, capsys) -> None:
    assert cli("emulate-pfs", *argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_fuse_problem_names_the_fix(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import ctypes.util

    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: False if p == "/dev/fuse" else real_exists(p))
    assert "modprobe fuse" in (fuse_problem() or "")
    assert cli("emulate-pfs", "--check") == 1
    assert capsys.readouterr().out.startswith("FUSE unusable: /dev/fuse does not exist")
    monkeypatch.undo()
    problem = fuse_problem()
    if problem and "/dev/fuse" in problem:
        pytest.skip(f"the rest needs an openable /dev/fuse: {problem}")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    problem = fuse_problem()
    assert problem is not None and "apt-get install fuse3" in problem
    with pytest.raises(UnsupportedError, match="libfuse is not installed"):
        mount("/tmp", "/tmp/nowhere-iobench")


def test_profiles_are_sourced_emulations_under_the_daemon_ceiling() -> None:
    assert {"lustre-light", "lustre-busy", "gpfs", "passthrough"} <= set(PROFILES)
    for p in PROFILES.values():
        assert p.sources and all(len(s) > 20 for s in p.sources)
        assert p.describe().startswith("EMULATED parallel filesystem")
        assert p.bandwidth_MBps is None or p.bandwidth_MBps < DAEMON_CEILING_MBPS
        assert Profile.from_dict(p.to_dict()) == p
    light, busy = get_profile("lustre-light"), get_profile("lustre-busy")
    assert busy.metadata_ms > light.metadata_ms and busy.read_ms > light.read_ms
    assert busy.bandwidth_MBps < light.bandwidth_MBps
    with pytest.raises(ConfigError, match="unknown profile 'nfs'"):
        get_profile("nfs")
    with pytest.raises(ConfigError, match="unknown profile keys"):
        Profile.from_dict({**light.to_dict(), "speed": 1})
    with pytest.raises(ConfigError):
        Profile(name="x", imitates="y", metadata_ms=float("inf"))
    assert light.with_overrides(bandwidth_MBps=10).name == "lustre-light+custom"


def _counters(**kw: float) -> dict[str, float]:
    return {**dict.fromkeys(COUNTERS, 0.0), **kw}


def test_verdict_says_when_the_daemon_was_the_limit() -> None:
    prof = get_profile("lustre-light").to_dict()
    busy = assess(_counters(bytes_served=300e6, read_requests=300, read_service_s=2.0,
                            read_throttle_wait_s=0.1, daemon_cpu_s=0.95, uptime_s=1.0), prof)
    assert busy["limited_by"] == "daemon" and "daemon itself was the limit" in busy["verdict"]
    assert busy["verdict"].startswith("EMULATED")
    capped = assess(_counters(bytes_served=400e6, read_requests=400, read_service_s=4.0,
                              read_throttle_wait_s=3.5, daemon_cpu_s=0.3, uptime_s=1.0), prof)
    assert capped["limited_by"] == "profile-bandwidth" and capped["served_MBps"] == 400
    lat = assess(_counters(bytes_served=1e6, read_requests=100, lookups=100, read_service_s=1.0,
                           read_latency_wait_s=0.8, metadata_wait_s=0.5, daemon_cpu_s=0.1,
                           uptime_s=2.0), prof)
    assert lat["limited_by"] == "profile-latency"
    assert assess(_counters(uptime_s=5.0), prof)["limited_by"] == "idle"

    doc = {"pid": 1, "mount": "/m", "profile": prof, "counters": _counters(uptime_s=1.0)}
    later = {**doc, "counters": _counters(uptime_s=3.0, bytes_served=2e6, read_requests=2,
                                          read_service_s=0.01, daemon_cpu_s=0.01)}
    d = delta(doc, later)
    assert d["bytes_served"] == 2e6 and d["uptime_s"] == 2.0 and d["served_MBps"] == 1.0
    assert d["limited_by"] == "client" and d["emulated"] is True
    with pytest.raises(DatasetError, match="different iobench-pfs daemons"):
        delta(doc, {**later, "pid": 2})


@pytest.mark.fuse
def test_a_daemon_that_cannot_start_is_reported_and_leaves_nothing(
        pfs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    # The daemon process loads libfuse from here, and fails.
    monkeypatch.setenv("FUSE_LIBRARY_PATH", str(tmp_path / "no-such-libfuse.so"))
    mp = tmp_path / "never"
    with pytest.raises(StorageError, match=r"daemon exited \(status 1\) before mounting"):
        mount(backing, mp)
    assert not mp.exists() and not _mounted(mp)
    assert not list((tmp_path / "run").glob("*.pid"))


@pytest.mark.fuse
def test_read_requests_in_flight_overlap_their_latency(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "f").write_bytes(os.urandom(64 * 1024))
    lat_s, readers, each = 0.1, 40, 4
    mp = Path(pfs(backing, read_latency_ms=lat_s * 1000, direct_io=True).mountpoint)

    def read(_: int) -> None:
        fd = os.open(mp / "f", os.O_RDONLY)
        try:
            for k in range(each):
                assert len(os.pread(fd, 4096, 4096 * k)) == 4096
        finally:
            os.close(fd)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wall = time.perf_counter() - t0
    # Ideal: each * lat = 0.4 s. Ten daemon threads (libfuse's default) would need 1.6 s.
    assert each * lat_s * 0.95 <= wall < 1.2, wall
    assert stats_for(mp)["counters"]["read_requests"] == readers * each


@pytest.mark.fuse
def test_other_users_get_only_what_the_backing_modes_allow(pfs) -> None:
    import shutil
    import tempfile

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and util-linux setpriv to read as another user")
    top = Path(tempfile.mkdtemp(prefix="iobench-pfs-perm-", dir="/tmp"))  # tmp_path is 0700
    try:
        top.chmod(0o755)
        backing = top / "backing"
        backing.mkdir(mode=0o755)
        (backing / "private").write_text("secret")
        (backing / "private").chmod(0o600)
        (backing / "public").write_text("shared")
        (backing / "public").chmod(0o644)
        mp = Path(pfs(backing, mp=top / "mnt").mountpoint)

        def cat_as_nobody(name: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                   "cat", str(mp / name)], capture_output=True, text=True,
                                  timeout=30)

        assert cat_as_nobody("public").stdout == "shared"
        denied = cat_as_nobody("private")
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
    finally:
        _force_unmount(str(top / "mnt"), None, Path(os.environ["IOBENCH_PFS_RUN_DIR"]))
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.fuse
def test_stats_for_costs_no_emulated_round_trip(pfs, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "f").write_bytes(b"q" * 10)
    mp = Path(pfs(backing, open_latency_ms=200).mountpoint)
    docs = [stats_for(mp / "f"), stats_for(mp), is_emulated(mp / "f"), stats_for(mp)]
    assert all(d is not None for d in docs)
    # Reading the counters (even for a file's path) is not itself a charged lookup or read.
    assert docs[-1]["counters"]["lookups"] == 0 and docs[-1]["counters"]["read_requests"] == 0
    assert docs[-1]["counters"]["metadata_wait_s"] == 0
