"""`iobench probe`: storage-tier figures with fio and with iobench's own measurement."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from test_cache import make_dataset

from conftest import cli, run_cmd
from iobench.core import procio
from iobench.core.errors import ConfigError, StorageError
from iobench.workflows.probe import ProbeConfig, parse_size, probe_storage, sample_size_for

TINY = ["--size", "4M", "--runtime", "0.2", "--metadata-files", "20", "--readers", "1,2"]
NAMES = {"seq_write_1", "seq_write_2", "seq_read_1", "seq_read_2", "randread_4k_1",
         "randread_4k_2", "randread_110000B_1", "randread_110000B_2"}


def _check_doc(doc: dict, engine: str, storage: Path) -> None:
    assert doc["schema"] == "iobench.probe" and doc["schema_version"] == 2
    assert doc["engine"] == engine and doc["metadata_engine"] == "iobench"
    assert {t["name"] for t in doc["tests"]} == NAMES
    for t in doc["tests"]:
        assert t["engine"] == engine and t["bytes"] > 0 and t["seconds"] > 0, t
        assert t["MBps"] == pytest.approx(t["bytes"] / t["seconds"] / 1e6, rel=1e-6)
        assert t["iops"] > 0 and t["readers"] in (1, 2)
        if t["op"] == "randread":
            assert t["bytes"] % t["bs_bytes"] == 0  # whole blocks, no short reads
    for key, value in doc["summary"].items():
        if key.startswith("first_byte_ms"):
            assert value is not None and value > 0, key
            continue
        if key == "sample_reads":
            assert [r["sample_bytes"] for r in value] == [110_000]
            assert all(r["MBps"] > 0 and r["iops"] > 0 for r in value)
        else:
            assert value is not None and value > 0, key
    assert [m["threads"] for m in doc["metadata"]] == [1, 2]
    for m in doc["metadata"]:  # every cold small file timed from open() to its first byte
        fb = m["first_byte_ms"]
        assert fb["n"] == m["files"] and 0 < fb["p50"] <= fb["p95"] <= fb["p99"], fb
        for part in ("cold_open_ms", "cold_read_ms", "close_ms"):
            assert m[part]["n"] == m["files"] and m[part]["p50"] > 0
        assert m["cold_open_ms"]["mean"] + m["cold_read_ms"]["mean"] == pytest.approx(
            fb["mean"])
        assert m["open_stat_close_per_s"] > 0
    assert doc["cache_status"] == "cold" and doc["cache_reason"] is None  # a local disk
    assert doc["storage"]["shared"] is False and doc["storage"]["statfs_type"]
    prof = doc["emulator_profile"]
    s = doc["summary"]
    assert prof["read_ms"] == pytest.approx(s["cold_read_ms_p50"], rel=1e-3)
    assert prof["metadata_ms"] == pytest.approx(s["cold_open_ms_p50"] + s["close_ms_p50"],
                                                rel=1e-3)
    assert prof["bandwidth_MBps"] == pytest.approx(s["seq_read_MBps"], rel=1e-3)
    assert doc["storage"]["path"] == str(storage.resolve())
    assert not [p for p in storage.iterdir() if p.name.startswith(".iobench-probe")]


def _only_result(d: Path) -> dict:
    (path,) = d.glob("probe-*.json")
    return json.loads(path.read_text())


def test_probe_with_fio(tmp_path):
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (scripts/install-system-deps.sh installs it)")
    storage = tmp_path / "tier"
    storage.mkdir()
    assert cli("probe", "--storage", storage, *TINY, "--engine", "fio", "--results",
               tmp_path / "res") == 0
    doc = _only_result(tmp_path / "res")
    _check_doc(doc, "fio", storage)
    assert doc["engine_version"].startswith("fio-")
    assert all(t["extra"]["fio_bw_bytes"] > 0 for t in doc["tests"])


def test_probe_without_fio_on_path(tmp_path):
    """No fio on PATH: auto falls back to iobench's own measurement, --engine fio says why."""
    storage = tmp_path / "tier"
    storage.mkdir()
    env = {"PATH": str(Path(sys.executable).parent)}
    r = run_cmd("probe", "--storage", storage, *TINY, "--results", tmp_path / "res", env=env)
    assert r.returncode == 0, r.stderr
    _check_doc(_only_result(tmp_path / "res"), "python", storage)
    r = run_cmd("probe", "--storage", storage, *TINY, "--engine", "fio", env=env)
    assert r.returncode != 0 and "fio is not installed" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_buffered_python_probe_reads_storage_not_memory(tmp_path, monkeypatch):
    """Without O_DIRECT the files are evicted and each block read once: the kernel's own
    count of bytes read from the device covers what the read tests report."""
    if procio.read_bytes_unavailable(tmp_path) is not None:
        pytest.skip("the kernel does not count read_bytes on this filesystem")
    monkeypatch.setenv("IOBENCH_PROBE_ENGINE", "python")
    cfg = ProbeConfig(storage=tmp_path, file_bytes=8 * 2**20, readers=(1, 2), runtime_s=5,
                      sample_bytes=100_000, metadata_files=10, direct=False)
    before = procio.tree_io()
    doc = probe_storage(cfg)
    delta = procio.tree_io() - before
    assert doc["engine"] == "python" and doc["direct"] is False
    read = sum(t["bytes"] for t in doc["tests"] if t["op"] != "write")
    assert read >= 4 * 8 * 2**20  # sequential passes alone: 1 + 2 files of 8 MiB, then more
    assert delta.read_bytes >= 0.9 * read
    (sample,) = {t["bs_bytes"] for t in doc["tests"] if t["name"].startswith("randread_1000")}
    assert sample == 100_000  # buffered: the dataset's own sample size, unrounded


def test_several_sample_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("IOBENCH_PROBE_ENGINE", "python")
    cfg = ProbeConfig(storage=tmp_path, file_bytes=4 * 2**20, readers=(1,), runtime_s=0.05,
                      sample_bytes=(3072, 110_000), metadata_files=5)
    doc = probe_storage(cfg)
    assert [r["sample_bytes"] for r in doc["summary"]["sample_reads"]] == [3072, 110_000]
    names = {t["name"] for t in doc["tests"]}
    assert {"randread_3072B_1", "randread_110000B_1"} <= names
    assert doc["summary"]["sample_bytes"] == 3072  # the first is the headline


def test_buffered_random_reads_as_the_loaders_read(tmp_path, monkeypatch):
    """Besides the O_DIRECT random reads, the sample size read through the page cache at the
    loaders' reader counts (more than --readers: their files are written too): a test per
    count in `buffered_tests`, whole samples, the bytes fetched per read as its request size,
    and the best in the summary and in the sample size's entry."""
    monkeypatch.setenv("IOBENCH_PROBE_ENGINE", "python")
    cfg = ProbeConfig(storage=tmp_path, file_bytes=4 * 2**20, readers=(1,), runtime_s=0.2,
                      sample_bytes=3000, metadata_files=5, buffered_readers="3,1")
    assert cfg.buffered_readers == (1, 3)
    doc = probe_storage(cfg)
    assert doc["config"]["buffered_readers"] == [1, 3]
    assert "bufread" not in {t["op"] for t in doc["tests"]}  # the O_DIRECT tests stay apart
    tests = {t["name"]: t for t in doc["buffered_tests"]}
    assert set(tests) == {"bufread_3000B_1", "bufread_3000B_3"}
    for t in tests.values():
        assert t["op"] == "bufread" and t["direct"] is False and t["engine"] == "python"
        reads = round(t["iops"] * t["seconds"])
        assert reads > 0 and t["bytes"] == reads * 3000  # whole samples, one read each
        assert t["extra"]["sample_bytes"] == 3000
        if t["extra"]["request_bytes_from"] == "measured":  # the pages fetched per read
            assert t["bs_bytes"] == max(3000, round(t["extra"]["resident_bytes"] / reads))
        else:
            assert t["bs_bytes"] == 4096
    best = max(tests.values(), key=lambda t: t["iops"])
    s = doc["summary"]
    assert s["buffered_read_iops"] == best["iops"] and s["buffered_read_MBps"] == best["MBps"]
    assert s["buffered_bs_bytes"] == best["bs_bytes"] and s["buffered_readers"] == best["readers"]
    (entry,) = s["sample_reads"]
    assert entry["buffered_iops"] == best["iops"]
    assert entry["buffered_bs_bytes"] == best["bs_bytes"]
    assert cfg.files == 3 and ProbeConfig(storage=tmp_path).buffered_readers == (1, 4)


def test_buffered_random_reads_are_cold_and_count_the_bytes_fetched(tmp_path):
    """Given all the time it needs, each reader reads the opening tenth of its file's samples
    in its seeded order, each once; the files were evicted first, so the device reads at
    least every page those samples span, and the bytes fetched per read cover them."""
    import numpy as np

    from iobench.workflows.probe import BUFREAD_SHARE, _PyEngine

    if procio.read_bytes_unavailable(tmp_path) is not None:
        pytest.skip("the kernel does not count read_bytes on this filesystem")
    cfg = ProbeConfig(storage=tmp_path, file_bytes=4 * 2**20, readers=(2,), runtime_s=600,
                      sample_bytes=1000, metadata_files=5)
    for i in range(2):
        with open(tmp_path / f"probe.{i}", "wb") as f:
            f.write(os.urandom(cfg.file_bytes))
            os.fsync(f.fileno())
    eng = _PyEngine(cfg, tmp_path, tmp_path, direct=False)
    before = procio.tree_io()
    t = eng.bufread(2, 1000, "1000B")
    delta = procio.tree_io() - before
    slots = 4 * 2**20 // 1000
    per_reader = int(slots * BUFREAD_SHARE)
    reads = round(t.iops * t.seconds)
    assert reads == 2 * per_reader and t.bytes == reads * 1000  # each sample once
    pages = 0
    for i in range(2):  # the pages the samples span, in the order the probe drew
        offs = np.random.default_rng([cfg.seed, i, 1000]).permutation(slots)[:per_reader] * 1000
        pages += len(set((offs // 4096).tolist()) | set(((offs + 999) // 4096).tolist()))
    assert delta.read_bytes >= 0.9 * pages * 4096
    if t.extra["request_bytes_from"] != "measured":
        pytest.skip("the kernel does not report page-cache residency here")
    assert t.extra["resident_bytes"] >= pages * 4096
    assert t.bs_bytes == max(1000, round(t.extra["resident_bytes"] / reads))


def test_sample_size_from_dataset(tmp_path):
    make_dataset(tmp_path / "cifar10-files", [4000, 4000])
    assert sample_size_for("cifar10", tmp_path) == 1000  # 4 samples per 4000-byte file
    assert sample_size_for("cifar10") == 32 * 32 * 3
    assert sample_size_for("cosmoflow") == 128**3 * 4 * 2
    assert sample_size_for("imagenet") == 110_000


def test_parse_size():
    assert parse_size("4096") == 4096 and parse_size("64k") == 65536
    assert parse_size("16M") == 16 * 2**20 and parse_size("1.5GiB") == 3 * 2**29
    with pytest.raises(ConfigError, match="not a size"):
        parse_size("12X")


@pytest.mark.parametrize("argv, needle", [
    (["--storage", "/does/not/exist"], "is not a directory"),
    (["--storage", "{tmp}", "--size", "12X"], "not a size"),
    (["--storage", "{tmp}", "--readers", "0,2"], "must be in [1, 256]"),
    (["--storage", "{tmp}", "--buffered-readers", "2,0"], "must be in [1, 256]"),
    (["--storage", "{tmp}", "--buffered-readers", "two"], "give counts separated by commas"),
    (["--storage", "{tmp}", "--size", "1M"], "below"),
    (["--storage", "{tmp}", "--size", "1000T"], "not enough space"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, needle):
    code = cli("probe", *[a.replace("{tmp}", str(tmp_path)) for a in argv],
               "--results", tmp_path / "res")
    err = capsys.readouterr().err
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "res").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".iobench-probe")]
    assert os.listdir(tmp_path) == []


def test_read_only_tier_probed_through_its_backing_directory(tmp_path):
    """An emulated parallel filesystem is read-only: files are written via its backing
    directory and every read and stat goes through the FUSE mount."""
    from iobench.core.errors import IobenchError
    from iobench.pfs import control

    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    try:
        m = control.mount(backing, mnt, "passthrough")
    except IobenchError as e:
        pytest.skip(f"cannot mount the emulated parallel filesystem here: {e}")
    try:
        with pytest.raises(StorageError, match="not writable"):
            probe_storage(ProbeConfig(storage=mnt, file_bytes=4 * 2**20, readers=(1,),
                                      runtime_s=0.1, metadata_files=5, engine="python"))
        cfg = ProbeConfig(storage=mnt, write_via=backing, file_bytes=4 * 2**20, readers=(1, 2),
                          runtime_s=0.1, sample_bytes=110_000, metadata_files=10,
                          engine="python", label="pfs")
        doc = probe_storage(cfg)
    finally:
        m.unmount()
    assert doc["storage"]["kind"] == "fuse" and doc["write_via"] == str(backing)
    assert doc["label"] == "pfs" and {t["name"] for t in doc["tests"]} == NAMES
    assert all(t["bytes"] > 0 for t in doc["tests"])
    assert doc["summary"]["stat_per_s"] > 0 and doc["summary"]["open_read_close_per_s"] > 0
    assert os.listdir(backing) == []  # scratch removed


def test_probe_writes_a_profile_the_emulator_replays(tmp_path, capsys):
    """`probe` on a tier writes a profile; `emulate-pfs --profile FILE` mounts with its
    figures; the site's --evict-cmd runs before every read test and metadata run."""
    from iobench.core.errors import IobenchError
    from iobench.pfs import control

    storage, res = tmp_path / "tier", tmp_path / "res"
    storage.mkdir()
    log = tmp_path / "evictions"
    assert cli("probe", "--storage", storage, *TINY, "--engine", "python", "--results", res,
               "--evict-cmd", f"echo x >> {log}") == 0
    doc = _only_result(res)
    # every read test, the buffered ones (as loaders read) included
    reads = [t for t in doc["tests"] + doc["buffered_tests"] if t["op"] != "write"]
    assert len(log.read_text().split()) == len(reads) + len(doc["metadata"])
    assert doc["evict_cmd"] == f"echo x >> {log}" and doc["cache_status"] == "cold"
    (pfile,) = res.glob("pfs-profile-*.json")
    assert str(pfile) in capsys.readouterr().out
    pdoc = json.loads(pfile.read_text())
    assert pdoc["schema"] == "iobench.pfs-profile" and pdoc["profile"] == doc["emulator_profile"]
    assert pdoc["probe"]["storage"]["path"] == str(storage.resolve())

    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    (backing / "f").write_bytes(b"y" * 5000)
    try:
        code = cli("emulate-pfs", "--backing", backing, "--mount", mnt, "--profile", pfile)
    except IobenchError as e:
        pytest.skip(f"cannot mount the emulated parallel filesystem here: {e}")
    if code != 0:
        pytest.skip("cannot mount the emulated parallel filesystem here")
    try:
        assert (mnt / "f").read_bytes() == b"y" * 5000
        prof = control.status(mnt)["profile"]
    finally:
        control.unmount(mnt)
    want = doc["emulator_profile"]
    assert {k: prof[k] for k in ("metadata_ms", "read_ms", "bandwidth_MBps", "iops")} == {
        k: want[k] for k in ("metadata_ms", "read_ms", "bandwidth_MBps", "iops")}


@pytest.mark.parametrize("content, needle", [
    (None, "neither a profile name"),
    ("{not json", "cannot read it as JSON"),
    ('{"schema": "iobench.result"}', "not a profile"),
    ('{"schema": "iobench.pfs-profile", "schema_version": 1, "profile": {"name": "x"}}',
     "needs at least"),
    ('{"schema": "iobench.pfs-profile", "schema_version": 1, "profile": '
     '{"name": "x", "imitates": "y", "read_ms": -1}}', "read_ms"),
])
def test_bad_profile_file_is_one_line(tmp_path, capsys, content, needle):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    code = cli("emulate-pfs", "--backing", tmp_path, "--mount", tmp_path / "m", "--profile",
               path)
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "m").exists()


def test_a_sample_size_rounded_up_to_4k_keeps_its_own_figures(tmp_path, monkeypatch, capsys):
    """O_DIRECT reads a 3080-byte CIFAR-like sample as 4096-byte blocks: the sample figure is
    its own test's, not the best of it and the 4 KiB test (which then read the same block
    size), and the summary line says both sizes."""
    monkeypatch.setenv("IOBENCH_PROBE_ENGINE", "python")
    storage = tmp_path / "tier"
    storage.mkdir()
    assert cli("probe", "--storage", storage, *TINY, "--engine", "python",
               "--sample-size", "3080", "--results", tmp_path / "res") == 0
    doc = _only_result(tmp_path / "res")
    if not doc["direct"]:
        pytest.skip("this filesystem refuses O_DIRECT")
    tests = {t["name"]: t for t in doc["tests"]}
    own = [tests[f"randread_3080B_{n}"] for n in (1, 2)]
    assert {t["bs_bytes"] for t in own} == {4096}
    s = doc["summary"]
    assert s["sample_read_MBps"] == max(t["MBps"] for t in own)
    assert s["sample_read_iops"] == max(t["iops"] for t in own)
    assert s["sample_bs_bytes"] == 4096
    assert "3080-byte samples as 4096-byte random reads" in capsys.readouterr().out
