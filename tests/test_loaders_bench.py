"""`iobench bench-read`: the grid runs on a tiny dataset, the table and JSON hold every figure,
bad command lines fail with one line. (No timing assertions: figures come from idle runs.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from iobench.generators import GenerateConfig, generate_dataset

    root = tmp_path_factory.mktemp("bench")
    generate_dataset(GenerateConfig(dataset="cifar10", format="hdf5", storage=root,
                                    samples=48, samples_per_file=16, seed=1))
    generate_dataset(GenerateConfig(dataset="cifar10", format="lmdb", storage=root,
                                    samples=48, samples_per_file=16, seed=1))
    return root


def test_grid_table_and_result_document(storage, tmp_path, capsys):
    rc = cli("bench-read", "--storage", storage, "--dataset", "cifar10", "--format", "hdf5",
             "--loaders", "hdf5", "--workers", "0,1", "--shuffle", "global,block",
             "--batch-size", "8", "--epochs", "2", "--results", tmp_path)
    out = capsys.readouterr().out
    assert rc == 0
    assert "| loader | workers | shuffle | samples/s | MB/s |" in out
    docs = list(tmp_path.glob("bench-read-*.json"))
    assert len(docs) == 1
    doc = json.loads(docs[0].read_text())
    assert doc["schema"] == "iobench.bench_read" and doc["schema_version"] == 1
    rows = doc["rows"]
    # per worker count: the naive baseline, then hdf5 x (global, block)
    assert [(r["loader"], r["workers"], r["shuffle"]) for r in rows] == [
        ("naive-h5py", 0, "global"), ("hdf5", 0, "global"), ("hdf5", 0, "block"),
        ("naive-h5py", 1, "global"), ("hdf5", 1, "global"), ("hdf5", 1, "block")]
    for r in rows:
        assert r["samples"] == 2 * 48  # two epochs, all samples (one rank)
        assert r["batch_bytes"] == 2 * 48 * 32 * 32 * 3
        assert r["samples_per_s"] > 0 and r["read_MBps"] > 0
        assert r["wait_p50_s"] <= r["wait_p95_s"] <= r["wait_p99_s"] <= r["wait_max_s"]
        assert r["first_batch_s"] > 0
        assert r["vs_naive"] > 0
        frac = r["cache_resident_fraction_at_start"]
        assert frac is None or 0.0 <= frac <= 1.0
        assert len(r["per_epoch"]) == 2
        assert r["per_epoch"][0]["cache"]["method"] == "fadvise"
        assert r["loader"] in out
    assert rows[0]["vs_naive"] == pytest.approx(1.0)
    assert not doc["dd"]["available"] and "average" in doc["dd"]["why"]  # 49 kB files
    assert doc["dataset"]["num_samples"] == 48
    assert "versions" in doc["provenance"]


def test_other_format_uses_the_hdf5_copy_for_the_baseline(storage, capsys):
    rc = cli("bench-read", "--storage", storage, "--dataset", "cifar10", "--format", "lmdb",
             "--loaders", "lmdb", "--workers", "0", "--shuffle", "none", "--batch-size", "16",
             "--no-decode", "--warm-cache", "--no-dd")
    out = capsys.readouterr().out
    assert rc == 0
    assert "| naive-h5py | 0 | global |" in out and "| lmdb | 0 | none |" in out
    assert "dd (" not in out


def test_dd_reference_on_large_files(tmp_path, capsys):
    from iobench.generators import GenerateConfig, generate_dataset

    generate_dataset(GenerateConfig(dataset="cosmoflow", format="hdf5", storage=tmp_path,
                                    samples=2, samples_per_file=1, seed=1))
    rc = cli("bench-read", "--storage", tmp_path, "--dataset", "cosmoflow", "--format", "hdf5",
             "--loaders", "hdf5", "--workers", "0", "--shuffle", "none", "--batch-size", "1",
             "--no-decode", "--no-naive", "--results", tmp_path / "r")
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(next((tmp_path / "r").glob("*.json")).read_text())
    dd = doc["dd"]
    assert dd["available"] and dd["files"] == 2 and dd["bytes"] == sum(
        f.stat().st_size for f in (tmp_path / "cosmoflow-hdf5").glob("part-*.h5"))
    assert dd["MBps"] > 0 and dd["mode"].startswith(("direct", "buffered"))
    row = doc["rows"][0]
    assert row["vs_dd"] == pytest.approx(row["read_MBps"] / dd["MBps"])
    assert row["vs_naive"] is None and "| hdf5 | 0 | none |" in out and "dd (" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "two"], "--workers 'two': expected comma-separated integers"),
    (["--loaders", "tfrecord"], "unknown loader 'tfrecord'"),
    (["--shuffle", "random"], "unknown shuffle 'random'"),
    (["--batch-size", "0"], "batch_size=0"),
])
def test_bad_options_fail_with_one_line(storage, capsys, args, message):
    base = ["--storage", storage, "--dataset", "cifar10", "--format", "hdf5"]
    assert cli("bench-read", *base, *args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_missing_dataset_names_the_directory(tmp_path, capsys):
    assert cli("bench-read", "--storage", tmp_path, "--dataset", "cosmoflow",
               "--format", "netcdf") == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "cosmoflow-netcdf") in err
