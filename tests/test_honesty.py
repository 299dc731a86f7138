"""Trustworthy numbers: cold in user space too, start-up apart, synchronised steps, repeats.

Each test here fails on a loop that flatters its figures: a library cache
that serves a "cold" epoch, worker start-up counted as dataset reads, ranks
that run free of each other, or a clock that only agrees with itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli, mpiexec_path, run_cmd
from iobench.core import results, sysinfo
from iobench.core.manifest import Manifest
from iobench.core.world import World
from iobench.loaders import make_loader
from iobench.workflows.train import TrainConfig, run, server_cache_check
from wrappers import ShadowClock

TESTS = Path(__file__).parent


def _generate(storage: Path, fmt: str, samples: int, *extra: str) -> Manifest:
    assert cli("generate", "--dataset", "cifar10", "--format", fmt, "--samples", str(samples),
               "--storage", str(storage), *extra) == 0
    return Manifest.load(storage / f"cifar10-{fmt}")


def _result(results_dir: Path) -> dict:
    paths = results.find_results([results_dir])
    assert len(paths) == 1, paths
    return results.load_result(paths[0])


@pytest.fixture(scope="module")
def gzip_storage(tmp_path_factory) -> Path:
    """cifar10 compressed with gzip (chunked, one sample per chunk) in HDF5 and NetCDF."""
    s = tmp_path_factory.mktemp("gzip")
    for fmt in ("hdf5", "netcdf"):
        _generate(s, fmt, 2048, "--compression", "gzip")
    return s


@pytest.fixture(scope="module")
def plain_storage(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("plain")
    _generate(s, "hdf5", 1024)
    return s


@pytest.mark.parametrize("loader", ["hdf5", "netcdf", "dali"])
def test_cold_epochs_read_every_byte_through_the_library(gzip_storage: Path, tmp_path: Path,
                                                         loader: str) -> None:
    """Persistent workers keep files open all run: no chunk cache may serve a cold epoch."""
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    extra = ["--format", "hdf5"] if loader == "dali" else []
    assert cli("train", "--loader", loader, "--storage", gzip_storage, "--model", "none",
               "--epochs", "3", "--workers", "2", "--batch-size", "64",
               "--results", tmp_path, *extra) == 0
    doc = _result(tmp_path)
    for ep in doc["epochs"]:
        rchar = sum(r["os_rchar"] for r in ep["ranks"])
        needed = ep["summary"]["batch_bytes"]
        assert rchar >= 0.9 * needed, (ep["epoch"], rchar, needed)
    caches = doc["cache"]["user_space"]
    assert caches and all(v == 0 for k, v in caches.items() if k.endswith("_bytes")), caches


def test_warm_cache_runs_keep_the_library_defaults(gzip_storage: Path, tmp_path: Path) -> None:
    assert cli("train", "--loader", "hdf5", "--storage", gzip_storage, "--model", "none",
               "--epochs", "1", "--workers", "0", "--warm-cache", "--results", tmp_path) == 0
    caches = _result(tmp_path)["cache"]["user_space"]
    assert caches["hdf5_chunk_cache_bytes"] > 0 and caches["hdf5_sieve_buffer_bytes"] > 0


def test_worker_start_up_is_counted_apart_from_the_first_epoch(plain_storage: Path,
                                                              tmp_path: Path) -> None:
    """New workers import their libraries before epoch 1's counters start (fresh processes)."""
    docs = {}
    for workers in (0, 2):
        out = tmp_path / f"w{workers}"
        r = run_cmd("train", "--loader", "hdf5", "--storage", plain_storage, "--model", "none",
                    "--epochs", "1", "--workers", str(workers), "--results", out)
        assert r.returncode == 0, r.stderr
        docs[workers] = _result(out)
    first = {w: sum(r["os_rchar"] for r in d["epochs"][0]["ranks"]) for w, d in docs.items()}
    # the same data read either way; two workers add only their own file opens (~40 kB)
    assert first[2] <= first[0] + 200_000, first
    startup = docs[2]["loader"]["startup"][0]["ranks"][0]
    assert startup["processes"] == 3 and startup["os_rchar"] > 200_000, startup  # imports


def test_shadow_clock_agrees_and_injected_delays_are_bounded(plain_storage: Path,
                                                             tmp_path: Path) -> None:
    """The loop's stall and wall against a clock it does not own, and known injected costs."""
    delay, compute = 0.02, 0.03
    shadows: list[ShadowClock] = []

    def factory(manifest, lc, rank, size):
        shadows.append(ShadowClock(make_loader("hdf5", manifest, lc, rank, size), delay))
        return shadows[-1]

    cfg = TrainConfig(loader="hdf5", storage=str(plain_storage), compute_time_s=compute,
                      epochs=2, batch_size=128, workers=0, results=str(tmp_path))
    doc = run(cfg, factory, World())
    assert doc is not None
    shadow = shadows[0]
    for ep in doc["epochs"]:
        r = ep["ranks"][0]
        e = ep["epoch"]
        steps = shadow.steps(e)
        assert r["steps"] == steps == 8
        assert abs(r["stall_s"] - shadow.stall_s(e)) <= 0.02 * shadow.stall_s(e), (r, e)
        assert abs(r["wall_s"] - shadow.wall_s(e)) <= 0.02 * shadow.wall_s(e), (r, e)
        # each step waited at least the injected delay and computed at least its time,
        # and neither figure swallowed the other's time
        assert steps * delay <= r["stall_s"] <= steps * (delay + 0.05), r
        assert steps * compute <= r["compute_s"] <= steps * (compute + 0.01), r


@pytest.mark.mpi
@pytest.mark.parametrize("sync", [True, False])
def test_one_slow_rank_stalls_every_rank_when_steps_are_synchronised(
        plain_storage: Path, tmp_path: Path, sync: bool) -> None:
    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (install the `mpich` extra)")
    slow = 0.1
    argv = [exe, "-n", "2", sys.executable, str(TESTS / "slow_rank_train.py"), "--slow-rank",
            "1", "--slow-s", str(slow), "--loader", "hdf5", "--storage", str(plain_storage),
            "--compute-time", "0.01", "--epochs", "1", "--batch-size", "64", "--workers", "0",
            "--results", str(tmp_path)] + ([] if sync else ["--no-step-sync"])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    doc = _result(tmp_path)
    ranks = {x["rank"]: x for x in doc["epochs"][0]["ranks"]}
    steps = ranks[1]["steps"]
    assert steps == 8
    assert ranks[1]["stall_s"] >= steps * slow
    if sync:  # rank 0 waits for rank 1's batch at every step, as in data-parallel training
        assert ranks[0]["stall_s"] >= 0.8 * steps * slow, ranks
        assert doc["compute"]["steps"].startswith("synchronous")
    else:  # DLIO's free-running ranks: rank 0 never waits for rank 1
        assert ranks[0]["stall_s"] < 0.3 * steps * slow, ranks
        assert doc["compute"]["steps"] == "free-running"


def test_repeat_gives_independent_tagged_repetitions_and_their_spread(plain_storage: Path,
                                                                      tmp_path: Path) -> None:
    assert cli("train", "--loader", "hdf5", "--storage", plain_storage, "--model", "none",
               "--epochs", "2", "--workers", "0", "--repeat", "3", "--results", tmp_path) == 0
    doc = _result(tmp_path)
    assert doc["schema_version"] == results.SCHEMA_VERSION == 4
    assert [(e["repeat"], e["epoch"]) for e in doc["epochs"]] == [(r, e) for r in range(3)
                                                                   for e in range(2)]
    assert all(e["cache"]["status"] == "cold" for e in doc["epochs"])
    assert len(doc["loader"]["startup"]) == 3  # a fresh loader per repetition
    spread = doc["summary"]["spread"]
    for key in ("epoch_wall_s", "stall_s", "samples_per_s", "read_MBps"):
        s = spread[key]
        assert s["n"] == 3 and s["min"] <= s["median"] <= s["max"], (key, s)
    json.dumps(doc, allow_nan=False)


def test_bad_repeat_and_no_step_sync_with_a_model_are_one_line(plain_storage: Path, capsys,
                                                             tmp_path: Path) -> None:
    assert cli("train", "--loader", "hdf5", "--storage", plain_storage, "--repeat", "0",
               "--results", tmp_path) == 2
    assert "--repeat 0 must be >= 1" in capsys.readouterr().err
    assert cli("train", "--loader", "hdf5", "--storage", plain_storage, "--model", "cnn",
               "--no-step-sync", "--results", tmp_path) == 2
    assert "--no-step-sync" in capsys.readouterr().err


def test_server_cache_rule_on_shared_tiers_only(plain_storage: Path, tmp_path: Path) -> None:
    """MLPerf Storage's 5x rule: on a shared tier a small dataset may sit in server memory."""
    manifest = Manifest.load(plain_storage / "cifar10-hdf5")
    cfg = TrainConfig(loader="hdf5", storage=str(plain_storage), results=str(tmp_path))
    local = sysinfo.mount_of(manifest.root)
    assert local.kind == "local" or local.kind == "overlay"
    assert server_cache_check(cfg, local, manifest, 24 << 30, 1) is None
    from dataclasses import replace

    lustre = replace(local, fstype="lustre", kind="parallel")
    got = server_cache_check(cfg, lustre, manifest, 24 << 30, 2)
    assert got is not None and not got["ok"] and got["required_bytes"] == 5 * (24 << 30)
    assert "2 node(s)" in got["warning"] and "lustre" in got["warning"]
    sized = replace(cfg, server_cache_gb=0.0001)  # 100 kB of server cache: 5x is 500 kB
    got = server_cache_check(sized, lustre, manifest, 24 << 30, 2)
    assert got is not None and got["ok"] and got["cache_source"] == "--server-cache-gb"
    assert got["warning"] is None


def test_the_result_says_what_computed(plain_storage: Path, tmp_path: Path) -> None:
    assert cli("train", "--loader", "hdf5", "--storage", plain_storage, "--model", "cnn",
               "--epochs", "1", "--workers", "0", "--max-steps", "2", "--results", tmp_path) == 0
    doc = _result(tmp_path)
    dev = doc["compute"]["device"]
    assert dev["type"] == "cpu" and dev["name"] == sysinfo.cpu_model() and dev["cores"] >= 1
    assert any("trains on the CPU" in w and "--compute-time" in w for w in doc["warnings"])


def test_a_gpu_this_torch_cannot_use_is_named(monkeypatch) -> None:
    from iobench.workflows import train

    monkeypatch.setattr(sysinfo, "gpus", lambda: [{"index": 0, "name": "NVIDIA H100"}])
    cpu_build = {"type": "cpu", "name": "x", "cores": 2, "cuda": None, "torch": "2.13.0+cpu"}
    (w,) = train.device_warnings(cpu_build, "emulated")
    assert "NVIDIA H100" in w and "CPU build" in w and "CUDA build of torch" in w
    assert not train.device_warnings({**cpu_build, "name": "y"}, "emulated")[0].startswith("the")
