"""`iobench stage` with copy worker processes: exact in both --verify modes, stopped cleanly, resumable."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cache import make_dataset

from conftest import cli
from iobench.core.errors import ConfigError, DatasetError, IobenchError
from iobench.core.manifest import Manifest
from iobench.workflows.stage import PARTIAL, StageConfig, parse_verify, stage_dataset

SMALL = [3_000 + 37 * k for k in range(150)]  # three batches of small files (64 each)


def _assert_exact(m: Manifest, dest: Path) -> None:
    """Every file under its final name has the source's bytes; no temporary file is left."""
    for f in m.files:
        data = (dest / f.path).read_bytes()
        assert len(data) == f.bytes and hashlib.sha256(data).hexdigest() == f.sha256, f.path
    assert not [p for p in dest.rglob("*") if PARTIAL in p.name]


def _no_incomplete_file(m: Manifest, dest: Path) -> int:
    """Every file under its final name is complete and correct; how many there are."""
    n = 0
    for f in m.files:
        p = dest / f.path
        if p.exists():
            data = p.read_bytes()
            assert len(data) == f.bytes and hashlib.sha256(data).hexdigest() == f.sha256, f.path
            n += 1
    return n


@pytest.mark.parametrize("verify", ["full", "size"])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_the_copy_is_exact_in_both_verify_modes(tmp_path, verify, threads):
    m = make_dataset(tmp_path / "src" / "cifar10-files", [*SMALL, 5 * 2**20, 1000])
    assert cli("stage", "--from", tmp_path / "src", "--to", tmp_path / "dst", "--threads",
               threads, "--verify", verify, "--results", tmp_path / "res") == 0
    dest = tmp_path / "dst" / "cifar10-files"
    _assert_exact(m, dest)
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "res").glob("stage-*.json")]
    assert doc["verify"] == verify and doc["verified"] is (verify == "full")
    assert doc["copied_files"] == len(m.files) and doc["stage_bytes"] == m.total_bytes
    if verify == "full":  # what verification cost, as its own figure
        assert doc["checksum_s"] > 0 and 0 < doc["checksum_share"] <= 1
    else:
        assert doc["checksum_s"] is None and doc["checksum_share"] is None
    assert doc["evict_s"] >= 0 and Manifest.load(dest).files == m.files


def test_verify_option_and_its_old_spelling():
    assert parse_verify(None) is True and parse_verify("full") is True
    assert parse_verify("size") is False and parse_verify(None, no_verify=True) is False
    with pytest.raises(ConfigError, match="--no-verify with --verify full"):
        parse_verify("full", no_verify=True)
    with pytest.raises(ConfigError, match="sync='never'"):
        StageConfig("cifar10", "files", Path("a"), Path("b"), sync="never")


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("sync", ["fs", "file"])
def test_verify_size_still_catches_a_size_mismatch(tmp_path, threads, sync):
    """A source file longer or shorter than its manifest entry fails the copy with --verify
    size too, in a worker process as in the rank's own thread; none of its batch is left
    under a final name, nor any temporary file."""
    m = make_dataset(tmp_path / "src" / "cifar10-files", SMALL)
    for k, change in ((70, b"x"), (140, None)):  # one longer, one shorter
        p = m.path_of(m.files[k])
        p.write_bytes(p.read_bytes() + change if change else p.read_bytes()[:-1])
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst", threads=threads,
                      verify=False, sync=sync)
    with pytest.raises(DatasetError, match="bytes, the manifest says"):
        stage_dataset(cfg)
    dest = tmp_path / "dst" / "cifar10-files"
    assert not (dest / m.files[70].path).exists() and not (dest / m.files[69].path).exists()
    _no_incomplete_file(m, dest)
    assert not [p for p in dest.rglob("*") if PARTIAL in p.name]
    assert not (dest / "iobench.json").exists()


def _children(pid: int) -> set[int]:
    """The live child processes of `pid` (any of its threads')."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "children") as f:
            out.update(int(c) for c in f.read().split())
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def slow_source(tmp_path):
    """A dataset of small files behind the emulated parallel filesystem capped at 1 MB/s."""
    from iobench.pfs import control

    backing = tmp_path / "backing"
    m = make_dataset(backing / "cifar10-files", [20_000] * 400)
    try:
        mount = control.mount(backing, tmp_path / "pfs", "passthrough", bandwidth_MBps=1)
    except IobenchError as e:
        pytest.skip(f"cannot mount the emulated parallel filesystem here: {e}")
    yield m, tmp_path / "pfs"
    mount.unmount()


def _start(source: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], list[str], Path]:
    dest = tmp_path / "dst" / "cifar10-files"
    args = [sys.executable, "-m", "iobench", "stage", "--from", str(source), "--to",
            str(tmp_path / "dst"), "--threads", "2", "--results", str(tmp_path / "res")]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (  # some files done, others mid-batch
            dest.is_dir() and any(PARTIAL in p.name for p in dest.iterdir())
            and any(PARTIAL not in p.name for p in dest.iterdir())):
        time.sleep(0.05)
    return proc, args, dest


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_stops_the_workers_cleanly_and_the_stage_resumes(tmp_path, slow_source,
                                                                      signum, code):
    """SIGINT or SIGTERM while workers copy: the command exits with its usual code, every
    worker process is gone, no temporary file is left and every file under its final name
    is complete; a rerun copies the rest."""
    m, source = slow_source
    proc, args, dest = _start(source, tmp_path)
    workers = _children(proc.pid)
    assert len(workers) >= 2, "the copy workers had not started"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "interrupted" in err and "Traceback" not in err
    assert not [w for w in workers if _alive(w)], "a copy worker outlived the interrupt"
    assert not [p for p in dest.rglob("*") if PARTIAL in p.name]
    done = _no_incomplete_file(m, dest)
    assert done < len(m.files) and not (dest / "iobench.json").exists()
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{done} already complete" in r.stdout or done == 0
    _assert_exact(m, dest)


def test_a_kill_in_the_middle_of_a_batch_resumes(tmp_path, slow_source):
    """SIGKILL to the command mid-batch (no clean-up at all): its workers die with it,
    nothing incomplete is under a final name, and a rerun removes the temporary files,
    keeps the complete files and copies the rest."""
    m, source = slow_source
    proc, args, dest = _start(source, tmp_path)
    workers = _children(proc.pid)
    assert len(workers) >= 2, "the copy workers had not started"
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [w for w in workers if _alive(w)]:
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], "a copy worker outlived its parent"
    done = _no_incomplete_file(m, dest)
    assert done < len(m.files) and not (dest / "iobench.json").exists()
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(next((tmp_path / "res").glob("stage-*.json")).read_text())
    assert doc["skipped_files"] == done and doc["copied_files"] == len(m.files) - done
    _assert_exact(m, dest)
    assert os.path.exists(dest / "iobench.json")


def test_shard_mode_copies_only_each_nodes_share(tmp_path):
    """Two nodes (emulated by threads) in shard mode, each rank with copy workers: each node
    copies exactly its ranks' data files and the labels, nothing of the other's share."""
    from test_stage import stage_on_thread_nodes

    from iobench.core import sampling

    m = make_dataset(tmp_path / "src" / "cifar10-files", [4_000 + 100 * k for k in range(90)])
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "node{node}",
                      mode="shard", threads=2)
    docs = stage_on_thread_nodes(cfg)
    labels = m.files[-1]
    for r in range(2):
        mine = [m.data_files[k] for k in sampling.files_for_rank(len(m.data_files), r, 2)]
        dest = tmp_path / f"node{r}" / "cifar10-files"
        got = {p.name for p in dest.iterdir()} - {"iobench.json"}
        assert got == {f.path for f in mine} | {labels.path}
        for f in [*mine, labels]:
            assert hashlib.sha256((dest / f.path).read_bytes()).hexdigest() == f.sha256
        node = next(n for n in docs[0]["per_node"] if n["node"] == r)
        assert node["copied_bytes"] == sum(f.bytes for f in mine) + labels.bytes


def _resident(paths: list[Path]) -> float:
    from iobench.core import cache

    frac = cache.resident_fraction(paths)
    if frac is None:
        pytest.skip("this process may not learn the page-cache residency here")
    return frac


@pytest.mark.parametrize(("opts", "source_dropped", "dest_dropped"), [
    ((), True, True),  # batches synced and dropped through their open descriptors
    (("--threads", "1"), True, True),
    (("--sync", "file"), True, True),
    (("--warm-source",), False, True),  # the source stays as the user had it
    (("--no-fsync",), True, True),  # the copies' dirty pages: written back after the copy
])
def test_the_copy_leaves_no_pages_behind(tmp_path, opts, source_dropped, dest_dropped):
    """After staging batches of small files (and a large one), neither the copies nor the
    source they were read from stay in the page cache, without a pass that opens every
    file again (`_drop_batch`); with --warm-source the source's pages are left alone."""
    m = make_dataset(tmp_path / "src" / "cifar10-files", [*SMALL, 5 * 2**20])
    if tmp_path.stat().st_dev == os.stat("/dev/shm").st_dev:
        pytest.skip("tmpfs holds its files in the page cache")
    for f in m.files:  # warm: what the copy leaves is then what it dropped or not
        m.path_of(f).read_bytes()
    assert cli("stage", "--from", tmp_path / "src", "--to", tmp_path / "dst", *opts,
               "--results", tmp_path / "res") == 0
    dest = tmp_path / "dst" / "cifar10-files"
    copies = _resident([dest / f.path for f in m.files])  # before anything reads them
    assert (copies <= 0.1) if dest_dropped else (copies >= 0.9), copies
    src = _resident([m.path_of(f) for f in m.files])
    assert (src <= 0.1) if source_dropped else (src >= 0.9), src
    _assert_exact(m, dest)
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "res").glob("stage-*.json")]
    assert doc["evict_s"] > 0


def test_the_copies_pages_are_dropped_before_the_renames(tmp_path, monkeypatch):
    """Each batch's copies leave the page cache through the descriptors the copy holds,
    once they are durable and before they get their final names: no copy is opened
    again for it."""
    from iobench.workflows import stage

    m = make_dataset(tmp_path / "src" / "cifar10-files", SMALL)
    seen: list[float] = []
    real = stage._drop_batch

    def spy(copied, cfg, counters, lock):
        real(copied, cfg, counters, lock)
        seen.append(_resident([Path(c.tmp) for c in copied]))
        assert all(not os.path.exists(c.dst) for c in copied)

    monkeypatch.setattr(stage, "_drop_batch", spy)
    monkeypatch.setattr(stage.cache, "evict", lambda paths: pytest.fail("a pass after"))
    stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst",
                              threads=1, sync="fs"))
    assert len(seen) == 3 and max(seen) <= 0.1, seen
    _assert_exact(m, tmp_path / "dst" / "cifar10-files")


def test_stage_does_not_import_torch_nor_the_format_libraries(tmp_path):
    """`iobench stage` uses neither torch nor h5py, netCDF4 or lmdb: its result's provenance
    must not import them (seconds of a small stage's wall time)."""
    make_dataset(tmp_path / "src" / "cifar10-files", SMALL[:5])
    code = ("import sys; from iobench.cli import main; "
            f"rc = main(['stage', '--from', {str(tmp_path / 'src')!r}, '--to', "
            f"{str(tmp_path / 'dst')!r}, '--results', {str(tmp_path / 'res')!r}]); "
            "print(rc, any(m in sys.modules for m in ('torch', 'h5py', 'netCDF4', 'lmdb')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.split()[-2:] == ["0", "False"], r.stdout + r.stderr
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "res").glob("stage-*.json")]
    assert isinstance(doc["provenance"]["gpus"], list)
    versions = doc["provenance"]["versions"]  # the packages' versions, without importing them
    assert versions["h5py"] and versions["netCDF4"] and versions["lmdb"]


def test_a_link_inside_the_source_tree_is_staged_and_one_out_of_it_refused(tmp_path):
    """The source's containment check resolves each folder once and only the files that
    are symbolic links: a link to a file inside the tree is staged (its bytes), a link
    out of it is refused before anything is copied."""
    m = make_dataset(tmp_path / "src" / "cifar10-files", SMALL[:10])
    inside = m.path_of(m.files[3])
    moved = inside.parent / "elsewhere" / inside.name
    moved.parent.mkdir()
    inside.rename(moved)
    inside.symlink_to(moved)
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst", threads=2)
    stage_dataset(cfg)
    _assert_exact(m, tmp_path / "dst" / "cifar10-files")
    outside = tmp_path / "outside.bin"
    victim = m.path_of(m.files[5])
    outside.write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(outside)
    with pytest.raises(DatasetError, match="outside the dataset: refused"):
        stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst2"))
    assert not (tmp_path / "dst2").exists()


def test_the_source_is_evicted_through_the_copys_own_open(tmp_path, monkeypatch):
    """From a network or FUSE source (`stage.IN_COPY_KINDS`): Each source file is opened once, by the copy, and evicted through that descriptor
    before its first read (no pass of opens before the copy: on a FUSE or parallel
    filesystem each open is a round trip, and that pass cost more than the copy); the
    residency the result reports is the one measured there: none, from a warm source."""
    from iobench.core import cache, sysinfo
    from iobench.workflows import stage

    m = make_dataset(tmp_path / "src" / "cifar10-files", [*SMALL[:70], 5 * 2**20])
    if tmp_path.stat().st_dev == os.stat("/dev/shm").st_dev:
        pytest.skip("tmpfs holds its files in the page cache")
    for f in m.files:  # warm: an eviction that did not happen would show
        m.path_of(f).read_bytes()
    src = str(tmp_path / "src")
    opens: dict[str, int] = {}
    real_open = os.open

    def counting_open(path, *a, **kw):
        if os.fspath(path).startswith(src):
            opens[os.fspath(path)] = opens.get(os.fspath(path), 0) + 1
        return real_open(path, *a, **kw)

    at_read: list[int | None] = []
    real_hashed = stage._copy_hashed

    def measured(fin, *a, **kw):  # what is resident as the copy starts reading
        at_read.append(cache.evict_fd(fin, f"/proc/self/fd/{fin}", os.fstat(fin),
                                      evict_pages=False))
        return real_hashed(fin, *a, **kw)

    # as from a network filesystem: this folder's kind is one evicted inside the copy
    monkeypatch.setattr(stage, "IN_COPY_KINDS",
                        stage.IN_COPY_KINDS | {sysinfo.mount_of(tmp_path).kind})
    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(stage, "_copy_hashed", measured)
    doc = stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst",
                                    threads=1, sync="fs"))
    monkeypatch.undo()
    data = {os.fspath(m.path_of(f)) for f in m.files}
    assert {p: n for p, n in opens.items() if p in data} == dict.fromkeys(data, 1)
    if None in at_read:
        pytest.skip("this process may not learn the page-cache residency here")
    assert len(at_read) == len(m.files) and set(at_read) == {0}, at_read
    sc = doc["source_cache"]
    assert sc["per_file"] == "copy" and sc["status"] == "cold" and sc["method"] == "fadvise"
    assert sc["resident_fraction_at_start"] == 0.0
    (node,) = sc["per_node"]
    assert node["files"] == len(m.files) and node["total_bytes"] == m.total_bytes
    _assert_exact(m, tmp_path / "dst" / "cifar10-files")


@pytest.mark.parametrize("kind, in_copy", [
    ("parallel", True), ("network", True), ("fuse-network", True), ("fuse", True),
    ("local", False), ("memory", False), ("overlay", False), ("other", False)])
def test_the_source_filesystem_kind_chooses_where_it_is_evicted(kind, in_copy):
    """Each open a round trip to servers or a FUSE daemon: evicted inside the copy; a local
    disk: a pass before the copy, which costs the copy nothing."""
    from iobench.workflows import stage

    assert (kind in stage.IN_COPY_KINDS) is in_copy


def test_a_local_source_is_evicted_in_a_pass_before_the_copy(tmp_path):
    """On a local disk the pass before the copy is the cheaper eviction (in the copy it cost
    11-21 % of the copy's time, docs/results.md section 13): the result says `pass`, and
    the source was cold when the copy read it."""
    from iobench.core import sysinfo
    from iobench.workflows import stage

    if sysinfo.mount_of(tmp_path).kind in stage.IN_COPY_KINDS:
        pytest.skip("tmp_path is not on a local filesystem")
    if tmp_path.stat().st_dev == os.stat("/dev/shm").st_dev:
        pytest.skip("tmpfs holds its files in the page cache")
    m = make_dataset(tmp_path / "src" / "cifar10-files", [*SMALL[:20], 3 * 2**20])
    for f in m.files:  # warm: an eviction that did not happen would show
        m.path_of(f).read_bytes()
    doc = stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst",
                                    threads=1, sync="fs"))
    sc = doc["source_cache"]
    assert sc["per_file"] == "pass" and sc["status"] == "cold" and sc["method"] == "fadvise"
    assert sc["resident_fraction_at_start"] <= 0.1
    (node,) = sc["per_node"]
    assert node["files"] == len(m.files) and node["total_bytes"] == m.total_bytes


def test_stage_s_times_the_copy_not_the_workers_start_or_stop(tmp_path, monkeypatch):
    """The copy workers are forked before the timed window and joined after it: forking
    costs CPU per worker, not per byte (docs/metrics.md, "Staging"). A start and a stop
    made 3 s slow each leave a copy of 150 small files well under 3 s."""
    from iobench.workflows import _stage_pool

    m = make_dataset(tmp_path / "src" / "cifar10-files", SMALL)

    class SlowPool(_stage_pool.Pool):  # type: ignore[type-arg]
        def __init__(self, *a, **k):
            time.sleep(3.0)
            super().__init__(*a, **k)

        def close(self):
            time.sleep(3.0)
            super().close()

    monkeypatch.setattr(_stage_pool, "Pool", SlowPool)
    doc = stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst",
                                    threads=2))
    assert doc["stage_s"] < 2.5, doc["stage_s"]
    _assert_exact(m, tmp_path / "dst" / "cifar10-files")


def test_workers_that_cannot_start_fail_the_stage_with_one_error(tmp_path, monkeypatch):
    """A pool that cannot start (no fork, no memory) is the staging's error, naming the fix,
    and nothing lands under a final name (two ranks: tests/test_stage.py)."""
    from iobench.workflows import _stage_pool

    make_dataset(tmp_path / "src" / "cifar10-files", SMALL)

    def refuse(*a, **k):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(_stage_pool, "Pool", refuse)
    with pytest.raises(IobenchError, match="cannot start 2 copy worker processes.*--threads"):
        stage_dataset(StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "dst",
                                  threads=2))
    assert not [p for p in (tmp_path / "dst").rglob("*.bin")]
