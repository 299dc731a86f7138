"""Loaders beyond the format conformance kit (tests/test_conformance.py): stored bytes,
preprocessing, the same data from threads, processes and DALI, and clear errors naming
the file for wrong, missing or damaged datasets."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_SEED, check_batches, truth
from iobench.core.datasets import DATASETS
from iobench.core.errors import DatasetError, DatasetNotFoundError
from iobench.core.formats import FORMATS as REGISTRY
from iobench.core.formats import loader_formats
from iobench.core.manifest import Manifest
from iobench.loaders import LoaderConfig, make_loader
from iobench.loaders import _preprocess as pp

SEED = TINY_SEED
FORMATS = tuple(REGISTRY)
DALI_FORMATS = loader_formats("dali")
# Readers deliver the stored samples (the conformance kit proves them exact, per format);
# preprocessing is one per-batch path after any of them, so it is checked on a record
# format, the one-file-per-sample tree (whose reader decodes PNG itself), and DALI's two
# ways in (its external source, its native readers).
DECODE_FORMATS = ("hdf5", "files")

try:
    import nvidia.dali  # noqa: F401

    HAVE_DALI = True
except ImportError:
    HAVE_DALI = False
DALI_MARKS = [pytest.mark.dali, pytest.mark.skipif(not HAVE_DALI, reason="NVIDIA DALI not installed")]


def needs_dali(f):
    """Mark a test `dali` and skip it where DALI is not installed."""
    for mark in DALI_MARKS:
        f = mark(f)
    return f



@pytest.fixture(scope="module")
def dataset_root(tiny_root):
    return tiny_root  # generated once per session, shared with the conformance kit


def cfg(**kw) -> LoaderConfig:
    base = {"batch_size": 3, "workers": 0, "decode": False, "seed": 11, "shuffle": "global"}
    return LoaderConfig(**{**base, **kw})


def collect(loader, epoch: int = 0) -> list:
    return list(loader.epoch(epoch))


def _payload_truth(root: Path, fmt: str, dataset: str, idx: list[int]) -> int:
    spec = DATASETS[dataset]
    m = Manifest.load(root)
    if REGISTRY[fmt].per_sample_files:  # the whole file
        sizes = {f.first_sample: f.bytes for f in m.data_files}
        return sum(sizes[i] for i in idx)
    if spec.sample_kind == "jpeg":
        payload = sum(len(truth(dataset, i)[0]) for i in idx)
    else:
        payload = len(idx) * spec.sample_nbytes
    if fmt == "zarr" and spec.sample_kind != "jpeg":  # each inner chunk's crc32c
        payload += len(idx) * 4
    if fmt == "lmdb":  # the whole record: header, label, payload
        label_bytes = int(np.prod(spec.label_shape)) * np.dtype(spec.label_dtype).itemsize
        payload += len(idx) * (16 + label_bytes)
    return payload


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dataset", ["cifar10", "imagenet"])
def test_payload_bytes_are_the_stored_bytes(dataset_root, fmt, dataset):
    root = dataset_root(dataset, fmt)
    with make_loader(fmt, root, cfg()) as ld:
        for b in collect(ld):
            assert b.payload_bytes == _payload_truth(root, fmt, dataset, b.indices.tolist())


def reference_cifar10(idx: list[int], epoch: int, seed: int) -> np.ndarray:
    """Pad-4 / crop / flip / normalise, one sample at a time, written independently."""
    out = []
    for i in idx:
        x = np.pad(truth("cifar10", i)[0], ((4, 4), (4, 4), (0, 0)))
        oy, ox, flip = (int(v[0]) for v in pp.cifar_params(seed, epoch, np.array([i])))
        assert 0 <= oy <= 8 and 0 <= ox <= 8
        crop = x[oy:oy + 32, ox:ox + 32]
        if flip:
            crop = crop[:, ::-1]
        f = (crop.astype(np.float64) / 255 - np.array(pp.CIFAR_MEAN)) / np.array(pp.CIFAR_STD)
        out.append(f.transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


DECODE_CASES = [(fmt, fmt) for fmt in DECODE_FORMATS] + \
    [pytest.param("dali", fmt, marks=DALI_MARKS) for fmt in DECODE_FORMATS]


CONVERTS = ("device", "loader")


@pytest.mark.parametrize("convert", CONVERTS)
@pytest.mark.parametrize(("loader", "fmt"), DECODE_CASES)
def test_decoded_cifar10_is_the_augmented_ground_truth(dataset_root, loader, fmt, convert):
    root = dataset_root("cifar10", fmt)
    with make_loader(loader, root, cfg(decode=True, batch_size=8, convert=convert)) as ld:
        flips = set()
        for b in collect(ld, epoch=2):
            if convert == "device":  # cropped and flipped uint8 crosses; normalised here
                assert b.samples.dtype == torch.uint8 and b.finish is not None
            else:
                assert b.finish is None
            x = b.model_input()
            assert x.shape == (len(b.indices), 3, 32, 32)
            assert x.dtype == torch.float32
            ref = reference_cifar10(b.indices.tolist(), epoch=2, seed=11)
            np.testing.assert_allclose(x.numpy(), ref, rtol=1e-5, atol=1e-5)
            flips |= {int(pp.cifar_params(11, 2, b.indices.numpy())[2][k])
                      for k in range(len(b.indices))}
        assert flips == {0, 1}  # both branches exercised


@pytest.mark.parametrize("convert", CONVERTS)
@pytest.mark.parametrize(("loader", "fmt"), DECODE_CASES)
def test_decoded_cosmoflow_is_log1p_channels_first(dataset_root, loader, fmt, convert):
    """Bit for bit numpy's float32 log1p of the stored int16, channels first, from every
    loader, converted in the loader or where the batch is consumed."""
    root = dataset_root("cosmoflow", fmt)
    with make_loader(loader, root, cfg(decode=True, batch_size=2, convert=convert)) as ld:
        for b in collect(ld):
            if convert == "device":  # the stored int16 crosses processes, half the bytes
                assert b.samples.dtype == torch.int16 and b.samples.shape[-1] == 4
            x = b.model_input()
            assert x.shape == (len(b.indices), 4, 128, 128, 128) and x.dtype == torch.float32
            for j, i in enumerate(b.indices.tolist()):
                ref = np.log1p(truth("cosmoflow", i)[0].astype(np.float32)).transpose(3, 0, 1, 2)
                np.testing.assert_array_equal(x[j].numpy().view(np.uint32), ref.view(np.uint32))


def test_log1p_table_is_numpy_log1p_bit_for_bit():
    """All 65,536 int16 values, -inf and nan included."""
    from iobench.loaders.base import Finish, log1p_int16

    x = np.arange(65536, dtype=np.uint16).view(np.int16)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = np.log1p(x.astype(np.float32))
    np.testing.assert_array_equal(log1p_int16(x).view(np.uint32), ref.view(np.uint32))
    t = torch.from_numpy(x.reshape(1, 16, 16, 64, 4).copy())
    y = Finish("log1p", channels_last=True)(t)
    assert y.shape == (1, 4, 16, 16, 64)
    assert y.is_contiguous(memory_format=torch.channels_last_3d)  # no transpose copy made
    np.testing.assert_array_equal(y.permute(0, 2, 3, 4, 1).numpy().reshape(-1).view(np.uint32),
                                  ref.view(np.uint32))


@pytest.mark.parametrize("fmt", DECODE_FORMATS)
def test_decoded_imagenet(dataset_root, fmt):
    """Random-resized crop of the decoded JPEG, normalised; the same from every PyTorch loader."""
    root = dataset_root("imagenet", fmt)
    with make_loader(fmt, root, cfg(decode=True, batch_size=4)) as ld:
        batches = collect(ld)
    ref_root = dataset_root("imagenet", "hdf5")
    with make_loader("hdf5", ref_root, cfg(decode=True, batch_size=4, convert="loader")) as ld:
        ref = collect(ld)
    for b, r in zip(batches, ref, strict=True):
        assert b.samples.dtype == torch.uint8 and b.samples.shape == (len(b.indices), 224, 224, 3)
        x = b.model_input()
        assert x.shape == (len(b.indices), 3, 224, 224)
        assert torch.isfinite(x).all()
        # normalised: pixel values in [0, 1] map into [-mean/std, (1-mean)/std]
        assert x.min() >= -2.2 and x.max() <= 2.7
        assert torch.equal(x, r.samples)  # converted here or in the loader: the same floats
        torch.testing.assert_close(b.labels, r.labels)


def test_rrc_params_stay_inside_the_image():
    h = np.array([300, 500, 10, 400])
    w = np.array([500, 300, 400, 10])
    idx = np.arange(4)
    for epoch in range(20):
        box = pp.rrc_params(h, w, 3, epoch, idx)
        top, left, bh, bw = box.T
        assert (top >= 0).all() and (left >= 0).all() and (bh > 0).all() and (bw > 0).all()
        assert (top + bh <= h).all() and (left + bw <= w).all()


@needs_dali
@pytest.mark.parametrize("fmt", ["hdf5", "files"])
def test_dali_decoded_imagenet_shape_and_range(dataset_root, fmt):
    root = dataset_root("imagenet", fmt)
    with make_loader("dali", root, cfg(decode=True, batch_size=4)) as ld:
        for b in collect(ld):
            x = b.model_input()
            assert x.shape == (len(b.indices), 3, 224, 224)
            assert x.dtype == torch.float32 and torch.isfinite(x).all()
            assert x.min() >= -2.2 and x.max() <= 2.7


def test_orders_differ_between_epochs_and_repeat_with_the_same_seed(dataset_root):
    root = dataset_root("cifar10", "hdf5")
    for shuffle in ("global", "block"):
        c = cfg(shuffle=shuffle, block_size=4, shuffle_window=3)
        with make_loader("hdf5", root, c) as a, make_loader("hdf5", root, c) as b:
            e0 = [x.indices for x in collect(a, 0)]
            e1 = [x.indices for x in collect(a, 1)]
            again = [x.indices for x in collect(b, 0)]
        assert not torch.equal(torch.cat(e0), torch.cat(e1))
        assert torch.equal(torch.cat(e0), torch.cat(again))
        assert sorted(torch.cat(e0).tolist()) == list(range(40))
        with make_loader("hdf5", root, cfg(shuffle=shuffle, block_size=4, seed=12)) as other:
            assert not torch.equal(torch.cat([x.indices for x in collect(other, 0)]),
                                   torch.cat(e0))
    with make_loader("hdf5", root, cfg(shuffle="none")) as ld:
        assert torch.cat([x.indices for x in collect(ld, 3)]).tolist() == list(range(40))


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.indices, y.indices)
        assert torch.equal(x.labels, y.labels)
        assert torch.equal(x.samples, y.samples)
        assert x.payload_bytes == y.payload_bytes
        assert x.finish == y.finish
        assert (x.offsets is None) == (y.offsets is None)
        if x.offsets is not None:
            assert torch.equal(x.offsets, y.offsets)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("dataset", "decode"), [("cifar10", True), ("imagenet", False)])
def test_threads_processes_and_main_process_give_the_same_data(dataset_root, fmt, dataset,
                                                               decode):
    root = dataset_root(dataset, fmt)
    runs = []
    for workers, wtype in ((0, "process"), (2, "process"), (2, "thread")):
        with make_loader(fmt, root, cfg(workers=workers, worker_type=wtype, decode=decode,
                                        batch_size=4)) as ld:
            runs.append(collect(ld, 0) + collect(ld, 1))  # persistent workers, two epochs
    _same(runs[0], runs[1])
    _same(runs[0], runs[2])


@needs_dali
@pytest.mark.parametrize("fmt", DALI_FORMATS)
def test_dali_gives_the_same_data_as_the_pytorch_loader(dataset_root, fmt):
    root = dataset_root("cifar10", fmt)
    for decode in (False, True):
        with make_loader("dali", root, cfg(workers=2, decode=decode, batch_size=8)) as d, \
                make_loader(fmt, root, cfg(workers=0, decode=decode, batch_size=8)) as t:
            for epoch in (0, 1, 0):  # sequential epochs reuse DALI's pipeline; a jump rebuilds it
                for x, y in zip(collect(d, epoch), collect(t, epoch), strict=True):
                    assert torch.equal(x.indices, y.indices)
                    assert torch.equal(x.labels, y.labels)
                    assert x.payload_bytes == y.payload_bytes
                    torch.testing.assert_close(x.samples, y.samples, rtol=1e-5, atol=1e-5)


@needs_dali
def test_dali_epoch_left_early_restarts_cleanly(dataset_root):
    root = dataset_root("cifar10", "lmdb")
    with make_loader("dali", root, cfg(workers=1)) as ld:
        it = ld.epoch(0)
        next(it)
        it.close()
        check_batches("cifar10", collect(ld, 1), ld.indices(1))


def test_netcdf4_and_h5py_in_one_process(dataset_root):
    a = collect(make_loader("netcdf", dataset_root("cifar10", "netcdf"), cfg()))
    b = collect(make_loader("hdf5", dataset_root("cifar10", "hdf5"), cfg()))
    c = collect(make_loader("netcdf", dataset_root("cifar10", "netcdf"), cfg()))
    _same(a, b)
    _same(a, c)


def test_pin_memory_and_non_persistent_workers(dataset_root):
    root = dataset_root("cifar10", "hdf5")
    with make_loader("hdf5", root, cfg(workers=1, persistent_workers=False, pin_memory=True,
                                       prefetch=1)) as ld:
        check_batches("cifar10", collect(ld, 0), ld.indices(0))
        check_batches("cifar10", collect(ld, 1), ld.indices(1))


def test_local_scope_reads_only_own_files(dataset_root):
    root = dataset_root("cifar10", "hdf5")
    m = Manifest.load(root)
    seen = []
    for rank in (0, 1):
        with make_loader("hdf5", root, cfg(scope="local"), rank=rank, world=2) as ld:
            got = torch.cat([b.indices for b in collect(ld)]).tolist()
            own = [f for k, f in enumerate(m.data_files) if k % 2 == rank]
            assert all(any(f.first_sample <= i < f.first_sample + f.num_samples for f in own)
                       for i in got)
            seen.append(got)
    assert not set(seen[0]) & set(seen[1])


# ------------------------------------------------------------------------------- errors

ALL_LOADERS = [*FORMATS, pytest.param("dali", marks=DALI_MARKS)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_wrong_format_names_the_dataset(dataset_root, fmt):
    root = dataset_root("cifar10", fmt)
    other = next(f for f in FORMATS if f != fmt)
    with pytest.raises(DatasetError, match=f"{root}.*{fmt}"):
        make_loader(other, root, cfg())
    import importlib

    from iobench.loaders import LOADERS

    mod, _, cls = LOADERS[other][0].partition(":")
    with pytest.raises(DatasetError, match=str(root)):
        getattr(importlib.import_module(mod), cls)(Manifest.load(root), cfg())


@pytest.mark.parametrize("loader", ALL_LOADERS)
def test_missing_manifest(tmp_path, dataset_root, loader):
    src = dataset_root("cifar10", "hdf5" if loader == "dali" else loader)
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    (dst / "iobench.json").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"iobench\.json is missing"):
        make_loader(loader, dst, cfg())


def _copy(src: Path, tmp_path: Path) -> tuple[Path, Manifest]:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst, Manifest.load(dst)


ERROR_CASES = [(fmt, fmt) for fmt in FORMATS] + \
    [pytest.param("dali", fmt, marks=DALI_MARKS) for fmt in ("netcdf", "lmdb", "files")]
# (a truncated file, for every format: tests/test_conformance.py)


@pytest.mark.parametrize(("loader", "fmt"), ERROR_CASES)
def test_damaged_file_fails_in_the_main_process_naming_it(tmp_path, dataset_root, loader, fmt):
    """Same size as the manifest says, garbage inside: the worker's error comes back whole."""
    dataset = "imagenet" if fmt == "files" else "cifar10"  # a JPEG that does not decode
    root, m = _copy(dataset_root(dataset, fmt), tmp_path)
    victim = m.path_of(m.data_files[-1])
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.write(b"\xff" * min(size, 4096))
    # (dali with a files dataset checks each file's magic bytes when it is built)
    with pytest.raises(DatasetError, match=str(victim)) as err, \
            make_loader(loader, root, cfg(workers=2, decode=fmt == "files")) as ld:
        collect(ld)
    assert "\n" not in str(err.value)


def test_bad_config_values_are_named():
    from iobench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="worker_type='fiber'"):
        LoaderConfig(worker_type="fiber")
    with pytest.raises(ConfigError, match="unknown loader 'tfrecord'"):
        make_loader("tfrecord", "/nonexistent", LoaderConfig())


def test_lmdb_open_in_the_parent_then_forked_workers(dataset_root):
    """py-lmdb forbids a second open in one process, and its registry survives fork()."""
    root = dataset_root("cifar10", "lmdb")
    with make_loader("lmdb", root, cfg(workers=0)) as main_proc, \
            make_loader("lmdb", root, cfg(workers=2)) as forked, \
            make_loader("lmdb", root, cfg(workers=2, worker_type="thread")) as threads:
        a = collect(main_proc)  # environments now open in this process
        _same(a, collect(forked))
        _same(a, collect(threads))
        _same(a, collect(main_proc))


class _KilledReader:
    """Fault injection: a worker reading sample `victim` is killed (as the OOM killer would).

    The worker dies inside its read, holding no lock of the DataLoader's queues
    (killing it from outside at an arbitrary moment can leave one held).
    """

    victim = 5

    def read(self, indices, alloc=None):
        import os
        import signal

        if self.victim in indices.tolist() and os.getpid() != self.parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().read(indices, alloc)


def test_a_killed_worker_is_a_clear_error(dataset_root):
    import os

    from iobench.core.errors import UnsupportedError
    from iobench.loaders.hdf5 import HDF5Loader, HDF5Reader

    class Reader(_KilledReader, HDF5Reader):
        parent = os.getpid()

    class Loader(HDF5Loader):
        reader_cls = Reader

    root = dataset_root("cifar10", "hdf5")
    with Loader(root, cfg(workers=1, prefetch=1, batch_size=2, shuffle="none")) as ld:
        it = ld.epoch(0)
        next(it)  # samples 0 and 1; the batch holding sample 5 kills its worker
        with pytest.raises(UnsupportedError, match="worker died"):
            for _ in it:
                pass
        Reader.victim = -1
        check_batches("cifar10", collect(ld, 1), ld.indices(1))  # the next epoch starts afresh


@needs_dali
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_dali_gpu_without_a_gpu_says_so(dataset_root):
    from iobench.core.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="device='gpu'"):
        make_loader("dali", dataset_root("cifar10", "hdf5"), cfg(device="gpu"))


@pytest.mark.gpu
@needs_dali
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("dataset", "fmt"), [("cifar10", "hdf5"), ("cifar10", "files"),
                                              ("cosmoflow", "lmdb"), ("imagenet", "files")])
def test_dali_on_the_gpu_matches_the_cpu(dataset_root, dataset, fmt):
    root = dataset_root(dataset, fmt)
    with make_loader("dali", root, cfg(decode=True, device="gpu", workers=1)) as g, \
            make_loader("dali", root, cfg(decode=True, workers=1)) as c:
        for x, y in zip(collect(g), collect(c), strict=True):
            assert x.samples.is_cuda and not y.samples.is_cuda
            assert torch.equal(x.indices, y.indices) and torch.equal(x.labels, y.labels)
            if dataset == "imagenet":  # nvJPEG and DALI's random crop: shape and range only
                assert x.model_input().shape == (len(x.indices), 3, 224, 224)
            else:  # the same compact samples, and the same floats converted on the GPU
                assert torch.equal(x.samples.cpu(), y.samples)
                assert torch.equal(x.model_input().cpu(), y.model_input())


@pytest.mark.parametrize(("fmt", "compression"), [("hdf5", "gzip"), ("hdf5", "lzf"),
                                                  ("netcdf", "gzip")])
def test_compressed_data_and_stored_chunk_bytes(tmp_path, fmt, compression):
    """Compressed samples decode to the ground truth; payload counts the stored chunk bytes."""
    import h5py

    from iobench.workflows.generate import GenerateConfig, generate_dataset

    m = generate_dataset(GenerateConfig(dataset="cifar10", format=fmt, storage=tmp_path,
                                        samples=20, samples_per_file=8, seed=SEED,
                                        compression=compression))
    chunk_bytes = {}
    for f in m.data_files:  # the stored size of each sample's chunk, read independently
        with h5py.File(m.path_of(f), "r") as h:
            ds = h["samples"]
            for k in range(f.num_samples):
                chunk_bytes[f.first_sample + k] = ds.id.get_chunk_info_by_coord(
                    (k, 0, 0, 0)).size
    # lzf finds no repeats in noisy pixels (it shrinks saturated images only): stored as is
    stored, raw = sum(chunk_bytes.values()), 20 * 32 * 32 * 3
    assert stored < raw if compression == "gzip" else stored <= raw
    loaders = [fmt, "dali"] if HAVE_DALI else [fmt]
    for name in loaders:
        with make_loader(name, m.root, cfg(workers=1)) as ld:
            batches = collect(ld, 0)
            check_batches("cifar10", batches, ld.indices(0))
            for b in batches:
                assert b.payload_bytes == sum(chunk_bytes[i] for i in b.indices.tolist())


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_epoch_left_early_then_the_next_is_complete(dataset_root, worker_type):
    """`train --max-steps` leaves epochs early: persistent workers must start the next cleanly."""
    root = dataset_root("cifar10", "netcdf")
    with make_loader("netcdf", root, cfg(workers=2, worker_type=worker_type)) as ld:
        it = ld.epoch(0)
        next(it)
        it.close()
        check_batches("cifar10", collect(ld, 1), ld.indices(1))
        check_batches("cifar10", collect(ld, 2), ld.indices(2))


def test_block_shuffle_prefetches_whole_blocks(tmp_path):
    """Cold cache: one batch under `block` brings its blocks into the page cache, `global`
    only its samples (measured with the kernel's own residency counts). HDF5 only: netCDF-C
    reads the file's head sequentially, so kernel readahead blurs the picture."""
    fmt = "hdf5"
    import time

    from iobench.core import cache
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    m = generate_dataset(GenerateConfig(dataset="cifar10", format=fmt, storage=tmp_path,
                                        samples=2048, samples_per_file=2048, seed=SEED))
    path = m.path_of(m.data_files[0])
    block_bytes = 256 * 32 * 32 * 3
    resident = {}
    for mode in ("global", "block"):
        cache.evict([path])
        if cache.resident_bytes(path) != 0:
            pytest.skip("cannot evict or measure page-cache residency here (tmpfs, no rights)")
        with make_loader(fmt, m.root, cfg(shuffle=mode, batch_size=8, block_size=256,
                                          shuffle_window=2)) as ld:
            next(iter(ld.epoch(0)))
            last, deadline = -1, time.monotonic() + 10
            while time.monotonic() < deadline:  # the advice is asynchronous: wait for it
                now = cache.resident_bytes(path)
                if now == last:
                    break
                last = now
                time.sleep(0.3)
            resident[mode] = last
    assert resident["block"] >= block_bytes
    assert resident["block"] > resident["global"] + block_bytes // 2


@pytest.mark.parametrize("workers", [0, 1])
def test_lmdb_pages_can_be_evicted_between_epochs(tmp_path, workers):
    """Mapped pages cannot be evicted: the LMDB reader unmaps them after each batch, so the
    next epoch starts cold although its (persistent) workers keep the environment open."""
    from iobench.core import cache
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    m = generate_dataset(GenerateConfig(dataset="cifar10", format="lmdb", storage=tmp_path,
                                        samples=600, samples_per_file=300, seed=SEED))
    paths = [m.path_of(f) for f in m.data_files]
    cache.evict(paths)
    if cache.resident_fraction(paths) != 0.0:
        pytest.skip("cannot evict or measure page-cache residency here (tmpfs, no rights)")
    with make_loader("lmdb", m.root, cfg(workers=workers, batch_size=32)) as ld:
        for epoch in range(2):
            check_batches("cifar10", collect(ld, epoch), ld.indices(epoch))
            assert cache.resident_fraction(paths) > 0.5  # it was read through the cache
            cache.evict(paths)
            assert cache.resident_fraction(paths) < 0.05


@pytest.mark.parametrize("samples", [20, 40])  # one short shard; two shards, the last short
def test_zarr_compressed_payload_is_each_inner_chunk(tmp_path, samples):
    """zstd-compressed inner chunks: payload counts each one's stored bytes (its zstd frame
    and the 4-byte crc32c), computed here with numcodecs, whatever the shard holds."""
    from numcodecs import Zstd

    from iobench.workflows.generate import GenerateConfig, generate_dataset

    m = generate_dataset(GenerateConfig(dataset="cifar10", format="zarr", storage=tmp_path,
                                        samples=samples, samples_per_file=32, seed=SEED,
                                        compression="zstd"))
    want = {i: len(Zstd(level=3).encode(np.ascontiguousarray(truth("cifar10", i)[0]))) + 4
            for i in range(samples)}
    with make_loader("zarr", m.root, cfg(workers=0)) as ld:
        batches = collect(ld, 0)
        check_batches("cifar10", batches, ld.indices(0))
        for b in batches:
            assert b.payload_bytes == sum(want[i] for i in b.indices.tolist())


def test_uniforms_are_uniform_stream_by_stream():
    """The several-streams-at-once draw equals the one-stream one, value for value."""
    idx = np.array([0, 1, 7, 2**40, 2**62 + 5], dtype=np.int64)
    for seed, epoch in ((0, 0), (11, 2), (2**40, 3)):
        both = pp.uniforms(seed, epoch, idx, (1, 2, 3, 17))
        for row, stream in zip(both, (1, 2, 3, 17), strict=True):
            np.testing.assert_array_equal(row, pp.uniform(seed, epoch, idx, stream))


@pytest.mark.parametrize("convert", CONVERTS)
@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("dataset", ["cifar10", "cosmoflow", "imagenet", "raw"])
def test_finish_of_is_every_batch_finish(dataset, decode, convert):
    """Process workers send no `Finish` with each batch: the consumer puts the loader's
    own (`finish_of`) on it, which must be the one `to_batch` gives every batch."""
    shape, dtype = {"cifar10": ((2, 32, 32, 3), np.uint8), "imagenet": ((0,), np.uint8),
                    "cosmoflow": ((1, 2, 2, 2, 4), np.int16), "raw": ((2, 5), np.float32)}[dataset]
    if dataset == "imagenet" and decode:
        pytest.skip("needs JPEG bytes; the rule is dataset-independent (FINISH table)")
    n = shape[0] if dataset != "imagenet" else 0
    from iobench.loaders._reader import RawBatch

    raw = RawBatch(np.zeros(shape, dtype), np.zeros(n, np.int64), np.zeros(n, np.int64),
                   np.zeros(1, np.int64) if dataset == "imagenet" else None)
    b = pp.to_batch(dataset, raw, np.arange(n), 0, 0, decode, convert)
    assert pp.finish_of(dataset, decode, convert) == b.finish


def _cifar10_one_by_one(x: np.ndarray, idx: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """Pad 4 / crop / flip / channels first, one sample at a time, from `uniforms` itself."""
    u = pp.uniforms(seed, epoch, idx, (1, 2, 3))
    out = []
    for k in range(len(x)):
        oy, ox = int(np.floor(u[0, k] * 9)), int(np.floor(u[1, k] * 9))
        padded = np.pad(x[k], ((4, 4), (4, 4), (0, 0)))
        crop = padded[oy:oy + x.shape[1], ox:ox + x.shape[2]]
        out.append((crop[:, ::-1] if u[2, k] < 0.5 else crop).transpose(2, 0, 1))
    return np.stack(out)


def _with_flips(seed: int, epoch: int, n: int, flip: int | None) -> np.ndarray:
    """n sample indices whose flip draw is `flip` (None: whatever it is)."""
    pool = np.arange(20 * n + 40)
    if flip is not None:
        pool = pool[pp.cifar_params(seed, epoch, pool)[2] == flip]
    return pool[:n]


@pytest.mark.parametrize(("batch", "shape", "flip"), [
    (64, (32, 32, 3), None), (5, (32, 32, 3), None), (3, (12, 12, 3), None),
    (64, (32, 32, 3), 1), (64, (32, 32, 3), 0), (1, (32, 32, 3), 1), (1, (32, 32, 3), 0),
    (9, (12, 20, 3), None), (9, (7, 5, 1), None)])
def test_cifar10_batch_path_equals_sample_by_sample(batch, shape, flip):
    """The batch path (rows placed whole into a reused zeroed buffer, unflipped and flipped
    samples transposed apart, then put back in batch order) gives each sample's pad /
    crop / flip exactly: mixed, all-flipped and unflipped batches, non-square and
    one-channel samples. Run over epochs and shapes in turn: the reused buffers must
    hold nothing of an earlier batch."""
    rng = np.random.default_rng(batch)
    for epoch in range(3):
        x = rng.integers(0, 256, (batch, *shape), dtype=np.uint8)
        idx = _with_flips(5, epoch, batch, flip)
        flips = set(pp.cifar_params(5, epoch, idx)[2].tolist())
        assert flips == ({0, 1} if flip is None and batch > 8 else flips)
        want = _cifar10_one_by_one(x, idx, 5, epoch)
        np.testing.assert_array_equal(pp.cifar10(x, idx, 5, epoch), want)
        out = np.full((batch, shape[2], *shape[:2]), 7, dtype=np.uint8)
        assert pp.cifar10(x, idx, 5, epoch, out=out) is out
        np.testing.assert_array_equal(out, want)
        pp.cifar10(rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8), idx[:2], 5, epoch)


def test_cifar10_from_threads_at_once():
    """Thread workers run the batch path side by side: each thread has its own buffers."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(3)
    jobs = [(rng.integers(0, 256, (b, s, s, 3), dtype=np.uint8), rng.integers(0, 10**6, b), e)
            for e, (b, s) in enumerate([(64, 32), (7, 12), (64, 32), (5, 32)] * 4)]

    def run(job: tuple) -> bool:
        x, idx, epoch = job
        return all(np.array_equal(pp.cifar10(x, idx, 1, epoch), _cifar10_one_by_one(
            x, idx, 1, epoch)) for _ in range(5))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, jobs))


def _unmix(y: int) -> int:
    """The inverse of `pp._mix` on one 64-bit value."""
    m = (1 << 64) - 1

    def unshift(v: int, s: int) -> int:
        x = v
        for _ in range(64 // s + 1):
            x = v ^ (x >> s)
        return x

    y = unshift(y, 31)
    y = (y * pow(0x94D049BB133111EB, -1, 1 << 64)) & m
    y = unshift(y, 27)
    y = (y * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & m
    return unshift(y, 30)


def test_cifar_params_are_floor_u_times_9_and_u_below_half_bit_for_bit():
    """The crop offsets and flips (computed in fewer numpy calls than the definition) are
    floor(u * 9) and u < 0.5 of the `uniforms` draws exactly, also where u * 9 rounds
    up to a whole number or u is 0.5 to the last bit: indices made by inverting the mix so
    that the draws land there."""
    seed, epoch = 7, 3
    base = seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + 0x5EED  # as `uniform`
    with np.errstate(over="ignore"):
        keys = [int(pp._mix(np.uint64((base + s * 0x8CB92BA72F3D8DD7) & ((1 << 64) - 1))))
                for s in (1, 2, 3)]
    m53 = []  # 53-bit draws (u = m / 2**53) at and around each k / 9 and 1 / 2
    for k in range(1, 9):
        edge = (k << 53) // 9
        m53 += [edge + d for d in range(-3, 4)]
    m53 += [(1 << 52) + d for d in (-2, -1, 0, 1)] + [0, (1 << 53) - 1]
    idx = []
    for stream_key in keys:
        for m in m53:
            for low in (0, (1 << 11) - 1):  # the bits u drops
                idx.append(_unmix((m << 11) | low) ^ stream_key)
    idx_arr = np.array(idx, dtype=np.uint64).view(np.int64)
    oy, ox, flip = pp.cifar_params(seed, epoch, idx_arr)
    u = pp.uniforms(seed, epoch, idx_arr, (1, 2, 3))
    np.testing.assert_array_equal(oy, np.floor(u[0] * 9).astype(np.int64))
    np.testing.assert_array_equal(ox, np.floor(u[1] * 9).astype(np.int64))
    np.testing.assert_array_equal(flip, (u[2] < 0.5).astype(np.int64))
    assert oy.dtype == ox.dtype == flip.dtype == np.int64
    # the crafted draws did land on the edges
    assert set(np.round(u[0, :len(m53) * 2] * (1 << 53)).astype(np.int64).tolist()) == set(m53)


def test_an_epoch_resumed_after_its_short_last_batch_is_empty(dataset_root):
    """`epoch(e, start_step)` takes every step of the epoch, the one after a short last
    batch too (nothing left to read); one past it is refused in one place
    (`Loader.start_sample`), naming the steps."""
    from iobench.core.errors import ConfigError

    root = dataset_root("cifar10", "hdf5")
    n = Manifest.load(root).num_samples
    with make_loader("hdf5", root, cfg(batch_size=n - 1)) as ld:  # batches of n-1, then 1
        assert ld.steps_per_epoch() == 2
        assert [len(b.indices) for b in ld.epoch(0, start_step=1)] == [1]
        assert list(ld.epoch(0, start_step=2)) == []
        with pytest.raises(ConfigError, match=r"start_step=3 must be in \[0, 2\]"):
            list(ld.epoch(0, start_step=3))
