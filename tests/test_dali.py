"""The DALI loader's own machinery: how its Python workers start (fork only while no CUDA is
live in the process), spawned workers' data, the files format's per-batch paths from a
compact manifest, and undecoded JPEG batches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from iobench.core.manifest import DataPaths, Manifest
from iobench.loaders import LoaderConfig, make_loader

try:
    import nvidia.dali  # noqa: F401

    HAVE_DALI = True
except ImportError:
    HAVE_DALI = False
pytestmark = [pytest.mark.dali,
              pytest.mark.skipif(not HAVE_DALI, reason="NVIDIA DALI not installed")]


def cfg(**kw) -> LoaderConfig:
    base = {"batch_size": 4, "workers": 0, "decode": False, "seed": 11, "shuffle": "global"}
    return LoaderConfig(**{**base, **kw})


def same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.indices, y.indices) and torch.equal(x.labels, y.labels)
        assert torch.equal(x.samples, y.samples) and x.payload_bytes == y.payload_bytes
        assert (x.offsets is None) == (y.offsets is None)
        if x.offsets is not None:
            assert torch.equal(x.offsets, y.offsets)


def cuda_goes_live(monkeypatch) -> None:
    """This process as it is once the model has moved to a GPU: torch has initialised CUDA
    (what a machine without one can show of it; forking is then what DALI refuses)."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)


def test_workers_fork_only_while_no_cuda_is_live(monkeypatch):
    from iobench.loaders.dali import cuda_live, start_method

    assert start_method(gpu=True) == "spawn"  # building a GPU pipeline initialises CUDA
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: CUDA may be live already")
    assert not cuda_live() and start_method(gpu=False) == "fork"
    cuda_goes_live(monkeypatch)
    assert cuda_live() and start_method(gpu=False) == "spawn"


@pytest.mark.parametrize("fmt", ["hdf5", "lmdb"])
def test_pipelines_built_before_and_after_cuda_went_live_deliver_the_same(tiny_root, fmt,
                                                                          monkeypatch):
    """A pipeline forks its workers while it may, spawns them once CUDA is live (in the same
    loader: an epoch jump rebuilds it), and both deliver what the PyTorch loader does."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: CUDA may be live already")
    root = tiny_root("cifar10", fmt)
    c = cfg(workers=2, decode=True, batch_size=8)
    with make_loader("dali", root, c) as d, make_loader(fmt, root, cfg(decode=True,
                                                                        batch_size=8)) as t:
        forked = list(d.epoch(0))
        assert d._pipe.py_start_method == "fork"
        cuda_goes_live(monkeypatch)
        spawned = list(d.epoch(1)) + list(d.epoch(0))  # 0 after 1: a new pipeline
        assert d._pipe.py_start_method == "spawn"
        same(forked, list(t.epoch(0)))
        same(spawned, list(t.epoch(1)) + list(t.epoch(0)))


@pytest.mark.parametrize("dataset", ["imagenet", "cifar10"])
def test_files_from_a_compact_manifest_deliver_what_a_listed_one_does(tiny_root, tmp_path,
                                                                       dataset):
    """The files format's paths come batch by batch from the compact table (millions of
    files are never listed), and give the same batches as the JSON list's."""
    src = tiny_root(dataset, "files")
    dst = tmp_path / "compact"
    shutil.copytree(src, dst)
    Manifest.load(dst).write(dst, form="compact")
    runs = []
    for root in (src, dst):
        with make_loader("dali", root, cfg(workers=2, decode=dataset == "cifar10")) as ld:
            runs.append(list(ld.epoch(0)) + list(ld.epoch(1)) + list(ld.epoch(3)))
            if root == dst:
                assert isinstance(ld.reader.paths, DataPaths)
    same(*runs)


@pytest.mark.parametrize("fmt", ["files", "hdf5"])
def test_undecoded_jpegs_are_the_pytorch_loaders_bytes(tiny_root, fmt):
    """JPEG bytes back to back with their offsets (a view of DALI's buffer), the last
    batch short, as the PyTorch loader delivers them."""
    root: Path = tiny_root("imagenet", fmt)
    with make_loader("dali", root, cfg(workers=1)) as d, make_loader(fmt, root, cfg()) as t:
        for epoch in (0, 1):
            got, want = list(d.epoch(epoch)), list(t.epoch(epoch))
            assert len(got[-1].indices) < 4  # 10 images in batches of 4
            same(got, want)


@pytest.mark.parametrize(("dataset", "fmt"), [("imagenet", "files"), ("cifar10", "hdf5")])
def test_epochs_cut_at_max_steps_keep_one_pipeline(tiny_root, dataset, fmt):
    """`train --max-steps` takes only the first steps of each epoch: the source ends the
    epoch there, so the next epoch runs on the same pipeline (a rebuild cost 1.9 s of stall
    per epoch on the H200) and delivers what an uncut loader's first steps are."""
    root = tiny_root(dataset, fmt)
    whole, cut = cfg(workers=1, batch_size=4), cfg(workers=1, batch_size=4, max_steps=2)
    with make_loader("dali", root, whole) as w, make_loader("dali", root, cut) as c:
        assert c.steps_per_epoch() > 2
        got = list(c.epoch(0))
        pipe = c._pipe
        got += list(c.epoch(1)) + list(c.epoch(2))
        assert c._pipe is pipe and len(got) == 6
        same(got, [b for e in range(3) for b in list(w.epoch(e))[:2]])
