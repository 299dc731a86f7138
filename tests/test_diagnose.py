"""Tests of `iobench diagnose`: the answer from the ceilings, and known causes set on purpose.

The slow tests cap an emulated parallel filesystem (FUSE) below or above the demand, or
make the CPU the limit on a local tier, and check that the diagnosis names the cause that
was set; they skip with the reason where FUSE is not usable.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli
from iobench.core.errors import ConfigError
from iobench.workflows.diagnose import (
    LOADER,
    MEMORY_RUN,
    NONE,
    STORAGE,
    STORAGE_RUN,
    USER_RUN,
    DiagnoseConfig,
    DiagnoseResult,
    Measurement,
    RunSpec,
    classify,
    demand_of,
    iobench_argv,
    load_diagnosis,
    parse_worker_counts,
    plan_runs,
    train_args,
    user_run_note,
)


def _runs(kind: str, rates: dict[int, float]) -> list[Measurement]:
    return [Measurement(kind, n, r, 10, None, None, f"r{n}") for n, r in rates.items()]


def _classify(demand: float, memory: dict[int, float], storage: dict[int, float]):
    return classify(demand, _runs(MEMORY_RUN, memory), _runs(STORAGE_RUN, storage))


# ---- the answer from the ceilings (no runs) --------------------------------------------------

def test_storage_under_the_demand_at_every_worker_count_is_stage() -> None:
    d = _classify(1000, {1: 5000, 2: 9000}, {1: 300, 2: 450})
    assert (d.cause, d.action, d.storage_ceiling) == (STORAGE, "stage", 450)
    assert "stage" in d.line and "450" in d.line and "1000" in d.line


def test_loader_under_the_demand_from_memory_is_gpu_decode_not_stage() -> None:
    d = _classify(1000, {1: 200, 2: 380}, {1: 5000, 2: 9000})
    assert (d.cause, d.action, d.memory_ceiling, d.workers) == (LOADER, "gpu-decode", 380, None)
    assert "staging will not help" in d.line


def test_the_lower_ceiling_is_the_cause_when_both_are_under() -> None:
    assert _classify(1000, {1: 100}, {1: 500}).cause == LOADER
    d = _classify(1000, {1: 500}, {1: 100})
    assert d.cause == STORAGE and "then the loader too" in d.line


def test_enough_workers_is_the_smallest_count_where_both_ceilings_meet() -> None:
    d = _classify(1000, {1: 600, 2: 1100, 4: 2000}, {1: 800, 2: 900, 4: 3000})
    assert (d.cause, d.action, d.workers) == (LOADER, "workers", 4)
    assert "--workers 4" in d.line


def test_keeps_up_at_the_fewest_workers_tried() -> None:
    d = _classify(1000, {1: 1500, 2: 2500}, {1: 2000, 2: 4000})
    assert (d.cause, d.action, d.workers) == (NONE, "none", 1)
    assert d.line.startswith("keeps up")


def test_demand_from_a_compute_time_or_a_measured_rate() -> None:
    assert demand_of(64, compute_s=0.02).samples_per_s == pytest.approx(3200)
    w = demand_of(7, compute_s=0.323, workload="unet3d")
    assert w.source == "workload" and w.detail.startswith("unet3d")
    assert demand_of(64, measured=812.5).source == "measured"
    for bad in ({}, {"compute_s": 0.1, "measured": 5.0}):
        with pytest.raises(ConfigError, match="demand"):
            demand_of(64, **bad)
    with pytest.raises(ConfigError, match="--compute-time"):
        demand_of(64, compute_s=0.0)
    with pytest.raises(ConfigError, match="--demand"):
        demand_of(64, measured=-1.0)


def test_worker_counts_parse_and_reject_by_name() -> None:
    assert parse_worker_counts("4,1,2,2") == (1, 2, 4)
    for bad in ("", "a,b", "-1,2"):
        with pytest.raises(ConfigError, match="--worker-counts"):
            parse_worker_counts(bad)


def _config(**kw) -> DiagnoseConfig:
    base = {"loader": "hdf5", "storage": "/s", "dataset": "cifar10", "batch_size": 32,
            "demand": demand_of(32, measured=1600.0), "worker_counts": (1, 2)}
    return DiagnoseConfig(**{**base, **kw})


def test_the_plan_measures_memory_and_storage_at_each_count_then_the_users_run() -> None:
    assert [(s.kind, s.workers) for s in plan_runs(_config())] == [
        (MEMORY_RUN, 1), (MEMORY_RUN, 2), (STORAGE_RUN, 1), (STORAGE_RUN, 2)]
    assert plan_runs(_config(user_workers=3))[-1] == RunSpec(USER_RUN, 3)
    mem = train_args(_config(), RunSpec(MEMORY_RUN, 2), Path("/r"))
    assert {"--warm-cache", "--model", "none"} <= set(mem) and "--no-decode" not in mem
    sto = train_args(_config(), RunSpec(STORAGE_RUN, 2), Path("/r"))
    assert "--no-decode" in sto and "--warm-cache" not in sto
    user = train_args(_config(), RunSpec(USER_RUN, 1), Path("/r"))
    assert float(user[user.index("--compute-time") + 1]) == pytest.approx(32 / 1600)
    assert iobench_argv(["train"])[1:4] == ["-P", "-m", "iobench"]


def test_the_users_run_is_set_against_the_answer_without_changing_it() -> None:
    d = _classify(1000, {1: 600, 2: 1500}, {1: 3000, 2: 3000})
    slow = Measurement(USER_RUN, 1, 550.0, 10, 0.55, None, "u")
    assert "below the 2 workers the pipeline needs" in user_run_note(slow, d)
    keeps = _classify(1000, {1: 1500}, {1: 3000})
    assert "it stalls though both ceilings meet" in user_run_note(slow, keeps)
    fine = Measurement(USER_RUN, 1, 990.0, 10, 0.99, None, "u")
    assert user_run_note(fine, keeps).endswith("against a demand of 1000")


def test_a_diagnosis_document_round_trips_and_a_damaged_one_is_named(tmp_path: Path) -> None:
    from iobench.core.errors import DatasetError
    from iobench.workflows.diagnose import write_diagnosis

    d = _classify(1000, {1: 1500}, {1: 300})
    result = DiagnoseResult(_config(), tuple(_runs(MEMORY_RUN, {1: 1500})),
                            tuple(_runs(STORAGE_RUN, {1: 300})), None, d, "now", ("a note",))
    path = write_diagnosis(result, tmp_path)
    assert load_diagnosis(path) == result
    doc = json.loads(path.read_text())
    del doc["diagnosis"]
    path.write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match="not a whole iobench.diagnose"):
        load_diagnosis(path)


def test_a_command_line_without_a_demand_is_one_line_and_exit_2(tmp_path: Path,
                                                                   capsys) -> None:
    assert cli("diagnose", "--loader", "hdf5", "--storage", tmp_path) == 2
    assert "--compute-time" in capsys.readouterr().err
    assert cli("diagnose", "--loader", "hdf5", "--storage", tmp_path, "--demand", "10",
               "--worker-counts", "x") == 2
    assert not list(tmp_path.iterdir())


# ---- known causes, set on purpose ------------------------------------------------------------

@pytest.fixture(scope="module")
def cifar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("d-cifar")
    assert cli("generate", "--dataset", "cifar10", "--samples", "1024", "--storage", s) == 0
    return s


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("d-imagenet")
    assert cli("generate", "--dataset", "imagenet", "--samples", "256", "--storage", s) == 0
    return s


@pytest.fixture
def emulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Factory: mount the emulated tier over a backing directory with the given caps."""
    from iobench.pfs import fuse_problem, mount, unmount

    problem = fuse_problem()
    if problem:
        pytest.skip(f"FUSE unusable: {problem}")
    monkeypatch.setenv("IOBENCH_PFS_RUN_DIR", str(tmp_path / "run"))
    made: list[Path] = []

    def _mount(backing: Path, **caps: float) -> Path:
        mp = tmp_path / f"pfs{len(made)}"
        mount(backing, mp, "passthrough", **caps)
        made.append(mp)
        return mp

    yield _mount
    for mp in made:
        unmount(mp, lazy=True, timeout_s=10)


def _diagnose(tmp_path: Path, storage: Path, *extra: str, dataset: str = "cifar10") -> dict:
    results = tmp_path / "results"
    assert cli("diagnose", "--loader", "hdf5", "--storage", storage, "--dataset", dataset,
               "--steps", "8", "--run-timeout", "240", "--results", results, *extra) == 0
    (path,) = results.iterdir()  # the measurement runs' own results are not left there
    doc = json.loads(path.read_text())
    assert doc["schema"] == "iobench.diagnose" and doc["schema_version"] == 1
    assert load_diagnosis(path).to_dict() == doc
    return doc


# cifar10 samples are 3,073 stored bytes: a 0.3 MB/s cap serves about 100 samples/s
CASES = [
    pytest.param({"bandwidth_MBps": 0.3}, "1600", STORAGE, id="bandwidth-under-demand"),
    pytest.param({"bandwidth_MBps": 200.0}, "100", NONE, id="bandwidth-over-demand"),
    pytest.param({"read_latency_ms": 200.0}, "1600", STORAGE, id="latency-under-demand"),
    pytest.param({"read_latency_ms": 1.0}, "100", NONE, id="latency-over-demand"),
]


@pytest.mark.slow
@pytest.mark.fuse
@pytest.mark.parametrize(("caps", "demand", "cause"), CASES)
def test_a_capped_tier_is_named_when_it_is_the_cause(cifar: Path, emulated, tmp_path: Path,
                                                     caps: dict, demand: str,
                                                     cause: str) -> None:
    doc = _diagnose(tmp_path, emulated(cifar, **caps), "--demand", demand,
                    "--batch-size", "32", "--worker-counts", "1,2")
    d = doc["diagnosis"]
    assert d["cause"] == cause, d["line"]
    assert [m["workers"] for m in doc["storage"]] == [1, 2]


@pytest.mark.slow
@pytest.mark.parametrize(("demand", "cause"), [("800", LOADER), ("5", NONE)],
                         ids=["cpu-under-demand", "cpu-over-demand"])
def test_the_cpu_is_named_when_decoding_is_the_cause(imagenet: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     demand: str, cause: str) -> None:
    """JPEG decoding on one worker (70-350 samples/s here, with the load of the machine)
    from a local tier whose stored bytes the loader reads about 10x faster: on a busy
    machine both ceilings fall under 800 and the lower one, the CPU's, is still the cause.
    Run from a folder holding a broken `iobench/`, which the measurement runs must not
    import."""
    decoy = tmp_path / "cwd" / "iobench"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the decoy in the cwd')\n")
    monkeypatch.chdir(decoy.parent)
    doc = _diagnose(tmp_path, imagenet, "--demand", demand, "--batch-size", "32",
                    "--worker-counts", "1", dataset="imagenet")
    d = doc["diagnosis"]
    assert d["cause"] == cause, d["line"]
    assert d["memory_ceiling"] < d["storage_ceiling"]
    if cause == LOADER:
        assert d["action"] == "gpu-decode" and "staging will not help" in d["line"]


@pytest.mark.slow
@pytest.mark.fuse
def test_the_answer_does_not_change_with_the_users_worker_count(cifar: Path, emulated,
                                                                 tmp_path: Path) -> None:
    mp = emulated(cifar, bandwidth_MBps=0.3)
    lines = []
    for w in ("1", "2"):
        doc = _diagnose(tmp_path / f"w{w}", mp, "--compute-time", "0.02", "--batch-size", "32",
                        "--worker-counts", "1", "--workers", w)
        assert doc["run"]["workers"] == int(w)
        lines.append((doc["diagnosis"]["cause"], doc["diagnosis"]["action"]))
    assert lines == [(STORAGE, "stage")] * 2
