"""Reused batch buffers: reused once the consumer lets go, never while it holds a batch
(or a view, or a numpy array, of one); the same data as fresh buffers; the decode fast
paths (imagenet's resize and reduced-size DCT) within their documented tolerance; the
CUDA paths (pinned buffers, conversion on the device), where there is a GPU."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from iobench.core.datasets import DATASETS
from iobench.loaders import LoaderConfig, make_loader
from iobench.loaders import _preprocess as pp

SEED = 5
HAVE_CUDA = torch.cuda.is_available()
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")]


@functools.cache
def truth(dataset: str, index: int):
    from iobench.generators.synth import make_sample

    return make_sample(DATASETS[dataset], SEED, index)


@functools.cache
def _generate(storage: Path, dataset: str, fmt: str, n: int, per: int) -> Path:
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    m = generate_dataset(GenerateConfig(dataset=dataset, format=fmt, storage=storage,
                                        samples=n, samples_per_file=per, seed=SEED))
    return m.root


@pytest.fixture(scope="module")
def cifar(tmp_path_factory) -> Path:
    return _generate(tmp_path_factory.mktemp("buffers"), "cifar10", "hdf5", 96, 40)


def _check(batches: list, dataset: str = "cifar10") -> None:
    for b in batches:
        for j, i in enumerate(b.indices.tolist()):
            x, y = truth(dataset, i)
            assert np.array_equal(b.samples[j].numpy(), x), i
            assert int(b.labels[j]) == y


def _mappings(ptrs: list[int]) -> set[tuple[str, str]]:
    """(device, inode) of the shared-memory mapping holding each address (/proc/self/maps)."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            spans.append((lo, hi, parts[3], parts[4]))
    out = set()
    for p in ptrs:
        hit = [(dev, ino) for lo, hi, dev, ino in spans if lo <= p < hi]
        assert hit, f"address {p:#x} is in no mapping"
        out.add(hit[0])
    return out


def test_process_workers_reuse_their_shared_buffers(cifar):
    """24 batches through 2 workers land in a handful of shared-memory buffers, not one new
    segment per batch (which cost page faults, a copy and a descriptor round trip each)."""
    c = LoaderConfig(batch_size=4, workers=2, prefetch=2, shuffle="global", seed=1, decode=False)
    with make_loader("hdf5", cifar, c) as ld:
        ld.start()
        for epoch in range(2):
            inodes, n = set(), 0
            for b in ld.epoch(epoch):
                inodes |= _mappings([b.samples.data_ptr()])
                _check([b])
                n += 1
            assert n == 24
            assert len(inodes) <= 2 * (c.prefetch + 2), inodes


@pytest.mark.parametrize(("workers", "worker_type"), [(0, "process"), (2, "process"),
                                                      (2, "thread")])
def test_a_held_batch_is_never_overwritten(cifar, workers, worker_type):
    """Hold every batch of an epoch (more than there are buffers), or only a view or a
    numpy array of each: all still hold their own samples after the epoch, and the next."""
    c = LoaderConfig(batch_size=4, workers=workers, worker_type=worker_type, prefetch=1,
                     shuffle="global", seed=3, decode=False)
    with make_loader("hdf5", cifar, c) as ld:
        kept = list(ld.epoch(0))  # 24 batches held at once
        views, arrays, idx = [], [], []
        for b in ld.epoch(1):  # keep only a slice view / a numpy array of each
            views.append(b.samples[1:])
            arrays.append(b.samples.numpy()[:1])
            idx.append(b.indices.clone())
            del b
        list(ld.epoch(2))  # a third epoch, dropping everything: reuses what it may
        _check(kept)
        for v, a, i in zip(views, arrays, idx, strict=True):
            assert np.array_equal(v.numpy(), np.stack([truth("cifar10", k)[0]
                                                       for k in i[1:].tolist()]))
            assert np.array_equal(a[0], truth("cifar10", int(i[0]))[0])


def test_epoch_left_early_frees_its_prefetched_buffers(cifar):
    """Batches prefetched and discarded when an epoch is left early do not keep their
    buffers lent: later epochs still run in the same few buffers."""
    c = LoaderConfig(batch_size=4, workers=2, prefetch=2, shuffle="global", seed=2,
                     decode=False)
    with make_loader("hdf5", cifar, c) as ld:
        ld.start()
        for epoch in range(4):
            it = ld.epoch(epoch)
            next(it)
            it.close()
        inodes = set()
        for b in ld.epoch(9):
            inodes |= _mappings([b.samples.data_ptr()])
            _check([b])
        assert len(inodes) <= 2 * (c.prefetch + 2)
        assert not (ld.slots.flags.numpy() != 0).sum() > 2 * (c.prefetch + 2)


def test_the_same_bytes_from_reused_and_fresh_buffers(cifar):
    """Pooled (workers) and unpooled-equivalent (main process) reads agree batch by batch,
    JPEG bytes and offsets included."""
    for dataset in ("cifar10",):
        a = LoaderConfig(batch_size=5, workers=2, shuffle="global", seed=4, decode=False)
        b = LoaderConfig(batch_size=5, workers=0, shuffle="global", seed=4, decode=False)
        with make_loader("hdf5", cifar, a) as la, make_loader("hdf5", cifar, b) as lb:
            for x, y in zip(la.epoch(0), lb.epoch(0), strict=True):
                assert torch.equal(x.samples, y.samples) and torch.equal(x.labels, y.labels)
                assert torch.equal(x.indices, y.indices) and x.payload_bytes == y.payload_bytes
        del dataset


def test_workers_run_single_threaded(cifar):
    """A reader in a worker process sees torch limited to one thread."""
    from iobench.loaders.hdf5 import HDF5Loader, HDF5Reader

    class Reader(HDF5Reader):
        def read(self, indices, alloc=None):
            raw = super().read(indices, alloc)
            raw.labels[:] = torch.get_num_threads()  # report it through the labels
            return raw

    class Loader(HDF5Loader):
        reader_cls = Reader

    with Loader(cifar, LoaderConfig(batch_size=8, workers=2)) as ld:
        ld.start()
        assert {int(v) for b in ld.epoch(0) for v in b.labels} == {1}


# -- imagenet: the decode fast path, against the full-size PIL path of before ---------------

def _reference_imagenet(jpegs: list[bytes], indices: np.ndarray, seed: int, epoch: int
                        ) -> np.ndarray:
    """Full-size decode, crop, PIL BILINEAR resize, flip: the path before the fast one."""
    from PIL import Image

    images = [np.asarray(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpegs]
    hs = np.array([im.shape[0] for im in images])
    ws = np.array([im.shape[1] for im in images])
    boxes = pp.rrc_params(hs, ws, seed, epoch, indices)
    flips = pp.uniform(seed, epoch, indices, 3) < 0.5
    out = []
    for im, (t, left, h, w), f in zip(images, boxes.tolist(), flips, strict=True):
        c = Image.fromarray(im[t:t + h, left:left + w]).resize((224, 224), Image.BILINEAR)
        out.append(np.asarray(c.transpose(Image.FLIP_LEFT_RIGHT) if f else c))
    return np.stack(out)


def _pack(jpegs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(jpegs) + 1, dtype=np.int64)
    np.cumsum([len(j) for j in jpegs], out=offsets[1:])
    return np.frombuffer(b"".join(jpegs), dtype=np.uint8), offsets


def test_imagenet_fast_path_within_tolerance_of_the_pil_path():
    """Torch's antialiased bilinear on uint8 follows PIL's BILINEAR: every pixel within 2
    levels, mean under 0.1 (docs/loaders.md). The random draws are unchanged."""
    spec = DATASETS["imagenet"]
    from iobench.generators.synth import make_sample

    jpegs = [make_sample(spec, SEED, i)[0] for i in range(12)]
    idx = np.arange(12)
    data, offsets = _pack(jpegs)
    for epoch in (0, 1):
        got = pp.imagenet(data, offsets, idx, 9, epoch).astype(int)
        ref = _reference_imagenet(jpegs, idx, 9, epoch).astype(int)
        d = np.abs(got - ref)
        assert d.max() <= 2 and d.mean() < 0.1, (d.max(), d.mean())


def test_reduced_size_dct_for_large_crops():
    """A large image whose crop spans >= 2 x 224 each way is decoded at 1/2..1/8 size; its
    sample stays close to the full-size decode (mean under 2 levels, detail below what the
    resize keeps) and has the same geometry."""
    from PIL import Image

    yy, xx = np.mgrid[0:1600, 0:2000]
    rgb = np.stack([(xx // 7) % 256, (yy // 5) % 256, ((xx + yy) // 11) % 256], axis=-1)
    smooth = np.asarray(Image.fromarray(rgb.astype(np.uint8)).filter(
        __import__("PIL.ImageFilter", fromlist=["x"]).GaussianBlur(3)))
    buf = io.BytesIO()
    Image.fromarray(smooth).save(buf, format="JPEG", quality=90)
    jpegs = [buf.getvalue()] * 16
    idx = np.arange(16)
    boxes = pp.rrc_params(np.full(16, 1600), np.full(16, 2000), 9, 0, idx)
    reduce = pp.dct_reduction(boxes[:, 2], boxes[:, 3])
    assert (reduce > 1).sum() >= 8  # most of these crops are decoded smaller
    data, offsets = _pack(jpegs)
    fast = pp.imagenet(data, offsets, idx, 9, 0).astype(int)
    full = pp.imagenet(data, offsets, idx, 9, 0, reduced_dct=False).astype(int)
    d = np.abs(fast - full)
    assert d.mean() < 2.0, d.mean()
    assert (d[reduce == 1] == 0).all()  # images decoded at full size: the same pixels


def test_damaged_jpeg_names_its_sample():
    data, offsets = _pack([b"\xff\xd8 not a jpeg"])
    with pytest.raises(pp.DecodeError, match="sample 7"):
        pp.imagenet(data, offsets, np.array([7]), 0, 0)


# -- CUDA paths (no GPU here: these skip) ----------------------------------------------------

@pytest.mark.parametrize("op", ["log1p", "normalise"])
def test_finish_on_the_gpu_gives_the_cpu_floats(op):
    for m in needs_gpu:
        if m.name == "skipif" and m.args[0]:
            pytest.skip(m.kwargs["reason"])
    from iobench.loaders.base import Finish

    if op == "log1p":
        x = torch.from_numpy(np.arange(65536, dtype=np.uint16).view(np.int16)
                             .reshape(4, 8, 8, 64, 4).copy())
        f = Finish("log1p", channels_last=True)
    else:
        x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
        f = Finish("normalise", mean=pp.CIFAR_MEAN, std=pp.CIFAR_STD)
    cpu = f(x)
    gpu = f(x.cuda())
    assert gpu.is_cuda
    assert torch.equal(gpu.cpu().view(torch.int32), cpu.contiguous().view(torch.int32)) or \
        torch.equal(gpu.cpu(), cpu)


def test_pinned_worker_buffers_on_a_gpu_machine(cifar):
    """With pin_memory, batches from worker processes are page-locked in place (their
    shared buffers registered with CUDA), hold their own samples, and copy to the GPU."""
    for m in needs_gpu:
        if m.name == "skipif" and m.args[0]:
            pytest.skip(m.kwargs["reason"])
    c = LoaderConfig(batch_size=4, workers=2, prefetch=1, pin_memory=True, seed=6,
                     decode=False)
    with make_loader("hdf5", cifar, c) as ld:
        ld.start()
        kept = []
        for b in ld.epoch(0):
            assert b.samples.is_pinned()
            g = b.samples.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            assert torch.equal(g.cpu(), b.samples)
            kept.append(b)
        _check(kept)


def test_preadv_into_scatters_whole_buffers_and_names_a_short_file(tmp_path):
    """HDF5's contiguous samples are read with one scatter read per run of samples: every
    buffer is filled whole, in order; a file that ends early is an error, not zeros."""
    import os

    from iobench.loaders._reader import preadv_into

    data = np.random.default_rng(1).integers(0, 256, 10_000, dtype=np.uint8)
    (tmp_path / "f").write_bytes(data.tobytes())
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        bufs = [np.empty(n, dtype=np.uint8) for n in (1, 700, 4096, 3)]
        preadv_into(fd, [memoryview(b) for b in bufs], 100)
        assert np.array_equal(np.concatenate(bufs), data[100:100 + 4800])
        many = [np.empty(7, dtype=np.uint8) for _ in range(1300)]  # more than IOV_MAX
        preadv_into(fd, [memoryview(b) for b in many], 0)
        assert np.array_equal(np.concatenate(many), data[:9100])
        with pytest.raises(OSError, match="short"):
            preadv_into(fd, [memoryview(np.empty(200, dtype=np.uint8))], 9900)
    finally:
        os.close(fd)
