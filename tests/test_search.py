"""MLPerf Storage workloads, `iobench datasize` and `iobench search` (docs/mlperf.md).

The search runs real cold `iobench train` points under mpiexec; the physics
check runs it on the emulated parallel filesystem with a bandwidth cap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_pfs import fuse_usable, pfs  # noqa: F401  (fixtures)

from conftest import cli, mpiexec_path
from iobench.core.metrics import EpochClock, rank_figures
from iobench.core.workloads import WORKLOADS, resolve
from iobench.workflows.search import (
    SearchConfig,
    answer,
    next_point,
    physics_estimate,
    train_command,
)

MB = 1_000_000


# ---- the table and the rules -----------------------------------------------------------------

def test_workload_table_holds_mlperf_figures() -> None:
    r = resolve("resnet50", "a100")
    assert (r.batch, r.compute_s, r.workload.au_threshold) == (400, 0.435, 0.90)
    assert r.workload.samples_per_file == 1251
    c = resolve("cosmoflow", "h100")
    assert (c.batch, c.compute_s, c.workload.au_threshold) == (1, 0.0035, 0.70)
    assert WORKLOADS["unet3d"].sample_bytes == 146_600_628
    assert WORKLOADS["retinanet"].batch == {"b200": 24, "mi355": 32}


def test_physics_figures_of_the_issue() -> None:
    """floor(B / (AU_min x demand)) at 200 MB/s: resnet50 a100 2, h100 1, cosmoflow h100 0."""
    def at_200(w: str, a: str) -> int:
        r = resolve(w, a, runnable=False)
        return physics_estimate(200, r.workload.au_threshold, r.demand_Bps / MB)

    assert at_200("resnet50", "a100") == 2
    assert at_200("resnet50", "h100") == 1
    assert at_200("cosmoflow", "h100") == 0
    assert at_200("unet3d", "h100") == 0


def test_datasize_prints_mlperf_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("datasize", "--workload", "resnet50", "--accelerator", "a100",
               "--accelerators", "8") == 0
    out = capsys.readouterr().out
    assert "1,600,000 samples in 1,279 files" in out  # 500 x 400 x 8, 1,251 per file
    assert cli("datasize", "--workload", "cosmoflow", "--accelerator", "h100",
               "--accelerators", "4", "--hosts", "2", "--host-memory-gb", "256") == 0
    out = capsys.readouterr().out
    assert "971,820 samples" in out and "5 x 2 host(s) x 256 GiB" in out  # memory rule wins


@pytest.mark.parametrize("argv, words", [
    (["generate", "--workload", "unet3d", "--accelerator", "h100", "--format", "hdf5"],
     "contradicts --workload unet3d (--format npz)"),
    (["train", "--workload", "retinanet", "--accelerator", "a100", "--storage", "."],
     "choose one of: b200, mi355"),
    (["train", "--loader", "files", "--accelerator", "h100", "--storage", "."],
     "--accelerator applies with --workload"),
    (["datasize", "--workload", "resnet50", "--accelerator", "b200", "--accelerators", "1"],
     "choose one of: a100, h100"),
    (["search", "--workload", "cosmoflow", "--accelerator", "h100", "--storage", ".",
      "--launcher", "mpiexec -n 4"], "must contain {ranks}"),
    (["generate", "--workload", "resnet50", "--accelerator", "a100", "--format", "lmdb"],
     "contradicts --workload resnet50"),
    (["search", "--workload", "cosmoflow", "--accelerator", "h100", "--storage", ".",
      "--hosts", "4", "--max-accelerators", "2"], "raise --max-accelerators to 4 or more"),
])
def test_bad_workload_lines_are_one_line_exit_2(argv: list[str], words: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


def test_au_mlperf_leaves_out_the_first_steps_io() -> None:
    clock = EpochClock()
    clock.start_ns = 0
    clock.wait_ns = [1_000_000_000, 100_000_000]  # first batch 1 s, then 0.1 s
    clock.compute_ns = [500_000_000, 500_000_000]
    clock._last = 2_100_000_000
    f = rank_figures(clock)
    assert f["au"] == pytest.approx(1.0 / 2.1)
    assert f["au_mlperf"] == pytest.approx(1.0 / 1.1)


@given(k=st.integers(0, 80), limit=st.integers(1, 64))
def test_search_finds_the_largest_passing_count_in_few_points(k: int, limit: int) -> None:
    """With AU falling below the threshold above k accelerators, the search answers
    min(k, limit), never measures above the limit, and takes O(log) points."""
    passed: dict[int, bool] = {}
    while (n := next_point(passed, limit)) is not None:
        assert 1 <= n <= limit and n not in passed
        passed[n] = n <= k
    assert answer(passed) == min(k, limit)
    assert len(passed) <= 2 * (limit.bit_length() + 1)


@given(k=st.integers(0, 80), max_accelerators=st.integers(1, 64), hosts=st.integers(1, 8))
def test_search_over_hosts_runs_only_even_spreads(k: int, max_accelerators: int,
                                                  hosts: int) -> None:
    """--hosts H: every count run is a multiple of H (N / H per host) up to
    --max-accelerators rounded down to one; the answer is the largest such count that
    passes, still in O(log) points."""
    if hosts > max_accelerators:  # a ConfigError (below)
        return
    cfg = SearchConfig(workload="cosmoflow", accelerator="h100", storage=".", hosts=hosts,
                       max_accelerators=max_accelerators)
    assert cfg.step == hosts and cfg.limit == max_accelerators // hosts * hosts
    passed: dict[int, bool] = {}
    while (n := next_point(passed, cfg.limit, cfg.step)) is not None:
        assert n % hosts == 0 and hosts <= n <= cfg.limit and n not in passed
        passed[n] = n <= k
    assert answer(passed) == min(k, cfg.limit) // hosts * hosts
    assert len(passed) <= 2 * ((cfg.limit // hosts).bit_length() + 1)


def test_launcher_gets_the_per_host_count(tmp_path: Path) -> None:
    cfg = SearchConfig(workload="cosmoflow", accelerator="h100", storage=".", hosts=4,
                       max_accelerators=10,
                       launcher=("env", "RANKS={ranks}", "PER_HOST={per_host}"))
    assert cfg.limit == 8
    cmd = train_command(cfg, 8, tmp_path)
    assert cmd[1:3] == ["RANKS=8", "PER_HOST=2"]
    with pytest.raises(ValueError, match="do not spread evenly over 4 hosts"):
        train_command(cfg, 6, tmp_path)


# ---- real runs -------------------------------------------------------------------------------

needs_mpi = pytest.mark.skipif(mpiexec_path() is None, reason="mpiexec not found (mpich extra)")


@pytest.fixture(scope="module")
def cosmo_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cosmo")
    assert cli("generate", "--workload", "cosmoflow", "--accelerator", "h100", "--samples", "24",
               "--storage", d) == 0
    return d


def test_cosmoflow_samples_are_mlperf_sized(cosmo_storage: Path) -> None:
    sizes = {p.stat().st_size for p in (cosmo_storage / "cosmoflow-mlperf-files" / "train")
             .glob("*.npy")}
    assert len(sizes) == 1 and abs(sizes.pop() / 2_828_486 - 1) < 0.10


def test_train_with_a_workload_runs_its_preset(cosmo_storage: Path, tmp_path: Path) -> None:
    """--workload cosmoflow --accelerator h100: batch 1, 0.0035 s per step, no decoding, AU
    threshold 0.70, and a warning that 24 samples are under MLPerf's 500."""
    res = tmp_path / "res"
    assert cli("train", "--workload", "cosmoflow", "--accelerator", "h100", "--storage",
               cosmo_storage, "--epochs", "1", "--results", res) == 0
    [path] = res.glob("*.json")
    doc = json.loads(path.read_text())
    c = doc["config"]
    assert (c["dataset"], c["loader"], c["batch_size"], c["compute_time_s"], c["decode"]) == \
        ("cosmoflow-mlperf", "files", 1, 0.0035, False)
    assert doc["summary"]["verdict"]["threshold"] == 0.70
    assert any("MLPerf Storage asks for 500" in w for w in doc["warnings"])
    s = doc["epochs"][0]["summary"]
    assert s["au_mlperf_mean"] >= s["au_mean"]


@pytest.fixture(scope="module")
def unet3d_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One unet3d sample at MLPerf's size (152 MB, ~6 s here): samples cannot be made
    smaller (their sizes are MLPerf's), so the tests read one sample."""
    d = tmp_path_factory.mktemp("unet3d")
    assert cli("generate", "--workload", "unet3d", "--accelerator", "a100", "--samples", "1",
               "--storage", d) == 0
    return d


def test_unet3d_samples_are_mlperf_sized_npz_volumes(unet3d_storage: Path) -> None:
    """One .npz per sample, within 10% of MLPerf's mean, holding the seed's volume."""
    import numpy as np

    from iobench.core.datasets import DATASETS
    from iobench.generators.synth import make_sample, sample_depth

    [path] = (unet3d_storage / "unet3d-npz" / "train").glob("*.npz")
    assert abs(path.stat().st_size / 146_600_628 - 1) < 0.10
    x, y = make_sample(DATASETS["unet3d"], 0, 0)
    with np.load(path, allow_pickle=False) as z:
        assert z["x"].shape == (sample_depth(DATASETS["unet3d"], 0, 0), 264, 264, 4)
        assert z["x"].dtype == np.int16
        assert np.array_equal(z["x"], x) and np.array_equal(z["y"], y)
    assert len(np.unique(x[::8, ::8, ::8, 3])) > 100  # a field, not a constant


def test_train_runs_unet3d(unet3d_storage: Path, tmp_path: Path) -> None:
    """--workload unet3d --accelerator b200: the npz loader, batch 7, 0.162 s per step; the
    one sample is one partial batch, read whole from storage."""
    res = tmp_path / "res"
    assert cli("train", "--workload", "unet3d", "--accelerator", "b200", "--storage",
               unet3d_storage, "--epochs", "1", "--results", res) == 0
    [path] = res.glob("*.json")
    doc = json.loads(path.read_text())
    c = doc["config"]
    assert (c["dataset"], c["loader"], c["batch_size"], c["compute_time_s"], c["decode"]) == \
        ("unet3d", "npz", 7, 0.162, False)
    [npz] = (unet3d_storage / "unet3d-npz" / "train").glob("*.npz")
    assert doc["epochs"][0]["summary"]["batch_bytes"] == npz.stat().st_size


@needs_mpi
def test_search_refuses_a_point_of_one_step(unet3d_storage: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A real cold run of one emulated b200 on the one sample is one step per epoch: MLPerf's
    AU leaves the first step out, so it would read 1.00 by construction ("keeps 1
    accelerator"). The search refuses it in one line naming the step count and the fix."""
    res = tmp_path / "res"
    assert cli("search", "--workload", "unet3d", "--accelerator", "b200", "--storage",
               unet3d_storage, "--results", res, "--max-accelerators", "1") == 1  # SearchError
    err = capsys.readouterr().err.strip().splitlines()
    assert "measured 1 step(s) per epoch" in err[-1] and "iobench datasize" in err[-1], err
    assert not any("keeps 1" in ln for ln in err)


@pytest.fixture(scope="module")
def retinanet_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("retinanet")
    assert cli("generate", "--workload", "retinanet", "--accelerator", "b200", "--samples",
               "120", "--jobs", "2", "--storage", d) == 0
    return d


def test_retinanet_jpegs_are_mlperf_sized(retinanet_storage: Path) -> None:
    """One JPEG per file, mean within 10% of MLPerf's 322,957 B (the first 120 of seed 0:
    -0.1%; 1,000: -0.5%, docs/mlperf.md)."""
    sizes = [p.stat().st_size for p in (retinanet_storage / "openimages-files" / "train")
             .rglob("*.JPEG")]
    assert len(sizes) == 120
    assert abs(sum(sizes) / len(sizes) / 322_957 - 1) < 0.10


def test_train_runs_retinanet(retinanet_storage: Path, tmp_path: Path) -> None:
    res = tmp_path / "res"
    assert cli("train", "--workload", "retinanet", "--accelerator", "mi355", "--storage",
               retinanet_storage, "--epochs", "1", "--results", res) == 0
    [path] = res.glob("*.json")
    doc = json.loads(path.read_text())
    c = doc["config"]
    assert (c["dataset"], c["loader"], c["batch_size"], c["compute_time_s"]) == \
        ("openimages", "files", 32, 0.0634)
    assert doc["summary"]["verdict"]["threshold"] == 0.85
    assert doc["epochs"][0]["summary"]["samples"] == 120


@needs_mpi
def test_search_on_local_disk_writes_a_search_result(cosmo_storage: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Threshold 0.01: every point passes, so the search doubles to the cap (1, 2) and stops;
    every point is a real run with --repeat 2; the report plots it. Run from a directory
    holding another `iobench` package (a checkout): the points still run this one."""
    res = tmp_path / "res"
    decoy = tmp_path / "checkout" / "iobench"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "__main__.py").write_text("raise SystemExit('the decoy iobench ran')\n")
    monkeypatch.chdir(decoy.parent)
    assert cli("search", "--workload", "cosmoflow", "--accelerator", "h100", "--storage",
               cosmo_storage, "--results", res, "--max-accelerators", "2", "--repeat", "2",
               "--au-threshold", "0.01") == 0
    out = capsys.readouterr().out
    assert "keeps 2 accelerator(s) at AU >= 0.01" in out.splitlines()[-1]
    [path] = res.glob("search-*.json")
    doc = json.loads(path.read_text())
    assert (doc["kind"], doc["status"], doc["max_accelerators"]) == ("search", "complete", 2)
    assert [p["accelerators"] for p in doc["points"]] == [1, 2]
    for p in doc["points"]:
        assert p["repeats"] == 2 and 0 < p["au"] <= 1 and p["read_MBps"] > 0
        train = json.loads(Path(p["result"]).read_text())
        assert train["world"]["size"] == p["accelerators"] and train["cache"]["mode"] == "cold"
        if p["accelerators"] > 1:
            assert train["compute"]["steps"].startswith("synchronous")
    assert cli("report", res, "--out", tmp_path / "r.md") == 0
    text = (tmp_path / "r.md").read_text()
    assert "iobench search" in text and (tmp_path / "r-search.png").stat().st_size > 0


@needs_mpi
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_search_says_so(cosmo_storage: Path, tmp_path: Path, sig: int,
                                    code: int) -> None:
    res = tmp_path / "res"
    proc = subprocess.Popen(
        [sys.executable, "-m", "iobench", "search", "--workload", "cosmoflow", "--accelerator",
         "h100", "--storage", str(cosmo_storage), "--results", str(res), "--slowdown", "100",
         "--max-accelerators", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "search cosmoflow/h100: 1 accelerator(s) ..."
    assert "1 accelerator(s)" in line, line
    time.sleep(4)  # the point's ranks are running (24 steps of 0.35 s)
    proc.send_signal(sig)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == code, rest
    [path] = res.glob("search-*.json")
    doc = json.loads(path.read_text())
    assert doc["status"] == "interrupted" and doc["points"] == []
    assert "marked interrupted" in rest
    assert not list(res.glob("search-*/n1/*.json")) or all(
        json.loads(p.read_text())["status"] != "complete"
        for p in res.glob("search-*/n1/*.json"))


# ---- physics: a bandwidth cap decides the count ----------------------------------------------

@needs_mpi
@pytest.mark.fuse
@pytest.mark.slow
def test_search_answers_the_bandwidth_physics(pfs, tmp_path: Path,  # noqa: F811
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """On the emulated PFS capped at B, the answer is floor(B / (AU_min x demand)) or one
    less (efficiency below 100%), never more (the cap is hard).

    Scaled so that this 2-core CI machine's CPUs are not what limits: B = 50 MB/s and every
    accelerator's demand / 4 (--slowdown 4: compute 4x longer), the same ratio as the issue's
    200 MB/s at full demand; resnet50's batch is 40 with 1/10 of the compute time (demand
    kept). Expected: resnet50 a100 2, resnet50 h100 1, cosmoflow h100 0.
    """
    backing = tmp_path / "backing"
    assert cli("generate", "--workload", "resnet50", "--accelerator", "a100", "--samples",
               "1300", "--storage", backing, "--jobs", "2") == 0
    assert cli("generate", "--workload", "cosmoflow", "--accelerator", "h100", "--samples",
               "24", "--storage", backing) == 0
    from iobench.core.manifest import Manifest

    m = Manifest.load(backing / "imagenet-hdf5")
    per_sample = sum(f.bytes for f in m.data_files) / m.num_samples
    assert abs(per_sample / 114_660 - 1) < 0.10, per_sample
    bandwidth, slowdown = 50.0, 4.0
    mp = pfs(backing, "passthrough", bandwidth_MBps=bandwidth).mountpoint
    capsys.readouterr()
    for workload, acc, expected, batch in (("resnet50", "a100", 2, "40"),
                                           ("resnet50", "h100", 1, "40"),
                                           ("cosmoflow", "h100", 0, "1")):
        r = resolve(workload, acc)
        assert physics_estimate(bandwidth, r.workload.au_threshold,
                                r.demand_Bps / slowdown / MB) == expected
        res = tmp_path / f"res-{workload}-{acc}"
        assert cli("search", "--workload", workload, "--accelerator", acc, "--storage", mp,
                   "--results", res, "--batch-size", batch, "--slowdown", str(slowdown),
                   "--max-accelerators", "4") == 0
        [path] = res.glob("search-*.json")
        doc = json.loads(path.read_text())
        got = doc["max_accelerators"]
        curve = [(p["accelerators"], round(p["au"], 3), round(p["read_MBps"], 1))
                 for p in doc["points"]]
        print(f"{workload}/{acc}: expected {expected}, got {got}: {curve}", file=sys.__stderr__)
        assert expected - 1 <= got <= expected, (workload, acc, curve)
        # the cap is shared: no point read faster than it (5% for the emulator's pacing)
        assert all(p["read_MBps"] <= bandwidth * 1.05 for p in doc["points"]), curve


def test_sweep_takes_the_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = Path(__file__).resolve().parents[1] / "scripts" / "sweeps" / "laptop.yaml"
    assert cli("sweep", sweep, "--dry-run", "--results", tmp_path, "--workload", "cosmoflow",
               "--accelerator", "h100") == 0
    runs = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("run")]
    assert runs and all("cosmoflow-mlperf-files files" in ln and " b1 " in ln for ln in runs)
