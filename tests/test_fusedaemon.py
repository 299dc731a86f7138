"""Tests of the FUSE daemon's reply counts (`iobench.core.fusedaemon`) and what train and project do with them.

The counters are read from real processes: a child that writes a known number of
times, the emulated parallel filesystem's daemon (FUSE, marked `fuse`), whose own
counters cross-check what its /proc/PID/io says, and the one-box GlusterFS client.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from test_gluster import gluster  # noqa: F401  (fixture: the one-box GlusterFS mount)
from test_pfs import fuse_usable, pfs  # noqa: F401  (fixtures)

from iobench.core import cache
from iobench.core.fusedaemon import (
    DISAGREED,
    TOO_SMALL,
    UNREADABLE,
    FuseDaemon,
    ReadCost,
    Uncalibrated,
    calibrate,
    find_daemon,
    reads_and_bytes,
)
from iobench.core.result_types import TrainResult
from iobench.pfs import stats_for
from result_docs import real_result

WRITER = ("import os, sys\n"
          "sys.stdin.readline()\n"
          "fd = os.open(os.devnull, os.O_WRONLY)\n"
          "for _ in range(100):\n"
          "    os.write(fd, b'0123456789')\n"
          "os.write(1, b'done\\n')\n"
          "sys.stdin.readline()\n")


def test_counters_are_a_real_process_writes_and_their_bytes() -> None:
    """The daemon's figures are its own writes (syscw) and bytes (wchar): a child that
    writes 100 x 10 bytes and one 5-byte line between two readings shows exactly those."""
    child = subprocess.Popen([sys.executable, "-c", WRITER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    try:
        daemon = FuseDaemon(pid=child.pid, mount_point="/", name="python")
        a = daemon.counters()
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"done\n"
        b = daemon.counters()
        assert b["daemon_replies"] - a["daemon_replies"] == 101
        assert b["daemon_reply_bytes"] - a["daemon_reply_bytes"] == 1005
    finally:
        child.stdin.write(b"end\n")
        child.stdin.close()
        child.wait(timeout=30)
    assert FuseDaemon(pid=child.pid, mount_point="/", name="python").counters() == {}


def test_no_daemon_off_fuse_or_for_a_process_without_dev_fuse(tmp_path: Path) -> None:
    """A local folder has no daemon (None, never a guess)."""
    assert find_daemon(tmp_path) is None
    assert find_daemon(tmp_path, pid=os.getpid()) is None


def test_reads_and_bytes_arithmetic() -> None:
    """Writes over the calibrated writes per read are reads; the bytes less each read's
    overhead are the data; nothing counted is no figure."""
    cost = ReadCost(replies_per_read=2.0, overhead_bytes=152.0, read_bytes=4096)
    reads, data = reads_and_bytes(2_000, 1_000 * (6_000 + 152), cost) or (0, 0)
    assert reads == 1_000 and data == pytest.approx(6_000_000)
    assert reads_and_bytes(0, 0, cost) is None


@pytest.mark.fuse
def test_emulated_tiers_counters_agree_with_its_daemons_proc_counts(pfs, tmp_path: Path  # noqa: F811
                                                                   ) -> None:
    """The emulated tier is a FUSE daemon on this host: found by its pid, one write per
    read in the calibration, and a shuffled read's requests and bytes as its own counters
    say, over-counted only by the metadata replies (opens, getattrs, releases)."""
    backing = tmp_path / "backing"
    backing.mkdir()
    data = os.urandom(8 << 20)
    (backing / "f").write_bytes(data)
    h = pfs(backing)
    mp = Path(h.mountpoint)
    assert find_daemon(mp, pid=os.getpid()) is None  # a pid given must hold /dev/fuse
    daemon = find_daemon(mp, pid=h.pid)
    assert daemon is not None and daemon.pid == h.pid
    s0 = stats_for(mp)
    cost = calibrate(daemon, [mp / "f"])
    s1 = stats_for(mp)
    assert s0 is not None and s1 is not None and isinstance(cost, ReadCost)
    # two rounds alike (more where a stray reply, e.g. an earlier release, disturbed one)
    calibrated = s1["counters"]["read_requests"] - s0["counters"]["read_requests"]
    assert calibrated % 32 == 0 and 2 * 32 <= calibrated <= 6 * 32, calibrated
    assert cost.replies_per_read == 1.0 and cost.read_bytes == 4096
    cache.evict([mp / "f"])
    s0 = stats_for(mp)
    a = daemon.counters()
    with open(mp / "f", "rb") as f:
        for i in np.random.default_rng(0).permutation(2048)[:512].tolist():
            f.seek(i * 4096)
            assert f.read(3000) == data[i * 4096:i * 4096 + 3000]
    b = daemon.counters()
    s1 = stats_for(mp)
    assert s0 is not None and s1 is not None
    requests = s1["counters"]["read_requests"] - s0["counters"]["read_requests"]
    served = s1["counters"]["bytes_served"] - s0["counters"]["bytes_served"]
    found = reads_and_bytes(b["daemon_replies"] - a["daemon_replies"],
                            b["daemon_reply_bytes"] - a["daemon_reply_bytes"], cost)
    assert found is not None
    reads, got = found
    assert requests <= reads <= requests + 8  # open, getattr, flush, release, ...
    assert served <= got <= served + 8 * 256  # their replies' bytes


@dataclass(frozen=True)
class _Shared(FuseDaemon):
    """A daemon whose mount another reader uses while each calibration round is counted:
    before round k's second reading, the open file `other` is read at 3 k pages never read
    before (real FUSE reads, answered like the calibration's own; 3 apart a round, so an
    open's or a getattr's reply landing in one round or the next cannot make two agree)."""

    other: int = -1
    readings: list[int] = field(default_factory=list)

    def counters(self) -> dict[str, int]:
        self.readings.append(len(self.readings))
        k = len(self.readings) // 2
        if len(self.readings) % 2 == 0:
            for i in range(3 * k):
                os.pread(self.other, 4096, (3 * k * k + i) * 2 * 4096)
        return super().counters()


@pytest.mark.fuse
def test_calibration_refuses_rounds_that_another_reader_disturbed(pfs, tmp_path: Path  # noqa: F811
                                                                  ) -> None:
    """Another reader on the mount adds its replies to the calibration's rounds, a
    different number each round: no two agree, so there is no cost a read and the reason
    names the mount and the rounds' counts. The same daemon undisturbed gives 1 write a read."""
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "f").write_bytes(os.urandom(8 << 20))
    (backing / "other").write_bytes(os.urandom(8 << 20))
    h = pfs(backing)
    mp = Path(h.mountpoint)
    found = find_daemon(mp, pid=h.pid)
    assert found is not None
    other = os.open(mp / "other", os.O_RDONLY)
    try:
        os.posix_fadvise(other, 0, 0, os.POSIX_FADV_RANDOM)
        busy = _Shared(pid=found.pid, mount_point=found.mount_point, name=found.name,
                       other=other)
        cost = calibrate(busy, [mp / "f"])
    finally:
        os.close(other)
    assert isinstance(cost, Uncalibrated) and cost.kind == DISAGREED, cost
    assert "no two of 6 rounds of 32 reads agreed" in cost.reason and str(mp) in cost.reason
    assert len(busy.readings) == 12  # every round was counted
    quiet = calibrate(found, [mp / "f"])
    assert isinstance(quiet, ReadCost) and quiet.replies_per_read == 1.0


def test_calibration_needs_two_rounds_of_pages() -> None:
    """Files holding too few pages two apart for two rounds of reads, or one that is gone,
    are no calibration, with the reason."""
    daemon = FuseDaemon(pid=os.getpid(), mount_point="/", name="python")
    small = Path(__file__)
    cost = calibrate(daemon, [small, small.with_name("conftest.py")])
    assert isinstance(cost, Uncalibrated) and cost.kind == TOO_SMALL, cost
    assert cost.reason.startswith("the 2 data file(s) read hold ")
    gone = calibrate(daemon, [small.with_name("no-such-file")])
    assert isinstance(gone, Uncalibrated) and gone.kind == UNREADABLE, gone
    assert "no-such-file" in gone.reason


@pytest.mark.fuse
def test_calibration_reads_one_page_of_each_of_many_small_files(pfs, tmp_path: Path  # noqa: F811
                                                                ) -> None:
    """A dataset of one small file a sample (3,000 bytes each) is calibrated one read a
    file: the emulated tier's daemon, 1 write and its 16-byte header a read."""
    backing = tmp_path / "backing"
    backing.mkdir()
    for i in range(100):
        (backing / f"s{i:03d}").write_bytes(os.urandom(3000))
    h = pfs(backing)
    mp = Path(h.mountpoint)
    daemon = find_daemon(mp, pid=h.pid)
    assert daemon is not None
    cost = calibrate(daemon, sorted(mp.iterdir()))
    assert cost == ReadCost(replies_per_read=1.0, overhead_bytes=16.0, read_bytes=3000), cost


def test_project_takes_k_from_the_daemons_replies_when_the_tier_has_no_counters() -> None:
    """With no request counters, k comes from the daemon's replies (median epoch), and
    says so; without a calibration the figures give no k (the probe's, or none)."""
    from iobench.core.projection import Figure, TierLimits
    from iobench.workflows.project import samples_per_request

    doc = real_result()
    sample = doc["dataset"]["total_bytes"] / doc["dataset"]["num_samples"]
    for e, k in zip(doc["epochs"], (2.0, 3.0), strict=True):
        e["tier_bytes"] = {"daemon_replies": 2_000, "replies_per_read": 2.0,
                           "daemon_reply_bytes": int(1_000 * (k * sample + 152)),
                           "reply_overhead_bytes": 152.0, "source": "the FUSE daemon's replies"}
    tier = TierLimits(Figure(1e9, "bw"), Figure(1e5, "md"))
    k = samples_per_request(TrainResult.from_dict(doc), tier)
    assert k is not None and k.value == pytest.approx(2.5, rel=1e-3)
    assert k.source.startswith("measured: the FUSE daemon's replies")
    for e in doc["epochs"]:
        e["tier_bytes"]["replies_per_read"] = None
    assert samples_per_request(TrainResult.from_dict(doc), tier) is None
    # one file a sample: a request holds one sample at most, whatever the replies say (each
    # file's open, getattr, flush and release count as reads there)
    doc["dataset"]["format"] = "files"
    k = samples_per_request(TrainResult.from_dict(doc), tier)
    assert k is not None and k.value == 1.0 and "one file a sample" in k.source


@pytest.mark.fuse
def test_train_records_the_daemons_replies_beside_the_emulated_tiers_counters(
        pfs, tmp_path: Path) -> None:  # noqa: F811
    """`train` on the emulated tier stores, per epoch, its daemon's writes with the
    calibration and what they count; each read is one reply there, so they are at least
    the tier's own request count, and the bytes at least the bytes it served."""
    mp, doc = _train_on_emulated_tier(pfs, tmp_path, 1024, 512, "--epochs", "2")
    for ep in doc["epochs"]:
        t = ep["tier_bytes"]
        assert t["replies_per_read"] == 1.0 and t["reply_overhead_bytes"] == 16.0, t
        assert t["source"].startswith("the FUSE daemon's replies") and mp in t["source"]
        assert t["daemon_replies"] >= t["read_requests"] > 0, t
        assert t["daemon_reply_bytes"] >= t["bytes_served"] > 0, t


@pytest.mark.fuse
def test_train_says_why_the_daemon_was_not_calibrated(pfs, tmp_path: Path) -> None:  # noqa: F811
    """A dataset too small to calibrate on (one file of 128 samples of 3 kB: 48 pages two
    apart): the replies are still recorded, with no cost a read, and the run's warnings
    say why."""
    _, doc = _train_on_emulated_tier(pfs, tmp_path, 128, 128, "--epochs", "1",
                                     "--batch-size", "16")
    (ep,) = doc["epochs"]
    t = ep["tier_bytes"]
    assert t["replies_per_read"] is None and t["daemon_replies"] >= t["read_requests"] > 0, t
    (w,) = [w for w in doc["warnings"] if w.startswith("the FUSE daemon's writes per read")]
    assert "too few for two rounds of 32 reads" in w, w


def _train_on_emulated_tier(pfs, tmp_path: Path, samples: int, per_file: int,  # noqa: F811
                            *options: str) -> tuple[str, dict]:
    """`train --model none` (one worker) on a cifar10-like HDF5 dataset on the emulated
    tier: its mount point and the result document."""
    import json

    from conftest import cli
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    backing = tmp_path / "backing"
    generate_dataset(GenerateConfig(dataset="cifar10", format="hdf5", storage=backing,
                                    samples=samples, samples_per_file=per_file, seed=1))
    mp = pfs(backing, "passthrough").mountpoint
    res = tmp_path / "res"
    assert cli("train", "--loader", "hdf5", "--storage", mp, "--model", "none",
               "--workers", "1", "--results", res, *options) == 0
    return mp, json.loads(next(res.glob("*.json")).read_text())


@pytest.mark.fuse
def test_a_warm_run_is_not_calibrated(pfs, tmp_path: Path) -> None:  # noqa: F811
    """`--warm-cache` keeps the dataset's pages: the calibration, which drops one data file's,
    does not run (no per-read cost, so `project` does not take k from it); the daemon's
    counts are still recorded, and no warning calls that a failed calibration."""
    _, doc = _train_on_emulated_tier(pfs, tmp_path, 1024, 512, "--epochs", "1", "--warm-cache")
    (ep,) = doc["epochs"]
    t = ep["tier_bytes"]
    assert t["replies_per_read"] is None and t["reply_overhead_bytes"] is None, t
    assert t["daemon_replies"] >= t["read_requests"] > 0, t
    assert not [w for w in doc["warnings"] if "writes per read" in w], doc["warnings"]


@pytest.mark.fuse
def test_train_on_glusterfs_counts_the_epochs_reads_at_its_client(gluster: Path,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    """On the one-box GlusterFS (no request counters of its own) the client daemon is
    found by the mount point on its command line, one read is calibrated in its writes,
    and each epoch's replies, less that overhead, hold at least the bytes the epoch read."""
    import json
    import shutil
    import uuid

    from conftest import cli
    from iobench.core.fusedaemon import reads_and_bytes as rb
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    d = gluster / f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    try:
        generate_dataset(GenerateConfig(dataset="cifar10", format="hdf5", storage=d,
                                        samples=1024, samples_per_file=512, seed=1))
        res = tmp_path / "res"
        assert cli("train", "--loader", "hdf5", "--storage", d, "--model", "none",
                   "--epochs", "1", "--workers", "1", "--results", res) == 0
        doc = json.loads(next(res.glob("*.json")).read_text())
    finally:
        shutil.rmtree(d, ignore_errors=True)
    for ep in doc["epochs"]:
        t = ep["tier_bytes"]
        assert t["source"].startswith("the FUSE daemon's replies (glusterfs"), t
        assert t["replies_per_read"] >= 1.0 and t["reply_overhead_bytes"] >= 16.0, t
        found = rb(t["daemon_replies"], t["daemon_reply_bytes"],
                   ReadCost(t["replies_per_read"], t["reply_overhead_bytes"], 4096))
        assert found is not None and found[1] >= 0.9 * ep["summary"]["batch_bytes"], (t, ep)
