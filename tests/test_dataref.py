"""One DatasetRef per run: found and checked once, carried with its manifest, passed down."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import cli
from iobench.core.dataref import DatasetRef, dataset_root, for_loader, locate, user_data
from iobench.core.errors import ConfigError, DatasetNotFoundError
from iobench.core.manifest import Manifest
from iobench.core.world import World


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("storage")
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples", "256",
               "--storage", root) == 0
    return root


def test_the_ways_in_name_the_same_dataset(storage: Path) -> None:
    by_loader = for_loader(str(storage), "cifar10", "hdf5")
    found = locate(storage)
    at_root = locate(storage / "cifar10-hdf5")
    for ref in (by_loader, found, at_root):
        assert ref.root == dataset_root(storage, "cifar10", "hdf5")
        assert (ref.dataset, ref.format, ref.user_data) == ("cifar10", "hdf5", False)
        assert ref.storage == str(storage)  # the storage root, however it was named
        assert ref.manifest.num_samples == 256
    assert by_loader == found == at_root
    assert by_loader.sibling("hdf5") == by_loader and by_loader.sibling("lmdb") is None
    with pytest.raises(DatasetNotFoundError, match="iobench generate --dataset cifar10 "
                                                   "--format lmdb"):
        for_loader(str(storage), "cifar10", "lmdb")


def test_results_inside_the_users_folder_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with h5py.File(data / "train.h5", "w") as h:
        h["x"] = np.zeros((8, 4), dtype=np.float32)
        h["y"] = np.arange(8) % 2
    folder = user_data(World(), str(data))
    one_file = user_data(World(), str(data / "train.h5"))
    assert isinstance(folder, DatasetRef) and folder.user_data and folder.sibling("hdf5") is None
    for inside in (data, data / "out", data / "a" / "b"):
        with pytest.raises(ConfigError, match=r"--results .* is inside --data"):
            folder.refuse_inside(inside)
    for outside in (tmp_path / "data2", tmp_path, tmp_path / "results"):
        folder.refuse_inside(outside)
    one_file.refuse_inside(data / "results")  # beside a file: the file is not touched


def test_train_with_stage_to_loads_each_manifest_once(storage: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The source is found and read once, then the run reads the copy staging made (no
    second resolution of the source through strings)."""
    loads: Counter[Path] = Counter()
    load = Manifest.load.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Manifest], root: str | Path) -> Manifest:
        loads[Path(root).resolve()] += 1
        return load(cls, root)

    monkeypatch.setattr(Manifest, "load", classmethod(counted))
    assert cli("train", "--loader", "hdf5", "--storage", storage, "--stage-to",
               tmp_path / "fast", "--compute-time", "0.001", "--epochs", "1", "--workers", "0",
               "--batch-size", "64", "--results", tmp_path / "res") == 0
    source = (storage / "cifar10-hdf5").resolve()
    copy = (tmp_path / "fast" / "cifar10-hdf5").resolve()
    assert loads[source] == 1 and loads[copy] == 1, loads
