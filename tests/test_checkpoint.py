"""`iobench checkpoint`: DCP checkpoints written and read back cold, and never one that looks complete but is not.

Small layouts (the real `cnn` model, ~0.8 MB; llama3-8b at --scale 0.0002, ~4 MB per rank),
one process or `mpiexec -n 2`; failures injected with IOBENCH_TEST_FAULT (a rank killed or
interrupted after its shard is written, another writer filling the disk) and a tiny tmpfs.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path

import pytest

from conftest import cli, run_cmd, run_mpi
from iobench.core import procio
from iobench.core.checkpoint_layout import LLAMA3, layout_for
from iobench.core.checkpoint_store import MARKER, METADATA, sha256_of


def _doc(results: Path) -> dict:
    docs = sorted(results.glob("checkpoint-*.json"))
    assert len(docs) == 1, docs
    return json.loads(docs[0].read_text())


def _run_dir(storage: Path) -> Path:
    dirs = list(storage.glob("iobench-checkpoint-*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def _accepted(run_dir: Path) -> list[str]:
    """The names of the folders `--read` would accept (they hold a marker)."""
    return sorted(p.name for p in run_dir.iterdir() if (p / MARKER).is_file())


def _one_line_error(stderr: str, words: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("iobench: error:")]
    assert len(errors) == 1 and words in errors[0], stderr[-2000:]


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> tuple[Path, dict]:
    """One single-process run of the real cnn layout, 2 checkpoints, kept."""
    base = tmp_path_factory.mktemp("ckpt")
    out = run_cmd("checkpoint", "--storage", base, "--model", "cnn", "--repeat", "2", "--keep",
                  "--mtbf", "24", "--interval", "3600", "--results", base / "res", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return _run_dir(base), _doc(base / "res")


# ------------------------------------------------------------------------ layouts

def test_llama3_layouts_keep_mlperf_sizes_and_scale_keeps_the_mix() -> None:
    for m in LLAMA3.values():
        full = layout_for(m.name, 1.0, m.processes)
        assert full.rank_bytes == pytest.approx(m.total_bytes / m.processes, rel=0.01)
        assert len(full.tensors) == 4 * (9 * m.layers + 3)
    full, small = layout_for("llama3-8b", 1.0, 8), layout_for("llama3-8b", 1e-4, 2)
    assert [t.name for t in full.tensors] == [t.name for t in small.tensors]
    assert small.rank_bytes == pytest.approx(full.rank_bytes * 1e-4, rel=0.01)
    big = {t.name: t.numel for t in full.tensors if t.numel > 10_000}
    for t in small.tensors:
        if t.name in big:  # the size mix is kept: every tensor shrinks alike
            assert t.numel / big[t.name] == pytest.approx(1e-4, rel=0.02)
    assert LLAMA3["llama3-8b"].parameters == pytest.approx(8.03e9, rel=0.01)


# ------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("argv, words", [
    (["--scale", "0"], "--scale"), (["--scale", "-1"], "--scale"), (["--scale", "2"], "--scale"),
    (["--model", "llama3-9b"], "unknown model"), (["--model", "cnn", "--scale", "0.5"], "--scale"),
    (["--repeat", "0"], "--repeat"),
    (["--model", "llama3-1t", "--repeat", "1000"], "free"),
    (["--mtbf", "0"], "--mtbf"), (["--interval", "60"], "--interval"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, capsys, argv, words) -> None:
    storage = tmp_path / "s"
    storage.mkdir()
    assert cli("checkpoint", "--storage", storage, "--results", tmp_path / "res", *argv) == 2
    _one_line_error(capsys.readouterr().err, words)
    assert list(storage.iterdir()) == [] and not (tmp_path / "res").exists()


def test_never_writes_into_a_dataset(tmp_path: Path, capsys) -> None:
    data = tmp_path / "cifar10-hdf5"
    (data / "sub").mkdir(parents=True)
    (data / "iobench.json").write_text("{}")
    assert cli("checkpoint", "--storage", data / "sub", "--model", "cnn") == 2
    _one_line_error(capsys.readouterr().err, "inside the dataset")
    assert list((data / "sub").iterdir()) == []


# ------------------------------------------------------------------------ figures

def test_write_then_cold_read_with_mlperf_figures(kept) -> None:
    run_dir, doc = kept
    assert doc["schema"] == "iobench.checkpoint" and doc["kind"] == "checkpoint"
    assert len(doc["writes"]) == 2 and len(doc["reads"]) == 2
    assert _accepted(run_dir) == ["ckpt-000", "ckpt-001"]
    for phase, key in (("writes", "write_s"), ("reads", "read_s")):
        for rec in doc[phase]:
            ranks = rec["ranks"]
            assert rec["duration_s"] == max(r[key] for r in ranks)  # MLPerf: the slowest rank
            assert rec["throughput_GBps"] == pytest.approx(rec["bytes"] / 1e9 / rec["duration_s"])
            assert rec["rank_GBps_min"] == min(r["GBps"] for r in ranks)
            assert rec["bytes"] == sum(r["bytes"] for r in ranks) > 500_000
    files = sorted(run_dir.glob("ckpt-000/__*.distcp"))
    assert [f.name for f in files] == ["__0_0.distcp"]  # one shard per rank
    assert doc["reads"][0]["bytes"] == files[0].stat().st_size
    assert doc["summary"]["write"]["throughput_GBps"]["n"] == 2
    assert doc["summary"]["read_gap_s"] >= 0
    note = procio.read_bytes_unavailable(run_dir)
    for rec in doc["reads"]:
        if note is not None:  # tmpfs, FUSE: never a guess
            assert rec["os_read_check"] == "unverified" and rec["os_read_bytes"] is None
        else:  # cold: the shard came from storage, as the OS counts it
            assert rec["cache"]["status"] == "cold", rec["cache"]
            assert rec["os_read_check"] == "verified", rec
            assert rec["os_read_bytes"] >= 0.95 * rec["bytes"]


def test_the_document_validates_and_a_damaged_one_does_not(kept) -> None:
    from iobench.core.schema import SchemaError
    from iobench.workflows.checkpoint import validate

    _, doc = kept
    assert validate(doc) is doc
    bad = json.loads(json.dumps(doc))
    bad["reads"][0]["ranks"][0]["read_s"] = "fast"
    with pytest.raises(SchemaError, match=r"reads\[0\]\.ranks\[0\]\.read_s"):
        validate(bad)


def test_checkpoints_are_removed_without_keep(tmp_path: Path) -> None:
    out = run_cmd("checkpoint", "--storage", tmp_path, "--model", "llama3-8b", "--scale",
                  "0.0002", "--results", tmp_path / "res")
    assert out.returncode == 0, out.stderr[-3000:]
    assert not list(tmp_path.glob("iobench-checkpoint-*"))
    doc = _doc(tmp_path / "res")
    assert doc["layout"]["tensors_per_rank"] == 4 * (9 * 32 + 3)
    assert any("MLPerf Storage runs llama3-8b with 8 processes" in w for w in doc["warnings"])
    assert "GB/s" in out.stdout and "result:" in out.stdout


def test_young_interval_from_the_measured_save_and_read(kept) -> None:
    _, doc = kept
    y = doc["summary"]["young"]
    cost = sorted(w["save_s"] + w["commit_s"] for w in doc["writes"])
    assert y["cost_s"] == pytest.approx(sum(cost) / 2)  # the median of two
    assert y["mtbf_s"] == 24 * 3600 and y["used_s"] == 3600
    assert y["optimal_s"] == pytest.approx(math.sqrt(2 * y["cost_s"] * y["mtbf_s"]))
    assert y["lost_per_day_s"] < y["lost_per_day_used_s"]  # Young's is the least loss


def test_young_loses_least_at_its_interval() -> None:
    from iobench.core.resilience import lost_fraction, young

    y = young(cost_s=60.0, restart_s=120.0, mtbf_s=24 * 3600.0)
    assert y.optimal_s == pytest.approx(math.sqrt(2 * 60 * 24 * 3600))  # ~54 min
    for other in (0.5 * y.optimal_s, 2 * y.optimal_s):
        assert lost_fraction(other, 60, 120, 86400) > lost_fraction(y.optimal_s, 60, 120, 86400)
    assert y.lost_per_day_s == pytest.approx(
        86400 * (60 / y.optimal_s + (y.optimal_s / 2 + 120) / 86400))


def test_mtbf_needs_the_writes(kept, capsys) -> None:
    run_dir, _ = kept
    assert cli("checkpoint", "--read", run_dir / "ckpt-000", "--mtbf", "24") == 2
    _one_line_error(capsys.readouterr().err, "--mtbf")


# ------------------------------------------------------------------------ what --read accepts

def test_read_accepts_a_complete_checkpoint(kept, tmp_path: Path) -> None:
    run_dir, _ = kept
    assert cli("checkpoint", "--read", run_dir / "ckpt-001", "--results", tmp_path) == 0
    doc = _doc(tmp_path)
    assert doc["writes"] == [] and len(doc["reads"]) == 1 and doc["layout"]["model"] == "cnn"


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_read_refuses_no_marker_damage_and_other_rank_counts(kept, tmp_path, capsys) -> None:
    run_dir, _ = kept
    bare = _copy(run_dir / "ckpt-000", tmp_path / "bare")
    (bare / MARKER).unlink()
    assert cli("checkpoint", "--read", bare) == 2
    _one_line_error(capsys.readouterr().err, "no completion marker")
    cut = _copy(run_dir / "ckpt-000", tmp_path / "cut")
    with open(cut / "__0_0.distcp", "r+b") as f:
        f.truncate(1000)
    assert cli("checkpoint", "--read", cut) == 2
    _one_line_error(capsys.readouterr().err, "damaged")
    two = _copy(run_dir / "ckpt-000", tmp_path / "two")
    marker = json.loads((two / MARKER).read_text())
    marker["ranks"] = 2
    (two / MARKER).write_text(json.dumps(marker))
    assert cli("checkpoint", "--read", two) == 2
    _one_line_error(capsys.readouterr().err, "written by 2 rank(s)")
    other = _copy(run_dir / "ckpt-000", tmp_path / "other")
    marker = json.loads((other / MARKER).read_text())
    marker["model"] = "resnet18"  # a marker that names another layout than the files hold
    (other / MARKER).write_text(json.dumps(marker))
    assert cli("checkpoint", "--read", other) == 2
    _one_line_error(capsys.readouterr().err, "does not hold")


class _Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_read_never_unpickles_anything_but_dcp_metadata(kept, tmp_path, capsys) -> None:
    """A .metadata crafted to run code, with a marker that matches it, is refused unrun."""
    run_dir, _ = kept
    evil = _copy(run_dir / "ckpt-000", tmp_path / "evil")
    ran = tmp_path / "the-payload-ran"
    (evil / METADATA).write_bytes(pickle.dumps(_Payload(str(ran))))
    marker = json.loads((evil / MARKER).read_text())
    marker["files"][METADATA] = (evil / METADATA).stat().st_size
    marker["metadata_sha256"] = sha256_of(evil / METADATA)
    (evil / MARKER).write_text(json.dumps(marker))
    assert cli("checkpoint", "--read", evil) == 2
    _one_line_error(capsys.readouterr().err, "refusing to load it")
    assert not ran.exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_read_refuses_a_checkpoint_of_non_tensor_objects(tmp_path, capsys) -> None:
    """DCP loads non-tensor items with torch.load(weights_only=False): refused before that."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core.checkpoint_store import Marker

    d = tmp_path / "objects"
    save({"rank0/x": torch.zeros(4), "rank0/obj": {"a": 1}},
         storage_writer=FileSystemWriter(d), no_dist=True)
    files = {p.name: p.stat().st_size for p in d.iterdir()}
    marker = Marker("cnn", 1.0, 1, 0, files, sha256_of(d / METADATA), "now")
    (d / MARKER).write_text(json.dumps(marker.to_dict()))
    assert cli("checkpoint", "--read", d) == 2
    _one_line_error(capsys.readouterr().err, "BytesStorageMetadata")


# ------------------------------------------------------------------------ failures mid-write

def test_interrupt_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    out = run_cmd("checkpoint", "--storage", tmp_path, "--model", "cnn", "--repeat", "3",
                  "--keep", "--results", tmp_path / "res",
                  env={"IOBENCH_TEST_FAULT": "rank=0,epoch=1,step=0,action=sigint"})
    assert out.returncode == 130, out.stderr[-3000:]
    run_dir = _run_dir(tmp_path)
    assert sorted(p.name for p in run_dir.iterdir()) == ["ckpt-000"]  # no partial left
    assert _accepted(run_dir) == ["ckpt-000"] and not (tmp_path / "res").exists()
    assert cli("checkpoint", "--read", run_dir / "ckpt-000", "--results", tmp_path / "r") == 0


@pytest.fixture
def tiny_fs(tmpfs):
    """A 3 MB tmpfs (conftest's `tmpfs`)."""
    return tmpfs("3m")


def test_full_disk_mid_write_is_one_line_and_keeps_the_previous(tiny_fs: Path,
                                                                  tmp_path: Path) -> None:
    out = run_cmd("checkpoint", "--storage", tiny_fs, "--model", "cnn", "--repeat", "2",
                  "--keep", "--results", tmp_path / "res",
                  env={"IOBENCH_TEST_FAULT": "rank=0,epoch=1,action=fill"})
    assert out.returncode == 2, out.stderr[-3000:]
    _one_line_error(out.stderr, "out of space")
    run_dir = _run_dir(tiny_fs)
    assert sorted(p.name for p in run_dir.iterdir()) == ["ckpt-000"]
    assert cli("checkpoint", "--read", run_dir / "ckpt-000", "--results", tmp_path / "r") == 0


def test_a_request_larger_than_the_disk_is_refused_before_writing(tiny_fs: Path,
                                                                  capsys) -> None:
    assert cli("checkpoint", "--storage", tiny_fs, "--model", "cnn", "--repeat", "5") == 2
    _one_line_error(capsys.readouterr().err, "free")
    assert list(tiny_fs.iterdir()) == []


# ------------------------------------------------------------------------ two ranks

@pytest.mark.mpi
def test_two_ranks_one_shard_each_and_a_killed_rank(tmp_path: Path) -> None:
    """Two ranks write a shard each; rank 1 killed during the second checkpoint leaves the
    first, which two ranks read back, and a partial folder `--read` refuses."""
    out = run_mpi(2, "checkpoint", "--storage", tmp_path, "--model", "cnn", "--repeat", "3",
                  "--keep", "--results", tmp_path / "res",
                  env={"IOBENCH_TEST_FAULT": "rank=1,epoch=1,step=0,action=kill"}, timeout=180)
    assert out.returncode != 0
    run_dir = _run_dir(tmp_path)
    assert _accepted(run_dir) == ["ckpt-000"]
    assert sorted(p.name for p in (run_dir / "ckpt-000").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]
    partial = [p for p in run_dir.iterdir() if p.name != "ckpt-000"]
    for p in partial:
        bad = run_cmd("checkpoint", "--read", p)
        assert bad.returncode == 2
        _one_line_error(bad.stderr, "no completion marker")
    good = run_mpi(2, "checkpoint", "--read", run_dir / "ckpt-000", "--repeat", "2",
                   "--results", tmp_path / "res2", timeout=180)
    assert good.returncode == 0, good.stderr[-3000:]
    doc = _doc(tmp_path / "res2")
    assert doc["world"]["size"] == 2 and len(doc["reads"]) == 2
    assert [r["rank"] for r in doc["reads"][0]["ranks"]] == [0, 1]
    assert good.stdout.count("result:") == 1


@pytest.mark.mpi
def test_two_ranks_interrupted_together(tmp_path: Path) -> None:
    out = run_mpi(2, "checkpoint", "--storage", tmp_path, "--model", "cnn", "--repeat", "3",
                  "--keep", "--results", tmp_path / "res",
                  env={"IOBENCH_TEST_FAULT": "rank=0,epoch=1,step=0,action=sigint"}, timeout=180)
    assert out.returncode == 130, out.stderr[-3000:]
    run_dir = _run_dir(tmp_path)
    assert sorted(p.name for p in run_dir.iterdir()) == ["ckpt-000"]
    assert "interrupted (SIGINT)" in out.stderr


# ------------------------------------------------------------------------ leftovers of killed runs

def test_a_killed_runs_partial_is_refused_then_removed_by_the_next_run(tmp_path: Path) -> None:
    """A run killed mid-write (SIGKILL: no clean-up) leaves `.ckpt-001.partial`: `--read`
    refuses it, naming how it goes; the next run in the same --storage removes it and
    says so, and leaves the killed run's complete checkpoint readable."""
    out = run_cmd("checkpoint", "--storage", tmp_path, "--model", "cnn", "--repeat", "3",
                  "--keep", "--results", tmp_path / "res",
                  env={"IOBENCH_TEST_FAULT": "rank=0,epoch=1,step=0,action=kill"})
    assert out.returncode != 0
    killed = _run_dir(tmp_path)
    partial = killed / ".ckpt-001.partial"
    assert partial.is_dir() and _accepted(killed) == ["ckpt-000"]
    bad = run_cmd("checkpoint", "--read", partial)
    assert bad.returncode == 2
    _one_line_error(bad.stderr, "no completion marker")
    assert "rm -rf" in bad.stderr and "removes it once that run is gone" in bad.stderr
    nxt = run_cmd("checkpoint", "--storage", tmp_path, "--model", "cnn",
                  "--results", tmp_path / "res2")
    assert nxt.returncode == 0, nxt.stderr[-3000:]
    assert not partial.exists() and _accepted(killed) == ["ckpt-000"]
    doc = _doc(tmp_path / "res2")
    assert any("removed 1 incomplete checkpoint folder(s) a killed run left" in w
               for w in doc["warnings"]), doc["warnings"]
    assert cli("checkpoint", "--read", killed / "ckpt-000", "--results", tmp_path / "r") == 0


def test_partials_of_a_live_or_foreign_writer_are_named_not_removed(tmp_path: Path) -> None:
    """A `.partial` whose writer still runs (this test's own process) or ran on another host
    is left in place, and the warning names the command that removes it."""
    import json as _json

    from iobench.core.checkpoint_store import OWNER, claim

    live, foreign = tmp_path / "iobench-checkpoint-live", tmp_path / "iobench-checkpoint-far"
    for run in (live, foreign):
        (run / ".ckpt-000.partial").mkdir(parents=True)
        claim(run / ".ckpt-000.partial")
    rec = _json.loads((foreign / ".ckpt-000.partial" / OWNER).read_text())
    (foreign / ".ckpt-000.partial" / OWNER).write_text(_json.dumps({**rec, "host": "far"}))
    out = run_cmd("checkpoint", "--storage", tmp_path, "--model", "cnn",
                  "--results", tmp_path / "res")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (live / ".ckpt-000.partial").is_dir() and (foreign / ".ckpt-000.partial").is_dir()
    warnings = " ".join(_doc(tmp_path / "res")["warnings"])
    assert "its run is still writing" in warnings and "another host" in warnings
    assert f"rm -rf {live / '.ckpt-000.partial'}" in warnings


# ------------------------------------------------------------------------ the shard I/O

@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_shards_stay_dcps_format_both_ways(tmp_path: Path, monkeypatch) -> None:
    """iobench's writer (write-behind, no zip CRC) writes files DCP's stock reader loads,
    and iobench's reader (O_DIRECT ranges, records copied without torch.load) loads them,
    the plain tensors by the fast path and a transposed one through torch.load."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core import checkpoint_io
    from iobench.core.checkpoint_store import load_metadata, reader, writer

    gen = torch.Generator().manual_seed(0)
    state = {f"rank0/t{i}": torch.randn(3000 + 7 * i, generator=gen).to(
        torch.bfloat16 if i % 2 else torch.float32) for i in range(40)}
    state["rank0/transposed"] = torch.randn(64, 32, generator=gen).t()
    state["rank0/empty"] = torch.zeros(0)
    save(state, storage_writer=writer(tmp_path, lambda: None), no_dist=True)
    stock = {k: torch.zeros_like(v) for k, v in state.items()}
    load(stock, storage_reader=FileSystemReader(tmp_path), no_dist=True)
    decoded = []
    plain = checkpoint_io.tensor_bytes
    monkeypatch.setattr(checkpoint_io, "tensor_bytes",
                        lambda *a: decoded.append(plain(*a) is not None) or plain(*a))
    fast = {k: torch.zeros_like(v) for k, v in state.items()}
    load(fast, storage_reader=reader(tmp_path, load_metadata(tmp_path)), no_dist=True)
    assert decoded == [True] * 40  # every plain tensor; the transposed one by torch.load
    for k, v in state.items():
        assert torch.equal(stock[k], v) and torch.equal(fast[k], v), k
    record = next(iter(tmp_path.glob("__0_*.distcp"))).read_bytes()
    view = memoryview(bytearray(record))
    assert checkpoint_io.tensor_bytes(view[:10], torch.float32, (3000,)) is None  # not a record


def test_read_ranges_cover_every_item_aligned() -> None:
    from iobench.core.checkpoint_io import READ_RANGE, ranges

    items = [(0, 100, "a"), (5000, 10, "b"), (7000, READ_RANGE * 2, "c"),
             (7000 + READ_RANGE * 2, 50, "d")]
    out = ranges(list(reversed(items)))
    held = [r for _, _, rs in out for r in rs]
    assert sorted(held) == sorted(items)
    for start, end, rs in out:
        assert start % 4096 == 0 and end % 4096 == 0
        assert all(start <= off and off + n <= end for off, n, _ in rs)


def test_a_stock_dcp_checkpoint_loads_through_iobenchs_reader(tmp_path: Path) -> None:
    """A checkpoint DCP's stock FileSystemWriter wrote (its records with their CRC-32) loads
    through iobench's reader, the plain tensors by the fast path, twice (the second time a
    record is not decoded again only when its head and tail equal a decoded one's)."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core.checkpoint_store import load_metadata, reader

    gen = torch.Generator().manual_seed(1)
    state = {f"t{i}": torch.randn(5 + 3 * (i % 4), generator=gen).to(dtype)
             for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.float16,
                                        torch.float64] * 3)}
    state["ints"] = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)
    state["transposed"] = torch.randn(8, 4, generator=gen).t()
    save(state, storage_writer=FileSystemWriter(tmp_path, thread_count=1), no_dist=True)
    for _ in range(2):
        back = {k: torch.zeros_like(v) for k, v in state.items()}
        load(back, storage_reader=reader(tmp_path, load_metadata(tmp_path)), no_dist=True)
        for k, v in state.items():
            assert torch.equal(back[k], v), k


def test_lean_dcp_leaves_the_logger_and_collector_as_they_were(monkeypatch) -> None:
    import gc
    import logging

    import torch
    from torch.distributed.checkpoint import state_dict_saver
    from torch.distributed.checkpoint.logger import _dcp_logger
    from torch.distributed.checkpoint.stateful import Stateful

    from iobench.core.checkpoint_io import lean_dcp

    class _Holder(Stateful):
        def state_dict(self) -> dict:
            return {"x": 1}

        def load_state_dict(self, state_dict: dict) -> None:
            pass

    stock = state_dict_saver._stateful_to_state_dict
    monkeypatch.setattr(_dcp_logger, "handlers", [logging.NullHandler()])
    level, frozen = _dcp_logger.level, gc.get_freeze_count()
    with lean_dcp():  # DCP's debug records go nowhere: not built
        assert not _dcp_logger.isEnabledFor(logging.DEBUG)
        assert gc.get_freeze_count() >= frozen
        lean = state_dict_saver._stateful_to_state_dict
        assert lean is not stock
        t = torch.zeros(2)
        assert lean({"t": t, "h": _Holder(), "n": 3}) == {"t": t, "h": {"x": 1}, "n": 3}
    assert (_dcp_logger.level, gc.get_freeze_count()) == (level, frozen)
    assert state_dict_saver._stateful_to_state_dict is stock
    monkeypatch.setattr(_dcp_logger, "handlers", [logging.StreamHandler()])
    with lean_dcp():  # someone reads them: kept
        assert _dcp_logger.isEnabledFor(logging.DEBUG) == (level <= logging.DEBUG)
        assert state_dict_saver._stateful_to_state_dict is stock


def _mixed_state() -> dict:
    """Tensors of every path of the benchmark's writer: plain ones of several dtypes, ones
    larger than a gathered write, more small records than one writev takes, and ones it
    hands to torch.save (transposed, a view of a larger storage, a scalar, an empty one)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    state = {f"t{i}": torch.randn(5 + 3 * (i % 4), generator=gen).to(dtype)
             for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.float16,
                                        torch.float64] * 3)}
    state.update({f"tiny{i}": torch.full((3,), float(i)) for i in range(400)})
    state["large"] = torch.randn(700_000, generator=gen)  # 2.8 MB: one writev of its own
    state["large_bf16"] = torch.randn(1100, 1000, generator=gen).to(torch.bfloat16)
    state["ints"] = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)
    state["view"] = torch.arange(100, dtype=torch.int32)[10:20]  # storage larger: cloned
    state["transposed"] = torch.randn(8, 4, generator=gen).t()  # torch.save itself
    state["scalar"] = torch.tensor(3.5)
    state["empty"] = torch.zeros(0)
    return state


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_benchmark_shard_is_dcps_own_file_byte_for_byte(tmp_path: Path, monkeypatch) -> None:
    """The benchmark's shard writer (torch.save's records from templates, each tensor written
    from its own memory; here every writev cut short, to resume) writes the very file DCP's
    own FileSystemWriter writes (CRC-32 off in both), and DCP's stock reader and iobench's
    load it."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core import checkpoint_io, checkpoint_write
    from iobench.core.checkpoint_store import load_metadata, reader, writer

    state = _mixed_state()
    ours, stock = tmp_path / "ours", tmp_path / "stock"
    w = writer(ours, lambda: None, records=True)
    assert checkpoint_write.fast_path(w)
    writev = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, bufs: writev(fd, bufs) if sum(
        len(b) for b in bufs) < 5000 else os.write(fd, bytes(memoryview(bufs[0])[:4999])))
    save(state, storage_writer=w, no_dist=True)
    monkeypatch.setattr(os, "writev", writev)
    assert w.files == ("__0_0.distcp",)
    with checkpoint_io.no_zip_crc():
        save(state, storage_writer=FileSystemWriter(stock, thread_count=1), no_dist=True)
    shard = "__0_0.distcp"
    assert (ours / shard).read_bytes() == (stock / shard).read_bytes()
    for r in (FileSystemReader(ours), reader(ours, load_metadata(ours))):
        back = {k: torch.zeros_like(v) for k, v in state.items()}
        load(back, storage_reader=r, no_dist=True)
        for k, v in state.items():
            assert torch.equal(back[k], v), k


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_benchmark_writes_in_calls_of_at_most_one_mib(tmp_path: Path, monkeypatch) -> None:
    """A tensor larger than MAX_CALL goes to the kernel in calls of at most MAX_CALL bytes
    (larger buffered writes cost 5-7x as much on this project's VM), each call's pieces in
    order: the file is still DCP's own, byte for byte."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core import checkpoint_io, checkpoint_write
    from iobench.core.checkpoint_store import writer

    state = _mixed_state()
    state["huge"] = torch.randn(1_500_000)  # 6 MB, in one piece
    calls: list[int] = []
    writev = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, bufs: calls.append(sum(
        len(memoryview(b).cast("B")) for b in bufs)) or writev(fd, bufs))
    save(state, storage_writer=writer(tmp_path / "ours", lambda: None, records=True),
         no_dist=True)
    monkeypatch.setattr(os, "writev", writev)
    assert max(calls) == checkpoint_write.MAX_CALL and sum(calls) > 6_000_000
    with checkpoint_io.no_zip_crc():
        save(state, storage_writer=FileSystemWriter(tmp_path / "stock", thread_count=1),
             no_dist=True)
    shard = "__0_0.distcp"
    assert (tmp_path / "ours" / shard).read_bytes() == (tmp_path / "stock" / shard).read_bytes()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_torch_without_plan_caching_saves_with_dcps_default_planner(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """On a torch whose DefaultSavePlanner has no `enable_plan_caching` (before 2.7, which
    pyproject allows), the benchmark saves with DCP's default planner: no TypeError, and a
    run's start empties nothing."""
    import torch
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core.checkpoint_store import forget_plans, save_planner, writer

    plain = default_planner.DefaultSavePlanner.__init__

    def old_init(self, flatten_state_dict: bool = True, flatten_sharded_tensors: bool = True,
                 dedup_replicated_tensors: bool | None = None,
                 dedup_save_to_lowest_rank: bool = False) -> None:
        plain(self, flatten_state_dict, flatten_sharded_tensors, dedup_replicated_tensors,
              dedup_save_to_lowest_rank)

    monkeypatch.setattr(default_planner.DefaultSavePlanner, "__init__", old_init)
    assert save_planner() is None
    forget_plans()
    state = {"t": torch.arange(10.0)}
    save(state, storage_writer=writer(tmp_path, lambda: None, records=True),
         planner=save_planner(), no_dist=True)
    assert (tmp_path / "__0_0.distcp").stat().st_size > 0


def test_a_short_write_leaves_the_rest_of_its_call_in_order() -> None:
    """`unwritten`: the tails a write of n bytes did not take, in order, none when it took all."""
    from iobench.core.checkpoint_write import unwritten

    call = [memoryview(b"abc"), memoryview(b"de"), memoryview(b"fgh")]
    assert [bytes(p) for p in unwritten(call, 0)] == [b"abc", b"de", b"fgh"]
    assert [bytes(p) for p in unwritten(call, 4)] == [b"e", b"fgh"]
    assert [bytes(p) for p in unwritten(call, 5)] == [b"fgh"]
    assert unwritten(call, 8) == []


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_only_the_benchmark_writes_from_records(tmp_path: Path, monkeypatch) -> None:
    """`train --checkpoint-every` saves with DCP's own writer (a user's DCP save pays its
    costs); only a writer asked for `records` uses the benchmark's."""
    import torch
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core import checkpoint_store

    plain = checkpoint_store.write_shard
    used = []
    monkeypatch.setattr(checkpoint_store, "write_shard",
                        lambda *a: used.append(1) or plain(*a))
    state = {"t": torch.arange(10.0)}
    save(state, storage_writer=checkpoint_store.writer(tmp_path / "a", lambda: None),
         no_dist=True)
    assert used == []
    save(state, storage_writer=checkpoint_store.writer(tmp_path / "b", lambda: None,
                                                       records=True), no_dist=True)
    assert used == [1]
    assert (tmp_path / "a" / "__0_0.distcp").read_bytes() == \
        (tmp_path / "b" / "__0_0.distcp").read_bytes()


def test_record_parts_are_torch_saves_bytes_or_none() -> None:
    import io

    import torch

    from iobench.core.checkpoint_io import no_zip_crc
    from iobench.core.checkpoint_write import record_parts

    with no_zip_crc():
        for t in (torch.arange(7, dtype=torch.float32), torch.ones(3, 5, dtype=torch.bfloat16),
                  torch.arange(7, dtype=torch.float32) * 2, torch.tensor([True, False])):
            parts = record_parts(t)
            assert parts is not None
            buf = io.BytesIO()
            torch.save(t, buf)
            assert b"".join(bytes(p) for p in parts) == buf.getvalue()
        assert record_parts(torch.randn(4, 3).t()) is None  # not contiguous
        assert record_parts(torch.arange(10)[2:5]) is None  # a view of a larger storage
        assert record_parts(torch.zeros(3, requires_grad=True)) is None
        assert record_parts(torch.nn.Parameter(torch.zeros(3))) is None  # a subclass
    assert record_parts(torch.arange(7, dtype=torch.float32), crc_is_off=False) is None


# ------------------------------------------------------------------------ the save's planning

def _plans_of(*keys_per_rank: list[str]) -> list:
    """DCP's local save plans of ranks holding tensors under these keys (as DCP's
    coordinator gets them: each a copy, as after the gather)."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    plans = []
    for rank, keys in enumerate(keys_per_rank):
        planner = DefaultSavePlanner()
        planner.set_up_planner({k: torch.zeros(3 + len(k), dtype=torch.bfloat16) for k in keys},
                               is_coordinator=rank == 0)
        plans.append(pickle.loads(pickle.dumps(planner.create_local_plan())))
    return plans


def test_benchmark_dedup_makes_dcps_own_plans() -> None:
    """The benchmark planner's dedup returns DCP's `dedup_save_plans` plans: the same items,
    the very same objects, in the same order, with no key planned twice and with some."""
    from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans

    from iobench.core.checkpoint_store import dedup_plans

    for plans in (_plans_of(["a", "b", "c"], ["d", "e"]),
                  _plans_of(["a", "shared", "c"], ["shared", "e"], [])):
        for lowest in (False, True):
            ours, stock = dedup_plans(plans, lowest), dedup_save_plans(plans, lowest)
            assert len(ours) == len(stock)
            for o, s in zip(ours, stock, strict=True):
                assert o == s and len(o.items) == len(s.items)
                assert all(a is b for a, b in zip(o.items, s.items, strict=True))
    assert len(sum((p.items for p in dedup_plans(plans, False)), [])) == 4  # "shared" once


def _metadata(folder: Path):
    import dataclasses

    from iobench.core.checkpoint_store import load_metadata

    md = load_metadata(folder)
    return dataclasses.replace(md, storage_meta=None)  # (the save's own id and path)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_later_saves_of_a_run_reuse_dcps_cached_plan(tmp_path: Path, monkeypatch) -> None:
    """The benchmark's second save of a run sends no plan items to the coordinator (DCP's
    plan cache), the first of a run always does; every save writes the shard and metadata
    DCP's stock planner writes, which DCP's stock reader loads."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core.checkpoint_io import no_zip_crc

    sent: list[list[bool]] = []
    stock_plan = DefaultSavePlanner.create_global_plan
    monkeypatch.setattr(DefaultSavePlanner, "create_global_plan", lambda self, plans: (
        sent.append([bool(p.items) for p in plans]), stock_plan(self, plans))[1])
    for run in ("r1", "r2"):
        assert cli("checkpoint", "--storage", tmp_path, "--model", "cnn", "--repeat", "3",
                   "--keep", "--results", tmp_path / run) == 0
    assert sent == [[True], [False], [False]] * 2
    run_dir = sorted(tmp_path.glob("iobench-checkpoint-*"))[0]
    state = _state_of(run_dir / "ckpt-000")
    with no_zip_crc():
        save(state, storage_writer=FileSystemWriter(tmp_path / "stock", thread_count=1),
             no_dist=True)
    shard = "__0_0.distcp"
    for k in range(3):
        ckpt = run_dir / f"ckpt-{k:03d}"
        assert (ckpt / shard).read_bytes() == (tmp_path / "stock" / shard).read_bytes()
        assert _metadata(ckpt) == _metadata(tmp_path / "stock")
        back = {key: torch.zeros_like(v) for key, v in state.items()}
        load(back, storage_reader=FileSystemReader(ckpt), no_dist=True)
        assert all(torch.equal(_bits(back[key]), _bits(v)) for key, v in state.items())


def _bits(t):
    """A tensor's bytes (random bits hold NaNs, which equal nothing)."""
    import torch

    return t.reshape(-1).view(torch.uint8)


def _state_of(ckpt: Path) -> dict:
    """The state dict the checkpoint at `ckpt` holds (its marker's layout, rank 0)."""
    from iobench.core.checkpoint_layout import build_state, layout_for
    from iobench.core.checkpoint_store import check_marker

    marker = check_marker(ckpt)
    return build_state(layout_for(marker.model, marker.scale, marker.ranks), 0, marker.seed)


@pytest.mark.mpi
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_two_ranks_later_saves_write_what_the_first_wrote(tmp_path: Path) -> None:
    """Two ranks, three saves (the later two from DCP's cached plan): the same shards and
    metadata each time, which DCP's stock reader loads."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load

    out = run_mpi(2, "checkpoint", "--storage", tmp_path, "--model", "cnn", "--repeat", "3",
                  "--keep", "--results", tmp_path / "res", timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = _run_dir(tmp_path)
    first = run_dir / "ckpt-000"
    state = _state_of(first)
    for k in (1, 2):
        ckpt = run_dir / f"ckpt-{k:03d}"
        assert _metadata(ckpt) == _metadata(first)
        for shard in ("__0_0.distcp", "__1_0.distcp"):
            assert (ckpt / shard).read_bytes() == (first / shard).read_bytes()
        back = {key: torch.zeros_like(v) for key, v in state.items()}
        load(back, storage_reader=FileSystemReader(ckpt), no_dist=True)
        assert all(torch.equal(_bits(back[key]), _bits(v)) for key, v in state.items())
