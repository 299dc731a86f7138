"""The naive baselines of `bench-read`: how often each opens its files, counted by the emulated
parallel filesystem's daemon (every open() through the FUSE mount reaches it), real h5py and
real DataLoader workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_pfs import fuse_usable, pfs  # noqa: F401  (fixtures: FUSE mounts, skip without FUSE)

from iobench.core.manifest import Manifest
from iobench.pfs import delta, stats_for

SAMPLES, PER_FILE = 48, 16  # three data files


@pytest.fixture
def mounted(pfs, tmp_path: Path) -> Manifest:  # noqa: F811
    """A tiny cifar10 HDF5 dataset, read through an emulated-pfs mount (no added cost)."""
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    backing = tmp_path / "backing"
    generate_dataset(GenerateConfig(dataset="cifar10", format="hdf5", storage=backing,
                                    samples=SAMPLES, samples_per_file=PER_FILE, seed=1))
    h = pfs(backing, "passthrough")
    return Manifest.load(Path(h.mountpoint) / "cifar10-hdf5")


def _opens(m: Manifest, workers: int, epochs: int, **kw: bool) -> tuple[int, int]:
    """(daemon opens, samples read) over `epochs` epochs of a naive baseline."""
    from iobench.loaders.naive import NaiveLoader

    loader = NaiveLoader(m, batch_size=8, workers=workers, shuffle=True, decode=False, **kw)
    s0 = stats_for(m.root)
    samples = 0
    try:
        for e in range(epochs):
            samples += sum(len(b.labels) for b in loader.epoch(e))
    finally:
        loader.close()
    return delta(s0, stats_for(m.root))["opens"], samples


@pytest.mark.fuse
@pytest.mark.parametrize("workers", [0, 2])
def test_fair_baseline_opens_each_file_once_per_worker(mounted: Manifest, workers: int) -> None:
    files = len(mounted.data_files)
    assert files == SAMPLES // PER_FILE
    opens, samples = _opens(mounted, workers, epochs=1)
    assert samples == SAMPLES
    # a shuffled epoch touches every file; each reading process opens each file at most once
    assert files <= opens <= files * max(workers, 1), opens
    # default (non-persistent) workers start afresh every epoch, so do the main process's handles
    opens, samples = _opens(mounted, workers, epochs=2)
    assert samples == 2 * SAMPLES and 2 * files <= opens <= 2 * files * max(workers, 1), opens


@pytest.mark.fuse
def test_open_per_sample_baseline_opens_once_per_sample(mounted: Manifest) -> None:
    opens, samples = _opens(mounted, 2, epochs=1, open_per_sample=True)
    assert samples == SAMPLES and opens == SAMPLES
