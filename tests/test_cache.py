"""Cold caches: eviction, truthful residency, per-node eviction, /proc io over worker trees."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import mpiexec_path
from iobench.core import cache, procio, sysinfo
from iobench.core.errors import ConfigError
from iobench.core.manifest import FileEntry, Manifest
from iobench.core.world import World

MiB = 2**20


def make_dataset(root: Path, sizes: list[int], *, seed: int = 0, aux: bool = True) -> Manifest:
    """A tiny dataset of random data files (and a labels file) with a real manifest.

    Staging, eviction and residency only look at files and the manifest, so the
    bytes need not be decodable; each data file holds 4 samples.
    """
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    entries = []
    for k, size in enumerate(sizes):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        name = f"part-{k:05d}.bin"
        (root / name).write_bytes(data)
        entries.append(FileEntry(name, size, hashlib.sha256(data).hexdigest(), 4 * k, 4))
    if aux:
        labels = rng.integers(0, 10, 4 * len(sizes), dtype=np.int64).tobytes()
        (root / "labels.npy").write_bytes(labels)
        entries.append(FileEntry("labels.npy", len(labels), hashlib.sha256(labels).hexdigest(),
                                 -1, 0, role="labels"))
    m = Manifest(dataset="cifar10", format="files", num_samples=4 * len(sizes), num_classes=10,
                 sample={"kind": "array", "shape": [32, 32, 3], "dtype": "uint8"},
                 label={"shape": [], "dtype": "int64"}, layout={"samples_per_file": 4},
                 files=tuple(entries), seed=seed, iobench_version="test",
                 created="2026-01-01T00:00:00Z")
    m.write(root)
    return Manifest.load(root)


def _read_all(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(4 * MiB):
            pass


def test_residency_near_zero_after_evict_and_one_after_read(tmp_path):
    p = tmp_path / "big.bin"
    p.write_bytes(os.urandom(8 * MiB))
    ev = cache.evict([p])
    assert ev.files == 1 and ev.bytes == 8 * MiB and not ev.errors
    cold = cache.resident_fraction([p])
    assert cold is not None and cold < 0.05
    _read_all(p)
    warm = cache.resident_fraction([p])
    assert warm is not None and warm > 0.95
    cache.evict([p])
    assert cache.resident_fraction([p]) < 0.05
    # half the file read, readahead off: about half resident
    fd = os.open(p, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        assert len(os.pread(fd, 4 * MiB, 0)) == 4 * MiB
    finally:
        os.close(fd)
    half = cache.resident_fraction([p])
    assert 0.45 < half < 0.6


def test_evict_reports_missing_files(tmp_path):
    ev = cache.evict([tmp_path / "nope"])
    assert ev.files == 0 and len(ev.errors) == 1 and "nope" in ev.errors[0]
    r = cache.residency([tmp_path / "nope"])
    assert r.unknown_files == 1 and r.fraction is None


def test_residency_unknown_rather_than_a_false_one(tmp_path):
    """A process that may not write a file gets lies from mincore: iobench says "unknown"."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a process without capabilities")
    d = Path(tempfile.mkdtemp(prefix="iobench-cache-", dir=tmp_path))
    p = d / "other-users.bin"
    p.write_bytes(os.urandom(2 * MiB))
    os.chown(p, 65534, 65534)  # owned by nobody, world-readable, not writable
    os.chmod(p, 0o444)
    cache.evict([p])
    code = textwrap.dedent(f"""
        import os
        from iobench.core import cache
        fd = os.open({str(p)!r}, os.O_RDONLY)
        lie = cache._mincore_pages(fd, os.fstat(fd).st_size)
        print(lie, cache.resident_bytes({str(p)!r}), cache.resident_fraction([{str(p)!r}]))
    """)
    # root with every capability dropped: not the owner, no CAP_FOWNER, cannot write
    r = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-all", sys.executable,
                        "-c", code], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "setpriv" in r.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    lie, rb, frac = r.stdout.split()
    assert int(lie) == 512  # mincore claims all 2 MiB resident although it was just evicted
    assert rb == "None" and frac == "None"
    assert cache.resident_fraction([p]) < 0.05  # the truth, as root


def test_files_for_node_and_split_cover_everything_once(tmp_path):
    m = make_dataset(tmp_path / "d", [1000, 3000, 2000, 500, 700, 100, 4000])
    world_size, nodes = 4, [[0, 1], [2, 3]]
    seen: list[str] = []
    for ranks in nodes:
        node_files = cache.files_for_node(m, ranks, world_size, "local")
        assert "labels.npy" in {f.path for f in node_files}  # auxiliary files on every node
        shares = [cache.split_files(node_files, i, len(ranks)) for i in range(len(ranks))]
        flat = [f.path for s in shares for f in s]
        assert sorted(flat) == sorted(f.path for f in node_files)  # a partition
        seen += [f.path for f in node_files if f.role == "data"]
    assert sorted(seen) == sorted(f.path for f in m.data_files)  # each data file on one node
    assert cache.files_for_node(m, [0], 4, "global") == list(m.files)
    loads = [sum(f.bytes for f in cache.split_files(m.files, i, 3)) for i in range(3)]
    assert max(loads) - min(loads) <= 4000  # balanced within one file
    with pytest.raises(ValueError, match="scope"):
        cache.files_for_node(m, [0], 1, "nodes")


def test_evict_for_node_single_process(tmp_path):
    m = make_dataset(tmp_path / "d", [MiB, 2 * MiB])
    for f in m.files:
        _read_all(m.path_of(f))
    warm = cache.evict_for_node(m, World(), cache.EvictOptions(evict_pages=False))
    assert warm.method == "none" and warm.status == "warm" and warm.resident_fraction > 0.9
    rep = cache.evict_for_node(m, World())
    assert rep.status == "cold" and rep.resident_fraction < 0.05 and rep.warning is None
    assert rep.files == 3 and rep.bytes == m.total_bytes and rep.storage_kind == "local"
    assert rep.to_dict()["per_node"][0]["total_bytes"] == m.total_bytes


def test_evict_for_node_on_tmpfs_warns_loudly(capsys):
    if not os.path.isdir("/dev/shm") or procio.read_bytes_unavailable("/dev/shm") is None:
        pytest.skip("no tmpfs at /dev/shm")
    d = Path(tempfile.mkdtemp(prefix="iobench-test-", dir="/dev/shm"))
    try:
        m = make_dataset(d, [MiB])
        rep = cache.evict_for_node(m, World())
        assert rep.status == "warm" and rep.resident_fraction > 0.9
        assert rep.storage_kind == "memory" and "tmpfs" in rep.warning
        assert "COLD CACHE FAILED" in capsys.readouterr().err
    finally:
        shutil.rmtree(d)


def test_evict_options_are_checked_when_built():
    with pytest.raises(ConfigError, match="warn_above=1.5"):
        cache.EvictOptions(warn_above=1.5)
    with pytest.raises(ConfigError, match="empty"):
        cache.EvictOptions(evict_cmd=" ")
    # a warm-cache pass runs no site command, so it does not look at one
    assert cache.EvictOptions(evict_pages=False, evict_cmd=" ").site_cmd is None


def test_drop_caches_needs_root_and_is_never_silent(tmp_path):
    m = make_dataset(tmp_path / "d", [MiB])
    with pytest.raises(ValueError, match="warm-cache"):
        cache.evict_for_node(m, World(), cache.EvictOptions(drop_caches=True, evict_pages=False))
    if os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK):
        rep = cache.evict_for_node(m, World(), cache.EvictOptions(drop_caches=True))
        assert rep.method == "drop_caches+fadvise" and rep.status == "cold"


@pytest.mark.mpi
def test_evict_for_node_under_mpi(tmp_path):
    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (install the `mpich` extra)")
    m = make_dataset(tmp_path / "d", [MiB, MiB, 2 * MiB, MiB])
    for f in m.files:
        _read_all(m.path_of(f))
    code = textwrap.dedent(f"""
        import json
        from iobench.core import cache
        from iobench.core.manifest import Manifest
        from iobench.core.world import get_world
        w = get_world()
        rep = cache.evict_for_node(Manifest.load({str(m.root)!r}), w,
                                   cache.EvictOptions(scope="local"))
        with open(f"{tmp_path}/rank{{w.rank}}.json", "w") as f:  # stdout lines interleave
            json.dump([w.rank, w.size, rep.to_dict()], f)
    """)
    r = subprocess.run([exe, "-n", "2", sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    import json

    docs = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    assert sorted(d[0] for d in docs) == [0, 1] and all(d[1] == 2 for d in docs)
    for _, _, rep in docs:
        # both ranks on one node, local scope: the node reads every file, each evicted once
        assert rep["files"] == len(m.files) and rep["bytes"] == m.total_bytes
        assert rep["status"] == "cold" and rep["resident_fraction"] < 0.05
    assert cache.resident_fraction([m.path_of(f) for f in m.files]) < 0.05


class _FileChunks:
    """A map-style dataset reading 1 MiB chunks of one file (a real DataLoader workload)."""

    def __init__(self, path: Path, chunks: int) -> None:
        self.path, self.chunks = path, chunks

    def __len__(self) -> int:
        return self.chunks

    def __getitem__(self, i: int) -> int:
        with open(self.path, "rb") as f:
            f.seek(i * MiB)
            return len(f.read(MiB))


def test_tree_io_counts_live_dataloader_workers(tmp_path):
    import torch.utils.data as tud

    if procio.read_bytes_unavailable(tmp_path) is not None:
        pytest.skip("the kernel does not count read_bytes on this filesystem")
    warmup = tmp_path / "warmup.bin"  # first use imports worker machinery: not our data
    warmup.write_bytes(os.urandom(MiB))
    assert sum(int(b.sum()) for b in tud.DataLoader(_FileChunks(warmup, 1), num_workers=1)) == MiB
    size = 32 * MiB
    p = tmp_path / "data.bin"
    p.write_bytes(os.urandom(size))
    cache.evict([p])
    assert cache.resident_fraction([p]) < 0.05
    loader = tud.DataLoader(_FileChunks(p, 32), batch_size=2, num_workers=2,
                            persistent_workers=True)
    before_tree, before_self = procio.tree_io(), procio.read_io(os.getpid())
    it = iter(loader)
    total = sum(int(b.sum()) for b in it)
    after_tree, after_self = procio.tree_io(), procio.read_io(os.getpid())
    assert total == size
    delta = after_tree - before_tree
    assert delta.processes >= 3  # this process and two live workers
    assert delta.read_bytes >= 0.9 * size  # workers' own counters, summed
    # the parent alone saw little of it: its workers are alive, not reaped
    assert after_self["read_bytes"] - before_self["read_bytes"] < 0.25 * size
    assert procio.os_read_bytes(delta, tmp_path) == delta.read_bytes
    del it, loader


def test_read_bytes_not_available_on_tmpfs():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    from iobench.core.sysinfo import mount_of

    if mount_of("/dev/shm").kind != "memory":
        pytest.skip("/dev/shm is not tmpfs here")
    assert "tmpfs" in procio.read_bytes_unavailable("/dev/shm")
    assert procio.os_read_bytes(procio.IoCounters(0, 10, 1, 1), "/dev/shm") is None


def test_train_drop_caches_option(tmp_path):
    """`iobench train --drop-caches` (root only) drops the node's page cache before each epoch
    and says so in the result; it is never on by default."""
    import json

    from test_sweep import make_hdf5_dataset

    from conftest import cli

    make_hdf5_dataset(tmp_path / "s")
    args = ["train", "--loader", "hdf5", "--storage", tmp_path / "s", "--epochs", "1",
            "--max-steps", "1", "--compute-time", "0.001", "--batch-size", "16"]
    assert cli(*args, "--results", tmp_path / "default") == 0
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "default").glob("*.json")]
    assert doc["epochs"][0]["cache"]["method"] == "fadvise" and not doc["config"]["drop_caches"]
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        assert cli(*args, "--drop-caches", "--results", tmp_path / "drop") != 0
        return
    assert cli(*args, "--drop-caches", "--results", tmp_path / "drop") == 0
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "drop").glob("*.json")]
    assert doc["epochs"][0]["cache"]["method"] == "drop_caches+fadvise"
    assert doc["epochs"][0]["cache"]["status"] == "cold"


def test_evict_drops_freshly_written_dirty_pages(tmp_path):
    """Pages still dirty (written, not yet on disk) are written back, then dropped."""
    p = tmp_path / "dirty.bin"
    with open(p, "wb") as f:
        f.write(os.urandom(4 * MiB))
    assert cache.resident_fraction([p]) > 0.95
    ev = cache.evict([p])
    assert not ev.errors and cache.resident_fraction([p]) < 0.05


@pytest.mark.dali
def test_tree_io_counts_live_dali_workers(tmp_path):
    """DALI's parallel external-source workers are processes too: their reads are counted
    while the pipeline lives, and not in the rank's own counters."""
    pytest.importorskip("nvidia.dali")
    from test_sweep import make_hdf5_dataset

    from iobench.loaders import LoaderConfig, make_loader

    if procio.read_bytes_unavailable(tmp_path) is not None:
        pytest.skip("the kernel does not count read_bytes on this filesystem")
    m = make_hdf5_dataset(tmp_path / "d", n=2048, per_file=512)
    paths = [m.path_of(f) for f in m.files]
    data = sum(f.bytes for f in m.data_files)
    loader = make_loader("dali", m, LoaderConfig(batch_size=64, workers=2, decode=False), 0, 1)
    try:
        for _ in loader.epoch(0):  # start-up: DALI's libraries are read in, workers start
            pass
        cache.evict(paths)
        before_tree, before_self = procio.tree_io(), procio.read_io(os.getpid())
        samples = sum(len(b.indices) for b in loader.epoch(1))
        after_tree, after_self = procio.tree_io(), procio.read_io(os.getpid())
    finally:
        loader.close()
    assert samples == m.num_samples
    delta = after_tree - before_tree
    assert delta.processes >= 3 and delta.read_bytes >= 0.9 * data
    assert after_self["read_bytes"] - before_self["read_bytes"] < 0.25 * data


def test_pages_a_live_mapping_holds_are_reported_not_hidden(tmp_path, capsys):
    """A reader that keeps the file mapped (like LMDB) pins its pages: eviction cannot drop
    them, and the report says so loudly instead of pretending the cache is cold."""
    import mmap

    m = make_dataset(tmp_path / "d", [2 * MiB], aux=False)
    path = m.path_of(m.files[0])
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        assert sum(mm[i] for i in range(0, len(mm), 4096)) >= 0  # touch every page
        rep = cache.evict_for_node(m, World())
    assert rep.status == "warm" and rep.resident_fraction > 0.9
    assert "mapped" in rep.warning and "COLD CACHE FAILED" in capsys.readouterr().err
    assert cache.evict_for_node(m, World()).status == "cold"  # unmapped: evicted


def _mount(fstype: str) -> sysinfo.MountInfo:
    kind = sysinfo.fs_kind(fstype)
    return sysinfo.MountInfo(path="/d", mount_point="/d", fstype=fstype, source="s", options="",
                             kind=kind, free_bytes=0, total_bytes=0,
                             shared=sysinfo.is_shared(kind))


@pytest.mark.parametrize("fstype, kind, client, complete, site", [
    ("ext4", "local", "fadvise", True, False),
    ("xfs", "local", "fadvise", True, False),
    ("tmpfs", "memory", "fadvise", True, False),
    ("fuse.iobench-pfs", "fuse", "fadvise", True, False),  # its daemon drops its backing pages
    ("fuse.glusterfs", "fuse-network", "fadvise", True, True),
    ("fuse.ceph-fuse", "fuse-network", "fadvise", True, True),
    ("fuse.something", "fuse", "fadvise", True, True),  # unknown FUSE: its daemon may cache
    ("nfs4", "network", "fadvise", True, True),
    ("ceph", "parallel", "fadvise", True, True),
    ("gpfs", "parallel", "fadvise", False, True),  # the pagepool is not the page cache
])
def test_eviction_plan_per_filesystem(fstype, kind, client, complete, site):
    plan = cache.eviction_plan(_mount(fstype))
    assert (plan.kind, plan.client, plan.client_complete) == (kind, client, complete)
    assert (plan.needs_site is not None) == site and plan.server_caches == site
    if site:
        assert fstype in plan.needs_site
    assert cache.client_commands(plan) == []


def test_lustre_plan_clears_the_lock_lru_as_root_with_lctl(monkeypatch, tmp_path):
    lctl = tmp_path / "lctl"
    lctl.write_text("#!/bin/sh\nexit 0\n")
    lctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    plan = cache.eviction_plan(_mount("lustre"))
    if os.geteuid() == 0:
        assert plan.client == "fadvise+lctl"
        assert cache.client_commands(plan) == [
            ("lctl", "set_param", "-n", "ldlm.namespaces.*.lru_size=clear")]
    else:
        assert plan.client == "fadvise" and "needs root" in plan.needs_site
    assert plan.server_caches and "lustre" in plan.needs_site  # the OSS caches remain


def test_evict_cmd_runs_on_local_rank_0_and_is_recorded(tmp_path):
    """On a local disk the epoch is cold with or without it; the command runs once per
    eviction, sees the dataset root, and a failing one is one line naming it."""
    from iobench.core.errors import StorageError

    m = make_dataset(tmp_path / "d", [8192, 8192])
    log = tmp_path / "log"
    rep = cache.evict_for_node(m, World(), cache.EvictOptions(
        evict_cmd=f'echo "$IOBENCH_DATASET_ROOT" >> {log}'))
    assert rep.status == "cold" and rep.method == "evict-cmd+fadvise" and rep.reason is None
    assert rep.evict_cmd["returncode"] == 0 and rep.evict_cmd["nodes"] == 1
    assert log.read_text().split() == [str(m.root)]
    assert rep.plan["fstype"] == rep.fstype and rep.plan["needs_site"] is None
    with pytest.raises(StorageError, match=r"exit status 3: boom.*leave --evict-cmd out"):
        cache.evict_for_node(m, World(), cache.EvictOptions(evict_cmd="echo boom >&2; exit 3"))
    with pytest.raises(ConfigError, match="empty"):
        cache.evict_for_node(m, World(), cache.EvictOptions(evict_cmd="  "))
