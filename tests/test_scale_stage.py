"""Staging millions of files: a compact dataset is copied share by share (arithmetic
slices of its table, a bounded window of copy tasks), never listed whole."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
from test_scale import compact_copy
from test_stage import stage_on_thread_nodes

from conftest import cli
from iobench.core import cache, manifest, sampling
from iobench.core.manifest import Manifest
from iobench.workflows import stage
from iobench.workflows.stage import PARTIAL, StageConfig


@pytest.fixture
def unlisted(monkeypatch):
    """Listing a compact table whole (its file sequence, its data files, or the node's
    files as one list) fails the test. Containment is checked per folder, as beyond
    CONTAINMENT_FILES files."""
    monkeypatch.setattr(manifest, "CONTAINMENT_FILES", 3)

    def refuse(*_a, **_k):
        raise AssertionError("a compact table was listed whole")

    monkeypatch.setattr(manifest.CompactFiles, "__iter__", refuse)
    monkeypatch.setattr(manifest.DataFiles, "__iter__", refuse)
    listed = cache.files_for_node

    def files_for_node(m, *a, **k):
        if m.compact is not None:
            refuse()
        return listed(m, *a, **k)

    monkeypatch.setattr(cache, "files_for_node", files_for_node)


@pytest.fixture
def source(tiny_root, tmp_path) -> Manifest:
    src = tmp_path / "src" / "cifar10-files"
    return compact_copy(tiny_root("cifar10", "files"), src)


def _stage(tmp_path: Path, *extra: str) -> int:
    return cli("stage", "--dataset", "cifar10", "--format", "files", "--from", tmp_path / "src",
               "--to", tmp_path / "dst", "--results", tmp_path / "res", "--no-progress", *extra)


def test_stage_of_a_compact_dataset_never_lists_it(source, tmp_path, unlisted):
    assert _stage(tmp_path) == 0
    staged = Manifest.load(tmp_path / "dst" / "cifar10-files")
    assert staged.compact is not None
    for e in cache.rank_share(source, [0], 0, 1):  # every file, byte for byte
        assert (staged.root / e.path).read_bytes() == source.path_of(e).read_bytes()
    assert _stage(tmp_path) == 0  # resumed: each rank stats its own share, nothing is copied
    newest = max((tmp_path / "res").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    doc = json.loads(newest.read_text())
    assert doc["copied_files"] == 0 and doc["skipped_files"] == len(source.files)
    assert doc["node_bytes"] == source.total_bytes


def test_leftovers_of_an_interrupted_copy_are_matched_by_the_table_pattern(source, tmp_path):
    assert _stage(tmp_path) == 0
    dst = tmp_path / "dst" / "cifar10-files"
    first = source.data_files[0].path
    (dst / first).unlink()  # as if the copy of this file was interrupted
    folder, _, name = first.rpartition("/")
    host = socket.gethostname()
    ours = dst / folder / f".{name}{PARTIAL}{host}-1-1"
    foreign = dst / folder / f".notes.txt{PARTIAL}{host}-1-1"  # not a file of the dataset
    for p in (ours, foreign):
        p.write_bytes(b"partial")
    assert _stage(tmp_path) == 0
    assert not ours.exists() and foreign.exists() and (dst / first).is_file()


def test_shard_of_a_compact_dataset_puts_each_nodes_files_and_their_rule(source, tmp_path,
                                                                          unlisted):
    cfg = StageConfig("cifar10", "files", tmp_path / "src", tmp_path / "node{node}",
                      mode="shard", threads=2)
    stage_on_thread_nodes(cfg)
    n = source.compact.num_files
    for r in range(2):
        dest = tmp_path / f"node{r}" / "cifar10-files"
        want = {e.path for e in source.compact.entries_at(
            np.array(sampling.files_for_rank(n, r, 2), dtype=np.int64))}
        got = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()
               and p.parent.name != manifest.TABLE_DIR and p.name not in ("iobench.json",
                                                                           "labels.npy")}
        assert got == want
        present = Manifest.load(dest).extra["staged"]["files_present"]
        assert present["data_files_of_ranks"] == [r] and present["world_size"] == 2
        assert present["rule"] == "sampling.files_for_rank" and present["aux"] == ["labels.npy"]


def test_copy_tasks_are_queued_a_window_at_a_time(monkeypatch):
    """A share is drawn as the threads free up (never a future per file up front), and
    after an error nothing more is drawn."""
    monkeypatch.setattr(stage, "WINDOW", 2)
    threads, lock = 2, threading.Lock()
    drawn = done = 0
    most = 0

    def share(n: int):
        nonlocal drawn, most
        for i in range(n):
            with lock:
                most = max(most, drawn - done)
                drawn += 1
            yield i

    def copy(i: int, fail_at: int | None = None) -> None:
        nonlocal done
        if i == fail_at:
            raise OSError(5, "boom")
        with lock:
            done += 1

    stop = threading.Event()
    assert stage._copy_all(share(200), copy, threads, stop) is None
    assert done == 200 and most <= stage.WINDOW * threads
    drawn = done = 0
    err = stage._copy_all(share(200), lambda i: copy(i, fail_at=10), threads, stop)
    assert isinstance(err, OSError) and stop.is_set()
    assert drawn <= 11 + stage.WINDOW * threads + threads


def test_preflight_of_a_compact_dataset_never_lists_it(source, tmp_path, unlisted, capsys):
    """The staging check sums the node's shares (sizes from the table, stat per file only
    where a copy exists already), so it passes without a list of every file."""
    assert cli("preflight", "--storage", source.root, "--stage-to", tmp_path / "fast") == 0
    assert f"for {source.total_bytes / 1e9:.3g} GB" in capsys.readouterr().out


def test_dalis_input_check_is_dealt_to_ranks_without_a_list(source, unlisted):
    """Rank r of w checks every w-th data file (a compact table a chunk at a time): a
    damaged file is found by the one rank whose share holds it, and by a single rank."""
    from iobench.core.errors import DatasetError
    from iobench.loaders.dali import check_native_inputs

    victim = source.path_of(source.data_files[3])
    data = bytearray(victim.read_bytes())
    data[:8] = b"garbage!"  # its size unchanged: only the magic bytes tell
    victim.write_bytes(bytes(data))
    check_native_inputs(source, 0, 2)  # positions 0, 2, 4, ...
    for rank, world in ((1, 2), (0, 1), (3, 4)):
        with pytest.raises(DatasetError, match=victim.name):
            check_native_inputs(source, rank, world)
    check_native_inputs(source, 1, 4)


def test_a_compact_table_streamed_row_by_row_is_the_listed_one(source):
    """generate builds its table from the journals a row at a time, given the count: the
    same table as from the list; a data file after an auxiliary one, or another count
    than the rows given, leaves the JSON list."""
    listed = list(source.files)
    n = source.num_samples
    count = source.compact.num_files
    streamed = manifest.compact_files(iter(listed), n, count)
    assert streamed is not None and streamed == manifest.compact_files(listed, n)
    assert list(streamed) == listed
    assert manifest.compact_files(iter(listed), n, count + 1) is None
    assert manifest.compact_files(iter(listed), n, count - 1) is None
    aux_first = [listed[-1], *listed[:-1]]
    assert manifest.compact_files(iter(aux_first), n, count) is None


def test_generate_builds_a_compact_manifest_without_holding_every_entry(tmp_path,
                                                                        monkeypatch):
    """Task results carry counts, not entries; the manifest comes from the journals,
    and is the one the entries would give."""
    from iobench.workflows import generate as generators
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    monkeypatch.setattr(manifest, "COMPACT_FILES", 20)
    seen = []
    run_task = generators._run_task

    def recorded(*a, **k):
        done = run_task(*a, **k)
        seen.append(done)
        return done

    monkeypatch.setattr(generators, "_run_task", recorded)
    m = generate_dataset(GenerateConfig(dataset="cifar10", format="npz", storage=tmp_path,
                                        samples=45, seed=1))
    assert seen and all(isinstance(x, (int, bool)) for done in seen for x in done)
    loaded = Manifest.load(m.root)
    assert loaded.compact is not None and loaded.compact.num_files == 45
    assert loaded.files == manifest.compact_files(list(loaded.files), 45)
    assert sum(done[1] for done in seen) == len(loaded.files)
    assert loaded.extra["total_bytes"] == loaded.total_bytes
