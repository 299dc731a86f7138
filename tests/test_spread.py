"""Spread over repeats: the figures `--repeat N` reports, and when a difference is significant."""

from __future__ import annotations

import math

import pytest

from iobench.core.spread import differs, fmt_spread, spread, spread_of


def test_spread_figures() -> None:
    s = spread([3.0, 1.0, 2.0, None])
    assert s is not None
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert s["cv"] == pytest.approx(1.0 / 2.0)  # stdev 1, mean 2
    assert s["values"] == [3.0, 1.0, 2.0]
    one = spread([5.0])
    assert one is not None and one["cv"] is None and one["median"] == 5.0
    assert spread([]) is None and spread([None, math.nan]) is None


def test_spread_of_records() -> None:
    got = spread_of([{"a": 1.0, "b": None}, {"a": 3.0, "b": None}], ("a", "b"))
    assert got["a"] is not None and got["a"]["median"] == 2.0
    assert got["b"] is None


def test_differences_inside_the_spread_are_not_significant() -> None:
    wide = spread([10.0, 14.0, 12.0])
    close = spread([13.0, 13.5, 12.5])
    far = spread([30.0, 31.0, 29.0])
    assert differs(wide, close) is False  # 1 apart, spread 4
    assert differs(wide, far) is True  # 18 apart
    assert differs(spread([1.0]), spread([2.0])) is None  # single passes: no spread known
    assert differs(None, far) is None


def test_fmt_spread() -> None:
    assert fmt_spread(spread([1.0, 2.0, 3.0])) == "2 [1-3]"
    assert fmt_spread(spread([1.5])) == "1.5"
    assert fmt_spread(None) == "-"


def _epoch(repeat: int | None, wall: float, stall: float, samples: int) -> dict:
    e = {"summary": {"wall_s": wall, "stall_s_max": stall, "stall_fraction_max": stall / wall,
                     "au_mean": 1 - stall / wall, "samples": samples, "batch_bytes": samples * 10}}
    if repeat is not None:
        e["repeat"] = repeat
    return e


def test_repetition_figures_group_epochs_by_repeat() -> None:
    from iobench.core.spread import repetition_figures, run_spread

    epochs = [_epoch(0, 2.0, 1.0, 100), _epoch(0, 4.0, 1.0, 100),
              _epoch(1, 1.0, 0.5, 100), _epoch(1, 1.0, 0.5, 100)]
    reps = repetition_figures(epochs)
    assert [r["repeat"] for r in reps] == [0, 1]
    assert reps[0]["epoch_wall_s"] == 3.0 and reps[1]["epoch_wall_s"] == 1.0
    assert reps[0]["samples_per_s"] == pytest.approx(200 / 6.0)
    assert reps[0]["read_MBps"] == pytest.approx(2000 / 6.0 / 1e6)
    s = run_spread(epochs)
    assert s["epoch_wall_s"] is not None and s["epoch_wall_s"]["median"] == 2.0
    assert s["epoch_wall_s"]["n"] == 2
    # a result from before --repeat: one repetition
    old = run_spread([_epoch(None, 2.0, 1.0, 10)])
    assert old["stall_s"] is not None and old["stall_s"]["n"] == 1
