"""`iobench compare` and `iobench report` read `iobench checkpoint` results: write and read GB/s side by side per tier.

Two small real DCP runs (the `cnn` layout, 2 checkpoints each) on two storage folders (the
test's temporary folder, and /dev/shm where there is one: another filesystem), then compare
and report on their result documents, alone and beside what else a results folder holds.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from conftest import cli, run_cmd


@pytest.fixture(scope="module")
def two_tiers(tmp_path_factory) -> tuple[Path, list[Path], list[Path]]:
    """The results folder of two checkpoint runs, their documents and storage folders."""
    base = tmp_path_factory.mktemp("ckres")
    shm = Path("/dev/shm")
    other = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else base / "other"
    other.mkdir(exist_ok=True)
    storages = [base / "local", other]
    res = base / "res"
    for s in storages:
        s.mkdir(exist_ok=True)
        out = run_cmd("checkpoint", "--storage", s, "--model", "cnn", "--repeat", "2",
                      "--results", res, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    docs = sorted(res.glob("checkpoint-*.json"), key=lambda p: json.loads(p.read_text())["created"])
    assert len(docs) == 2
    yield res, docs, storages
    if other.parent == shm:
        import shutil

        shutil.rmtree(other, ignore_errors=True)


def test_compare_puts_checkpoint_results_side_by_side(two_tiers, capsys) -> None:
    res, docs, storages = two_tiers
    for given in ([res], docs):  # a results folder, or the documents named
        assert cli("compare", *given) == 0
        out = capsys.readouterr().out
        assert "checkpoints, write then cold read" in out
        assert "slowest rank" in out and "×run1" in out
        assert out.count("cnn, 1 rank(s)") == 2  # one row per run, both tiers
    from iobench.workflows.checkpoint import load_result, side_by_side

    tiers = [r["tier"] for r in side_by_side([load_result(p) for p in docs])]
    assert [t.split(" (")[0] for t in tiers] == [str(s) for s in storages]


def test_compare_table_figures_are_the_documents(two_tiers) -> None:
    from iobench.workflows.checkpoint import load_result, side_by_side, side_by_side_cells

    _, docs, _ = two_tiers
    loaded = [load_result(p) for p in docs]
    rows = side_by_side(loaded)
    for row, doc in zip(rows, loaded, strict=True):
        w = [x["throughput_GBps"] for x in doc["writes"]]
        assert row["write"]["throughput_GBps"]["values"] == w
        assert row["read"]["duration_s"]["max"] == max(x["duration_s"] for x in doc["reads"])
        assert row["read"]["rank_GBps_min"]["min"] == min(x["rank_GBps_min"] for x in doc["reads"])
    assert rows[0]["write_vs_first"] == 1.0
    assert rows[1]["read_vs_first"] == pytest.approx(
        rows[1]["read"]["throughput_GBps"]["median"] / rows[0]["read"]["throughput_GBps"]["median"])
    assert len(side_by_side_cells(rows[0])) == 13


def test_report_holds_a_checkpoint_table(two_tiers, tmp_path: Path) -> None:
    res, _, storages = two_tiers
    out = tmp_path / "r.md"
    assert cli("report", res, "--out", out) == 0
    text = out.read_text()
    assert "## Checkpoints: write, then cold read" in text
    table = text.split("## Checkpoints: write, then cold read", 1)[1]
    for s in storages:
        assert str(s) in table


def test_plots_need_training_runs(two_tiers, tmp_path: Path, capsys) -> None:
    res, _, _ = two_tiers
    assert cli("compare", res, "--plot", tmp_path / "p.png") == 2
    assert "training runs" in capsys.readouterr().err
