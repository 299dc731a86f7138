"""`iobench train` end to end: real generated datasets, real loaders, `mpiexec -n 2`, crashes.

Tiny cifar10 datasets (generated once per module in every format), small
model, few steps: the whole file runs in about two minutes on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import VENV_BIN, cli, run_cmd, run_mpi
from iobench.core import results
from iobench.core.manifest import Manifest

SAMPLES = 512

pytestmark = pytest.mark.mpi


def generate(storage: Path, fmt: str, samples: int = SAMPLES) -> Manifest:
    """A real cifar10 dataset from the real generator (`iobench generate`)."""
    code = cli("generate", "--dataset", "cifar10", "--format", fmt, "--samples", str(samples),
               "--storage", str(storage))
    assert code == 0, f"iobench generate --format {fmt} failed"
    return Manifest.load(storage / f"cifar10-{fmt}")


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("train-storage")
    for fmt in dict.fromkeys(c[c.index("--format") + 1] if "--format" in c else loader
                             for loader, c in CASES.items()):
        generate(s, fmt)
    return s


def _only_result(results_dir: Path) -> dict:
    paths = results.find_results([results_dir])
    assert len(paths) == 1, paths
    return results.load_result(paths[0])


# loader -> extra options: between them, every kind of compute and shuffle is covered
CASES = {
    "hdf5": ["--model", "cnn"],
    "netcdf": ["--compute-time", "0.05"],
    "lmdb": ["--model", "none", "--no-decode", "--shuffle", "block"],
    "files": ["--model", "cnn", "--worker-type", "thread", "--shuffle", "none"],
    "dali": ["--format", "hdf5", "--compute-time", "0.05"],
}


@pytest.mark.parametrize("loader", list(CASES))
def test_two_ranks_every_loader(storage: Path, tmp_path: Path, loader: str) -> None:
    res = tmp_path / "res"
    out = run_mpi(2, "train", "--loader", loader, "--storage", storage, "--epochs", "2",
                  "--batch-size", "32", "--workers", "1", "--max-steps", "4",
                  "--results", res, *CASES[loader], timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = _only_result(res)
    assert doc["world"]["size"] == 2 and doc["world"]["launcher"] == "mpi"
    assert doc["world"]["backend"] == "gloo"
    assert doc["config"]["loader"] == loader and len(doc["epochs"]) == 2
    assert doc["dataset"]["num_samples"] == SAMPLES
    for ep in doc["epochs"]:
        assert [r["rank"] for r in ep["ranks"]] == [0, 1]
        assert ep["summary"]["samples"] == 2 * 4 * 32
        assert ep["summary"]["batch_bytes"] > 0 and ep["summary"]["read_MBps"] > 0
        # rank 0's host's busy CPU over the epoch: read under MPI too (no bound here: the
        # in-process test in test_train.py bounds it by a wall clock)
        assert ep["host_cpu"]["cpus"] >= 1 and ep["host_cpu"]["busy_s"] >= 0, ep["host_cpu"]
        if loader == "lmdb" and ep["cache"]["status"] == "warm":
            # LMDB readers keep the file mapped, and mapped pages cannot be evicted: the
            # run must say so (loudly, in the result) rather than pass for cold
            assert ep["epoch"] > 0 and any("COLD CACHE FAILED" in w for w in ep["warnings"])
        else:
            assert ep["cache"]["status"] == "cold", ep["cache"]
    kind = doc["compute"]["kind"]
    assert f"compute: {'real model' if kind == 'model' else kind}" in out.stdout.replace(
        "emulated accelerator", "emulated")
    if kind == "emulated":
        for ep in doc["epochs"]:
            for r in ep["ranks"]:
                # never short of the asked time; over it only by the scheduler's delays (a
                # loaded 2-core CI machine): a double count or a missed step would be far off
                assert 0.05 * 0.999 <= r["compute_mean_s"] < 0.05 * 1.25, r
    if kind == "model":
        assert doc["epochs"][-1]["training"]["accuracy"] is not None
    # rank 0 prints, the other rank stays quiet: one header, one result line
    assert out.stdout.count("result: ") == 1 and out.stdout.count("iobench train cifar10") == 1


def test_cold_cache_reads_storage_warm_does_not_and_it_learns(storage: Path,
                                                             tmp_path: Path) -> None:
    data_bytes = sum(f.bytes for f in Manifest.load(storage / "cifar10-hdf5").data_files)
    cold = run_cmd("train", "--loader", "hdf5", "--storage", storage, "--epochs", "3",
                   "--batch-size", "32", "--workers", "1", "--results", tmp_path / "cold",
                   env={"OMP_NUM_THREADS": "1"})
    assert cold.returncode == 0, cold.stderr[-3000:]
    doc = _only_result(tmp_path / "cold")
    for ep in doc["epochs"]:
        # every sample came from storage (file metadata stays in HDF5's metadata cache)
        assert ep["summary"]["os_read_bytes"] >= ep["summary"]["batch_bytes"], ep["summary"]
        assert ep["ranks"][0]["cache_resident_fraction_at_start"] <= 0.1
    # the generated cifar10 labels are learnable: far above 10 % chance within 3 epochs
    acc = [ep["training"]["accuracy"] for ep in doc["epochs"]]
    assert acc[-1] > 0.5, acc

    warm = run_cmd("train", "--loader", "hdf5", "--storage", storage, "--epochs", "2",
                   "--batch-size", "32", "--workers", "1", "--model", "none",
                   "--warm-cache", "--results", tmp_path / "warm", env={"OMP_NUM_THREADS": "1"})
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "WARM" in warm.stdout
    doc = _only_result(tmp_path / "warm")
    assert doc["cache"]["mode"] == "warm"
    second = doc["epochs"][1]
    assert second["ranks"][0]["cache_resident_fraction_at_start"] > 0.9
    assert second["summary"]["os_read_bytes"] < 0.05 * data_bytes, second["summary"]


@pytest.mark.parametrize("action", ["raise", "kill"])
def test_failed_rank_ends_the_job(storage: Path, tmp_path: Path, action: str) -> None:
    t0 = time.monotonic()
    out = run_mpi(2, "train", "--loader", "hdf5", "--storage", storage, "--epochs", "3",
                  "--batch-size", "16", "--workers", "1", "--results", tmp_path,
                  env={"IOBENCH_TEST_FAULT": f"rank=1,epoch=0,step=2,action={action}"},
                  timeout=120)
    assert time.monotonic() - t0 < 60
    assert out.returncode != 0
    if action == "raise":
        assert "iobench: error: rank 1 failed: RuntimeError: injected fault" in out.stderr
    assert not list(tmp_path.glob("*.json"))  # no result from a failed run


def test_missing_dataset_under_mpi_one_line(tmp_path: Path) -> None:
    out = run_mpi(2, "train", "--loader", "lmdb", "--storage", tmp_path, "--results", tmp_path,
                  timeout=120)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("iobench:")]
    assert lines == [f"iobench: error: no cifar10 dataset in lmdb format at "
                     f"{tmp_path}/cifar10-lmdb; create it with: iobench generate --dataset "
                     f"cifar10 --format lmdb --storage {tmp_path}"]


def test_result_is_plain_json(storage: Path, tmp_path: Path) -> None:
    out = run_cmd("train", "--loader", "hdf5", "--storage", storage, "--epochs", "1",
                  "--max-steps", "2", "--model", "none", "--workers", "0",
                  "--results", tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["schema"] == "iobench.result" and doc["run_id"] == path.stem
    assert doc["provenance"]["storage"]["fstype"] and doc["provenance"]["versions"]["torch"]


def _torchrun(*argv: str | Path, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    exe = VENV_BIN / "torchrun"
    if not exe.exists():
        pytest.skip("torchrun not installed")
    return subprocess.run([str(exe), "--nproc-per-node", "2", "-m", "iobench", *map(str, argv)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_torchrun_two_ranks_and_a_failing_rank(storage: Path, tmp_path: Path) -> None:
    args = ("train", "--loader", "hdf5", "--storage", storage, "--epochs", "1",
            "--batch-size", "32", "--workers", "1", "--max-steps", "3")
    out = _torchrun(*args, "--results", tmp_path / "ok")
    assert out.returncode == 0, out.stderr[-3000:]
    doc = _only_result(tmp_path / "ok")
    assert doc["world"]["launcher"] == "torchrun" and doc["world"]["size"] == 2
    t0 = time.monotonic()
    out = _torchrun(*args, "--results", tmp_path / "bad",
                    env={"IOBENCH_TEST_FAULT": "rank=1,epoch=0,step=1,action=raise"})
    assert time.monotonic() - t0 < 60 and out.returncode != 0
    assert "iobench: error: rank 1 failed: RuntimeError: injected fault" in out.stderr
