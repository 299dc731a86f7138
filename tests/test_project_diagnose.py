"""`iobench project` with a `diagnose` result as the node's delivery curve, and the client cache's front-loading of a shuffled epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli
from iobench.core.projection import (
    Figure,
    NodeFigures,
    ReadModel,
    TierLimits,
    delivery,
    epoch_shares,
    fit_delivery_latency,
    opening_share,
)


def _node(k: float | None = None, compute_s: float = 0.1, step_s: float = 0.1,
          workers: int = 1) -> NodeFigures:
    return NodeFigures(nodes=1, ranks_per_node=1, batch_size=100, workers=workers,
                       compute_s=compute_s, step_s=step_s, worker_cpu_s=0.0,
                       first_batch_s=0.0, sample_bytes=1000.0,
                       ops_per_sample=Figure(1.0, "test"), epoch_samples=100_000,
                       stall_s=0.0, au=None,
                       samples_per_request=None if k is None else Figure(k, "test"))


def _tier(bandwidth_Bps: float = 1e6, mds: float = 1e5) -> TierLimits:
    return TierLimits(bandwidth_Bps=Figure(bandwidth_Bps, "test"),
                      metadata_ops=Figure(mds, "test"))


# ------------------------------------------------------------------ front-loading, known answers

def test_a_shuffled_epochs_tier_bytes_fall_over_the_epoch_and_keep_their_mean() -> None:
    assert epoch_shares(1.0) == (1.0,)
    for k in (1.5, 2.0, 4.0):
        shares = epoch_shares(k)
        assert sum(shares) / len(shares) == pytest.approx(1.0)
        assert list(shares) == sorted(shares, reverse=True) and shares[0] > 1 > shares[-1]
    # the mean of k (1 - f)^(k - 1) over the epoch's opening fraction a: (1 - (1 - a)^k) / a
    assert opening_share(2.0, 1.0) == pytest.approx(1.0)
    assert opening_share(2.0, 0.5) == pytest.approx(1.5)
    assert opening_share(2.0, 1e-6) == pytest.approx(2.0, rel=1e-5)
    assert opening_share(1.0, 0.1) == 1.0


def test_front_loading_lengthens_the_mean_step_only_where_the_tier_limits_part_of_the_epoch(
        ) -> None:
    """One reader, no latency, no think: a part's step is max(compute, its bytes / bandwidth
    + metadata); the model's step is their mean over the parts."""
    tier = _tier(bandwidth_Bps=1.25e6)  # a batch's 100 kB: 0.08 s, its 100 opens 0.001 s
    for k in (1.0, 2.0):
        node = _node(k)
        want = sum(max(0.1, 0.001 + g * 0.08) for g in epoch_shares(k)) / len(epoch_shares(k))
        assert ReadModel(node, tier, (0.0, "none")).at(1).step_s == pytest.approx(want)
    assert ReadModel(_node(2.0), tier, (0.0, "none")).at(1).step_s > 0.1 + 1e-3
    assert ReadModel(_node(1.0), tier, (0.0, "none")).at(1).step_s == pytest.approx(0.1)
    fast = _tier(bandwidth_Bps=1e9)  # never limits: every part computes
    assert ReadModel(_node(2.0), fast, (0.0, "none")).at(1).step_s == pytest.approx(0.1)


def test_a_delivery_fits_the_latency_of_one_reader_in_closed_form() -> None:
    """One reader alone: batches/s = 1 / (metadata + bandwidth demand + latency)."""
    node, tier = _node(), _tier()
    demand = 100 / 1e5 + 100 * 1000 / 1e6
    latency = fit_delivery_latency(node, tier, 1, 1.0, 5.0)
    assert latency == pytest.approx(1 / 5.0 - demand, rel=1e-9)
    assert delivery(node, tier, 1, latency) == pytest.approx(5.0)
    assert fit_delivery_latency(node, tier, 1, 1.0, 100.0) == 0.0  # faster than the limits


def test_a_delivery_curve_gives_a_latency_per_sample_times_the_training_batch() -> None:
    """One reader, every batch alike (k = 1): a diagnosis batch of 50 delivered at X
    samples/s takes 50 / X s a batch, the limits' demand D of it, so L = (50 / X - D) / 50
    per sample; the projection's latency is that times its own batch (100)."""
    from iobench.workflows.diagnose import Demand, DiagnoseConfig, DiagnoseResult, Diagnosis
    from iobench.workflows.diagnose import Measurement as Run
    from iobench.workflows.project import delivery_curve

    cfg = DiagnoseConfig(loader="hdf5", storage="/x", dataset="cifar10", batch_size=50,
                         demand=Demand(1000.0, "measured", "test"))
    runs = (Run("storage", 1, 250.0, 10, None, 0.0, "a"), Run("storage", 2, 400.0, 10, None,
                                                               0.0, "b"))
    diag = DiagnoseResult(cfg, runs, runs, None,
                          Diagnosis("none", "none", 1, 400.0, 400.0, 100.0, "x"), "now")
    node, tier = _node(), _tier()
    demand = 50 / 1e5 + 50 * 1000 / 1e6  # a batch of 50: its opens and its bytes
    curve = delivery_curve(Path("d.json"), DiagnoseResult(cfg, runs, runs[:1], None,
                                                          diag.diagnosis, "now"), node, tier)
    assert curve.latency_s == pytest.approx((50 / 250.0 - demand) / 50 * 100, rel=1e-9)
    assert curve.points == ((1, 250.0, pytest.approx(250.0)),)
    both = delivery_curve(Path("d.json"), diag, node, tier)
    low, high = both.latency_range_s
    assert low < high and low <= both.latency_s <= high
    assert [w for w, _, _ in both.points] == [1, 2]


# ------------------------------------------------------------------ diagnose as the input, end to end

@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny cifar10, diagnosed (storage at 1 and 2 workers) and trained on."""
    top = tmp_path_factory.mktemp("proj-diag")
    data = top / "data"
    assert cli("generate", "--dataset", "cifar10", "--samples", "1024", "--storage", data) == 0
    assert cli("diagnose", "--loader", "hdf5", "--storage", data, "--dataset", "cifar10",
               "--steps", "8", "--batch-size", "32", "--worker-counts", "1,2",
               "--compute-time", "0.02", "--run-timeout", "240",
               "--results", top / "diag") == 0
    assert cli("train", "--loader", "hdf5", "--storage", data, "--dataset", "cifar10",
               "--compute-time", "0.02", "--epochs", "1", "--batch-size", "32",
               "--workers", "1", "--results", top / "train") == 0
    (diag,) = (top / "diag").glob("diagnose-*.json")
    (train,) = (top / "train").glob("*.json")
    return {"top": top, "diagnose": diag, "train": train}


def _project(measured: dict[str, Path], diagnose: Path, out: Path) -> list[str]:
    return ["project", "--train", str(measured["train"]), "--diagnose", str(diagnose),
            "--pfs-read-gbs", "0.05", "--pfs-mds-ops", "1e5", "--nodes", "1,4,64",
            "--simulate-max-nodes", "0", "--no-plot", "--results", str(out)]


@pytest.mark.slow
def test_a_diagnose_result_is_the_delivery_curve(measured: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    diag = json.loads(measured["diagnose"].read_text())
    assert cli(*_project(measured, measured["diagnose"], tmp_path / "a")) == 0
    out = capsys.readouterr().out
    assert "delivery curve of the diagnose result" in out and "PROJECTION" in out
    (path,) = (tmp_path / "a").glob("projection-*.json")
    doc = json.loads(path.read_text())
    assert doc["inputs"]["diagnose"] == str(measured["diagnose"])
    assert "diagnose result's fastest and slowest" in doc["model"]["spread_note"]
    curve = {f["name"]: f for f in doc["figures"] if f["name"].startswith("delivery with")}
    assert sorted(curve) == ["delivery with 1 worker(s), cold, no decode",
                             "delivery with 2 worker(s), cold, no decode"]
    for m in diag["storage"]:  # each measured point, as the diagnosis measured it
        f = curve[f"delivery with {m['workers']} worker(s), cold, no decode"]
        assert f["value"] == pytest.approx(m["samples_per_s"]) and not f["given"]
    # one worker count alone: the fitted model delivers exactly what it measured
    one = dict(diag, storage=diag["storage"][:1])
    single = tmp_path / "one.json"
    single.write_text(json.dumps(one))
    assert cli(*_project(measured, single, tmp_path / "b")) == 0
    capsys.readouterr()
    (path,) = (tmp_path / "b").glob("projection-*.json")
    (f,) = [f for f in json.loads(path.read_text())["figures"]
            if f["name"].startswith("delivery with")]
    model = float(f["source"].rsplit(": ", 1)[1].split()[0])
    if json.loads(path.read_text())["model"]["latency_s"] > 0:  # else the limits alone were slower
        assert model == pytest.approx(f["value"], rel=1e-3)


@pytest.mark.slow
def test_a_diagnose_result_of_another_dataset_or_no_diagnosis_is_one_line_and_exit_2(
        measured: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    other = json.loads(measured["diagnose"].read_text())
    other["config"]["dataset"] = "imagenet"
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps(other))
    for path, words in ((bad, "give results of one dataset"),
                        (measured["train"], "is not an iobench 'iobench.diagnose' document")):
        assert cli(*_project(measured, path, tmp_path / "r")) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert not list((tmp_path / "r").glob("projection-*.json"))
