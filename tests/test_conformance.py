"""The format conformance kit: what every registered format (`iobench.core.formats.FORMATS`)
must do, run for each of them on tiny datasets.

- exact round trip: every sample's bytes and label, through iobench's loader (and
  DALI where the registry says DALI reads the format) and through the format's own
  library, equal the synthesis; `verify --deep` finds nothing;
- a global shuffle reads each sample exactly once per epoch, in a new order;
- rank shards are disjoint and together complete;
- cold eviction reaches every file of the dataset (a store's chunk files included);
- a truncated file is a one-line error naming it, from the loader and from the reader;
- generation is byte-identical under `mpiexec -n 2` and with one process.

A new format joins by its registry line and one `READ_BACK` entry below.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TINY, TINY_SEED, check_batches, cli, run_mpi, truth
from iobench.core.datasets import DATASETS
from iobench.core.errors import DatasetError
from iobench.core.formats import FORMATS, loader_formats
from iobench.core.manifest import MANIFEST_NAME, Manifest
from iobench.loaders import LoaderConfig, make_loader

try:
    import nvidia.dali  # noqa: F401

    HAVE_DALI = True
except ImportError:
    HAVE_DALI = False
DALI_MARKS = [pytest.mark.dali, pytest.mark.skipif(not HAVE_DALI, reason="NVIDIA DALI not installed")]

NAMES = list(FORMATS)



def cfg(**kw: Any) -> LoaderConfig:
    base = {"batch_size": 3, "workers": 0, "decode": False, "seed": 11, "shuffle": "global"}
    return LoaderConfig(**{**base, **kw})


def indices(loader: Any, epoch: int) -> list[int]:
    return [i for b in loader.epoch(epoch) for i in b.indices.tolist()]


# ----------------------------------------------------------- each format's own library

def _containing(m: Manifest, i: int) -> tuple[Path, int]:
    f = next(f for f in m.data_files if f.first_sample <= i < f.first_sample + f.num_samples)
    return m.path_of(f), i - f.first_sample


def _hdf5(m: Manifest, i: int) -> tuple[Any, Any]:
    import h5py

    path, j = _containing(m, i)
    with h5py.File(path, "r") as f:
        if m.sample["kind"] == "jpeg":
            off = f["offsets"][...]
            return f["jpeg"][off[j]:off[j + 1]].tobytes(), f["labels"][j]
        return f["samples"][j], f["labels"][j]


def _netcdf(m: Manifest, i: int) -> tuple[Any, Any]:
    import xarray as xr

    path, j = _containing(m, i)
    with xr.open_dataset(path, engine="netcdf4", mask_and_scale=False) as ds:
        if m.sample["kind"] == "jpeg":
            off = ds["offsets"].values
            return ds["jpeg"].values[off[j]:off[j + 1]].tobytes(), ds["labels"].values[j]
        return ds["samples"].values[j], ds["labels"].values[j]


def _lmdb(m: Manifest, i: int) -> tuple[Any, Any]:
    import lmdb

    from iobench.core.records import HEADER, MAGIC, key

    spec = DATASETS[m.dataset]
    env = lmdb.open(str(_containing(m, i)[0]), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        rec = txn.get(key(i))
    env.close()
    magic, _v, _f, _r, nl, npay = HEADER.unpack_from(rec)
    assert magic == MAGIC
    label = np.frombuffer(rec, dtype=spec.label_dtype,
                          count=nl // np.dtype(spec.label_dtype).itemsize, offset=HEADER.size)
    payload = rec[HEADER.size + nl:HEADER.size + nl + npay]
    if spec.sample_kind == "jpeg":
        return payload, label[0]
    return np.frombuffer(payload, dtype=spec.sample_dtype).reshape(spec.sample_shape), (
        label if spec.label_shape else label[0])


def _files(m: Manifest, i: int) -> tuple[Any, Any]:
    path = _containing(m, i)[0]
    label = np.load(m.root / "labels.npy")[i]
    if path.suffix == ".npy":
        return np.load(path), label
    if path.suffix == ".png":
        from PIL import Image

        return np.asarray(Image.open(path)), label
    return path.read_bytes(), label


def _npz(m: Manifest, i: int) -> tuple[Any, Any]:
    with np.load(_containing(m, i)[0], allow_pickle=False) as z:
        x, y = z["x"], z["y"]
    return (x.tobytes() if m.sample["kind"] == "jpeg" else x), y


def _zarr(m: Manifest, i: int) -> tuple[Any, Any]:
    import warnings

    import xarray as xr
    import zarr

    if m.sample["kind"] == "jpeg":  # variable-length bytes: zarr-python itself
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = zarr.open_group(m.root, mode="r")
            return g["jpeg"][i:i + 1][0], g["labels"][i]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: xarray opens it quietly
        ds = xr.open_zarr(m.root)
    return ds["samples"][i].values, ds["labels"][i].values


# format -> (manifest, index) -> (sample, label), read with the format's own library
READ_BACK: dict[str, Callable[[Manifest, int], tuple[Any, Any]]] = {
    "hdf5": _hdf5, "netcdf": _netcdf, "lmdb": _lmdb, "files": _files, "npz": _npz,
    "zarr": _zarr}


def test_every_format_has_an_independent_read_back():
    assert set(READ_BACK) == set(FORMATS)


# -------------------------------------------------------------------------- the kit

LOADER_CASES = [(fmt, ds, fmt) for fmt in NAMES for ds in TINY] + \
    [pytest.param("dali", ds, fmt, marks=DALI_MARKS) for fmt in loader_formats("dali")
     for ds in TINY]


@pytest.mark.parametrize(("loader", "dataset", "fmt"), LOADER_CASES)
def test_round_trip_through_the_loader(tiny_root, loader, dataset, fmt):
    with make_loader(loader, tiny_root(dataset, fmt), cfg()) as ld:
        batches = list(ld.epoch(1))
        check_batches(dataset, batches, ld.indices(1))
        assert len(batches) == ld.steps_per_epoch()
        assert [len(b.indices) for b in batches][:-1] == [3] * (len(batches) - 1)


@pytest.mark.parametrize("fmt", NAMES)
@pytest.mark.parametrize("dataset", list(TINY))
def test_round_trip_through_its_own_library_and_verify(tiny_root, dataset, fmt):
    from iobench.generators.verify import verify_dataset
    from iobench.loaders.readers import deep_check

    m = Manifest.load(tiny_root(dataset, fmt))
    n = TINY[dataset][0]
    assert (m.num_samples, m.dataset, m.format) == (n, dataset, fmt)
    assert m.total_bytes == sum(m.path_of(f).stat().st_size for f in m.files)
    for i in {0, n // 2, n - 1}:
        want, want_label = truth(dataset, i)
        got, got_label = READ_BACK[fmt](m, i)
        if isinstance(want, bytes):
            assert bytes(got) == want
        else:
            np.testing.assert_array_equal(np.asarray(got), want)
        np.testing.assert_allclose(np.asarray(got_label), np.asarray(want_label))
    assert verify_dataset(m.root) == []
    assert deep_check(m) == []
    assert not list(m.root.rglob("*.tmp")) and not (m.root / ".iobench-partial").exists()


@pytest.mark.parametrize("fmt", NAMES)
def test_global_shuffle_reads_each_sample_once_per_epoch(tiny_root, fmt):
    with make_loader(fmt, tiny_root("cifar10", fmt), cfg(batch_size=7)) as ld:
        e0, e1 = indices(ld, 0), indices(ld, 1)
    assert sorted(e0) == sorted(e1) == list(range(40))
    assert e0 != e1


@pytest.mark.parametrize("fmt", NAMES)
def test_rank_shards_are_disjoint_and_complete(tiny_root, fmt):
    root = tiny_root("cifar10", fmt)
    shares = []
    for rank in (0, 1):
        with make_loader(fmt, root, cfg(batch_size=4), rank=rank, world=2) as ld:
            shares.append(indices(ld, 2))
    assert len(shares[0]) == len(shares[1]) == 20
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(40))


@pytest.mark.parametrize("fmt", NAMES)
def test_cold_eviction_reaches_every_file(tiny_root, fmt):
    from iobench.core import cache
    from iobench.core.world import World

    m = Manifest.load(tiny_root("cifar10", fmt))
    on_disk = {str(p.relative_to(m.root)) for p in m.root.rglob("*")
               if p.is_file() and p.name != MANIFEST_NAME}
    evicted = {f.path for f in cache.files_for_node(m, [0], 1)}
    assert on_disk == evicted  # every file the format wrote, a store's chunk files included
    paths = [m.path_of(f) for f in m.files]
    with make_loader(fmt, m.root, cfg()) as ld:
        indices(ld, 0)  # read through the page cache
        report = cache.evict_for_node(m, World(), cache.EvictOptions(loud=False))
        if report.resident_fraction is None or report.status == "unknown":
            pytest.skip("cannot measure page-cache residency here")
        if cache.resident_fraction(paths) not in (0.0, None) and report.status == "warm":
            pytest.skip(f"cannot evict here ({report.status}: {report.reason})")
        assert report.files == len(m.files)
        assert cache.resident_fraction(paths) < 0.05


@pytest.mark.parametrize("fmt", NAMES)
def test_a_truncated_file_is_one_line_naming_it(tiny_root, tmp_path, fmt):
    from iobench.loaders.readers import reader_for

    root = tmp_path / "copy"
    shutil.copytree(tiny_root("cifar10", fmt), root)
    m = Manifest.load(root)
    victim = m.path_of(m.data_files[1])
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    with pytest.raises(DatasetError, match=str(victim)) as err, \
            make_loader(fmt, root, cfg(workers=1)) as ld:
        indices(ld, 0)
    assert "\n" not in str(err.value)
    if FORMATS[fmt].maps_files:
        return  # a mapped file read past its end is SIGBUS: only the size check guards it
    # the reader itself, past the loader's size check: its own one-line error
    reader = reader_for(m)
    first = m.data_files[1].first_sample
    with pytest.raises(DatasetError, match=str(victim)) as err:
        reader.read(np.arange(first, first + m.data_files[1].num_samples, dtype=np.int64))
    assert "\n" not in str(err.value)
    reader.close()


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST_NAME}


@pytest.mark.mpi
@pytest.mark.parametrize("fmt", NAMES)
def test_generation_is_byte_identical_across_rank_counts(tiny_root, tmp_path, fmt):
    n, per = TINY["cifar10"]
    args = ["generate", "--dataset", "cifar10", "--format", fmt, "--samples", n,
            "--samples-per-file", per, "--seed", TINY_SEED]
    r = run_mpi(2, *args, "--storage", tmp_path / "mpi")
    assert r.returncode == 0, r.stderr
    assert cli(*args, "--storage", tmp_path / "jobs", "--jobs", "2") == 0
    one = tiny_root("cifar10", fmt)  # one process
    ref = _digests(one)
    assert _digests(tmp_path / "mpi" / one.name) == ref
    assert _digests(tmp_path / "jobs" / one.name) == ref
    assert Manifest.load(tmp_path / "mpi" / one.name).files == Manifest.load(one).files
