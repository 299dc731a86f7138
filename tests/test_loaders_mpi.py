"""Sharding under `mpiexec -n 2`: every sample once per epoch across the ranks, equal steps."""

from __future__ import annotations

import json

import pytest

from conftest import run_mpi

pytestmark = pytest.mark.mpi

try:
    import nvidia.dali  # noqa: F401

    HAVE_DALI = True
except ImportError:
    HAVE_DALI = False


class _Roots(dict):
    """format -> root of a cifar10 dataset, generated on first use."""

    def __init__(self, storage) -> None:
        super().__init__()
        self.storage = storage

    def __missing__(self, fmt: str) -> str:
        from iobench.workflows.generate import GenerateConfig, generate_dataset

        m = generate_dataset(GenerateConfig(dataset="cifar10", format=fmt, storage=self.storage,
                                            samples=42, samples_per_file=16, seed=3))
        self[fmt] = str(m.root)
        return self[fmt]


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _Roots(tmp_path_factory.mktemp("mpi"))


CASES = [("hdf5", "hdf5", 0), ("hdf5", "hdf5", 2), ("netcdf", "netcdf", 1), ("lmdb", "lmdb", 1),
         ("files", "files", 1),
         pytest.param("dali", "hdf5", 1, marks=[pytest.mark.dali, pytest.mark.skipif(
             not HAVE_DALI, reason="NVIDIA DALI not installed")]),
         pytest.param("dali", "files", 1, marks=[pytest.mark.dali, pytest.mark.skipif(
             not HAVE_DALI, reason="NVIDIA DALI not installed")])]


@pytest.mark.parametrize("shuffle", ["global", "block"])
@pytest.mark.parametrize(("loader", "fmt", "workers"), CASES)
def test_each_sample_once_per_epoch_across_two_ranks(roots, loader, fmt, workers, shuffle):
    r = run_mpi(2, roots[fmt], loader, "--shuffle", shuffle, "--workers", workers,
                "--epochs", 2, "--batch-size", 5, module="iobench.loaders._coverage",
                timeout=240)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["world"] == 2 and doc["num_samples"] == 42
    orders = []
    for ranks, steps in zip(doc["epochs"], doc["steps"], strict=True):
        a, b = ranks
        assert len(a) == len(b) == 21  # 42 samples, 2 ranks: all of them, half each
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(42))
        assert steps == [5, 5]  # ceil(21 / 5) on both ranks
        orders.append(a + b)
    assert orders[0] != orders[1]


def test_failing_rank_ends_the_job_with_the_message(tmp_path):
    r = run_mpi(2, tmp_path / "nothing", "hdf5", module="iobench.loaders._coverage", timeout=120)
    assert r.returncode != 0
    assert "iobench.json is missing" in r.stderr or "does not exist" in r.stderr
