"""iobench never writes into the user's data (issue 28): results inside --data are refused."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import cli


def _imagefolder(root: Path) -> Path:
    """A small ImageFolder tree: 2 classes of 6 JPEGs each."""
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i:03d}.jpg", quality=90)
    return root


def _snapshot(root: Path) -> dict[str, tuple[str, int] | str]:
    """Every entry under `root`: (sha256, mtime in ns) of each file, 'dir' for folders."""
    out: dict[str, tuple[str, int] | str] = {}
    for dirpath, dirnames, names in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for name in names:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (digest, os.stat(p).st_mtime_ns)
    return out


TRAIN = ("train", "--model", "none", "--epochs", "1", "--batch-size", "4", "--workers", "0")
BENCH = ("bench-read", "--workers", "0", "--shuffle", "none", "--batch-size", "4", "--no-dd",
         "--no-naive")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return _imagefolder(tmp_path / "tree")


def _refused(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--results" in err[0] and "inside --data" in err[0], err
    return err[0]


def test_train_from_inside_the_data_with_default_results_is_refused(
        tree: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(tree)
    monkeypatch.chdir(tree)
    assert cli(*TRAIN, "--data", ".") == 2  # the default ./iobench-results is in the data
    _refused(capsys)
    assert not (tree / "iobench-results").exists()
    assert _snapshot(tree) == before


@pytest.mark.parametrize("command", [TRAIN, BENCH], ids=["train", "bench-read"])
def test_results_inside_the_data_are_refused(command: tuple[str, ...], tree: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(tree)
    for inside in (tree / "out", tree / "cat" / "out", tree):
        assert cli(*command, "--data", tree, "--results", inside) == 2
        _refused(capsys)
    assert _snapshot(tree) == before


def test_train_bench_read_and_a_failed_run_leave_every_file_as_it_was(
        tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(tree)
    res = tmp_path / "results"  # beside the data, not in it
    assert cli(*TRAIN, "--data", tree, "--results", res) == 0
    assert cli(*BENCH, "--data", tree, "--results", res) == 0
    assert cli(*TRAIN, "--data", tree, "--loader", "hdf5", "--results", res) == 2  # fails
    assert "--loader files" in capsys.readouterr().err
    assert list(res.glob("*.json")) and _snapshot(tree) == before
