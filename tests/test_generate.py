"""`iobench generate` / `verify`: round trips through each format's own library,
determinism across ranks and jobs, resume, refusal, damage detection, bad input."""

from __future__ import annotations

import hashlib
import io
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import cli, run_cmd, run_mpi
from iobench.core.datasets import DATASETS
from iobench.core.manifest import Manifest
from iobench.core.records import key
from iobench.generators.lmdb import keys
from iobench.generators.synth import make_sample
from iobench.generators.verify import verify_dataset
from iobench.workflows.generate import GenerateConfig, generate_dataset

TINY = {"cifar10": (40, 16), "imagenet": (5, 2), "cosmoflow": (3, 2)}


# round trips of every format and dataset, and one-process vs `mpiexec -n 2` generation
# of each format: tests/test_conformance.py


def test_jpeg_sizes_look_like_imagenet(tmp_path):
    m = generate_dataset(GenerateConfig(dataset="imagenet", format="hdf5", storage=tmp_path,
                                        samples=24, samples_per_file=24))
    jb = m.extra["jpeg_bytes"]
    assert 50_000 < jb["p50"] < 150_000 and jb["std"] > 5_000 and jb["count"] == 24
    blob, _ = make_sample(DATASETS["imagenet"], 0, 0)
    import simplejpeg

    h, w = simplejpeg.decode_jpeg_header(blob)[:2]
    assert min(h, w) >= 32 and max(h, w) <= 4288  # sizes: tests/test_synthesis.py


def test_cifar10_signal_is_learnable():
    spec = DATASETS["cifar10"]
    xs, ys = zip(*(make_sample(spec, 0, i) for i in range(1200)), strict=True)
    x = np.stack(xs).reshape(1200, -1).astype(np.float32)
    y = np.asarray(ys)
    means = np.stack([x[:1000][y[:1000] == c].mean(0) for c in range(10)])
    pred = np.argmin(((x[1000:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == y[1000:]).mean() > 0.4  # chance is 0.1


def test_cosmoflow_signal_depends_on_parameters():
    spec = DATASETS["cosmoflow"]
    (a, la), (b, lb) = make_sample(spec, 0, 0), make_sample(spec, 0, 1)
    assert a.shape == (128, 128, 128, 4) and a.dtype == np.int16 and la.shape == (4,)
    # mean count per voxel follows the 4th parameter (nbar = 20 + 40 u3)
    for arr, lab in ((a, la), (b, lb)):
        assert abs(arr[..., 3].mean() - (20 + 40 * lab[3])) < 0.15 * (20 + 40 * lab[3])


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "iobench.json"}


@pytest.mark.mpi
@pytest.mark.parametrize("dataset, fmt, samples, per_file, nfiles", [
    ("cifar10", "hdf5", 2100, 700, 3),  # files that start and end inside synthesis blocks
    ("imagenet", "hdf5", 9, 2, 5), ("imagenet", "files", 6, 1, 7),
    ("cosmoflow", "lmdb", 5, 2, 3), ("cosmoflow", "netcdf", 3, 1, 3)])
def test_deterministic_across_ranks_and_jobs(tmp_path, dataset, fmt, samples, per_file, nfiles):
    args = ["generate", "--dataset", dataset, "--format", fmt, "--samples", str(samples),
            "--samples-per-file", str(per_file), "--seed", "5"]
    assert cli(*args, "--storage", tmp_path / "one") == 0
    assert cli(*args, "--storage", tmp_path / "jobs", "--jobs", "2") == 0
    r = run_mpi(2, *args, "--storage", tmp_path / "mpi")
    assert r.returncode == 0, r.stderr
    ref = _digests(tmp_path / "one" / f"{dataset}-{fmt}")
    assert len(ref) == nfiles
    assert _digests(tmp_path / "jobs" / f"{dataset}-{fmt}") == ref
    assert _digests(tmp_path / "mpi" / f"{dataset}-{fmt}") == ref
    m1 = Manifest.load(tmp_path / "one" / f"{dataset}-{fmt}")
    m2 = Manifest.load(tmp_path / "mpi" / f"{dataset}-{fmt}")
    assert m1.files == m2.files


def test_resume_after_killed_run(tmp_path):
    argv = [sys.executable, "-m", "iobench", "generate", "--dataset", "cosmoflow", "--format",
            "hdf5", "--samples", "12", "--samples-per-file", "1", "--storage", str(tmp_path)]
    root = tmp_path / "cosmoflow-hdf5"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((root / ".iobench-partial").glob("task-*"))) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (root / "iobench.json").exists()
    done_before = len(list((root / ".iobench-partial").glob("task-*")))
    assert 3 <= done_before < 12
    # damage one completed file: resume must redo it rather than trust it
    victim = sorted(root.glob("part-*.h5"))[0]
    with open(victim, "r+b") as f:
        f.seek(5000)
        f.write(b"\xff" * 8)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "kept from an earlier run" in r.stderr
    assert verify_dataset(root) == []
    fresh = generate_dataset(GenerateConfig(dataset="cosmoflow", format="hdf5", samples=12,
                                            samples_per_file=1, storage=tmp_path / "fresh"))
    assert _digests(root) == _digests(fresh.root)


def test_refuses_other_dataset_without_force(tmp_path, capsys):
    base = ["generate", "--storage", tmp_path, "--samples", "20"]
    assert cli(*base) == 0
    assert cli(*base) == 0  # same dataset: already complete, nothing to do
    assert "already complete" in capsys.readouterr().err
    assert cli("generate", "--storage", tmp_path, "--samples", "30") == 2
    err = capsys.readouterr().err
    assert "--force" in err and len(err.strip().splitlines()) == 1
    assert Manifest.load(tmp_path / "cifar10-hdf5").num_samples == 20
    assert cli("generate", "--storage", tmp_path, "--samples", "30", "--force") == 0
    assert Manifest.load(tmp_path / "cifar10-hdf5").num_samples == 30


def test_verify_names_each_problem(tmp_path, capsys):
    m = generate_dataset(GenerateConfig(dataset="cifar10", format="files", storage=tmp_path,
                                        samples=30))
    files = [m.path_of(f) for f in m.data_files]
    files[0].write_bytes(files[0].read_bytes()[:-10])  # truncated
    data = bytearray(files[1].read_bytes())
    data[len(data) // 2] ^= 0x40  # flipped byte
    files[1].write_bytes(bytes(data))
    files[2].unlink()  # missing
    assert cli("verify", m.root, "--jobs", "2") == 1
    err = capsys.readouterr().err
    assert f"truncated: {files[0]}" in err
    assert f"checksum mismatch: {files[1]}" in err
    assert f"missing: {files[2]}" in err
    assert "3 problem(s)" in err


def test_verify_catches_damage_in_containers(tmp_path):
    m = generate_dataset(GenerateConfig(dataset="cifar10", format="lmdb", storage=tmp_path,
                                        samples=40, samples_per_file=20))
    p = m.path_of(m.data_files[1])
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)
    probs = verify_dataset(m.root)
    assert len(probs) == 1 and probs[0].startswith("truncated") and str(p) in probs[0]


@pytest.mark.parametrize("argv", [
    # records larger than a page take overflow pages: the pre-check passes, the write fails
    ["--dataset", "cifar10", "--format", "lmdb", "--samples", "1000", "--samples-per-file",
     "500"],
    # compressed: no pre-check; netCDF-C reports the full disk as "HDF error"
    ["--dataset", "cosmoflow", "--format", "netcdf", "--compression", "gzip", "--samples", "2"],
    # a block per small file
    ["--dataset", "cifar10", "--format", "files", "--samples", "1000"],
])
def test_out_of_space_in_every_writer_is_one_line(tmpfs, argv):
    mnt = tmpfs("3600k")
    r = run_cmd("generate", *argv, "--storage", mnt)
    assert r.returncode == 2, r.stderr
    assert "out of space" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list(mnt.rglob("iobench.json")) and not list(mnt.rglob(".*.tmp"))


def test_absurd_size_refused_before_writing(tmp_path):
    r = run_cmd("generate", "--samples", "1000000000000", "--storage", tmp_path)
    assert r.returncode == 2
    assert "needs about 3,072.0 TB" in r.stderr and "free" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written, not even the journal


def test_force_on_a_full_disk_keeps_the_old_dataset(tmpfs):
    mnt = tmpfs("5500k")
    old = ["generate", "--dataset", "cifar10", "--format", "lmdb", "--samples-per-file", "500",
           "--storage", mnt]
    assert run_cmd(*old, "--samples", "500").returncode == 0
    root = mnt / "cifar10-lmdb"
    before = _digests(root)
    # passes the up-front check (LMDB takes more than the samples' bytes), then fills the
    # disk while the old dataset is still there
    r = run_cmd(*old, "--samples", "1000", "--force")
    assert r.returncode == 2 and "out of space" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert _digests(root) == before and verify_dataset(root) == []
    assert Manifest.load(root).num_samples == 500
    # space made: the interrupted replacement resumes beside the old one, then swaps in
    shutil.rmtree(root)
    assert run_cmd(*old, "--samples", "1000", "--force").returncode == 0
    assert Manifest.load(root).num_samples == 1000 and verify_dataset(root) == []
    assert sorted(p.name for p in mnt.iterdir()) == ["cifar10-lmdb"]


def test_force_replaces_in_one_swap(tmp_path):
    base = ["generate", "--storage", tmp_path, "--samples-per-file", "10"]
    assert run_cmd(*base, "--samples", "20").returncode == 0
    r = run_cmd(*base, "--samples", "40", "--force")
    assert r.returncode == 0, r.stderr
    root = tmp_path / "cifar10-hdf5"
    assert Manifest.load(root).num_samples == 40 and verify_dataset(root) == []
    assert [p.name for p in tmp_path.iterdir()] == ["cifar10-hdf5"]  # nothing left beside it


def test_out_of_space_leaves_no_partial_file(tmpfs):
    mnt = tmpfs("2m")
    # compressed: past the up-front space check, so the writer meets the full disk
    r = run_cmd("generate", "--dataset", "cosmoflow", "--samples", "2", "--compression",
                "gzip", "--storage", mnt)
    assert r.returncode == 2
    assert "out of space" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list(mnt.rglob("*.tmp")) and not list(mnt.rglob("*.h5"))


@pytest.mark.parametrize("argv, needle", [
    (["--dataset", "mnist"], "invalid choice: 'mnist'"),
    (["--format", "tfrecord"], "invalid choice: 'tfrecord'"),
    (["--samples", "-5"], "--samples -5 must be >= 1"),
    (["--samples-per-file", "0"], "--samples-per-file 0 must be >= 1"),
    (["--dataset", "imagenet", "--compression", "gzip"], "already compressed"),
    (["--format", "netcdf", "--compression", "lzf"], "not available for the netcdf format"),
    (["--jobs", "0"], "--jobs 0 must be >= 1"),
])
def test_bad_options_one_line(tmp_path, argv, needle):
    r = run_cmd("generate", "--storage", tmp_path, *argv)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_unwritable_target_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = run_cmd("generate", "--storage", blocker / "sub")
    assert r.returncode == 2 and "cannot create --storage" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_verify_without_manifest(tmp_path):
    r = run_cmd("verify", tmp_path)
    assert r.returncode == 2 and "iobench.json is missing" in r.stderr


def test_standard_tools_read_the_files(tmp_path):
    for fmt in ("hdf5", "netcdf", "lmdb"):
        generate_dataset(GenerateConfig(format=fmt, storage=tmp_path, samples=10))
    tools = {"h5ls": [tmp_path / "cifar10-hdf5" / "part-00000.h5"],
             "ncdump": ["-h", tmp_path / "cifar10-netcdf" / "part-00000.nc"],
             "mdb_stat": ["-n", tmp_path / "cifar10-lmdb" / "part-00000.lmdb"]}
    ran = 0
    for tool, args in tools.items():
        if shutil.which(tool):
            r = subprocess.run([tool, *map(str, args)], capture_output=True, text=True)
            assert r.returncode == 0, (tool, r.stderr)
            ran += 1
    if not ran:
        pytest.skip("none of h5ls, ncdump, mdb_stat is installed (hdf5-tools, netcdf-bin, "
                    "lmdb-utils)")


def test_png_and_npy_open_with_standard_libraries(tmp_path):
    from PIL import Image

    m = generate_dataset(GenerateConfig(dataset="cifar10", format="files", storage=tmp_path,
                                        samples=4))
    png = m.path_of(m.data_files[0])
    assert png.suffix == ".png" and png.parent.name.startswith("c")
    with Image.open(io.BytesIO(png.read_bytes())) as im:
        assert im.size == (32, 32) and im.mode == "RGB"


def test_a_container_that_cannot_be_built_in_memory_is_refused(tmp_path):
    """ImageNet-like JPEGs of one container file are encoded in memory: a file larger than
    this machine's memory is refused up front (or, where the disk is smaller still, for
    the disk), naming the options that fix it."""
    from iobench.workflows.generate import _memory_available

    n = str((_memory_available() or 64 << 30) // 110_000 + 1)
    r = run_cmd("generate", "--dataset", "imagenet", "--samples", n,
                "--samples-per-file", n, "--jobs", "2", "--storage", tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "in memory per file" in r.stderr or "free" in r.stderr
    assert not list(tmp_path.iterdir())


def test_lmdb_keys_built_together_equal_one_by_one():
    """The writer's batch of keys is `key` of each index, big-endian, in order."""
    for first, count in ((0, 0), (0, 3), (255, 2), (2**40 - 1, 3), (2**63 - 2, 2)):
        assert keys(first, count) == [key(i) for i in range(first, first + count)]
