"""`iobench bench-read`: the grid runs on a tiny dataset, the table and JSON hold every figure,
bad command lines fail with one line. (No timing assertions: figures come from idle runs.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from iobench.workflows.generate import GenerateConfig, generate_dataset

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
    assert doc["schema"] == "iobench.bench_read" and doc["schema_version"] == 2
    rows = doc["rows"]
    # per worker count: the two naive baselines, then hdf5 x (global, block)
    assert [(r["loader"], r["workers"], r["shuffle"]) for r in rows] == [
        (loader, w, shuffle) for w in (0, 1) for loader, shuffle in [
            ("naive-h5py", "global"), ("naive-h5py-open-per-sample", "global"),
            ("hdf5", "global"), ("hdf5", "block")]]
    assert doc["baselines"] == {"vs_naive": "naive-h5py",
                                "vs_naive_open_per_sample": "naive-h5py-open-per-sample"}
    for r in rows:
        assert r["samples"] == 2 * 48  # two epochs, all samples (one rank)
        assert r["batch_bytes"] == 2 * 48 * 32 * 32 * 3
        assert r["samples_per_s"] > 0 and r["read_MBps"] > 0
        assert r["wait_p50_s"] <= r["wait_p95_s"] <= r["wait_p99_s"] <= r["wait_max_s"]
        assert r["first_batch_s"] > 0
        assert r["vs_naive"] > 0 and r["vs_naive_open_per_sample"] > 0
        assert r["repeat"] == 1 and r["spread"]["samples_per_s"]["n"] == 1
        assert r["significant"] == {"vs_naive": None, "vs_naive_open_per_sample": None}
        frac = r["cache_resident_fraction_at_start"]
        assert frac is None or 0.0 <= frac <= 1.0
        assert len(r["per_epoch"]) == 2
        assert r["per_epoch"][0]["cache"]["method"] == "fadvise"
        assert r["loader"] in out
    assert rows[0]["vs_naive"] == pytest.approx(1.0)
    assert rows[1]["vs_naive_open_per_sample"] == pytest.approx(1.0)
    assert rows[0]["vs_naive_open_per_sample"] == pytest.approx(
        rows[0]["samples_per_s"] / rows[1]["samples_per_s"])
    assert "| naive-h5py | 0 | global |" in out and "| base |" in out
    assert "x open-per-sample" in out and "[" not in out.split("\n\n")[0]  # no spread at N=1
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
    assert "| naive-h5py-open-per-sample | 0 | global |" in out
    assert "dd (" not in out


def test_dd_reference_on_large_files(tmp_path, capsys):
    from iobench.workflows.generate import GenerateConfig, generate_dataset

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
    assert row["vs_naive"] is None and row["vs_naive_open_per_sample"] is None
    assert "| hdf5 | 0 | none |" in out and "dd (" in out and "naive-h5py" not in out


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "two"], "--workers 'two': expected comma-separated integers"),
    (["--loaders", "tfrecord"], "unknown loader 'tfrecord'"),
    (["--shuffle", "random"], "unknown shuffle 'random'"),
    (["--batch-size", "0"], "batch_size=0"),
    (["--repeat", "0"], "--repeat 0: give the number of cold repetitions"),
    (["--repeat", "-2"], "--repeat -2: give the number of cold repetitions"),
    (["--repeat", "two"], "argument --repeat: invalid int value: 'two'"),
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


def test_repeat_interleaves_cold_repetitions_with_spread(storage, tmp_path, capsys):
    rc = cli("bench-read", "--storage", storage, "--dataset", "cifar10", "--format", "hdf5",
             "--loaders", "hdf5", "--workers", "0", "--shuffle", "global,block",
             "--batch-size", "8", "--repeat", "2", "--no-dd", "--results", tmp_path)
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert rc == 0
    doc = json.loads(next(tmp_path.glob("bench-read-*.json")).read_text())
    assert doc["config"]["repeat"] == 2
    # interleaved: repetition 1 of every cell, then repetition 2 of every cell
    progress = [line for line in err.splitlines() if line.startswith("bench-read: [")]
    cells = ["naive-h5py,", "naive-h5py-open-per-sample,", "hdf5, workers=0, shuffle=global",
             "hdf5, workers=0, shuffle=block"]
    assert len(progress) == 8
    for i, line in enumerate(progress):
        assert line.startswith(f"bench-read: [{i // 4 + 1}/2] {cells[i % 4]}"), progress
    rows = {r["loader"] + "/" + r["shuffle"]: r for r in doc["rows"]}
    base, open_ps = rows["naive-h5py/global"], rows["naive-h5py-open-per-sample/global"]
    for r in doc["rows"]:
        assert r["repeat"] == 2 and len(r["per_epoch"]) == 2
        assert [e["repeat"] for e in r["per_epoch"]] == [0, 1]
        assert all(e["cache"]["method"] == "fadvise" for e in r["per_epoch"])  # cold each time
        for k in ("samples_per_s", "read_MBps", "wait_p50_s", "wait_p99_s", "vs_naive",
                  "vs_naive_open_per_sample"):
            s = r["spread"][k]
            assert s["n"] == 2 and s["min"] <= s["median"] <= s["max"], (k, s)
            assert r[k] == pytest.approx(s["median"])  # headline stays the median
        # paired: repetition i against the same repetition of each baseline
        for key, b in (("vs_naive", base), ("vs_naive_open_per_sample", open_ps)):
            want = [a / c for a, c in zip(r["spread"]["samples_per_s"]["values"],
                                          b["spread"]["samples_per_s"]["values"], strict=True)]
            assert r["spread"][key]["values"] == pytest.approx(want)
            sig = not (r["spread"][key]["min"] <= 1.0 <= r["spread"][key]["max"])
            assert r["significant"][key] is sig
        assert r["samples"] == 48  # per repetition, not summed
    assert base["spread"]["vs_naive"]["values"] == [1.0, 1.0]
    table = out.split("\n\n")[0]
    hdf5_line = next(line for line in table.splitlines() if line.startswith("| hdf5 | 0 | block"))
    cells_ = [c.strip() for c in hdf5_line.strip("|").split("|")]
    assert "[" in cells_[3] and "-" in cells_[3]  # samples/s: median [min-max]
    for col, key in ((11, "vs_naive"), (12, "vs_naive_open_per_sample")):
        assert cells_[col].startswith(f"{rows['hdf5/block'][key]:.2f} [")
        assert cells_[col].endswith(" n.s.") == (rows["hdf5/block"]["significant"][key] is False)
    assert "2 cold repetitions of the grid, interleaved" in out
