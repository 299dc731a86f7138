"""Untrusted datasets: a manifest cannot reach outside its dataset, and is checked before use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import cli, run_cmd
from iobench.core.errors import DatasetError
from iobench.core.manifest import Manifest


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    assert cli("generate", "--dataset", "cifar10", "--format", "files", "--samples", "32",
               "--storage", tmp_path / "s") == 0
    return tmp_path / "s" / "cifar10-files"


def _edit(root: Path, fn) -> None:
    p = root / "iobench.json"
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize("path", ["../outside.npy", "/etc/passwd", "train/./x.png", "a\0b",
                                  "iobench.json", "train//x.png"])
def test_paths_outside_or_odd_are_refused(dataset: Path, path: str, capsys) -> None:
    def change(doc):
        doc["files"][0]["path"] = path
    _edit(dataset, change)
    with pytest.raises(DatasetError, match="not a plain relative path"):
        Manifest.load(dataset)
    for argv in (("verify", dataset),
                 ("train", "--loader", "files", "--storage", dataset.parent, "--model", "none"),
                 ("stage", "--from", dataset.parent, "--to", dataset.parent.parent / "dst")):
        assert cli(*argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not a plain relative path" in err[0], err
    assert not (dataset.parent.parent / "dst" / "cifar10-files" / "iobench.json").exists()


def test_a_symlink_out_of_the_tree_is_refused(dataset: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    m = Manifest.load(dataset)
    victim = m.path_of(m.data_files[3])
    victim.unlink()
    os.symlink(secret, victim)
    with pytest.raises(DatasetError, match="outside the dataset: refused"):
        Manifest.load(dataset)
    assert cli("stage", "--from", dataset.parent, "--to", tmp_path / "dst") == 2
    assert not any(p.read_bytes() == b"not yours" for p in (tmp_path / "dst").rglob("*")
                   if p.is_file())


@pytest.mark.parametrize("change, needle", [
    (lambda d: d.update(num_samples="32"), "num_samples: expected an integer >= 0"),
    (lambda d: d.update(files={"a": 1}), "files: expected a list"),
    (lambda d: d["files"][0].update(sha256=5), "files[0].sha256: expected a string"),
    (lambda d: d.update(num_samples=10**15), "num_samples 1000000000000000 is outside"),
    (lambda d: d["files"][1].update(first_sample=0), "must tile 0..32 in order"),
    (lambda d: d.update(files=[]), "files: expected a list (not empty)"),
    (lambda d: d["sample"].update(dtype="O"), "is not a plain number type"),
])
def test_a_malformed_manifest_is_one_line_before_any_use(dataset: Path, change, needle,
                                                         capsys) -> None:
    _edit(dataset, change)
    assert cli("verify", dataset) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_bytes_that_are_not_utf8(dataset: Path, capsys) -> None:
    (dataset / "iobench.json").write_bytes(b'{"schema": "iobench.manifest", \xff\xfe}')
    assert cli("verify", dataset) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "iobench.json" in err


def _read_only_dir(tmp_path: Path) -> Path:
    """A directory no one may write: a read-only mount (root) or mode 0555 (others)."""
    import subprocess

    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)]).returncode:
            pytest.skip("cannot mount a read-only tmpfs here")
    else:
        d.chmod(0o555)
    return d


@pytest.mark.parametrize("make_argv", [
    lambda s, ro: ("stage", "--from", s, "--to", s.parent / "dst", "--results", ro),
    lambda s, ro: ("train", "--loader", "files", "--storage", s, "--results", ro),
    lambda s, ro: ("bench-read", "--storage", s, "--workers", "0", "--results", ro),
    lambda s, ro: ("report", s, "--out", ro / "r.html"),
])
def test_unwritable_outputs_fail_before_any_work(dataset: Path, tmp_path: Path, make_argv,
                                                 capsys) -> None:
    import subprocess

    ro = _read_only_dir(tmp_path)
    try:
        argv = make_argv(dataset.parent, ro)
        assert cli(*argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not writable" in err[0] and str(ro) in err[0], err
        assert not (dataset.parent.parent / "dst").exists()  # nothing was copied
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)])


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_baselines_fail_cleanly_on_a_damaged_file(tmp_path: Path, workers: str,
                                                      capsys) -> None:
    assert cli("generate", "--dataset", "cifar10", "--samples", "256", "--storage",
               tmp_path) == 0
    with open(tmp_path / "cifar10-hdf5" / "part-00000.h5", "r+b") as f:
        f.write(b"\xff" * 4096)  # the HDF5 signature and superblock
    assert cli("bench-read", "--storage", tmp_path, "--workers", workers, "--shuffle",
               "global", "--no-dd", "--loaders", "hdf5") == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("iobench")]
    assert len(err) == 1 and "naive baseline cannot read" in err[0] and "part-00000.h5" in err[0]


@pytest.mark.parametrize("fmt", ["files", "hdf5"])
def test_a_fifo_in_a_dataset_is_named_not_waited_on(tmp_path: Path, fmt: str) -> None:
    """A FIFO where a data file belongs: verify, train and stage name it, and nothing waits
    for a writer that never comes (each command under a timeout)."""
    assert cli("generate", "--dataset", "cifar10", "--format", fmt, "--samples", "32",
               "--samples-per-file", "16", "--storage", tmp_path / "s") == 0
    root = tmp_path / "s" / f"cifar10-{fmt}"
    m = Manifest.load(root)
    victim = m.path_of(m.data_files[1])
    victim.unlink()
    os.mkfifo(victim)
    for argv in (("verify", root),
                 ("train", "--loader", fmt, "--storage", root.parent, "--model", "none",
                  "--epochs", "1", "--results", tmp_path / "r"),
                 ("train", "--loader", fmt, "--storage", root.parent, "--model", "none",
                  "--epochs", "1", "--workers", "0", "--results", tmp_path / "r"),
                 ("stage", "--from", root.parent, "--to", tmp_path / "dst")):
        r = run_cmd(*argv, timeout=120)
        err = r.stderr.strip().splitlines()
        assert r.returncode != 0 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert any("a FIFO" in line and str(victim) in line for line in err), (argv, r.stderr)
    assert not (tmp_path / "dst" / f"cifar10-{fmt}" / "iobench.json").exists()


def _set_label(m: Manifest, fmt: str, sample: int, value: int) -> Path:
    """Give `sample` the label `value` in the data itself; return the file changed."""
    import numpy as np

    if fmt == "files":
        entry = next(f for f in m.files if f.role == "labels")
        path = m.path_of(entry)
        lab = np.load(path)
        lab[sample] = value
        with open(path, "wb") as fh:
            np.save(fh, lab)
        return path
    entry = next(f for f in m.data_files
                 if f.first_sample <= sample < f.first_sample + f.num_samples)
    path, j = m.path_of(entry), sample - entry.first_sample
    if fmt == "hdf5":
        import h5py

        with h5py.File(path, "r+") as f:
            f["labels"][j] = value
    elif fmt == "netcdf":
        import netCDF4

        with netCDF4.Dataset(path, "a") as ds:
            ds.variables["labels"][j] = value
    else:
        import lmdb

        from iobench.core.records import HEADER, key
        env = lmdb.open(str(path), subdir=False, lock=False)
        with env.begin(write=True) as txn:
            rec = bytearray(txn.get(key(sample)))
            dt = np.dtype(m.label["dtype"])
            rec[HEADER.size:HEADER.size + dt.itemsize] = np.array([value], dtype=dt).tobytes()
            txn.put(key(sample), bytes(rec))
        env.close()
    return path


@pytest.mark.parametrize("fmt", ["files", "hdf5", "netcdf", "lmdb"])
def test_a_label_out_of_range_is_named_by_verify_and_train(tmp_path: Path, fmt: str) -> None:
    """A class label of 999 in a 10-class dataset, the manifest rewritten to match the
    changed file: verify and train (before any model sees it) name the sample and file."""
    from iobench.generators.base import sha256_file

    assert cli("generate", "--dataset", "cifar10", "--format", fmt, "--samples", "32",
               "--samples-per-file", "16", "--storage", tmp_path / "s") == 0
    root = tmp_path / "s" / f"cifar10-{fmt}"
    path = _set_label(Manifest.load(root), fmt, 21, 999)

    def match(doc):  # the manifest now agrees with the damaged file
        for f in doc["files"]:
            if (root / f["path"]) == path:
                f["bytes"], f["sha256"] = path.stat().st_size, sha256_file(path)
    _edit(root, match)
    for argv in (("verify", root),
                 ("train", "--loader", fmt, "--storage", root.parent, "--model", "none",
                  "--epochs", "1", "--results", tmp_path / "r")):
        r = run_cmd(*argv, timeout=120)
        # verify lists what it found (exit 1); train stops at the first (exit 2)
        assert r.returncode == (1 if argv[0] == "verify" else 2), (argv, r.stderr)
        assert "Traceback" not in r.stderr
        line = [x for x in r.stderr.splitlines() if "label 999" in x]
        assert line and "outside 0..9" in line[0] and str(path) in line[0], (argv, r.stderr)
        assert "sample 21" in line[0], line


def _rehash(root: Path, path: Path) -> None:
    """Rewrite the manifest to match a changed file, as someone hiding damage would."""
    from iobench.generators.base import sha256_file

    def match(doc):
        for f in doc["files"]:
            if (root / f["path"]) == path:
                f["bytes"], f["sha256"] = path.stat().st_size, sha256_file(path)
    _edit(root, match)


def _hdf5_as_int16(m: Manifest) -> Path:
    import h5py

    path = m.path_of(m.data_files[0])
    with h5py.File(path, "r+") as f:
        x = f["samples"][:]
        del f["samples"]
        f.create_dataset("samples", data=x.astype("int16"))
    return path


def _png_named_jpeg(m: Manifest) -> Path:
    import io

    from PIL import Image

    path = m.path_of(m.data_files[2])
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 10, 10)).save(buf, format="PNG")
    path.write_bytes(buf.getvalue())
    return path


def _broken_jpeg_in_hdf5(m: Manifest) -> Path:
    import h5py

    path = m.path_of(m.data_files[0])
    with h5py.File(path, "r+") as f:
        start = int(f["offsets"][3])
        f["jpeg"][start:start + 4] = [0, 1, 2, 3]
    return path


def _lmdb_record_moved(m: Manifest) -> Path:
    import lmdb

    from iobench.core.records import key
    path = m.path_of(m.data_files[0])
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        rec = txn.get(key(5))
        txn.delete(key(5))
        txn.put(key(10_000), rec)
    env.close()
    return path


@pytest.mark.parametrize("dataset, fmt, damage, needle", [
    ("cifar10", "hdf5", _hdf5_as_int16, "samples stored as int16, cifar10 has uint8"),
    ("imagenet", "files", _png_named_jpeg, "does not start as a .jpeg file does"),
    ("imagenet", "hdf5", _broken_jpeg_in_hdf5, "sample 3 is not a JPEG"),
    ("cifar10", "lmdb", _lmdb_record_moved, "expected sample 5's; records were moved"),
])
def test_verify_looks_inside(tmp_path: Path, dataset: str, fmt: str, damage, needle: str
                             ) -> None:
    """Damage the checksums cannot see (the manifest rewritten to match): verify names it."""
    assert cli("generate", "--dataset", dataset, "--format", fmt, "--samples", "8",
               "--storage", tmp_path / "s") == 0
    root = tmp_path / "s" / f"{dataset}-{fmt}"
    path = damage(Manifest.load(root))
    _rehash(root, path)
    r = run_cmd("verify", root)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert any(needle in line and str(path) in line for line in r.stderr.splitlines()), r.stderr


def test_verify_refuses_files_the_manifest_does_not_list(dataset: Path) -> None:
    (dataset / "train" / "leftover.png").write_bytes(b"half a copy")
    r = run_cmd("verify", dataset)
    assert r.returncode == 1 and "not in the manifest" in r.stderr and "leftover.png" in r.stderr
    assert "--allow-extra" in r.stderr
    r = run_cmd("verify", dataset, "--allow-extra")
    assert r.returncode == 0, r.stderr


def _truncate(m: Manifest) -> Path:
    path = m.path_of(m.data_files[2])
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)
    return path


@pytest.mark.dali
@pytest.mark.parametrize("dataset, damage, rehash, needle, command", [
    ("imagenet", _truncate, False, "the file is truncated or was changed", "train"),
    ("imagenet", _png_named_jpeg, True, "does not start as a .jpeg file does", "train"),
    # cut short, then the manifest resealed over it (sizes and checksums recomputed): the
    # magic bytes are intact, the end is not (issue 32: a cut PNG crashed DALI's decoder)
    ("imagenet", _truncate, True, "does not end as a whole .jpeg file does", "train"),
    ("cifar10", _truncate, True, "does not end as a whole .png file does", "train"),
    ("cifar10", _truncate, True, "does not end as a whole .png file does", "bench-read"),
])
def test_dali_gets_no_file_its_decoders_would_crash_on(tmp_path: Path, dataset: str, damage,
                                                       rehash: bool, needle: str,
                                                       command: str) -> None:
    """DALI's native readers and decoders see a files dataset's files only after iobench
    checked their size and first and last bytes: one line naming the file, no signal."""
    pytest.importorskip("nvidia.dali")
    assert cli("generate", "--dataset", dataset, "--format", "files", "--samples", "8",
               "--storage", tmp_path / "s") == 0
    root = tmp_path / "s" / f"{dataset}-files"
    path = damage(Manifest.load(root))
    if rehash:
        _rehash(root, path)
    if command == "train":
        r = run_cmd("train", "--loader", "dali", "--dataset", dataset, "--format", "files",
                    "--storage", root.parent, "--model", "none", "--epochs", "1",
                    "--batch-size", "4", "--results", tmp_path / "r", timeout=300)
    else:
        r = run_cmd("bench-read", "--loaders", "dali", "--dataset", dataset, "--format",
                    "files", "--storage", root.parent, "--epochs", "1", "--batch-size", "4",
                    "--results", tmp_path / "r", timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr)
    err = r.stderr.strip().splitlines()
    assert any(needle in line and str(path) in line for line in err), r.stderr
    assert "Traceback" not in r.stderr


def test_verify_deep_decodes_every_sample(tmp_path: Path) -> None:
    """A JPEG inside HDF5 whose marker is intact but whose body is garbage passes plain
    verify (manifest rewritten to match) and train would accept it; --deep names it."""
    import h5py

    assert cli("generate", "--dataset", "imagenet", "--format", "hdf5", "--samples", "8",
               "--storage", tmp_path / "s") == 0
    root = tmp_path / "s" / "imagenet-hdf5"
    m = Manifest.load(root)
    path = m.path_of(m.data_files[0])
    with h5py.File(path, "r+") as f:
        lo, hi = int(f["offsets"][5]), int(f["offsets"][6])
        f["jpeg"][lo + 600:hi] = 0  # past the headers: scan data and end marker gone
    _rehash(root, path)
    assert run_cmd("verify", root).returncode == 0
    r = run_cmd("verify", "--deep", root)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert any("sample 5 does not decode as a JPEG" in line and str(path) in line
               for line in r.stderr.splitlines()), r.stderr
    for ds, fmt in (("cifar10", "lmdb"), ("cosmoflow", "netcdf")):  # intact: OK
        assert cli("generate", "--dataset", ds, "--format", fmt, "--samples", "4",
                   "--storage", tmp_path / "s") == 0
        r = run_cmd("verify", "--deep", tmp_path / "s" / f"{ds}-{fmt}")
        assert r.returncode == 0 and "OK" in r.stdout, r.stderr


def test_verify_takes_the_storage_root_as_every_other_command(tmp_path: Path) -> None:
    """`verify STORAGE` finds the one dataset there, as `train --storage` does; with several,
    --dataset/--format pick one, and without them one line names the choice."""
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    generate_dataset(GenerateConfig(format="hdf5", storage=tmp_path, samples=16))
    r = run_cmd("verify", tmp_path)
    assert r.returncode == 0 and "cifar10-hdf5: OK" in r.stdout, r.stderr
    generate_dataset(GenerateConfig(format="npz", storage=tmp_path, samples=16))
    r = run_cmd("verify", tmp_path)
    assert r.returncode == 2 and "holds several datasets" in r.stderr, r.stderr
    r = run_cmd("verify", tmp_path, "--format", "npz")
    assert r.returncode == 0 and "cifar10-npz: OK" in r.stdout, r.stderr
