"""unet3d's per-sample size spread (MLPerf Storage: 146,600,628 B +- 68,341,808 per .npz).

The depth of each stored volume is drawn so that the sizes' mean and standard
deviation are MLPerf's; the npz loader crops or zero-pads each to the fixed
patch so batches stack, and reads every stored byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import cli
from iobench.core.datasets import DATASETS
from iobench.core.manifest import Manifest
from iobench.core.workloads import WORKLOADS
from iobench.generators.synth import (
    DEPTH_SPREAD,
    make_sample,
    sample_depth,
    synthesis_version_of,
)

UNET3D = DATASETS["unet3d"]
SLICE = 264 * 264 * 4 * 2  # bytes of one int16 264 x 264 x 4 slice


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("count", [168, 2000])  # KiTS19's 168 volumes, and more
def test_unet3d_sizes_have_mlperfs_mean_and_spread(seed: int, count: int) -> None:
    w = WORKLOADS["unet3d"]
    sizes = np.array([sample_depth(UNET3D, seed, i) for i in range(count)]) * SLICE
    assert abs(sizes.mean() / w.sample_bytes - 1) < 0.10
    assert abs(sizes.std() / w.sample_bytes_stdev - 1) < 0.10
    assert sizes.min() > 0
    # deterministic: the same seed and index give the same depth, another seed others
    assert [sample_depth(UNET3D, seed, i) for i in range(50)] == list(sizes[:50] // SLICE)
    assert [sample_depth(UNET3D, seed + 1, i) for i in range(50)] != list(sizes[:50] // SLICE)


def test_depth_spread_is_the_workload_tables() -> None:
    w = WORKLOADS["unet3d"]
    mean, std = DEPTH_SPREAD["unet3d"]
    assert (round(mean * SLICE), round(std * SLICE)) == (w.sample_bytes, w.sample_bytes_stdev)
    # only unet3d's and cifar10's bytes changed: the other datasets keep synthesis version 2
    assert synthesis_version_of("unet3d") == synthesis_version_of("cifar10") == 3
    assert {synthesis_version_of(d) for d in DATASETS if d not in ("unet3d", "cifar10")} == {2}


def test_unet3d_needs_one_file_per_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    assert cli("generate", "--dataset", "unet3d", "--format", "hdf5", "--samples", "1",
               "--storage", tmp_path) != 0
    err = capsys.readouterr().err
    assert "use --format npz" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def spread_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three unet3d samples at MLPerf's sizes (seed 0: 272, 173 and 380 slices; 460 MB):
    one at about the mean, one cropped to fewer slices, one repeated to more."""
    d = tmp_path_factory.mktemp("unet3d-spread")
    assert cli("generate", "--workload", "unet3d", "--accelerator", "b200", "--samples", "3",
               "--storage", d) == 0
    return d


def test_unet3d_samples_vary_in_size(spread_storage: Path) -> None:
    root = spread_storage / "unet3d-npz"
    m = Manifest.load(root)
    depths = [sample_depth(UNET3D, 0, i) for i in range(3)]
    assert len(set(depths)) == 3 and min(depths) < 264 < max(depths)
    sizes = []
    for i, f in enumerate(m.data_files):
        with np.load(root / f.path, allow_pickle=False) as z:
            x, y = z["x"], z["y"]
        want_x, want_y = make_sample(UNET3D, 0, i)
        assert x.shape == (depths[i], 264, 264, 4) and x.dtype == np.int16
        assert np.array_equal(x, want_x) and np.array_equal(y, want_y)
        assert abs(f.bytes - depths[i] * SLICE) < 4096  # the zip and .npy headers
        sizes.append(f.bytes)
    # a deeper volume repeats the periodic field: slice 264 is slice 0
    big = int(np.argmax(depths))
    with np.load(root / m.data_files[big].path, allow_pickle=False) as z:
        assert np.array_equal(z["x"][264], z["x"][0])
    assert m.layout["variable_depth"]["distribution"] == "lognormal"
    assert m.extra["synthesis_version"] == 3
    assert m.extra["sample_bytes"]["min"] == min(sizes)
    assert m.extra["sample_bytes"]["max"] == max(sizes)
    assert cli("verify", root) == 0


def test_npz_reader_crops_and_pads_to_the_patch(spread_storage: Path) -> None:
    from iobench.loaders.npz import NPZReader

    m = Manifest.load(spread_storage / "unet3d-npz")
    r = NPZReader(m)
    batch = r.read(np.array([2, 0, 1]))
    assert batch.samples.shape == (3, 264, 264, 264, 4)
    for k, i in enumerate([2, 0, 1]):
        x, y = make_sample(UNET3D, 0, i)
        d = min(len(x), 264)
        assert np.array_equal(batch.samples[k, :d], x[:d])
        assert not batch.samples[k, d:].any()
        assert np.array_equal(batch.labels[k], y)
        assert batch.stored_bytes[k] == m.data_files[i].bytes  # every stored byte read


@pytest.mark.parametrize("how", [
    ("--workload", "unet3d", "--accelerator", "b200"),  # emulated compute, --no-decode
    # pure ingest (unet3d has no decoded pipeline: --no-decode), a batch of all three
    ("--loader", "npz", "--dataset", "unet3d", "--model", "none", "--no-decode",
     "--batch-size", "3"),
])
def test_one_epoch_trains_on_spread_samples(spread_storage: Path, tmp_path: Path,
                                            how: tuple[str, ...]) -> None:
    res = tmp_path / "res"
    assert cli("train", *how, "--storage", spread_storage, "--epochs", "1", "--workers", "2",
               "--results", res) == 0
    [path] = res.glob("*.json")
    doc = json.loads(path.read_text())
    files = sorted((spread_storage / "unet3d-npz" / "train").glob("*.npz"))
    s = doc["epochs"][0]["summary"]
    assert s["samples"] == 3
    assert s["batch_bytes"] == sum(f.stat().st_size for f in files)
