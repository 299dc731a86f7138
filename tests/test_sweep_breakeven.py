"""The staging break-even a sweep reports: a number only where the two epoch times differ by
more than their measured spread, else `not significant` in its output and its record."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from test_report import results_dir, with_repeats  # noqa: F401 (a fixture)

from iobench.core import breakeven, results
from iobench.core.result_types import SweepDoc
from iobench.workflows import report
from iobench.workflows.sweep import parse_sweep, staging_answers


def _results(src: Path, out: Path, slow: list[list[float]], fast: list[list[float]],
              tagged: bool) -> Path:
    """`src`'s probes and staging, with its 0-worker runs in place (`slow`) and on the copy
    (`fast`) given these epoch walls (a list per repetition)."""
    out.mkdir()
    for p in [*src.glob("probe-*.json"), *src.glob("stage-*.json")]:
        shutil.copy(p, out)
    col = report.load_directory(src)
    run_of = {(Path(r.config.storage).name, r.config.workers): r.to_dict() for r in col.runs}
    results.write_result(with_repeats(run_of["slow", 0], slow, "slow", tagged), out)
    results.write_result(with_repeats(run_of["fast", 0], fast, "fast", tagged), out)
    return out


def _sweep(src: Path):
    root = src.parent
    return parse_sweep({"datasets": ["cifar10"], "results": str(src),
                        "tiers": [{"name": "pfs", "path": str(root / "slow"),
                                   "stage_to": str(root / "fast"), "stage_name": "nvme"}]})


def test_single_passes_within_their_epochs_spread_are_not_significant(results_dir, tmp_path):  # noqa: F811
    """The sweep's case: single passes, 0.39 s against 0.38 s per epoch, while each run's
    cold epochs vary by 0.06 s: no break-even number, `not significant`."""
    res = _results(results_dir, tmp_path / "res", [[0.36, 0.42]], [[0.35, 0.41]], tagged=False)
    col = report.load_directory(res)
    (row,) = [s for s in report.staging_rows(col) if s["run"]]
    assert row["epoch_slow_s"] == pytest.approx(0.39) and row["epoch_fast_s"] == pytest.approx(0.38)
    assert row["significant"] is False and row["spread_over"] == "epochs"
    assert breakeven.outcome(row) == "not significant"
    text = breakeven.break_even_text(row)
    assert text.startswith("n.s.") and f"{row['break_even_epochs']:.2f}" not in text

    lines: list[str] = []
    answers = staging_answers(res, _sweep(results_dir), lines.append)
    (answer,) = [a for a in answers if a["run"]]
    assert answer["outcome"] == "not significant" and answer["break_even_epochs"] is None
    assert (answer["from"], answer["to"]) == ("pfs", "nvme")
    (line,) = [ln for ln in lines if "0 workers" in ln]
    assert line.startswith("[break-even] cifar10-hdf5 pfs -> nvme (hdf5, 0 workers")
    assert "not significant" in line and not re.search(r"after [\d.]+ epochs", line)
    # the sweep record holds them, typed
    doc = SweepDoc.from_dict({"schema": "iobench.sweep", "schema_version": 1,
                              "break_evens": answers})
    assert [b.outcome for b in doc.break_evens if b.run] == ["not significant"]


def test_repetitions_within_their_spread_are_not_significant(results_dir, tmp_path):  # noqa: F811
    res = _results(results_dir, tmp_path / "res", [[0.39, 0.39], [0.30, 0.30], [0.45, 0.45]],
                   [[0.38, 0.38], [0.33, 0.33], [0.40, 0.40]], tagged=True)
    (row,) = [s for s in report.staging_rows(report.load_directory(res)) if s["run"]]
    assert row["significant"] is False and row["spread_over"] == "repetitions"
    (answer,) = [a for a in staging_answers(res, _sweep(results_dir), lambda s: None)
                 if a["run"]]
    assert answer["outcome"] == "not significant" and answer["break_even_epochs"] is None


def test_a_clear_gain_keeps_its_number(results_dir, tmp_path):  # noqa: F811
    res = _results(results_dir, tmp_path / "res", [[0.38, 0.40]], [[0.10, 0.12]], tagged=False)
    lines: list[str] = []
    (answer,) = [a for a in staging_answers(res, _sweep(results_dir), lines.append) if a["run"]]
    assert answer["outcome"] == "pays off" and answer["significant"] is True
    assert answer["break_even_epochs"] == pytest.approx(answer["stage_s"] / (0.39 - 0.11))
    assert any(f"pays for itself after {answer['break_even_epochs']:.2f} epochs" in ln
               for ln in lines)
