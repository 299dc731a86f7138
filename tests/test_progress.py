"""Progress off a terminal (a batch job's log): a line at each interval, even inside one file."""

from __future__ import annotations

import re

import pytest

from conftest import run_cmd
from iobench.core.progress import DEFAULT_INTERVAL_S, INTERVAL_ENV, interval_s


def test_generate_writes_progress_lines_to_a_log(tmp_path) -> None:
    # one HDF5 file of ImageNet-like JPEGs: seconds inside a single file, where the
    # per-file progress alone would say nothing (a terminal's bar showed "0/?")
    r = run_cmd("generate", "--dataset", "imagenet", "--samples", "400", "--storage", tmp_path,
                env={INTERVAL_ENV: "0.2"})
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("generate imagenet-hdf5: ")]
    assert lines, r.stderr
    m = re.match(r"generate imagenet-hdf5: ([\d.]+) of ~([\d.]+) MB", lines[0])
    assert m and float(m.group(2)) > 0, lines[0]  # the expected size, before any file is done


@pytest.mark.parametrize("value, expected", [("5", 5.0), ("0", DEFAULT_INTERVAL_S),
                                             ("-1", DEFAULT_INTERVAL_S), ("inf", DEFAULT_INTERVAL_S),
                                             ("soon", DEFAULT_INTERVAL_S)])
def test_the_interval_is_a_positive_number_or_the_default(monkeypatch, value, expected) -> None:
    monkeypatch.setenv(INTERVAL_ENV, value)
    assert interval_s() == expected


def test_stage_writes_progress_lines_to_a_log_unless_told_not_to(tmp_path) -> None:
    src, env = tmp_path / "src", {INTERVAL_ENV: "0.01"}
    assert run_cmd("generate", "--samples", "8192", "--storage", src).returncode == 0
    r = run_cmd("stage", "--from", src, "--to", tmp_path / "a", "--results", tmp_path / "r",
                env=env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^staging: [\d.]+ of ~[\d.]+ MB", r.stderr, re.M), r.stderr
    r = run_cmd("stage", "--from", src, "--to", tmp_path / "b", "--results", tmp_path / "r",
                "--no-progress", env=env)
    assert r.returncode == 0 and "staging: " not in r.stderr, r.stderr
