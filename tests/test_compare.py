"""`iobench compare`: table rows and ratios, the PNG plot, bad input, staging break-even, repeats."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_report import make_npy_dataset as make_checked_dataset
from test_report import with_repeats
from test_train import Factory, make_npy_dataset

from conftest import cli
from iobench.core import breakeven, results
from iobench.core.world import World
from iobench.workflows import compare
from iobench.workflows.stage import stage_for_training
from iobench.workflows.train import TrainConfig, run


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, list[Path]]:
    storage = tmp_path_factory.mktemp("cmp-storage")
    make_npy_dataset(storage, n=128)
    out = tmp_path_factory.mktemp("cmp-results")
    paths = []
    for delay in (0.0, 0.01):  # the second "storage" is slower: 10 ms per batch
        cfg = TrainConfig(loader="hdf5", storage=str(storage), epochs=2, batch_size=32,
                          workers=0, compute_time_s=0.005, results=str(out))
        paths.append(results.write_result(run(cfg, Factory(delay), World()), out))
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
    (lambda d: d, "holds no iobench training results"),
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
    model_run = results.write_result(run(cfg, Factory(), World()), tmp_path / "r")
    png = tmp_path / "acc.png"
    assert cli("compare", str(model_run), str(paths[0]), "--accuracy-plot", str(png)) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "train acc" in capsys.readouterr().out


# ------------------------------------------------------------------ staging break-even

def _train(storage: Path, out: Path, delay_s: float, stage_to: Path | None = None,
           **kw: Any) -> tuple[Path, dict]:
    """A real run (as `iobench train [--stage-to]` does it), written and read back."""
    cfg = TrainConfig(**{"loader": "hdf5", "storage": str(storage), "epochs": 2,
                         "batch_size": 32, "workers": 0, "compute_time_s": 0.002,
                         "results": str(out), **kw})
    staging = None
    if stage_to is not None:
        cfg, staging = stage_for_training(cfg, stage_to, "replicate", World())
    doc = run(cfg, Factory(delay_s), World())
    if staging:
        doc["staging"] = {**staging, "time_to_solution_s": staging["stage_s"]
                          + doc["summary"]["wall_s"]}
    path = results.write_result(doc, out)
    return path, results.load_result(path)


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Real runs: in place on `slow`, staged to `fast` (`--stage-to`), staged again to
    `fast` (resumed: the copy is there), and an in-place run with another batch size."""
    base = tmp_path_factory.mktemp("cmp-staging")
    slow, out = base / "slow", base / "results"
    slow.mkdir()
    make_checked_dataset(slow)  # real checksums: staging verifies them
    return {"in_place": _train(slow, out, 0.02),
            "staged": _train(slow, out, 0.0, stage_to=base / "fast"),
            "resumed": _train(slow, out, 0.0, stage_to=base / "fast"),
            "batch16": _train(slow, out, 0.02, batch_size=16)}


def _walls(doc: dict, walls: list[float], tmp_path: Path) -> tuple[Path, dict]:
    """`doc` with its epoch walls set (no timing left to chance), written for the CLI."""
    d = with_repeats(doc, [walls], "w", tagged=False)
    return results.write_result(copy.deepcopy(d), tmp_path), d


def _text(docs: list[dict]) -> str:
    console = Console(record=True, width=250, highlight=False)
    compare.render_table(docs, console=console)
    return console.export_text()


def test_break_even_pairs_the_source_run_whatever_the_order(staged, tmp_path) -> None:
    p_in, in_place = _walls(staged["in_place"][1], [2.0, 3.0], tmp_path)
    p_st, st = _walls(staged["staged"][1], [0.5, 0.5], tmp_path)
    for docs in ([in_place, st], [st, in_place]):  # staged first: still the slow/fast pair
        (row,) = breakeven.staging_pairs(docs)
        assert row["slow_run_id"] == in_place["run_id"] and row["fast_run_id"] == st["run_id"]
        assert row["refused"] is None and (row["epoch_slow_s"], row["epoch_fast_s"]) == (2.5, 0.5)
        assert row["break_even_epochs"] == pytest.approx(st["staging"]["stage_s"] / 2.0)
    assert cli("compare", p_st, p_in) == 0
    line = _text([st, in_place]).splitlines()[-1]
    assert line.startswith("staging (run 1):")
    assert f"in place (run 2): pays for itself after {st['staging']['stage_s'] / 2:.2f}" in line


@pytest.mark.parametrize("other, needle", [
    ("batch16", "batch_size 16 vs 32"),
    ("other_dataset", "dataset imagenet vs cifar10"),
])
def test_incomparable_runs_are_refused_with_the_reason(staged, capsys, other, needle) -> None:
    if other == "other_dataset":
        doc = copy.deepcopy(staged["in_place"][1])
        doc["dataset"]["dataset"] = "imagenet"
    else:
        doc = staged[other][1]
    st = staged["staged"][1]
    (row,) = breakeven.staging_pairs([st, doc])
    assert row["break_even_epochs"] is None and needle in row["refused"]
    assert "not computed" in breakeven.break_even_text(row)
    (line,) = [ln for ln in _text([st, doc]).splitlines() if ln.startswith("staging")]
    assert "break-even vs run 2 not computed: runs not comparable" in line and needle in line


def test_staging_that_does_not_pay_says_never(staged, tmp_path, capsys) -> None:
    p_in, in_place = _walls(staged["in_place"][1], [1.0, 1.0], tmp_path)
    p_sl, slower = _walls(staged["staged"][1], [1.5, 1.0], tmp_path)  # the copy is slower
    (row,) = breakeven.staging_pairs([in_place, slower])
    assert row["break_even_epochs"] == math.inf
    assert breakeven.break_even_text(row) == "never"
    assert breakeven.jsonable_break_even(row["break_even_epochs"]) == "never"
    assert cli("compare", p_in, p_sl) == 0
    assert "never pays for itself" in capsys.readouterr().out


def test_resumed_staging_is_no_staging_cost(staged) -> None:
    resumed = staged["resumed"][1]
    assert resumed["staging"]["skipped_files"] > 0  # the copy was already there
    (row,) = breakeven.staging_pairs([staged["in_place"][1], resumed])
    assert row["break_even_epochs"] is None and row["refused"] is None
    assert "resumed" in breakeven.break_even_text(row)


def test_staged_run_without_its_source_run_says_so(staged) -> None:
    (row,) = breakeven.staging_pairs([staged["staged"][1]])
    assert row["break_even_epochs"] is None and row["refused"].startswith("no in-place run of")


# --------------------------------------------------------------------------- repeats

@pytest.fixture(scope="module")
def repeated(two_runs) -> list[dict]:
    base = results.load_result(two_runs[1][0])
    return [with_repeats(base, [[1.0, 1.0], [1.2, 1.2], [1.4, 1.4]], "a"),
            with_repeats(base, [[1.1, 1.1], [1.3, 1.3], [1.5, 1.5]], "b"),  # within a's spread
            with_repeats(base, [[3.0, 3.0], [3.1, 3.1], [3.2, 3.2]], "c")]  # far outside


def test_repeats_show_medians_and_mark_not_significant(repeated, tmp_path) -> None:
    samples = repeated[0]["epochs"][0]["summary"]["samples"]
    rows = compare.run_rows(repeated)
    assert [r["repeats"] for r in rows] == [3, 3, 3]
    a = rows[0]["spread"]
    assert (a["epoch_wall_s"]["median"], a["epoch_wall_s"]["min"], a["epoch_wall_s"]["max"]) \
        == pytest.approx((1.2, 1.0, 1.4))
    assert a["stall_s"]["median"] == pytest.approx(0.6)
    assert a["samples_per_s"]["median"] == pytest.approx(samples / 1.2)
    assert rows[1]["differs"]["epoch_wall_s"] is False
    assert rows[2]["differs"]["epoch_wall_s"] is True
    assert rows[2]["samples_per_s_vs_first"] == pytest.approx(1.2 / 3.1)
    text = _text(repeated)
    (wall_line,) = [ln for ln in text.splitlines() if "epoch s" in ln]
    assert "1.2 [1-1.4]" in wall_line and "1.3 [1.1-1.5] n.s." in wall_line
    assert "3.1 [3-3.2]" in wall_line and "3.1 [3-3.2] n.s." not in wall_line
    assert "significance unknown" not in text
    # the per-epoch table keeps repetitions apart: run 1 vs itself is 1.0 in every row
    rows = compare.comparison_rows(repeated)
    assert len({(r["repeat"], r["epoch"]) for r in rows if r["run"] == 0}) == 6
    assert all(r["stall_vs_first"] == pytest.approx(1.0) for r in rows if r["run"] == 0)
    paths = [results.write_result(copy.deepcopy(d), tmp_path) for d in repeated]
    png = tmp_path / "stall.png"
    assert cli("compare", *paths, "--plot", png) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_single_passes_say_significance_is_unknown(two_runs) -> None:
    docs = [results.load_result(p) for p in two_runs[1]]  # v1 results: one repetition each
    rows = compare.run_rows(docs)
    assert [r["repeats"] for r in rows] == [1, 1]
    assert all(v is None for v in rows[1]["differs"].values())
    assert rows[0]["spread"]["epoch_wall_s"]["median"] == pytest.approx(
        sum(e["summary"]["wall_s"] for e in docs[0]["epochs"]) / 2)
    text = _text(docs)
    assert "run 2 vs run 1: significance unknown (single passes" in text
    assert not [ln for ln in text.splitlines() if ln.startswith("│") and "n.s." in ln]


def test_repeated_staging_break_even_from_medians(staged, repeated) -> None:
    in_place, st = staged["in_place"][1], staged["staged"][1]
    slow = with_repeats(in_place, [[3.0, 3.0], [3.5, 3.5], [4.0, 4.0]], "slow")
    fast = with_repeats(st, [[1.0, 1.0], [1.5, 1.5], [1.2, 1.2]], "fast")
    stage = {"median": 4.0, "min": 3.0, "max": 6.0, "cv": 0.3, "n": 3, "values": [3.0, 4.0, 6.0]}
    fast["staging"]["repeats"] = 3
    fast["staging"]["spread"] = {"stage_s": stage, "stage_MBps": None}
    (row,) = breakeven.staging_pairs([fast, slow])
    assert row["break_even_epochs"] == pytest.approx(4.0 / (3.5 - 1.2))
    assert row["significant"] is True and row["stage_spread"] == stage
    line = compare.staging_line(row, {slow["run_id"]: 2, fast["run_id"]: 1})
    assert "in 4 [3-6] s" in line and "1.2 [1-1.5] s staged vs 3.5 [3-4] s in place" in line
    # epoch times within their spread: the break-even is marked not significant
    close = with_repeats(in_place, [[1.1, 1.1], [1.3, 1.3], [1.6, 1.6]], "close")
    (row,) = breakeven.staging_pairs([close, fast])
    assert row["significant"] is False and "n.s." in breakeven.break_even_text(row)


def test_a_results_folder_as_users_fill_it(tmp_path, capsys):
    """The README's main job: stage and train results (and other documents) in one folder
    and its sub-folders; `compare` uses the staging for the break-even, skips the rest."""
    src, dst, res = tmp_path / "pfs", tmp_path / "nvme", tmp_path / "res"
    assert cli("generate", "--dataset", "cifar10", "--samples", "256", "--storage", src) == 0
    assert cli("stage", "--dataset", "cifar10", "--format", "hdf5", "--from", src, "--to", dst,
               "--results", res) == 0
    for storage, out in ((src, res / "in-place"), (dst, res)):
        assert cli("train", "--loader", "hdf5", "--storage", storage, "--model", "none",
                   "--epochs", "1", "--workers", "0", "--results", out) == 0
    assert cli("bench-read", "--storage", src, "--dataset", "cifar10", "--format", "hdf5",
               "--workers", "0", "--shuffle", "none", "--no-naive", "--no-dd",
               "--results", res) == 0
    capsys.readouterr()
    assert cli("compare", res) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "run 2:" in out and "skipped" in out and "iobench.bench_read" in out
    assert "in place (run" in out and "pays for itself" in out  # the stage result was paired
    globbed = sorted(str(p) for p in res.glob("*.json"))  # the shell's `res/*.json`
    assert cli("compare", *globbed, res / "in-place") == 0
