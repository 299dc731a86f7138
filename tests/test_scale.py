"""Millions of samples: the compact manifest, per-rank slices of it, and orders built
without a list of every file (tiny real datasets stand in for large ones)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_SEED, check_batches
from iobench.core import cache, manifest, sampling
from iobench.core.errors import DatasetError
from iobench.core.manifest import MANIFEST_NAME, TABLE_DIR, CompactFiles, Manifest
from iobench.loaders import LoaderConfig, make_loader

ONE_PER_FILE = ("files", "npz")


def compact_copy(src: Path, dst: Path) -> Manifest:
    """A copy of a dataset with its manifest rewritten in the compact form (version 2)."""
    shutil.copytree(src, dst)
    Manifest.load(dst).write(dst, form="compact")
    return Manifest.load(dst)


@pytest.fixture(scope="module")
def roots(tiny_root, tmp_path_factory):
    """{fmt: (JSON-list root, compact root)} of tiny cifar10 datasets."""
    top = tmp_path_factory.mktemp("compact")
    out = {}
    for fmt in ONE_PER_FILE:
        src = tiny_root("cifar10", fmt)
        compact_copy(src, top / fmt)
        out[fmt] = (src, top / fmt)
    return out


@pytest.mark.parametrize("fmt", ONE_PER_FILE)
def test_compact_manifest_lists_the_same_files(roots, fmt):
    src, dst = roots[fmt]
    old, new = Manifest.load(src), Manifest.load(dst)
    doc = json.loads((dst / MANIFEST_NAME).read_text())
    assert doc["schema_version"] == 2 and "table" in doc
    assert all(f.get("role") != "data" for f in doc["files"])  # no data file as JSON
    assert isinstance(new.files, CompactFiles)
    assert list(new.files) == list(old.files)
    assert list(new.data_files) == list(old.data_files) and new.files == old.files
    assert new.total_bytes == old.total_bytes and new.aux_files == old.aux_files
    assert new.files[3:7] == list(old.files[3:7]) and new.files[-1] == old.files[-1]
    assert json.loads((src / MANIFEST_NAME).read_text())["schema_version"] == 1  # unchanged


def rows_read_apart(monkeypatch) -> None:
    """Side tables read per batch, never held whole, each run of rows apart (the path a
    table beyond NpyRows.WHOLE_BYTES takes, on a tiny one)."""
    monkeypatch.setattr(manifest.NpyRows, "WHOLE_BYTES", 0)
    monkeypatch.setattr(manifest.NpyRows, "GAP_BYTES", 1)


@pytest.mark.parametrize("fmt", ONE_PER_FILE)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("held", [True, False], ids=["tables-held", "rows-gathered"])
def test_loader_on_a_compact_manifest_gives_the_same_batches(roots, fmt, workers, held,
                                                             monkeypatch):
    """Same indices, samples, labels and sizes from both forms, for each of 2 ranks, with
    the side tables held whole or read per batch (workers fork: they inherit the patch)."""
    if not held:
        rows_read_apart(monkeypatch)
    src, dst = roots[fmt]
    cfg = LoaderConfig(batch_size=4, workers=workers, decode=False, seed=3, shuffle="global")
    for rank in (0, 1):
        runs = []
        for root in (src, dst):
            with make_loader(fmt, root, cfg, rank=rank, world=2) as ld:
                runs.append(list(ld.epoch(0)) + list(ld.epoch(1)))
                if root == dst:  # nothing per file was built for the reader
                    assert isinstance(ld.reader.paths, manifest.DataPaths)
        for a, b in zip(*runs, strict=True):
            assert torch.equal(a.indices, b.indices) and torch.equal(a.labels, b.labels)
            assert torch.equal(a.samples, b.samples) and a.payload_bytes == b.payload_bytes
        epoch0 = runs[1][:len(runs[1]) // 2]
        order = np.concatenate([b.indices.numpy() for b in epoch0])
        check_batches("cifar10", epoch0, order)
        # each delivered payload is that sample's own file size (a wrong row of bytes.npy
        # would count another file's)
        files = Manifest.load(src).data_files
        assert [b.payload_bytes for b in epoch0] == [
            sum(files[i].bytes for i in b.indices.tolist()) for b in epoch0]


@pytest.mark.parametrize("shape,dtype", [((), np.int64), ((), np.uint16), ((32,), np.uint8),
                                         ((2, 3), np.float32)])
@pytest.mark.parametrize("gap", [1, 64, 1 << 14])
def test_table_rows_by_index_array_are_the_arrays_rows(tmp_path, monkeypatch, shape, dtype,
                                                       gap):
    """`NpyRows[idx]` (gathered in runs, or from the table held whole) equals numpy's
    indexing for unsorted, repeated, 2-D and edge indices."""
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 200, (5000, *shape)).astype(dtype)
    np.save(tmp_path / "t.npy", arr)
    monkeypatch.setattr(manifest.NpyRows, "GAP_BYTES", gap)
    for whole in (0, 1 << 30):
        monkeypatch.setattr(manifest.NpyRows, "WHOLE_BYTES", whole)
        rows = manifest.NpyRows.open(tmp_path / "t.npy")
        for idx in (rng.integers(0, 5000, 256), np.sort(rng.choice(5000, 300, replace=False)),
                    np.array([4999, 0, 0, 4999, 17]), rng.integers(0, 5000, (8, 16)),
                    np.arange(100, 140), np.array([7])):
            got = rows[idx]
            assert got.shape == arr[idx].shape and got.dtype == arr.dtype
            np.testing.assert_array_equal(got, arr[idx])
        assert rows[123].tolist() == arr[123].tolist() and rows[-1].tolist() == arr[-1].tolist()
        np.testing.assert_array_equal(rows[10:20], arr[10:20])
        with pytest.raises(IndexError):
            rows[np.array([1, 5000])]


@pytest.mark.parametrize("whole", [0, 1 << 30], ids=["rows-gathered", "table-held"])
def test_a_truncated_table_fails_naming_it_when_its_rows_are_read(tmp_path, monkeypatch, whole):
    np.save(tmp_path / "t.npy", np.arange(1000, dtype=np.int64))
    with open(tmp_path / "t.npy", "r+b") as f:  # the header says 1000 rows; 999 are there
        f.truncate(f.seek(0, 2) - 8)
    monkeypatch.setattr(manifest.NpyRows, "WHOLE_BYTES", whole)
    rows = manifest.NpyRows.open(tmp_path / "t.npy")
    if not whole:
        assert rows[np.array([3, 500, 998])].tolist() == [3, 500, 998]
    for read in (lambda: rows[np.array([3, 999])], lambda: rows[999]):
        with pytest.raises(DatasetError, match=r"t\.npy ends before row 1000: it is truncated"):
            read()


@pytest.mark.parametrize("fmt", ONE_PER_FILE)
@pytest.mark.parametrize("held", [True, False], ids=["tables-held", "rows-gathered"])
def test_a_compact_epoch_reads_its_tables_per_batch_not_per_sample(roots, fmt, held,
                                                                    monkeypatch):
    """A batch's labels, sizes and folders take a few table reads (none once a small table
    is held), not one per sample: before, a batch of B files cost ~3B preads."""
    if not held:
        rows_read_apart(monkeypatch)
        monkeypatch.setattr(manifest.NpyRows, "GAP_BYTES", 1 << 20)  # a run per batch
    reads = []
    real = manifest.NpyRows._read
    monkeypatch.setattr(manifest.NpyRows, "_read",
                        lambda self, first, count: reads.append(count) or real(self, first,
                                                                                count))
    cfg = LoaderConfig(batch_size=8, workers=0, decode=False, seed=3, shuffle="global")
    with make_loader(fmt, roots[fmt][1], cfg) as ld:
        reads.clear()
        batches = [b for e in range(3) for b in ld.epoch(e)]
    tables = 3 if fmt == "files" else 2  # dir, bytes (+ labels: npz files hold their own)
    assert len(batches) == 15
    assert len(reads) <= (tables if held else tables * len(batches))


def test_generator_writes_the_compact_form_beyond_the_threshold(tmp_path, monkeypatch):
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    monkeypatch.setattr(manifest, "COMPACT_FILES", 20)
    for fmt, n in (("npz", 21), ("hdf5", 64)):  # 64 samples in 4 files: stays a JSON list
        m = generate_dataset(GenerateConfig(dataset="cifar10", format=fmt, storage=tmp_path,
                                            samples=n, samples_per_file=16, seed=TINY_SEED))
        loaded = Manifest.load(m.root)
        assert (loaded.compact is not None) == (fmt == "npz")
        assert len(loaded.data_files) == (21 if fmt == "npz" else 4)
    from iobench.generators.verify import verify_dataset

    assert verify_dataset(tmp_path / "cifar10-npz") == []  # the side arrays are listed


def test_verify_finds_a_damaged_file_of_a_compact_dataset(roots, tmp_path):
    from iobench.generators.verify import verify_dataset

    m = compact_copy(roots["npz"][0], tmp_path / "d")
    victim = m.path_of(m.data_files[5])
    victim.write_bytes(victim.read_bytes()[:-1] + b"!")
    problems = verify_dataset(tmp_path / "d")
    assert len(problems) == 1 and str(victim) in problems[0]


def test_verify_deals_files_to_ranks_in_bounded_batches(roots, monkeypatch):
    """Each rank gets its chunks in batches of at most BATCH entries (never the whole list),
    and the ranks together check every file exactly once."""
    from iobench.generators import verify

    monkeypatch.setattr(verify, "CHUNK", 3)
    monkeypatch.setattr(verify, "BATCH", 5)
    for root in roots["npz"]:
        m = Manifest.load(root)
        seen = []
        for rank in range(3):
            batches = list(verify._my_entries(m, rank, 3))
            assert batches and all(len(b) < 5 + 3 for b in batches)
            seen += [e.path for b in batches for e in b]
        assert sorted(seen) == sorted(f.path for f in m.files)


def test_verify_of_a_compact_dataset_names_files_its_table_does_not(roots, tmp_path):
    """Without listing the table: a file named like a data file, but past the count or in
    another folder than its row says, is not in the manifest; the real ones are."""
    from iobench.generators.verify import verify_dataset

    m = compact_copy(roots["npz"][0], tmp_path / "d")
    assert verify_dataset(m.root) == []
    t = m.compact
    last = m.data_files[t.num_files - 1]
    folder = last.path.rpartition("/")[0]
    past = tmp_path / "d" / folder / t.name(t.num_files)
    past.write_bytes(b"x")
    first = m.data_files[0]
    other = [d for d in t.dirs if d != first.path.rpartition("/")[0]]
    moved = tmp_path / "d" / (other[0] if other else "elsewhere") / first.path.rpartition("/")[2]
    moved.parent.mkdir(exist_ok=True)
    moved.write_bytes(b"x")
    problems = verify_dataset(m.root)
    assert len(problems) == 2, problems
    assert all("not in the manifest" in p for p in problems)
    assert {str(past), str(moved)} == {p.split(": ")[1].split(" (")[0] for p in problems}


# ------------------------------------------------------------------ hostile compact manifests

def _edit(root: Path, **table) -> None:
    p = root / MANIFEST_NAME
    doc = json.loads(p.read_text())
    doc["table"].update(table)
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize(("table", "match"), [
    ({"dirs": ["../outside"]}, "not a plain relative path"),
    ({"dirs": ["/etc"]}, "not a plain relative path"),
    ({"dirs": ["train/../.."]}, "not a plain relative path"),
    ({"dirs": [TABLE_DIR]}, "not a plain relative path"),
    ({"prefix": "../"}, "may hold no"),
    ({"suffix": "/x"}, "may hold no"),
    ({"prefix": "7"}, "may hold no"),
    ({"count": 10_000}, "does not tile"),
    ({"samples_per_file": 0}, "does not tile"),
    ({"width": 0}, "outside 1..20"),
])
def test_a_hostile_table_is_refused_at_load(roots, tmp_path, table, match):
    root = tmp_path / "d"
    compact_copy(roots["npz"][0], root)
    _edit(root, **table)
    with pytest.raises(DatasetError, match=match) as err:
        Manifest.load(root)
    assert "\n" not in str(err.value)


def test_a_data_file_or_table_array_listed_as_json_is_refused(roots, tmp_path):
    root = tmp_path / "d"
    compact_copy(roots["files"][0], root)
    p = root / MANIFEST_NAME
    doc = json.loads(p.read_text())
    first = Manifest.load(roots["files"][0]).data_files[0]
    for path, role, match in ((first.path, "labels", "is a data file"),
                              ("x.npy", "data", "is a data file|must tile"),
                              (f"{TABLE_DIR}/bytes.npy", "index", "the table's own folder")):
        bad = {**doc, "files": doc["files"] + [{"path": path, "bytes": 1, "sha256": "",
                                                "first_sample": -1, "num_samples": 0,
                                                "role": role}]}
        p.write_text(json.dumps(bad))
        with pytest.raises(DatasetError, match=match):
            Manifest.load(root)


def test_a_folder_linked_outside_is_refused(roots, tmp_path, monkeypatch):
    root = tmp_path / "d"
    m = compact_copy(roots["npz"][0], root)
    outside = tmp_path / "outside"
    shutil.move(root / m.compact.dirs[0], outside)
    os.symlink(outside, root / m.compact.dirs[0])
    for limit in (manifest.CONTAINMENT_FILES, 3):  # each file checked, or each folder
        monkeypatch.setattr(manifest, "CONTAINMENT_FILES", limit)
        with pytest.raises(DatasetError, match="outside the dataset"):
            Manifest.load(root)


@pytest.mark.parametrize(("array", "value", "match"), [
    ("bytes", np.zeros(3, dtype=np.int64), "holds int64"),
    ("sha256", np.zeros((1, 31), dtype=np.uint8), "holds uint8"),
    ("dir", None, "is missing"),
])
def test_a_wrong_or_missing_side_array_is_refused_at_load(roots, tmp_path, array, value, match):
    root = tmp_path / "d"
    compact_copy(roots["npz"][0], root)
    path = root / TABLE_DIR / f"{array}.npy"
    path.unlink()
    if value is not None:
        np.save(path, value)
    with pytest.raises(DatasetError, match=match):
        Manifest.load(root)


def test_a_folder_index_out_of_range_fails_naming_the_table(roots, tmp_path):
    root = tmp_path / "d"
    m = compact_copy(roots["files"][0], root)
    dirs = np.load(root / TABLE_DIR / "dir.npy")
    dirs[4] = len(m.compact.dirs)
    np.save(root / TABLE_DIR / "dir.npy", dirs)
    with pytest.raises(DatasetError, match="dir.npy names a folder outside"):
        Manifest.load(root)  # up to CONTAINMENT_FILES files, each is checked at load


def test_beyond_the_containment_limit_a_bad_row_fails_when_read(roots, tmp_path, monkeypatch):
    root = tmp_path / "d"
    m = compact_copy(roots["files"][0], root)
    dirs = np.load(root / TABLE_DIR / "dir.npy")
    dirs[4] = len(m.compact.dirs)
    np.save(root / TABLE_DIR / "dir.npy", dirs)
    monkeypatch.setattr(manifest, "CONTAINMENT_FILES", 3)
    m = Manifest.load(root)  # folders checked, not each row: loading stays O(folders)
    assert m.files[3].path
    for read in (lambda: m.files[4], lambda: list(m.data_files),
                 lambda: manifest.DataPaths(m.root, m.compact)[4],
                 lambda: manifest.DataPaths(m.root, m.compact).at(np.arange(2, 6))):
        with pytest.raises(DatasetError, match="dir.npy names a folder outside"):
            read()


def test_version_1_manifests_stay_readable_and_version_2_needs_its_table(roots, tmp_path):
    root = tmp_path / "d"
    compact_copy(roots["npz"][0], root)
    p = root / MANIFEST_NAME
    doc = json.loads(p.read_text())
    p.write_text(json.dumps({**doc, "schema_version": 1}))
    with pytest.raises(DatasetError, match="has no a compact|schema_version 1"):
        Manifest.load(root)
    del doc["table"]
    p.write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match="needs a compact file table"):
        Manifest.load(root)


# ------------------------------------------------------------------ orders and shares

@pytest.mark.parametrize("mode", sampling.SHUFFLES)
def test_orders_are_the_int64_permutation_of_before(mode):
    """Built in int32, the order is the one the int64 code gave for the same seed."""
    n, world = 10_007, 3
    for seed, epoch in ((0, 0), (5, 2)):
        ref = np.arange(n, dtype=np.int64)
        if mode == "global":
            ref = np.random.default_rng([seed, epoch, 0x5EED]).permutation(ref)
        elif mode == "block":
            ref = sampling.epoch_order(ref, mode, seed, epoch, 64, 4)
        got = np.concatenate([sampling.rank_indices(n, mode, seed, epoch, r, world, 64, 4)
                              for r in range(world)])
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, ref[:n // world * world])


def test_rank_count_is_the_length_of_every_rank_order():
    ranges = [(a, min(10, 1003 - a)) for a in range(0, 1003, 10)]
    for scope, fr in (("global", None), ("local", ranges),
                      ("local", sampling.FileRanges(1003, samples_per_file=10))):
        for world in (1, 2, 7):
            want = sampling.rank_count(1003, world, file_ranges=fr, scope=scope)
            for mode in sampling.SHUFFLES:
                for r in range(world):
                    assert len(sampling.rank_indices(1003, mode, 1, 2, r, world, 8, 2,
                                                     file_ranges=fr, scope=scope)) == want


def test_local_scope_from_samples_per_file_equals_the_list_of_ranges():
    for n, k, world in ((1000, 1, 7), (1003, 10, 4), (64, 16, 4), (65, 16, 3)):
        listed = [(a, min(k, n - a)) for a in range(0, n, k)]
        arith = sampling.FileRanges(n, samples_per_file=k)
        for r in range(world):
            a = sampling.rank_indices(n, "global", 9, 1, r, world, file_ranges=listed,
                                      scope="local")
            b = sampling.rank_indices(n, "global", 9, 1, r, world, file_ranges=arith,
                                      scope="local")
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("scope", sampling.SCOPES)
def test_each_node_file_is_evicted_by_exactly_one_local_rank(roots, scope):
    src, dst = roots["files"]
    old, new = Manifest.load(src), Manifest.load(dst)
    world = 6
    for ranks in ([0], [0, 1], [1, 3, 5]):
        shares = [cache.rank_share(new, ranks, i, world, scope) for i in range(len(ranks))]
        assert all(isinstance(s, cache.FileShare) for s in shares)
        got = sorted(e.path for s in shares for e in s)
        want = sorted(e.path for e in cache.files_for_node(old, ranks, world, scope))
        assert got == want  # the node's files, each once
        for s in shares:
            assert [str(p) for p in cache.share_paths(new, s)] == \
                [str(new.root / e.path) for e in s]


def test_eviction_of_a_compact_dataset_reports_every_file(roots):
    from iobench.core.world import World

    new = Manifest.load(roots["npz"][1])
    rep = cache.evict_for_node(new, World(), cache.EvictOptions(loud=False))
    assert rep.files == len(new.files) and rep.bytes == new.total_bytes


def test_stage_copies_a_compact_dataset_and_its_table(roots, tmp_path):
    from conftest import cli

    src = tmp_path / "src" / "cifar10-npz"
    compact_copy(roots["npz"][0], src)
    assert cli("stage", "--dataset", "cifar10", "--format", "npz", "--from", tmp_path / "src",
               "--to", tmp_path / "dst", "--results", tmp_path / "res", "--no-progress") == 0
    staged = Manifest.load(tmp_path / "dst" / "cifar10-npz")
    assert staged.compact is not None and staged.files == Manifest.load(src).files


def test_preflight_checks_a_compact_dataset(roots, tmp_path, capsys):
    from conftest import cli

    root = roots["npz"][1]
    assert cli("preflight", "--storage", root, "--stage-to", tmp_path / "fast") == 0
    out = capsys.readouterr().out
    assert "files" in out and "eviction" in out


def test_the_dataset_version_covers_a_compact_manifests_tables(roots, tmp_path):
    """preflight's `version` hashes the side tables too: a node whose table differs (an
    older or half-copied copy) differs even when its iobench.json is the same bytes."""
    import hashlib

    from iobench.core.manifest import TABLE_DIR
    from iobench.workflows.preflight import dataset_sha256

    src, compact = roots["npz"]
    plain = hashlib.sha256((src / "iobench.json").read_bytes()).hexdigest()
    assert dataset_sha256(src, Manifest.load(src)) == plain  # version 1: the JSON alone
    copy = tmp_path / "copy"
    shutil.copytree(compact, copy)
    before = dataset_sha256(copy, Manifest.load(copy))
    assert before == dataset_sha256(compact, Manifest.load(compact))
    table = copy / TABLE_DIR / "sha256.npy"
    data = bytearray(table.read_bytes())
    data[-1] ^= 0xFF  # one checksum byte of the last file
    table.write_bytes(bytes(data))
    assert (copy / "iobench.json").read_bytes() == (compact / "iobench.json").read_bytes()
    assert dataset_sha256(copy, Manifest.load(copy)) != before
