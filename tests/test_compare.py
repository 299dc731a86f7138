"""`iobench compare`: table rows and ratios, the PNG plot, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train import factory, make_npy_dataset

from conftest import cli
from iobench import compare, results
from iobench.train import TrainConfig, run
from iobench.world import World


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, list[Path]]:
    storage = tmp_path_factory.mktemp("cmp-storage")
    make_npy_dataset(storage, n=128)
    out = tmp_path_factory.mktemp("cmp-results")
    paths = []
    for delay in (0.0, 0.01):  # the second "storage" is slower: 10 ms per batch
        cfg = TrainConfig(loader="hdf5", storage=str(storage), epochs=2, batch_size=32,
                          workers=0, compute_time_s=0.005, results=str(out))
        paths.append(results.write_result(run(cfg, factory(delay), World()), out))
    return out, paths


def test_rows_and_ratios(two_runs) -> None:
    _, paths = two_runs
    docs = [results.load_result(p) for p in paths]
    rows = compare.comparison_rows(docs)
    assert len(rows) == 4 and [r["run"] for r in rows] == [0, 0, 1, 1]
    assert all(r["stall_vs_first"] == pytest.approx(1.0) for r in rows[:2])
    for r in rows[2:]:
        base = docs[0]["epochs"][r["epoch"]]["summary"]["stall_s_max"]
        assert r["stall_vs_first"] == pytest.approx(r["stall_s"] / base)
        assert r["stall_s"] >= 0.01 * 4  # four batches, 10 ms injected each
    assert "emulated 0.005 s" in rows[0]["label"]
    # identical labels get the run id's tail to tell them apart
    assert rows[0]["label"] != rows[2]["label"]


def test_cli_table_and_png(two_runs, tmp_path: Path, capsys) -> None:
    out, paths = two_runs
    png = tmp_path / "plots" / "stall.png"
    assert cli("compare", str(paths[0]), str(paths[1]), "--plot", str(png)) == 0
    text = capsys.readouterr().out
    for col in ("stall s", "stall %", "AU", "samples/s", "MB/s", "×run1"):
        assert col in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert cli("compare", str(out)) == 0  # a directory of results
    assert "run 2:" in capsys.readouterr().out


@pytest.mark.parametrize("make,needle", [
    (lambda d: d / "missing.json", "no result file or directory"),
    (lambda d: (d / "x.json").write_text('{"schema": "iobench.manifest", "schema_version": 1}')
     and d / "x.json", "not an iobench 'iobench.result' document"),
    (lambda d: (d / "y.json").write_text("{oops") and d / "y.json", "not valid JSON"),
    (lambda d: d, "holds no iobench result files"),
])
def test_cli_bad_input_one_line(tmp_path: Path, capsys, make, needle) -> None:
    target = make(tmp_path)
    assert cli("compare", str(target)) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_cli_plot_needs_png(two_runs, capsys) -> None:
    _, paths = two_runs
    assert cli("compare", str(paths[0]), "--plot", "out.pdf") != 0
    assert "ending in .png" in capsys.readouterr().err


def test_accuracy_plot(two_runs, tmp_path: Path, capsys) -> None:
    out, paths = two_runs
    # the emulated runs have no model: a clear error, not an empty plot
    assert cli("compare", str(paths[0]), "--accuracy-plot", str(tmp_path / "a.png")) != 0
    assert "no run trained a real model" in capsys.readouterr().err
    storage = tmp_path / "s"
    make_npy_dataset(storage, n=128)
    cfg = TrainConfig(loader="hdf5", storage=str(storage), epochs=3, batch_size=32, workers=0,
                      model="cnn", results=str(tmp_path / "r"))
    model_run = results.write_result(run(cfg, factory(), World()), tmp_path / "r")
    png = tmp_path / "acc.png"
    assert cli("compare", str(model_run), str(paths[0]), "--accuracy-plot", str(png)) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "train acc" in capsys.readouterr().out


def test_break_even_of_staging_follows_metrics():
    from iobench.compare import break_even

    def doc(walls, staging=None):
        return {"epochs": [{"summary": {"wall_s": w}} for w in walls], "staging": staging}

    in_place = doc([10.0, 12.0])  # mean epoch 11 s
    staged = doc([6.0, 6.0], {"stage_s": 15.0, "stage_bytes": 10**9, "stage_MBps": 66.7})
    slower = doc([12.0, 12.0], {"stage_s": 1.0, "stage_bytes": 1, "stage_MBps": 1.0})
    rows = break_even([in_place, staged, slower])
    assert [r["run"] for r in rows] == [1, 2]
    assert rows[0]["break_even_epochs"] == 15.0 / (11.0 - 6.0)
    assert rows[1]["break_even_epochs"] is None  # staging never pays
