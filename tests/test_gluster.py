"""A real network filesystem in the suite: the one-box GlusterFS of scripts/pfs/local-gluster.sh.

The volume (two bricks on this host, FUSE-mounted, client-side caching
translators off) is brought up once for the module, or reused when it runs;
it is brought down again only if this module started it. Every test works in
its own directory on the mount and removes it. The proof that a cold epoch
read storage is the brick daemons' own count (`/proc/<pid>/io` `read_bytes`
of the `glusterfsd` processes): the kernel counts nothing for the FUSE client.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from conftest import cli
from iobench.core import procio, sysinfo
from iobench.core.world import World

pytestmark = pytest.mark.fuse  # GlusterFS: root, FUSE and the glusterfs packages

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "pfs" / "local-gluster.sh"
EVICT = f"{SCRIPT} evict"
LOCK = Path("/var/tmp/iobench-gluster.lock")  # held by the module using the volume
LOCK_WAIT_S = 1800.0  # the longest another module may hold it
OFF = ("performance.quick-read", "performance.io-cache", "performance.read-ahead",
       "performance.readdir-ahead", "performance.open-behind", "performance.nl-cache")


def _script(*args: str, env: dict[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _mount_from(stdout: str) -> Path:
    (line,) = stdout.strip().splitlines()
    assert line.startswith("export IOBENCH_PFS="), stdout
    return Path(line.split("=", 1)[1])


def _take(lock: IO[str], wait_s: float = LOCK_WAIT_S) -> None:
    """Hold `lock` exclusively, waiting for another module's hold up to `wait_s` seconds;
    then fail, naming the lock."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail(f"{lock.name}: another test module has held the GlusterFS volume for "
                            f"over {wait_s:.0f} s (a hung run? its pid holds the lock)")
            time.sleep(0.5)


@pytest.fixture(scope="module")
def gluster() -> Iterator[Path]:
    """The mount point of the one-box volume (skips with the script's reason where it cannot
    run: not root, packages missing, no FUSE). One module at a time holds it (`LOCK`): the
    parallel pass runs modules side by side, and the client's daemon counts the replies of
    every process using the mount (test_fusedaemon), and a module that brought the volume
    up brings it down."""
    if not SCRIPT.is_file():
        pytest.skip(f"{SCRIPT} is missing")
    if os.geteuid() != 0:
        pytest.skip("the one-box GlusterFS needs root")
    with open(LOCK, "a") as lock:
        _take(lock)  # released when the file closes
        was_up = _script("status").returncode == 0
        r = _script("up")
        if r.returncode != 0:
            pytest.skip(f"one-box GlusterFS unavailable: {r.stderr.strip().splitlines()[-1:]}")
        mnt = _mount_from(r.stdout)
        try:
            yield mnt
        finally:
            if not was_up:
                _script("down")


@pytest.fixture
def pfs(gluster: Path) -> Iterator[Path]:
    """A fresh directory on the GlusterFS mount, removed afterwards."""
    d = gluster / f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def brick_read_bytes() -> int:
    """Bytes the volume's brick daemons read from disk so far (their /proc/<pid>/io)."""
    pids = _script("brick-pids").stdout.split()
    assert len(pids) == 2, f"expected two brick daemons, found {pids}"
    total = 0
    for pid in pids:
        io = procio.read_io(int(pid))
        assert io is not None, f"brick daemon {pid} is gone"
        total += io["read_bytes"]
    return total


def _generate(storage: Path, *extra: str) -> Path:
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples", "4096",
               "--samples-per-file", "1024", "--storage", storage, *extra) == 0
    return storage / "cifar10-hdf5"


def _result(d: Path, pattern: str = "*.json") -> dict:
    (path,) = d.glob(pattern)
    return json.loads(path.read_text())


def test_up_is_idempotent_and_the_volume_can_be_made_cold(gluster: Path) -> None:
    r = _script("up")
    assert r.returncode == 0, r.stderr
    assert _mount_from(r.stdout) == gluster
    st = _script("status")
    assert st.returncode == 0 and _mount_from(st.stdout) == gluster, st.stderr
    m = sysinfo.mount_of(gluster)
    assert m.mount_point == str(gluster) and m.fstype == "fuse.glusterfs"
    vol = m.source.rsplit("/", 1)[1]
    for opt in OFF:  # translators that keep data in the client's memory, beyond any eviction
        out = subprocess.run(["gluster", "volume", "get", vol, opt], capture_output=True,
                             text=True, timeout=60).stdout
        assert any(ln.split()[:2] == [opt, "off"] for ln in out.splitlines()), out


def test_mount_is_recorded_from_the_mount_table_and_statfs(pfs: Path) -> None:
    m = sysinfo.mount_of(pfs)
    assert m.fstype == "fuse.glusterfs"  # the mount table names the client
    assert m.statfs_type == "fuseblk"  # statfs only knows it is FUSE
    assert m.kind == "fuse-network" and m.shared is True
    assert m.source.endswith(":/iobench") and "allow_other" in m.options
    local = sysinfo.mount_of(REPO)
    assert local.shared is False and local.statfs_type not in (None, "fuseblk")


def test_epochs_without_evict_cmd_are_unverified(pfs: Path, tmp_path: Path) -> None:
    """Client pages evicted and 0 % resident, yet the bricks' page cache still holds the
    data: no epoch may be called cold (the issue measured 4 MB read from the bricks for
    three "cold" epochs of a 537 MB dataset)."""
    _generate(pfs)
    res = tmp_path / "res"
    assert cli("train", "--loader", "hdf5", "--storage", pfs, "--model", "none",
               "--epochs", "2", "--workers", "1", "--results", res) == 0
    doc = _result(res)
    for ep in doc["epochs"]:
        c = ep["cache"]
        assert c["status"] == "unverified", c
        assert c["resident_fraction"] is not None and c["resident_fraction"] <= 0.10
        assert "fuse.glusterfs" in c["reason"] and "--evict-cmd" in c["reason"]
        assert c["evict_cmd"] is None and c["fstype"] == "fuse.glusterfs"
        assert c["plan"]["server_caches"] is True
    assert any("CACHE UNVERIFIED" in w for w in doc["warnings"])
    server = doc["cache"]["server_cache"]  # the 5x-RAM rule still applies
    assert server is not None and server["ok"] is False and server["warning"]
    storage = doc["provenance"]["storage"]
    assert (storage["fstype"], storage["statfs_type"], storage["kind"], storage["shared"]) == (
        "fuse.glusterfs", "fuseblk", "fuse-network", True)


def test_evict_cmd_makes_cold_epochs_read_the_bricks(pfs: Path) -> None:
    """With the site's command emptying the bricks' page cache, every cold epoch reads
    its data from the bricks' disk: their read_bytes cover >= 0.9 of what it needs."""
    from iobench.loaders import make_loader
    from iobench.workflows import train

    _generate(pfs)
    config = train.TrainConfig(loader="hdf5", storage=str(pfs), model="none", epochs=2,
                               workers=1, results=str(pfs.parent / f"{pfs.name}-res"),
                               evict_cmd=EVICT)
    try:
        doc = train.run(config, lambda m, c, r, w: make_loader("hdf5", m, c, r, w), World(),
                        counters=lambda: {"brick_read_bytes": brick_read_bytes()})
    finally:
        shutil.rmtree(config.results, ignore_errors=True)
    assert doc is not None
    for ep in doc["epochs"]:
        c, need = ep["cache"], ep["summary"]["batch_bytes"]
        assert c["status"] == "cold" and c["reason"] is None, c
        assert c["evict_cmd"]["returncode"] == 0 and c["evict_cmd"]["command"] == EVICT
        assert c["method"] == "evict-cmd+fadvise"
        assert need >= 4096 * 3072
        assert ep["tier_bytes"]["brick_read_bytes"] >= 0.9 * need, (ep["tier_bytes"], need)
    assert doc["cache"]["evict_cmd"] == EVICT
    assert doc["cache"]["server_cache"]["waived_by"] == f"--evict-cmd {EVICT!r}"
    assert not [w for w in doc["warnings"] if "UNVERIFIED" in w or "server" in w]


def test_bench_read_and_stage_with_and_without_evict_cmd(pfs: Path, tmp_path: Path) -> None:
    root = _generate(pfs)
    data = sum(f.stat().st_size for f in root.glob("part-*.h5"))
    out = tmp_path / "br"
    assert cli("bench-read", "--storage", pfs, "--dataset", "cifar10", "--format", "hdf5",
               "--loaders", "hdf5", "--workers", "0", "--shuffle", "none", "--no-naive",
               "--no-dd", "--evict-cmd", EVICT, "--results", out) == 0
    doc = _result(out)
    (row,) = doc["rows"]
    assert row["cache_status"] == ["cold"] and doc["config"]["evict_cmd"] == EVICT
    assert doc["provenance"]["storage"]["fstype"] == "fuse.glusterfs"

    res = tmp_path / "st"
    assert cli("stage", "--dataset", "cifar10", "--format", "hdf5", "--from", pfs,
               "--to", tmp_path / "local", "--results", res, "--no-progress") == 0
    sc = _result(res)["source_cache"]
    assert sc["status"] == "unverified" and "fuse.glusterfs" in sc["reason"], sc
    for p in res.iterdir():
        p.unlink()
    before = brick_read_bytes()
    assert cli("stage", "--dataset", "cifar10", "--format", "hdf5", "--from", pfs,
               "--to", tmp_path / "local2", "--results", res, "--no-progress",
               "--evict-cmd", EVICT) == 0
    read = brick_read_bytes() - before
    doc = _result(res)
    assert doc["source_cache"]["status"] == "cold"
    assert doc["source_cache"]["evict_cmd"]["returncode"] == 0
    assert doc["from"]["fstype"] == "fuse.glusterfs" and doc["from"]["shared"] is True
    assert doc["to"]["shared"] is False
    assert read >= 0.9 * data, (read, data)


def test_failing_evict_cmd_is_one_line(pfs: Path, tmp_path: Path, capsys) -> None:
    _generate(pfs)
    capsys.readouterr()
    code = cli("train", "--loader", "hdf5", "--storage", pfs, "--model", "none", "--epochs",
               "1", "--workers", "0", "--evict-cmd", "echo no server here >&2; exit 7",
               "--results", tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1, err
    assert "--evict-cmd" in err[0] and "exit status 7" in err[0] and "no server here" in err[0]
    assert not list(tmp_path.glob("*.json"))


def test_up_heals_a_stale_mount_and_a_dead_brick(gluster: Path, tmp_path: Path) -> None:
    """A second volume of the script's own, in tmp_path: kill its FUSE client and a brick
    daemon, and `up` brings both back; `down` leaves nothing of it."""
    env = {"IOBENCH_GLUSTER_DIR": str(tmp_path / "g"),
           "IOBENCH_GLUSTER_VOLUME": f"iobench-t{uuid.uuid4().hex[:6]}"}
    r = _script("up", env=env)
    assert r.returncode == 0, r.stderr
    mnt = _mount_from(r.stdout)
    try:
        (mnt / "f").write_bytes(b"x" * 10_000)
        fuse_client = f"--volfile-id=/{env['IOBENCH_GLUSTER_VOLUME']} {mnt}$"
        client = subprocess.run(["pgrep", "-f", "--", fuse_client], capture_output=True,
                                text=True).stdout.split()
        bricks = _script("brick-pids", env=env).stdout.split()
        assert len(client) == 1 and len(bricks) == 2, (client, bricks)
        for pid in (client[0], bricks[0]):
            os.kill(int(pid), 9)
        assert _script("status", env=env).returncode != 0
        r = _script("up", env=env)
        assert r.returncode == 0, r.stderr
        assert _script("status", env=env).returncode == 0
        assert (mnt / "f").read_bytes() == b"x" * 10_000
    finally:
        d = _script("down", env=env)
    assert d.returncode == 0, d.stderr
    assert not (tmp_path / "g").exists()
    assert _script("status").returncode == 0  # the module's volume is untouched


def test_probe_of_the_real_tier_and_its_profile(pfs: Path, tmp_path: Path) -> None:
    """Per tier: sequential and random read bandwidth, open+stat+close/s, first-byte latency;
    unverified without the site's eviction, cold with it; a profile the emulator accepts."""
    from iobench.pfs.profiles import load_profile

    tiny = ["--size", "8M", "--runtime", "0.3", "--metadata-files", "50", "--readers", "1,2",
            "--engine", "python"]
    assert cli("probe", "--storage", pfs, *tiny, "--results", tmp_path / "a") == 0
    doc = _result(tmp_path / "a", "probe-*.json")
    assert doc["cache_status"] == "unverified" and "--evict-cmd" in doc["cache_reason"]
    assert cli("probe", "--storage", pfs, *tiny, "--evict-cmd", EVICT,
               "--results", tmp_path / "b") == 0
    doc = _result(tmp_path / "b", "probe-*.json")
    assert doc["cache_status"] == "cold" and doc["storage"]["fstype"] == "fuse.glusterfs"
    s = doc["summary"]
    for key in ("seq_read_MBps", "rand4k_read_MBps", "sample_read_MBps", "open_stat_close_per_s",
                "first_byte_ms_p50", "first_byte_ms_p99"):
        assert s[key] and s[key] > 0, key
    (pfile,) = (tmp_path / "b").glob("pfs-profile-*.json")
    prof = load_profile(str(pfile))
    assert prof.name.startswith("probe:") and "fuse.glusterfs" in prof.imitates
    assert prof.metadata_ms > 0 and prof.read_ms > 0 and prof.bandwidth_MBps > 0


def test_a_module_waiting_for_the_volume_fails_naming_the_lock(tmp_path: Path) -> None:
    """Another module's hold past the wait is one clear failure, not a hang; a free lock is
    taken at once."""
    path = tmp_path / "lock"
    with open(path, "a") as held, open(path, "a") as waiting:
        _take(held, wait_s=0.0)
        with pytest.raises(pytest.fail.Exception, match="held the GlusterFS volume"):
            _take(waiting, wait_s=0.2)
