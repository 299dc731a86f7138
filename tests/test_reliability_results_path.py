"""`--results` inside a dataset folder is refused in one line before anything runs (issue 32,
item 6): a result file there is one the manifest does not list, and `verify` would reject the
dataset afterwards. As for `--data`, generated datasets and stage destinations (there or not
yet) are refused too; a storage root beside them is fine."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import cli


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results-path")
    assert cli("generate", "--dataset", "cifar10", "--samples", "64", "--storage", root) == 0
    return root


def _refused(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    assert cli(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert "internal error" not in err and "\n" not in err, err
    return err


@pytest.mark.parametrize("inside", ["cifar10-hdf5", "cifar10-hdf5/results"])
def test_train_refuses_results_in_the_dataset_it_reads(storage: Path, capsys,
                                                       inside: str) -> None:
    dataset = storage / "cifar10-hdf5"
    err = _refused(capsys, "train", "--loader", "hdf5", "--storage", storage, "--model", "none",
                   "--epochs", "1", "--results", storage / inside)
    assert f"is inside the dataset {dataset}" in err
    assert not (dataset / "results").exists()
    assert cli("verify", dataset) == 0


def test_train_refuses_results_in_its_stage_destination(storage: Path, tmp_path: Path,
                                                        capsys) -> None:
    dest = tmp_path / "nvme"
    err = _refused(capsys, "train", "--loader", "hdf5", "--storage", storage, "--model", "none",
                   "--epochs", "1", "--stage-to", dest, "--results",
                   dest / "cifar10-hdf5" / "r")
    assert f"is inside the dataset {dest / 'cifar10-hdf5'}" in err
    assert not dest.exists()  # refused before anything was copied


def test_stage_refuses_results_in_its_destination_or_source(storage: Path, tmp_path: Path,
                                                            capsys) -> None:
    dest = tmp_path / "nvme"
    for results in (dest / "cifar10-hdf5", storage / "cifar10-hdf5" / "r"):
        err = _refused(capsys, "stage", "--from", storage, "--to", dest, "--results", results)
        assert "is inside the dataset" in err
    assert not dest.exists()
    assert cli("stage", "--from", storage, "--to", dest, "--results", tmp_path / "res") == 0
    assert cli("verify", dest / "cifar10-hdf5") == 0 and list((tmp_path / "res").glob("stage-*.json"))


def test_bench_read_refuses_results_in_a_dataset(storage: Path, capsys) -> None:
    err = _refused(capsys, "bench-read", "--storage", storage, "--dataset", "cifar10",
                   "--format", "hdf5", "--max-batches", "1", "--results",
                   storage / "cifar10-hdf5" / "r")
    assert "is inside the dataset" in err


def test_a_results_folder_beside_the_datasets_is_fine(storage: Path, capsys) -> None:
    from iobench.core.dataref import refuse_in_dataset

    refuse_in_dataset(storage / "results")  # the storage root holds datasets; it is not one
    refuse_in_dataset(storage)
