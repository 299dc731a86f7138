"""`iobench stage`: parallel, checksummed, resumable copies between storage tiers."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_cache import make_dataset

from conftest import cli, run_mpi
from iobench.core import cache, procio, sampling
from iobench.core.errors import ConfigError, DatasetError, StorageError
from iobench.core.manifest import Manifest
from iobench.core.world import World
from iobench.workflows.stage import PARTIAL, StageConfig, stage_dataset

SIZES = [300_000, 20_000, 200_000, 5_000, 70_000]  # 5 data files + labels.npy
MiB = 2**20


def _dataset(tmp_path: Path) -> Manifest:
    return make_dataset(tmp_path / "src" / "cifar10-files", SIZES)


def _warm(m: Manifest) -> None:
    """Read the whole dataset, as a run before staging would, and check it is cached now."""
    paths = [m.path_of(f) for f in m.files]
    for p in paths:
        p.read_bytes()
    assert cache.resident_fraction(paths) >= 0.9  # measured, not assumed


def _counted(path: Path) -> bool:
    """Whether the kernel counts storage reads under `path` (not on tmpfs or FUSE)."""
    return procio.read_bytes_unavailable(path) is None


def _check_cold_source(doc: dict, m: Manifest, tmp_path: Path, nodes: int = 1) -> None:
    """The copy read storage, from a source measured cold at its start, on every node."""
    sc = doc["source_cache"]
    assert sc["mode"] == "cold" and sc["status"] == "cold" and sc["method"] == "fadvise"
    assert sc["resident_fraction_at_start"] <= 0.1 and sc["warning"] is None
    assert len(sc["per_node"]) == nodes
    assert all(n["resident_fraction_at_start"] <= 0.1 for n in sc["per_node"])
    assert sum(n["files"] for n in sc["per_node"]) >= len(m.files)
    if _counted(tmp_path):
        assert doc["os_read_bytes"] >= 0.9 * doc["stage_bytes"] > 0, doc["os_read_bytes"]
        assert doc["os_read_bytes_note"] is None
    else:
        assert doc["os_read_bytes"] is None and doc["os_read_bytes_note"]


def _assert_copy(m: Manifest, dest: Path, paths: list[str] | None = None) -> None:
    want = [f for f in m.files if paths is None or f.path in paths]
    for f in want:
        data = (dest / f.path).read_bytes()
        assert len(data) == f.bytes and hashlib.sha256(data).hexdigest() == f.sha256, f.path
    assert not [p for p in dest.iterdir() if PARTIAL in p.name]


def _results(d: Path) -> list[dict]:
    docs = [json.loads(p.read_text()) for p in d.glob("stage-*.json")]
    return sorted(docs, key=lambda doc: doc["created"])


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["replicate", "shard"])
def test_stage_roundtrip_and_resume_under_mpi(tmp_path, mode):
    m = _dataset(tmp_path)
    args = ["stage", "--dataset", "cifar10", "--format", "files", "--from", tmp_path / "src",
            "--to", tmp_path / "dst", "--mode", mode, "--threads", "2",
            "--results", tmp_path / "res"]
    r = run_mpi(2, *args)
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "dst" / "cifar10-files"
    _assert_copy(m, dest)  # one node holds both ranks: it needs every file in both modes
    staged = Manifest.load(dest)
    assert staged.files == m.files and staged.extra["staged"]["mode"] == mode
    assert staged.extra["staged"]["shuffle_scope"] == ("local" if mode == "shard" else "global")
    (doc,) = _results(tmp_path / "res")
    assert doc["schema"] == "iobench.stage" and doc["mode"] == mode
    assert doc["stage_bytes"] == m.total_bytes and doc["copied_files"] == len(m.files)
    assert doc["stage_s"] > 0 and doc["stage_MBps"] == pytest.approx(
        doc["stage_bytes"] / doc["stage_s"] / 1e6)
    assert doc["config"]["world_size"] == 2 and len(doc["per_rank"]) == 2
    assert all(r["files"] > 0 for r in doc["per_rank"])  # the two ranks split the work
    assert doc["to"]["fstype"] and doc["from"]["kind"]
    # the source had just been written (warm, dirty pages): both ranks evicted their share
    _check_cold_source(doc, m, tmp_path)
    (node,) = doc["source_cache"]["per_node"]
    assert node["files"] == len(m.files) and node["total_bytes"] == m.total_bytes
    if _counted(tmp_path):  # the ranks' own counts, summed
        assert doc["os_read_bytes"] == sum(r["os_read_bytes"] for r in doc["per_rank"])
        assert all(r["os_read_bytes"] >= 0.9 * r["copied_bytes"] for r in doc["per_rank"])

    # an interrupted copy: manifest not written yet, one file truncated, one missing, one
    # with the right size but wrong bytes, and a temporary file left by a killed process
    (dest / "iobench.json").unlink()
    with open(dest / "part-00000.bin", "r+b") as f:
        f.truncate(1000)
    (dest / "part-00001.bin").unlink()
    (dest / "part-00002.bin").write_bytes(b"\0" * SIZES[2])
    stale = dest / f".part-00003.bin{PARTIAL}{socket.gethostname()}-99999-1"
    stale.write_bytes(b"half")
    r = run_mpi(2, *args)
    assert r.returncode == 0, r.stderr
    _assert_copy(m, dest)
    assert not stale.exists() and Manifest.load(dest).files == m.files
    doc = _results(tmp_path / "res")[-1]
    assert doc["copied_files"] == 3 and doc["recopied_files"] == 2
    assert doc["skipped_files"] == len(m.files) - 3 and doc["removed_partials"] == 1
    assert doc["stage_bytes"] == SIZES[0] + SIZES[1] + SIZES[2]


class _Done:
    """A completed MPI request (what `Ibarrier` returns, tested until done)."""

    def Test(self) -> bool:
        return True


class _ThreadComm:
    """Enough of an MPI communicator for ranks that are threads (emulated nodes)."""

    def __init__(self, n: int) -> None:
        self._barrier = threading.Barrier(n, timeout=60)
        self._slots: list[object] = [None] * n
        self.rank = threading.local()

    def Barrier(self) -> None:  # mpi4py spells it so
        self._barrier.wait()

    def Ibarrier(self) -> _Done:  # the barrier at once; the request is then complete
        self._barrier.wait()
        return _Done()

    def allgather(self, obj: object) -> list[object]:
        self._slots[self.rank.value] = obj
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()
        return out


def stage_on_thread_nodes(cfg: StageConfig, nodes: int = 2) -> dict[int, dict]:
    """`stage_dataset` as ranks 0..nodes-1, one per node, each a thread (`{node}` in --to
    gives each its own destination); every rank's result, by rank."""
    comm = _ThreadComm(nodes)
    docs: dict[int, dict] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        comm.rank.value = r
        w = World(rank=r, size=nodes, local_rank=0, local_size=1, node=r, num_nodes=nodes,
                  launcher="mpi", hostname=f"host{r}", _comm=comm)
        try:
            docs[r] = stage_dataset(cfg, w)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return docs


def test_copy_workers_that_cannot_start_on_one_rank_stop_every_rank_before_the_copy(
        tmp_path, monkeypatch):
    """Two nodes (threads); one rank's copy workers cannot start (no fork): both ranks raise
    before any copy, the failing one naming the fix, the other the failing rank, and no
    rank copies its share first."""
    from iobench.core.errors import DistributedError
    from iobench.workflows import _stage_pool

    _dataset(tmp_path)
    real, calls, lock = _stage_pool.Pool, [], threading.Lock()

    def first_fails(*a, **k):
        with lock:
            calls.append(1)
            if len(calls) == 1:
                raise OSError(11, "Resource temporarily unavailable")
        return real(*a, **k)

    monkeypatch.setattr(_stage_pool, "Pool", first_fails)
    comm, errors = _ThreadComm(2), {}
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "node{node}", threads=2)

    def rank(r: int) -> None:
        comm.rank.value = r
        w = World(rank=r, size=2, local_rank=0, local_size=1, node=r, num_nodes=2,
                  launcher="mpi", hostname=f"host{r}", _comm=comm)
        try:
            stage_dataset(cfg, w)
        except BaseException as e:
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(errors) == [0, 1], errors
    kinds = sorted(type(e).__name__ for e in errors.values())
    assert kinds == sorted([StorageError.__name__, DistributedError.__name__]), errors
    assert any("lower --threads" in str(e) for e in errors.values()), errors
    assert any("starting the copy failed on rank" in str(e) for e in errors.values()), errors
    assert not list(tmp_path.glob("node*/cifar10-files/*.bin"))  # nobody copied first


def test_shard_puts_on_each_node_only_its_ranks_files(tmp_path):
    """Two nodes (emulated by threads, `{node}` in --to): each gets its ranks' files only."""
    m = _dataset(tmp_path)
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "node{node}",
                      mode="shard", threads=2)
    docs = stage_on_thread_nodes(cfg)
    ranges = [(f.first_sample, f.num_samples) for f in m.data_files]
    for r in range(2):
        dest = tmp_path / f"node{r}" / "cifar10-files"
        mine = [m.data_files[k].path for k in sampling.files_for_rank(len(m.data_files), r, 2)]
        present = sorted(p.name for p in dest.iterdir())
        assert present == sorted([*mine, "labels.npy", "iobench.json"])
        _assert_copy(m, dest, [*mine, "labels.npy"])
        staged = Manifest.load(dest)
        assert sorted(staged.extra["staged"]["files_present"]) == sorted([*mine, "labels.npy"])
        assert staged.extra["staged"]["ranks"] == [r]
        # every sample rank r reads with a local shuffle scope lives in a file on its node
        idx = sampling.rank_indices(m.num_samples, "global", 0, 1, r, 2, file_ranges=ranges,
                                    scope="local")
        on_node = [f for f in m.data_files if f.path in mine]
        assert all(any(f.first_sample <= i < f.first_sample + f.num_samples for f in on_node)
                   for i in idx)
    assert docs[0]["stage_bytes"] == docs[1]["stage_bytes"]  # every rank returns the total
    assert docs[0]["stage_bytes"] == m.total_bytes + m.files[-1].bytes  # labels on both nodes
    assert docs[0]["shuffle_scope"] == "local" and docs[0]["config"]["num_nodes"] == 2


def test_nodes_sharing_a_host_evict_in_a_pass_before_the_copy(tmp_path, monkeypatch):
    """Virtual nodes on one host share its page cache: there every file is evicted and
    measured in a pass before any node copies (one node's copy must not refill what
    another measures), where a node of its own evicts each file as its copy opens it
    (from a network source: this folder's kind counts as one here)."""
    from iobench.core import sysinfo
    from iobench.workflows import stage

    monkeypatch.setattr(stage, "IN_COPY_KINDS",
                        stage.IN_COPY_KINDS | {sysinfo.mount_of(tmp_path).kind})
    m = _dataset(tmp_path)
    _warm(m)
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "node{node}",
                      threads=2)
    docs = stage_on_thread_nodes(cfg)  # two nodes, one host
    for doc in docs.values():
        sc = doc["source_cache"]
        assert sc["per_file"] == "pass" and sc["status"] == "cold", sc
        assert [n["files"] for n in sc["per_node"]] == [len(m.files)] * 2
    _warm(m)
    one = stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "one"))
    sc = one["source_cache"]
    assert sc["per_file"] == "copy" and sc["status"] == "cold", sc
    assert sc["per_node"][0]["files"] == len(m.files)
    assert sc["per_node"][0]["total_bytes"] == m.total_bytes
    _check_cold_source(one, m, tmp_path)


def test_stage_in_process_without_verify_uses_kernel_copy(tmp_path):
    m = _dataset(tmp_path)
    assert cli("stage", "--dataset", "cifar10", "--format", "files", "--from",
               tmp_path / "src" / "cifar10-files", "--to", tmp_path / "dst", "--no-verify",
               "--results", tmp_path / "res") == 0
    _assert_copy(m, tmp_path / "dst" / "cifar10-files")
    (doc,) = _results(tmp_path / "res")
    assert doc["verified"] is False and doc["stage_bytes"] == m.total_bytes
    # the second run finds every file complete and correct: nothing copied
    assert cli("stage", "--dataset", "cifar10", "--format", "files", "--from", tmp_path / "src",
               "--to", tmp_path / "dst", "--results", tmp_path / "res") == 0
    doc = _results(tmp_path / "res")[-1]
    assert doc["copied_files"] == 0 and doc["skipped_files"] == len(m.files)
    assert doc["stage_bytes"] == 0


def test_result_names_tiers_by_absolute_path(tmp_path, monkeypatch):
    """Relative --from/--to are recorded as absolute: compare pairs runs by these paths
    from whatever directory it runs in."""
    _dataset(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli("stage", "--dataset", "cifar10", "--format", "files", "--from", "src",
               "--to", "dst", "--results", "res") == 0
    (doc,) = _results(tmp_path / "res")
    assert doc["from"]["root"] == str((tmp_path / "src" / "cifar10-files").resolve())
    assert doc["to"]["root"] == str((tmp_path / "dst" / "cifar10-files").resolve())


def test_damaged_source_fails_and_leaves_no_half_written_file(tmp_path):
    m = _dataset(tmp_path)
    bad = m.path_of(m.files[0])
    data = bytearray(bad.read_bytes())
    data[1234] ^= 0xFF
    bad.write_bytes(bytes(data))
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst", threads=1)
    with pytest.raises(DatasetError, match="checksum"):
        stage_dataset(cfg)
    dest = tmp_path / "dst" / "cifar10-files"
    assert not (dest / m.files[0].path).exists()
    assert not (dest / "iobench.json").exists()  # an incomplete copy never looks complete
    assert not [p for p in dest.iterdir() if PARTIAL in p.name]


def test_small_files_batched_rename_only_after_every_sync(tmp_path, monkeypatch):
    # small files are copied a batch at a time and fsynced together: a failure in the
    # middle of a batch (a damaged source, then a failed sync) leaves none of the batch
    # under its final name and no temporary file, and a rerun completes the copy
    from iobench.workflows import stage

    m = make_dataset(tmp_path / "src" / "cifar10-files", [3_000 + k for k in range(12)])
    bad = m.path_of(m.files[6])
    good = bad.read_bytes()
    bad.write_bytes(bytes([good[0] ^ 0xFF]) + good[1:])
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst", threads=1)
    dest = tmp_path / "dst" / "cifar10-files"
    with pytest.raises(DatasetError, match=f"{m.files[6].path}.*checksum"):
        stage_dataset(cfg)
    assert sorted(p.name for p in dest.iterdir()) == []  # one batch: nothing renamed
    bad.write_bytes(good)
    real = stage._finish
    calls: list[int] = []

    def failing_sync(fd: int, c: StageConfig) -> None:
        calls.append(fd)
        if len(calls) == 4:
            raise OSError(5, "Input/output error")
        real(fd, c)

    monkeypatch.setattr(stage, "_finish", failing_sync)
    with pytest.raises(StorageError, match="Input/output error"):
        stage_dataset(cfg)
    assert len(calls) >= 4 and not list(dest.iterdir())  # synced first, renamed after
    monkeypatch.setattr(stage, "_finish", real)
    stage_dataset(cfg)
    _assert_copy(m, dest)
    assert not [p for p in dest.iterdir() if PARTIAL in p.name]


@pytest.mark.parametrize("case, needle", [
    ("missing-source", "does not exist"),
    ("no-dataset", "no dataset cifar10-files under"),
    ("dest-is-a-file", "cannot create the destination"),
    ("wrong-format", "holds cifar10/files, not cifar10/hdf5"),
    ("bad-placeholder", "only {node} and {host}"),
])
def test_bad_input_is_one_line(tmp_path, capsys, case, needle):
    _dataset(tmp_path)
    src, dst, fmt = tmp_path / "src", tmp_path / "dst", "files"
    if case == "missing-source":
        src = tmp_path / "nowhere"
    elif case == "no-dataset":
        src = tmp_path
    elif case == "dest-is-a-file":
        (tmp_path / "afile").write_text("x")
        dst = tmp_path / "afile" / "sub"
    elif case == "wrong-format":
        src, fmt = tmp_path / "src" / "cifar10-files", "hdf5"
    elif case == "bad-placeholder":
        dst = Path(f"{tmp_path}/{{rank}}")
    code = cli("stage", "--dataset", "cifar10", "--format", fmt, "--from", src, "--to", dst,
               "--results", tmp_path / "res")
    err = capsys.readouterr().err
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "res").exists()


@pytest.fixture
def small_tmpfs(tmpfs):
    """A 1 MiB tmpfs (conftest's `tmpfs`)."""
    return tmpfs("1m")


def test_out_of_space(tmp_path, small_tmpfs):
    rng = np.random.default_rng(1)
    big = make_dataset(tmp_path / "src" / "cifar10-files", [700_000, 700_000])
    cfg = StageConfig("cifar10", "files", tmp_path / "src", small_tmpfs, threads=1)
    with pytest.raises(StorageError, match="not enough space"):  # checked before copying
        stage_dataset(cfg)
    assert not any((small_tmpfs / "cifar10-files").iterdir())
    # space runs out mid-copy: a same-sized wrong file passes the estimate, its copy does not fit
    dest = small_tmpfs / "cifar10-files"
    first = big.files[0]
    (dest / first.path).write_bytes(rng.integers(0, 256, first.bytes, dtype=np.uint8).tobytes())
    one = Manifest.load(big.root)
    import dataclasses

    dataclasses.replace(one, files=(first,), num_samples=first.num_samples,
                        root=None).write(big.root)
    with pytest.raises(StorageError, match="out of space"):
        stage_dataset(cfg)
    left = sorted(p.name for p in dest.iterdir())
    assert left == [first.path]  # the old file untouched, the partial copy removed


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["replicate", "shard"])
def test_train_stage_to_records_staging_and_training_together(tmp_path, mode):
    from test_sweep import make_hdf5_dataset

    m = make_hdf5_dataset(tmp_path / "slow")
    r = run_mpi(2, "train", "--loader", "hdf5", "--storage", tmp_path / "slow", "--stage-to",
                tmp_path / "fast", "--stage-mode", mode, "--epochs", "1", "--max-steps", "1",
                "--compute-time", "0.001", "--batch-size", "16", "--results", tmp_path / "res")
    assert r.returncode == 0, r.stderr
    _assert_copy(m, tmp_path / "fast" / "cifar10-hdf5")
    (path,) = (tmp_path / "res").glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["config"]["storage"] == str(tmp_path / "fast")  # trained from the copy
    assert doc["dataset"]["root"] == str((tmp_path / "fast" / "cifar10-hdf5").resolve())
    st = doc["staging"]
    assert st["mode"] == mode and st["stage_bytes"] == m.total_bytes and st["stage_s"] > 0
    assert st["shuffle_scope"] == ("local" if mode == "shard" else "global")
    assert st["from"]["root"] == str(m.root) and st["to"]["fstype"]
    assert st["time_to_solution_s"] == pytest.approx(st["stage_s"] + doc["summary"]["wall_s"])
    _check_cold_source(st, m, tmp_path)  # h5py had just written the source: it was warm
    from iobench.workflows import report

    col = report.load_directory(tmp_path / "res")
    rows = [report.run_row(d, col.probes) for d in col.runs]
    (row,) = report.staging_rows(col, rows)  # listed, though no in-place run to compare yet
    assert row["mode"] == mode and row["stage_s"] == st["stage_s"]
    assert row["break_even_epochs"] is None and row["run"] is None
    assert rows[0]["shuffle"] == ("global (local)" if mode == "shard" else "global")


def test_train_stage_to_bad_destination_is_one_line(tmp_path, capsys):
    from test_sweep import make_hdf5_dataset

    make_hdf5_dataset(tmp_path / "slow")
    (tmp_path / "afile").write_text("x")
    code = cli("train", "--loader", "hdf5", "--storage", tmp_path / "slow", "--stage-to",
               tmp_path / "afile", "--epochs", "1", "--compute-time", "0.001",
               "--results", tmp_path / "res")
    assert code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot create the destination" in err[0]
    assert not list((tmp_path / "res").glob("*.json")) if (tmp_path / "res").exists() else True


def test_interrupted_stage_leaves_no_partial_file_and_resumes(tmp_path):
    """Ctrl-C in the middle of a copy (from a bandwidth-capped emulated parallel filesystem):
    the temporary file is removed, nothing incomplete is left, and a rerun completes."""
    import signal
    import sys
    import time

    from iobench.core.errors import IobenchError
    from iobench.pfs import control

    backing = tmp_path / "backing"
    m = make_dataset(backing / "cifar10-files", [12_000_000, 1000])
    try:
        mount = control.mount(backing, tmp_path / "pfs", "passthrough", bandwidth_MBps=4)
    except IobenchError as e:
        pytest.skip(f"cannot mount the emulated parallel filesystem here: {e}")
    dest = tmp_path / "dst" / "cifar10-files"
    args = [sys.executable, "-m", "iobench", "stage", "--dataset", "cifar10", "--format",
            "files", "--from", str(tmp_path / "pfs"), "--to", str(tmp_path / "dst"),
            "--threads", "1", "--buffer-mib", "1", "--results", str(tmp_path / "res")]
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                dest.is_dir() and any(PARTIAL in p.name and p.stat().st_size > 0
                                      for p in dest.iterdir())):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "interrupted" in err and "Traceback" not in err
        left = sorted(p.name for p in dest.iterdir())
        assert "part-00000.bin" not in left and "iobench.json" not in left
        assert not [n for n in left if PARTIAL in n]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        mount.unmount()
    _assert_copy(m, dest)
    assert Manifest.load(dest).files == m.files


def test_manifest_paths_cannot_escape_the_destination(tmp_path):
    import dataclasses

    m = _dataset(tmp_path)
    bad = dataclasses.replace(m.files[0], path="../../escaped.bin")
    dataclasses.replace(m, files=(bad, *m.files[1:]), root=None).write(m.root)
    with pytest.raises(DatasetError, match="not a plain relative path"):
        stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst"))
    assert not (tmp_path / "escaped.bin").exists()


@pytest.mark.mpi
def test_failure_under_mpi_is_one_line(tmp_path):
    r = run_mpi(2, "stage", "--dataset", "cifar10", "--format", "hdf5", "--from",
                tmp_path / "nowhere", "--to", tmp_path / "dst", "--results", tmp_path / "res")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0], r.stderr


def test_stage_under_torchrun(tmp_path):
    import shutil as _sh
    import sys

    exe = _sh.which("torchrun", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("torchrun not found")
    m = _dataset(tmp_path)
    r = subprocess.run([exe, "--nproc-per-node", "2", "-m", "iobench", "stage", "--dataset",
                        "cifar10", "--format", "files", "--from", str(tmp_path / "src"), "--to",
                        str(tmp_path / "dst"), "--results", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    _assert_copy(m, tmp_path / "dst" / "cifar10-files")
    (doc,) = _results(tmp_path / "res")
    assert doc["config"]["launcher"] == "torchrun" and len(doc["per_rank"]) == 2


def test_stage_evicts_a_warm_source_and_reads_storage(tmp_path):
    """Issue 11 item 2: a source whose pages were just read is evicted before the timed copy,
    so the copy reads storage (the OS's own count), not the page cache."""
    if not _counted(tmp_path):
        pytest.skip(f"the kernel counts no storage reads here: "
                    f"{procio.read_bytes_unavailable(tmp_path)}")
    m = make_dataset(tmp_path / "src" / "cifar10-files", [2 * MiB, MiB, 300_000, 5_000])
    _warm(m)
    io0 = procio.tree_io()
    doc = stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst",
                                    threads=2))
    read = (procio.tree_io() - io0).read_bytes  # measured here, apart from the result
    assert read >= 0.9 * m.total_bytes, f"the copy read {read} of {m.total_bytes} bytes " \
        "from storage: it copied from the page cache"
    assert doc["stage_bytes"] == m.total_bytes
    _check_cold_source(doc, m, tmp_path)
    assert doc["schema_version"] == 3 and doc["repeats"] == 1 and doc["warnings"] == []
    # the copy leaves neither side in the page cache
    dest = tmp_path / "dst" / "cifar10-files"
    assert cache.resident_fraction([m.path_of(f) for f in m.files]) <= 0.1
    assert cache.resident_fraction([dest / f.path for f in m.files]) <= 0.1
    _assert_copy(m, dest)


def test_warm_source_keeps_the_source_and_says_so(tmp_path, capsys):
    m = make_dataset(tmp_path / "src" / "cifar10-files", [2 * MiB, MiB, 5_000])
    _warm(m)
    assert cli("stage", "--dataset", "cifar10", "--format", "files", "--from", tmp_path / "src",
               "--to", tmp_path / "dst", "--warm-source", "--repeat", "2",
               "--results", tmp_path / "res") == 0
    out, err = capsys.readouterr()
    (doc,) = _results(tmp_path / "res")
    sc = doc["source_cache"]
    assert sc["mode"] == "warm" and sc["method"] == "none" and sc["status"] == "warm"
    assert sc["resident_fraction_at_start"] >= 0.9  # measured at the start, not evicted
    assert "WARM SOURCE (--warm-source)" in sc["warning"] and doc["warnings"] == [sc["warning"]]
    assert "source WARM (--warm-source" in out and "WARNING: WARM SOURCE" in err
    for r in doc["repetitions"]:  # the source stays warm for every repetition
        assert r["source_cache"]["resident_fraction_at_start"] >= 0.9
        if _counted(tmp_path):
            assert r["os_read_bytes"] <= 0.1 * r["stage_bytes"]  # memory, as asked
    _assert_copy(m, tmp_path / "dst" / "cifar10-files")


@pytest.fixture
def shm_dir():
    """A directory on tmpfs (/dev/shm), removed afterwards: data that cannot be evicted."""
    from iobench.core.sysinfo import mount_of

    base = Path("/dev/shm")
    if not base.is_dir() or not os.access(base, os.W_OK) or mount_of(base).kind != "memory":
        pytest.skip("no writable tmpfs at /dev/shm")
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="iobench-test-", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_failed_source_eviction_is_said_loudly(tmp_path, shm_dir, capsys):
    """A source on tmpfs cannot be evicted: the result and the console say the copy read
    memory, and os_read_bytes is null with the reason, not a misleading 0."""
    m = make_dataset(shm_dir / "cifar10-files", [MiB, 5_000])
    assert cli("stage", "--dataset", "cifar10", "--format", "files", "--from", shm_dir,
               "--to", tmp_path / "dst", "--results", tmp_path / "res") == 0
    out, err = capsys.readouterr()
    (doc,) = _results(tmp_path / "res")
    sc = doc["source_cache"]
    assert sc["mode"] == "cold" and sc["status"] == "warm"
    assert sc["resident_fraction_at_start"] > 0.9
    assert sc["warning"].startswith("COLD SOURCE FAILED") and "tmpfs" in sc["warning"]
    assert doc["warnings"] == [sc["warning"]]
    assert "iobench: WARNING: COLD SOURCE FAILED" in err and "eviction failed" in out
    assert doc["os_read_bytes"] is None and "tmpfs" in doc["os_read_bytes_note"]
    _assert_copy(m, tmp_path / "dst" / "cifar10-files")


def test_repeat_copies_everything_from_a_cold_source_each_time(tmp_path, capsys):
    """Issue 11 item 9: --repeat N runs N full copies, each from a cold source; the medians
    are the headline, the spread is recorded, and only this staging's files are touched."""
    m = make_dataset(tmp_path / "src" / "cifar10-files", [2 * MiB, MiB, 300_000, 5_000])
    dest = tmp_path / "dst" / "cifar10-files"
    dest.mkdir(parents=True)
    (dest / "notes.txt").write_text("not iobench's")  # must survive the repetitions
    (tmp_path / "dst" / "other").mkdir()
    (tmp_path / "dst" / "other" / "x.bin").write_bytes(b"x")
    # complete from an earlier staging: with --repeat it is copied again, not skipped
    shutil.copyfile(m.path_of(m.files[0]), dest / m.files[0].path)
    _warm(m)
    t0 = time.perf_counter()
    assert cli("stage", "--dataset", "cifar10", "--format", "files", "--from", tmp_path / "src",
               "--to", tmp_path / "dst", "--repeat", "3", "--threads", "2",
               "--results", tmp_path / "res") == 0
    wall_s = time.perf_counter() - t0
    out = capsys.readouterr().out
    (doc,) = _results(tmp_path / "res")
    _assert_host_cpu(doc, wall_s)
    assert doc["repeats"] == 3 and doc["config"]["repeat"] == 3
    reps = doc["repetitions"]
    assert [r["repeat"] for r in reps] == [0, 1, 2] and doc["skipped_files"] == 0
    for r in reps:
        assert r["copied_files"] == len(m.files) and r["stage_bytes"] == m.total_bytes
        assert r["source_cache"]["resident_fraction_at_start"] <= 0.1
        if _counted(tmp_path):
            assert r["os_read_bytes"] >= 0.9 * m.total_bytes, r
    sp = doc["spread"]
    assert set(sp) == {"stage_s", "stage_MBps"}
    assert sp["stage_s"]["n"] == 3 and sp["stage_s"]["values"] == [r["stage_s"] for r in reps]
    assert sp["stage_MBps"]["values"] == [r["stage_MBps"] for r in reps]
    assert doc["stage_s"] == sp["stage_s"]["median"]
    assert doc["stage_MBps"] == sp["stage_MBps"]["median"]
    if _counted(tmp_path):
        assert doc["os_read_bytes"] == min(r["os_read_bytes"] for r in reps)
    _check_cold_source(doc, m, tmp_path)
    assert re.search(r"MB in [\d.]+ \[[\d.]+-[\d.]+\] s \([\d.]+ \[[\d.]+-[\d.]+\] MB/s\), "
                     r"median \[min-max\] of 3 repetitions", out), out
    _assert_copy(m, dest)  # the last copy stays, complete and verified
    assert Manifest.load(dest).files == m.files
    assert (dest / "notes.txt").read_text() == "not iobench's"
    assert (tmp_path / "dst" / "other" / "x.bin").read_bytes() == b"x"


def _assert_host_cpu(doc: dict, wall_s: float) -> None:
    """Each repetition holds the host's busy CPU over its copy, within what the host's CPUs
    could do over `wall_s` (a wall clock around the whole command, and a 10 ms tick, USER_HZ,
    at either end); the document's is their median."""
    from iobench.core.result_types import StageDoc

    cpus = [r["host_cpu"] for r in doc["repetitions"]]
    for c in cpus:
        assert c is not None and c["cpus"] >= 1, c
        assert 0 <= c["busy_s"] <= (wall_s + 0.02) * c["cpus"], (c, wall_s)
    assert doc["host_cpu"]["busy_s"] == statistics.median(c["busy_s"] for c in cpus)
    assert doc["host_cpu"]["cpus"] == cpus[0]["cpus"] and "/proc/stat" in doc["host_cpu"]["source"]
    assert StageDoc.from_dict(doc).host_cpu.busy_s == doc["host_cpu"]["busy_s"]


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_repeat_is_one_line(tmp_path, capsys, value):
    _dataset(tmp_path)
    code = cli("stage", "--dataset", "cifar10", "--format", "files", "--from", tmp_path / "src",
               "--to", tmp_path / "dst", "--repeat", value, "--results", tmp_path / "res")
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "--repeat" in err[0] and value in err[0], err
    assert not (tmp_path / "dst").exists() and not (tmp_path / "res").exists()
    with pytest.raises(ConfigError, match="whole number >= 1"):
        StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst", repeat=0)


def test_train_stage_to_warm_source(tmp_path):
    """`train --stage-to --warm-source`: staging measures the source without evicting it, and
    the training result's staging section says so."""
    from test_sweep import make_hdf5_dataset

    m = make_hdf5_dataset(tmp_path / "slow")
    _warm(m)
    assert cli("train", "--loader", "hdf5", "--storage", tmp_path / "slow", "--stage-to",
               tmp_path / "fast", "--warm-source", "--epochs", "1", "--max-steps", "1",
               "--workers", "0", "--compute-time", "0.001", "--batch-size", "16",
               "--results", tmp_path / "res") == 0
    (path,) = (tmp_path / "res").glob("*.json")
    st = json.loads(path.read_text())["staging"]
    sc = st["source_cache"]
    assert sc["mode"] == "warm" and sc["resident_fraction_at_start"] >= 0.9
    assert sc["warning"] and st["warnings"] == [sc["warning"]]
    assert "os_read_bytes" in st and st["stage_bytes"] == m.total_bytes
