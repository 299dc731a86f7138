"""Commands take --dataset/--format from what is on disk when that is unambiguous."""

from __future__ import annotations

import pytest

from conftest import cli
from iobench.core.dataref import locate
from iobench.core.errors import ConfigError, DatasetError, DatasetNotFoundError


def test_stage_and_bench_read_find_the_one_dataset(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    assert cli("generate", "--dataset", "cifar10", "--format", "lmdb", "--samples", "128",
               "--storage", src) == 0
    assert cli("stage", "--from", src, "--to", tmp_path / "dst", "--results",
               tmp_path / "res") == 0
    assert (tmp_path / "dst" / "cifar10-lmdb" / "iobench.json").is_file()
    assert cli("bench-read", "--storage", src / "cifar10-lmdb", "--workers", "0",
               "--shuffle", "none", "--no-naive", "--no-dd") == 0
    assert "| lmdb |" in capsys.readouterr().out


def test_several_datasets_or_none_are_one_line_errors(tmp_path) -> None:
    for fmt in ("hdf5", "lmdb"):
        assert cli("generate", "--dataset", "cifar10", "--format", fmt, "--samples", "64",
                   "--storage", tmp_path) == 0
    with pytest.raises(ConfigError, match=r"several datasets \(cifar10-hdf5, cifar10-lmdb\); "
                                          "pick one with --format"):
        locate(tmp_path, "cifar10")
    ref = locate(tmp_path, fmt="lmdb")
    assert (ref.dataset, ref.format) == ("cifar10", "lmdb")
    with pytest.raises(DatasetNotFoundError, match="no cosmoflow dataset under"):
        locate(tmp_path, "cosmoflow")
    with pytest.raises(DatasetError, match="holds cifar10/hdf5, not cifar10/lmdb"):
        locate(tmp_path / "cifar10-hdf5", fmt="lmdb")
