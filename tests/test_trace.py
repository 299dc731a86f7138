"""`train --trace FILE` (issue 28 item 6): a Chrome trace of every rank's steps, drawn by `report`.

Real generated cifar10 datasets and real loaders, one rank in-process and two
under `mpiexec -n 2`: the file loads as JSON, holds each measured kind for
every rank, and its wait spans sum to the stall the result reports for that
rank and epoch. Bad FILE paths are refused in one line before training.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import cli, run_cmd, run_mpi
from iobench.core import results
from iobench.core.metrics import EpochClock
from iobench.core.trace import StepClocks, Trace, epoch_part, write_trace
from iobench.workflows.timeline import epoch_line, epoch_svg, load_timeline

SAMPLES = 256
TRAIN = ("train", "--loader", "hdf5", "--epochs", "2", "--batch-size", "32",
         "--compute-time", "0.005")


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("trace-storage")
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples",
               str(SAMPLES), "--storage", str(s)) == 0
    return s


def _result(res: Path) -> dict[str, Any]:
    paths = results.find_results([res])
    assert len(paths) == 1, paths
    return results.load_result(paths[0])


def _spans(trace: dict[str, Any]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """X events by (rank, kind)."""
    out: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            assert set(e) == {"name", "ph", "ts", "dur", "pid", "tid", "args"}, e
            out[(e["pid"], e["name"])].append(e)
    return out


def _check_against_result(trace: dict[str, Any], doc: dict[str, Any], ranks: int,
                          kinds: tuple[str, ...]) -> None:
    """Each rank has every measured kind, one wait and compute span per step, and its
    waits in each epoch sum to the stall the result holds for it."""
    spans = _spans(trace)
    info = trace["otherData"]["iobench"]
    assert info["ranks"] == ranks and info["run_id"] == doc["run_id"]
    for kind in kinds:
        assert info["spans"][kind] == "measured"
    for rank in range(ranks):
        for kind in kinds:
            assert spans[(rank, kind)], (rank, kind)
        for kind, why in info["spans"].items():
            if why != "measured":  # a kind nothing measured is absent, and the file says why
                assert why.startswith("not measured: ") and not spans[(rank, kind)]
    for ep in doc["epochs"]:
        for r in ep["ranks"]:
            waits = [e for e in spans[(r["rank"], "wait")] if e["args"]["epoch"] == ep["epoch"]
                     and e["args"]["repeat"] == ep["repeat"]]
            assert len(waits) == r["steps"]
            assert sum(e["dur"] for e in waits) / 1e6 == pytest.approx(r["stall_s"], abs=1e-6)
            compute = [e for e in spans[(r["rank"], "compute")]
                       if e["args"]["epoch"] == ep["epoch"]]
            assert sum(e["dur"] for e in compute) / 1e6 == pytest.approx(r["compute_s"],
                                                                        abs=1e-6)


def test_one_rank_trace_matches_the_result_and_the_report_draws_it(storage: Path,
                                                                  tmp_path: Path) -> None:
    res, trace_file = tmp_path / "res", tmp_path / "out" / "run.trace.json"
    assert cli(*TRAIN, "--storage", storage, "--workers", "2", "--results", res,
               "--trace", trace_file) == 0
    doc = _result(res)
    assert doc["config"]["trace"] == str(trace_file)  # the result names it (absolute)
    trace = json.loads(trace_file.read_text())
    _check_against_result(trace, doc, 1, ("epoch", "wait", "compute", "fetch", "decode"))
    info = trace["otherData"]["iobench"]
    assert info["spans"]["h2d"].startswith("not measured") and "checkpoint" in info["spans"]
    workers = {e["tid"] for e in _spans(trace)[(0, "fetch")]}
    assert workers == {100, 101}  # one lane per loader worker process
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"wait (data stall)", "compute", "loader worker 1: fetch, decode"} <= names

    for out in (tmp_path / "report.md", tmp_path / "report.html"):
        assert cli("report", res, "--out", out) == 0
        text = out.read_text()
        assert "Stall timeline per epoch" in text and str(trace_file) in text
        assert "repeat 1 epoch 2: stall " in text
    assert text.count("<svg") == 2  # one drawing per epoch


def test_thread_workers_get_lanes_that_never_overlap(storage: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "t.json"
    assert cli(*TRAIN, "--storage", storage, "--workers", "2", "--worker-type", "thread",
               "--results", tmp_path / "res", "--trace", trace_file) == 0
    trace = json.loads(trace_file.read_text())
    _check_against_result(trace, _result(tmp_path / "res"), 1, ("wait", "fetch", "decode"))
    lanes: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in _spans(trace)[(0, "fetch")]:
        lanes[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    assert all(tid >= 1000 for tid in lanes)  # made in the rank's own process
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:], strict=False))


def test_two_ranks_gather_into_one_file(storage: Path, tmp_path: Path) -> None:
    res, trace_file = tmp_path / "res", tmp_path / "two.json"
    out = run_mpi(2, *TRAIN, "--storage", storage, "--workers", "1", "--results", res,
                  "--trace", trace_file, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = _result(res)
    trace = json.loads(trace_file.read_text())
    _check_against_result(trace, doc, 2, ("epoch", "wait", "compute", "fetch", "decode"))
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    assert sorted(procs) == [0, 1] and procs[1].startswith("rank 1 (")
    assert not list(tmp_path.glob(".two.json.*"))  # no temporary file left


def test_an_interrupted_run_traces_the_epochs_that_completed(storage: Path,
                                                            tmp_path: Path) -> None:
    res, trace_file = tmp_path / "res", tmp_path / "cut.json"
    out = run_cmd(*TRAIN, "--storage", storage, "--workers", "0", "--results", res,
                  "--trace", trace_file,
                  env={"IOBENCH_TEST_FAULT": "rank=0,epoch=1,step=2,action=sigint"})
    assert out.returncode != 0 and "interrupted" in out.stderr, out.stderr[-2000:]
    doc = _result(res)
    assert doc["status"] == "interrupted" and len(doc["epochs"]) == 1
    trace = json.loads(trace_file.read_text())
    assert {e["args"]["epoch"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0}
    _check_against_result(trace, doc, 1, ("epoch", "wait", "compute", "fetch", "decode"))


def _refused(capsys: pytest.CaptureFixture[str], words: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace" in err[0] and words in err[0], err


def test_bad_trace_paths_are_refused_before_training(storage: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = tmp_path / "res"
    bad = {tmp_path: "is a directory",
           storage / "cifar10-hdf5" / "t.json": "inside the dataset",
           blocker / "sub" / "t.json": "cannot be created"}
    for path, words in bad.items():
        assert cli(*TRAIN, "--storage", storage, "--workers", "0", "--results", res,
                   "--trace", path) == 2, path
        _refused(capsys, words)
    # staging reads the source first: a trace there is refused before the copy
    assert cli(*TRAIN, "--storage", storage, "--workers", "0", "--results", res,
               "--stage-to", tmp_path / "fast", "--trace",
               storage / "cifar10-hdf5" / "sub" / "t.json") == 2
    _refused(capsys, "inside the dataset")
    assert not (tmp_path / "fast").exists()
    assert not list(res.rglob("*.json"))  # no training ran: no result
    assert not (storage / "cifar10-hdf5" / "t.json").exists()


def test_a_trace_inside_the_users_data_is_refused(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import h5py
    import numpy as np

    data = tmp_path / "mine"
    data.mkdir()
    with h5py.File(data / "data.h5", "w") as h:
        h["images"] = np.zeros((64, 8, 8, 3), dtype=np.uint8)
        h["labels"] = np.arange(64, dtype=np.int64) % 4
    before = sorted(p.name for p in data.iterdir())
    for given, trace in ((data, data / "sub" / "t.json"), (data / "data.h5", data / "data.h5")):
        assert cli("train", "--data", given, "--epochs", "1", "--batch-size", "16",
                   "--workers", "0", "--results", tmp_path / "res", "--trace", trace) == 2
        _refused(capsys, "inside --data")
    assert sorted(p.name for p in data.iterdir()) == before


def _clock(start: int, waits: list[int], computes: list[int]) -> EpochClock:
    """An epoch clock holding these reads (ns), without waiting for them."""
    c = EpochClock()
    c.start_ns = start
    c.wait_ns, c.compute_ns = list(waits), list(computes)
    c._last = start + sum(waits) + sum(computes)
    return c


def test_a_loader_without_clocks_leaves_fetch_and_decode_out(tmp_path: Path) -> None:
    """Spans come from the loop's clock; a batch without `timing` adds no fetch or decode,
    and the file says those kinds were not measured."""
    clock = _clock(1_000_000, [5_000, 2_000, 3_000], [10_000, 10_000, 10_000])
    steps = StepClocks()
    for got in (1_004_000, 1_016_000, 1_028_000):
        steps.add((got, 0, None))
    trace = Trace("dali", "cpu", "r1")
    trace.add(0, 0, [epoch_part(0, "h", clock, steps)])
    doc = json.loads(write_trace(tmp_path / "t.json", trace).read_text())
    spans = _spans(doc)
    assert [e["dur"] for e in spans[(0, "wait")]] == [5.0, 2.0, 3.0]
    assert [e["ts"] for e in spans[(0, "compute")]] == [5.0, 17.0, 30.0]
    assert not spans[(0, "fetch")] and not spans[(0, "h2d")]
    why = doc["otherData"]["iobench"]["spans"]
    assert why["fetch"] == why["decode"] == ("not measured: the dali loader keeps no "
                                             "per-batch fetch and decode clocks")
    [ep] = load_timeline(tmp_path / "t.json")
    assert epoch_line(ep).startswith("repeat 1 epoch 1: stall 0.000 s of 0.000 s on rank 0")
    assert epoch_svg(ep).count("fill='#d32f2f'") >= 2  # the legend's and the waits'


def test_a_trace_iobench_did_not_write_is_one_line_in_the_report(tmp_path: Path) -> None:
    from iobench.core.errors import DatasetError

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"traceEvents": [{"name": "x", "ph": "X", "ts": 0, "dur": 1,
                                                  "pid": 1, "tid": 1}]}))
    for path in (other, tmp_path / "missing.json"):
        with pytest.raises(DatasetError, match="trace .*"):
            load_timeline(path)


def test_spans_beside_the_steps_get_lanes_of_their_own(tmp_path: Path) -> None:
    """A checkpoint's async write and drain (`Background`) become events of category
    "checkpoint" in named lanes on the rank's clock; a rank with no epoch in the file (no
    clock origin) has none."""
    from iobench.core.trace import LANES, Background

    clock = _clock(1_000_000, [5_000, 2_000], [10_000, 10_000])
    steps = StepClocks()
    trace = Trace("hdf5", "cpu", "r1", checkpoints=True, checkpoint_mode="async", drain=True)
    trace.add(0, 0, [epoch_part(0, "h", clock, steps, [(0, 4_000, 7)])])
    trace.background += [
        Background("checkpoint_write", 0, 0, 0, 7, 1_016_000, 1_030_000, 1_020_000, 500, "async"),
        Background("drain", 0, 0, 0, 7, 1_031_000, 1_040_000, 1_030_500, 600, "async"),
        Background("checkpoint_write", 3, 0, 0, 7, 1_016_000, 1_030_000, 0, 500, "async")]
    doc = json.loads(write_trace(tmp_path / "t.json", trace).read_text())
    events = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "checkpoint"]
    by = {e["name"]: e for e in events}
    assert len(events) == 3 and {e["pid"] for e in events} == {0}
    assert by["checkpoint"]["args"]["checkpoint"] == 7
    w, d = by["checkpoint_write"], by["drain"]
    assert (w["ts"], w["dur"], w["tid"]) == (16.0, 14.0, LANES["checkpoint_write"])
    assert w["args"] == {"repeat": 0, "epoch": 0, "checkpoint": 7, "bytes": 500,
                         "mode": "async", "shard_durable_us": 20.0}
    assert (d["ts"], d["dur"], d["tid"], d["args"]["queued_us"]) == (
        31.0, 9.0, LANES["drain"], 30.5)
    lanes = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert lanes[LANES["drain"]].startswith("checkpoint drain")
    assert lanes[LANES["checkpoint_write"]].startswith("checkpoint write (async")
    spans = doc["otherData"]["iobench"]["spans"]
    assert spans["checkpoint_write"].startswith("measured") and spans["drain"].startswith(
        "measured")
    assert all(why.startswith("not measured: this run saved no checkpoints")
               for k, why in Trace("hdf5", "cpu").spans().items()
               if k in ("checkpoint", "checkpoint_write", "drain"))
