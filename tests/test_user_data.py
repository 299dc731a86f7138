"""`--data PATH`: the user's own HDF5, NetCDF, LMDB and ImageFolder data, read and never written.

Every kind is made in tmp_path with the real libraries (h5py, netCDF4, lmdb,
PIL), detected, read back through the loaders (each sample and label equal to
what was stored), and run through `train --model none` and `bench-read`; the
user's folder is hashed file by file before and after, and must be identical
with no new entries. Each ambiguity is a one-line error naming its fix.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import h5py
import lmdb
import netCDF4
import numpy as np
import pytest
from PIL import Image

from conftest import cli, run_mpi
from iobench.core import results
from iobench.core.errors import IobenchError
from iobench.core.userdata import user_manifest
from iobench.loaders import make_loader
from iobench.loaders.base import LoaderConfig

N = 24  # samples per kind (per file for folders)
SHAPE = (6, 6, 3)
CLASSES = 3


def sample(i: int) -> np.ndarray:
    """Sample i's stored values: distinct per sample, so a misplaced row is caught."""
    return ((np.arange(np.prod(SHAPE)) + 7 * i) % 251).astype(np.uint8).reshape(SHAPE)


def label(i: int) -> int:
    return (i * 5 + 1) % CLASSES


def _npy(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def _jpeg(i: int) -> bytes:
    b = io.BytesIO()
    Image.fromarray(np.full((20 + i % 3, 24, 3), 10 * i % 250, dtype=np.uint8)).save(b, "JPEG")
    return b.getvalue()


def make_h5(path: Path, first: int = 0, n: int = N) -> Path:
    idx = range(first, first + n)
    with h5py.File(path, "w") as h:
        h["train/images"] = np.stack([sample(i) for i in idx])
        h["train/targets"] = np.array([label(i) for i in idx], dtype=np.int32)
        h["bbox"] = np.zeros((n, 2), dtype=np.float32)  # small 2-D array: not the samples
        h["mean"] = np.zeros(3, dtype=np.float64)
    return path


def make_nc(path: Path, first: int = 0, n: int = N, labels: bool = True) -> Path:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("sample", n)
        for k, d in enumerate(SHAPE):
            ds.createDimension(f"d{k}", d)
        v = ds.createVariable("x", "u1", ("sample", "d0", "d1", "d2"))
        v[:] = np.stack([sample(i) for i in range(first, first + n)])
        if labels:
            ds.createVariable("y", "i8", ("sample",))[:] = [label(i)
                                                            for i in range(first, first + n)]
    return path


def make_lmdb_dir(path: Path) -> Path:
    """A directory environment: ASCII zero-padded keys, .npy values, a `labels` record."""
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(b"%06d" % i, _npy(sample(i)))
        txn.put(b"labels", _npy(np.array([label(i) for i in range(N)], dtype=np.int64)))
    env.close()
    return path


def make_lmdb_file(path: Path) -> Path:
    """A single-file environment: 8-byte big-endian keys, JPEG values, labels under `y`."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(i.to_bytes(8, "big"), _jpeg(i))
        txn.put(b"y", _npy(np.array([label(i) for i in range(N)], dtype=np.uint8)))
    env.close()
    return path


def make_imagefolder(path: Path) -> Path:
    for c in ("cat", "dog", "emu"):
        (path / c).mkdir(parents=True)
    for i in range(N):
        c = ("cat", "dog", "emu")[label(i)]
        (path / c / f"img{i:03d}.jpg").write_bytes(_jpeg(i))
    return path


def _kinds() -> dict[str, Callable[[Path], Path]]:
    def h5_folder(d: Path) -> Path:
        (d / "parts").mkdir()
        make_h5(d / "parts" / "a.h5", 0, N)
        make_h5(d / "parts" / "b.h5", N, N // 2)
        return d / "parts"

    def nc_folder(d: Path) -> Path:
        (d / "parts").mkdir()
        make_nc(d / "parts" / "a.nc", 0, N)
        make_nc(d / "parts" / "b.nc", N, N // 2)
        return d / "parts"

    return {"hdf5-file": lambda d: make_h5(d / "data.h5"), "hdf5-folder": h5_folder,
            "netcdf-file": lambda d: make_nc(d / "data.nc"), "netcdf-folder": nc_folder,
            "lmdb-dir": lambda d: make_lmdb_dir(d / "env"),
            "lmdb-file": lambda d: make_lmdb_file(d / "train.lmdb"),
            "imagefolder": lambda d: make_imagefolder(d / "tree")}


KINDS = _kinds()
EXPECT = {  # kind -> (format, samples, detected keys)
    "hdf5-file": ("hdf5", N, {"data_key": "train/images", "label_key": "train/targets"}),
    "hdf5-folder": ("hdf5", N + N // 2, {"data_key": "train/images",
                                         "label_key": "train/targets"}),
    "netcdf-file": ("netcdf", N, {"data_key": "x", "label_key": "y"}),
    "netcdf-folder": ("netcdf", N + N // 2, {"data_key": "x", "label_key": "y"}),
    "lmdb-dir": ("lmdb", N, {"label_key": "labels"}),
    "lmdb-file": ("lmdb", N, {"label_key": "y"}),
    "imagefolder": ("files", N, {}),
}


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (hidden ones too): sha256 of each file, 'dir' for folders."""
    out = {}
    for dirpath, dirnames, names in os.walk(folder):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), folder)] = "dir"
        for name in names:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(params=list(KINDS))
def user_data(request, tmp_path: Path) -> tuple[str, Path, Path]:
    """(kind, the path given to --data, the user's folder that holds it)."""
    home = tmp_path / "home"
    home.mkdir()
    return request.param, KINDS[request.param](home), home


def test_detects_and_reads_back_every_kind(user_data: tuple[str, Path, Path]) -> None:
    kind, path, _ = user_data
    fmt, n, keys = EXPECT[kind]
    m = user_manifest(path)
    assert (m.format, m.num_samples, m.num_classes, m.dataset) == (fmt, n, CLASSES, "user")
    described = m.extra["user_data"]
    assert described["path"] == str(path.resolve()) and described["detected"] is True
    assert {k: described.get(k) for k in keys} == keys
    jpeg = kind in ("lmdb-file", "imagefolder")
    assert described["sample_shape"] == (None if jpeg else list(SHAPE))
    seen = []
    for workers in (0, 1):
        with make_loader(fmt, m, LoaderConfig(batch_size=5, workers=workers, seed=1)) as ld:
            ld.start()
            for b in ld.epoch(0):
                idx = b.indices.numpy()
                seen.append(idx)
                if kind == "imagefolder":  # sample order is sorted classes, sorted names
                    names = [m.files[i].path for i in idx]
                    want = [("cat", "dog", "emu").index(p.split("/")[0]) for p in names]
                    assert b.labels.tolist() == want
                else:
                    assert b.labels.tolist() == [label(i) for i in idx]
                if jpeg:  # decoded and cropped as ImageNet is: uint8 [B, 224, 224, 3]
                    assert tuple(b.samples.shape) == (len(idx), 224, 224, 3)
                else:  # arrays as stored
                    assert np.array_equal(b.samples.numpy(), np.stack([sample(i) for i in idx]))
    assert sorted(np.concatenate(seen).tolist()) == sorted(list(range(n)) * 2)


def test_train_and_bench_read_leave_the_data_untouched(user_data: tuple[str, Path, Path],
                                                       tmp_path: Path, capsys) -> None:
    kind, path, home = user_data
    fmt, n, keys = EXPECT[kind]
    before = snapshot(home)
    res = tmp_path / "results"
    code = cli("train", "--data", path, "--model", "none", "--epochs", "2", "--batch-size",
               "5", "--workers", "1", "--results", res)
    out = capsys.readouterr().out
    assert code == 0
    assert f"data: your data at {path.resolve()} ({fmt}" in out
    assert out.strip().splitlines()[-1].startswith("verdict: ")
    [doc] = [results.load_result(p) for p in results.find_results([res])]
    user = doc["provenance"]["user_data"]
    assert (user["path"], user["kind"], user["num_samples"]) == (str(path.resolve()), fmt, n)
    assert {k: user.get(k) for k in keys} == keys
    assert user["sample_dtype"] == "uint8"
    assert (doc["dataset"]["dataset"], doc["config"]["loader"]) == ("user", fmt)
    assert doc["cache"]["mode"] == "cold"
    # the user's files were evicted before every epoch: epoch 2 did not start warm from
    # epoch 1's reads ("warm" is what the measured residency says when eviction failed)
    assert [e["cache"]["status"] != "warm" for e in doc["epochs"]] == [True, True]
    assert [e["summary"]["samples"] for e in doc["epochs"]] == [n, n]
    assert doc["epochs"][0]["ranks"][0]["loader"]["batches"] > 0  # the readers' clocks ran

    code = cli("bench-read", "--data", path, "--workers", "0", "--shuffle", "global",
               "--batch-size", "5", "--no-dd", "--results", res)
    assert code == 0, capsys.readouterr().err
    [bench] = [json.loads(p.read_text()) for p in res.glob("bench-read-*.json")]
    assert bench["provenance"]["user_data"]["path"] == str(path.resolve())
    rows = {r["loader"]: r for r in bench["rows"]}
    assert rows[fmt]["samples"] == n
    # the naive h5py baselines read the user's HDF5 arrays by name too
    assert ("naive-h5py" in rows) == (fmt == "hdf5")
    assert snapshot(home) == before  # byte-identical, and nothing new (lock files, manifests)


def _h5(path: Path, **arrays: np.ndarray) -> Path:
    with h5py.File(path, "w") as h:
        for k, v in arrays.items():
            h[k] = v
    return path


X = np.zeros((10, 4, 4), dtype=np.float32)
Y = np.arange(10) % 2


def _case_files(d: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (extra command-line arguments, what the one-line error must name)."""
    mixed = d / "mixed"
    mixed.mkdir()
    _h5(mixed / "a.h5", x=X, y=Y)
    make_nc(mixed / "b.nc")
    empty = d / "empty"
    empty.mkdir()
    garbage = d / "garbage.h5"
    garbage.write_bytes(b"not an hdf5 file at all" * 10)
    env = lmdb.open(str(d / "env"), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i in range(4):
            txn.put(b"%d" % i, _npy(np.zeros(3, dtype=np.uint8)))
        txn.put(b"labels", _npy(np.zeros(4, dtype=np.int64)))
        txn.put(b"meta", b"{}")
    env.close()
    pngs = d / "pngs" / "cat"
    pngs.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(pngs / "a.png")
    nc3 = d / "classic.nc"
    with netCDF4.Dataset(nc3, "w", format="NETCDF3_CLASSIC") as ds:
        ds.createDimension("n", 4)
        ds.createVariable("x", "f4", ("n",))[:] = 0
    return {
        "two candidate arrays": ([str(_h5(d / "two.h5", a=X, b=X + 1, y=Y))], "--data-key"),
        "no labels": ([str(_h5(d / "nolab.h5", x=X))], "--label-key"),
        "labels of the wrong length": ([str(_h5(d / "short.h5", x=X, y=Y[:7]))],
                                       "--label-key"),
        "given labels of the wrong length": (
            [str(_h5(d / "short2.h5", x=X, y=Y, z=Y[:7])), "--label-key", "z"], "--label-key"),
        "float labels": ([str(_h5(d / "flt.h5", x=X, y=Y.astype(np.float32)))],
                         "--label-key"),
        "two label candidates": ([str(_h5(d / "twolab.h5", x=X, y=Y, z=Y))], "--label-key"),
        "negative labels": ([str(_h5(d / "neg.h5", x=X, y=Y - 1))], "--label-key"),
        "no such data key": ([str(_h5(d / "key.h5", x=X, y=Y)), "--data-key", "images"],
                             "--data-key"),
        "mixed file types": ([str(mixed)], "--data"),
        "empty folder": ([str(empty)], "--data"),
        "missing path": ([str(d / "nowhere.h5")], "--data"),
        "unreadable file": ([str(garbage)], "--data"),
        "netcdf-3": ([str(nc3)], "nccopy"),
        "lmdb with a stray key": ([str(d / "env")], "--label-key"),
        "imagefolder of PNG": ([str(d / "pngs")], "--data"),
        "a model on user data": ([str(_h5(d / "ok.h5", x=X, y=Y)), "--model", "cnn"],
                                 "--model none"),
        "--data with --storage": ([str(d / "ok.h5"), "--storage", str(d)], "--storage"),
        "an iobench dataset": ([str(_generated(d))], "--storage"),
    }


def _generated(d: Path) -> Path:
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples", "64",
               "--storage", d / "gen") == 0
    return d / "gen" / "cifar10-hdf5"


def test_each_ambiguity_is_one_line_naming_its_fix(tmp_path: Path, capsys) -> None:
    cases = _case_files(tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()  # what making the cases printed
    for name, (args, fix) in cases.items():
        data, rest = args[0], args[1:]
        model = [] if "--model" in rest else ["--model", "none"]
        code = cli("train", "--data", data, *model, *rest, "--loader", "hdf5", "--results",
                   tmp_path / "res")
        err = capsys.readouterr().err.strip()
        assert code == 2, f"{name}: exit {code}, {err}"
        assert len(err.splitlines()) == 1 and err.startswith("iobench: error: "), f"{name}: {err}"
        assert fix in err, f"{name}: {err!r} does not name {fix}"
        assert "Traceback" not in err
    assert snapshot(tmp_path) == before  # errors write nothing either (no result folder)


def test_detection_rules(tmp_path: Path) -> None:
    # the one large array: a smaller 2-D array beside it is no rival (>= 4x the bytes) ...
    m = user_manifest(_h5(tmp_path / "a.h5", x=X, box=np.zeros((10, 2)), y=Y))
    assert m.layout["data_key"] == "x" and m.layout["label_key"] == "y"
    # ... one of comparable size is, and naming it settles it
    path = _h5(tmp_path / "b.h5", x=X, z=X[:, :2], y=Y)
    with pytest.raises(IobenchError, match="--data-key"):
        user_manifest(path)
    m = user_manifest(path, data_key="z")
    assert m.sample["shape"] == [2, 4] and m.extra["user_data"]["detected"] is True
    m = user_manifest(path, data_key="z", label_key="y")
    assert m.extra["user_data"]["detected"] is False
    # labels 0..K-1: K is one more than the largest
    assert user_manifest(_h5(tmp_path / "c.h5", x=X, y=Y * 3)).num_classes == 4
    # a folder's files must hold one kind of sample
    (tmp_path / "f").mkdir()
    _h5(tmp_path / "f" / "a.h5", x=X, y=Y)
    _h5(tmp_path / "f" / "b.h5", x=X[:, :3], y=Y)
    with pytest.raises(IobenchError, match="one kind of sample"):
        user_manifest(tmp_path / "f")
    # ... and the same arrays, whatever the first file's were named
    _h5(tmp_path / "f" / "b.h5", images=X, y=Y)
    with pytest.raises(IobenchError, match="b.h5 lacks the arrays found in a.h5"):
        user_manifest(tmp_path / "f")


@pytest.mark.mpi
def test_two_ranks_read_the_user_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "parts").mkdir()
    make_h5(home / "parts" / "a.h5", 0, N)
    make_h5(home / "parts" / "b.h5", N, N)
    before = snapshot(home)
    res = tmp_path / "results"
    p = run_mpi(2, "train", "--data", home / "parts", "--model", "none", "--epochs", "1",
                "--batch-size", "4", "--workers", "0", "--results", res, timeout=240)
    assert p.returncode == 0, p.stderr
    [doc] = [results.load_result(r) for r in results.find_results([res])]
    assert doc["world"]["size"] == 2
    assert doc["provenance"]["user_data"]["files"] == 2
    assert doc["epochs"][0]["summary"]["samples"] == 2 * N  # each sample once, by one rank
    assert [r["samples"] for r in doc["epochs"][0]["ranks"]] == [N, N]
    assert snapshot(home) == before
