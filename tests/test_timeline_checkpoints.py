"""The report's stall timeline draws checkpoint saves: a real traced run with `--checkpoint-every`.

A tiny cifar10 dataset and the `cnn` model, 4 steps and a save every 2: the trace holds two
`checkpoint` spans (the time each save blocked the steps); the timeline read from it holds
them on the rank's row, in their own colour with a legend entry, and the report's timeline
text says the time they blocked the steps, per epoch and in all. The same run with
`--checkpoint-mode async --drain-to` also holds each save's background write (handed off
inside its blocked span, over before the next save's ends) and its drain (queued once the
write is committed), drawn and told beside the steps with the result's stall split.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli
from iobench.core import results
from iobench.workflows import timeline

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _traced_run(tmp: Path, *options: object) -> tuple[Path, Path, dict]:
    """(the trace, the results folder, the result) of a traced 4-step run of the cnn on a
    tiny cifar10 (HDF5), saving every 2 steps into tmp/ck, with `options` added."""
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples", "128",
               "--storage", tmp / "data") == 0
    trace = tmp / "run.trace.json"
    assert cli("train", "--storage", tmp / "data", "--loader", "hdf5", "--model", "cnn",
               "--batch-size", "32", "--workers", "0", "--max-steps", "4",
               "--checkpoint-every", "2", "--checkpoint-to", tmp / "ck", "--trace", trace,
               "--results", tmp / "res", *options) == 0
    (path,) = results.find_results([tmp / "res"])
    return trace, tmp / "res", results.load_result(path)


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(the trace, the results folder, the result) of a run with 2 saves."""
    return _traced_run(tmp_path_factory.mktemp("timeline-ckpt"), "--epochs", "1")


def test_the_timeline_holds_each_save_on_the_ranks_row(traced) -> None:
    trace, _, doc = traced
    blocked_us = [s["blocked_s"] * 1e6 for s in doc["checkpoint"]["saves"]]
    assert len(blocked_us) == 2
    (ep,) = timeline.load_timeline(trace)
    r = ep.ranks[0]
    assert [d for _, d in r.checkpoint] == pytest.approx(blocked_us, abs=2)
    # each after the compute of steps 2 and 4, before the next step's wait
    events = json.loads(trace.read_text())["traceEvents"]
    saves = [x for e in events if e.get("cat") == "checkpoint" for x in (e["ts"], e["dur"])]
    assert [x for span in r.checkpoint for x in span] == pytest.approx(saves)
    (label, spans), *_ = timeline._rows(ep)
    assert label == "rank 0"
    assert [x for k, s, d in spans if k == "checkpoint" for x in (s, d)] == pytest.approx(saves)
    svg = timeline.epoch_svg(ep)
    assert f"fill='{timeline.COLOURS['checkpoint']}'" in svg and ">checkpoint</text>" in svg
    assert len({timeline.COLOURS[k] for k in ("compute", "wait", "checkpoint")}) == 3
    ck = timeline.checkpoint_blocked(ep)
    assert ck is not None and ck[1:] == (2, 0)
    assert ck[0] == pytest.approx(sum(blocked_us), abs=4)
    assert (f"checkpoint saves blocked the steps for {sum(blocked_us) / 1e6:.3f} s (2 save(s), "
            "rank 0)") in timeline.epoch_line(ep)


@pytest.mark.parametrize("suffix", ["md", "html"])
def test_the_report_says_the_time_saves_blocked_the_steps(traced, tmp_path, suffix) -> None:
    _, res, doc = traced
    out = tmp_path / f"report.{suffix}"
    assert cli("report", res, "--out", out) == 0
    text = out.read_text()
    total = sum(s["blocked_s"] for s in doc["checkpoint"]["saves"])
    assert timeline.TITLE in text
    assert f"checkpoint saves blocked the steps for {total:.3f} s in all (2 save(s))" in text
    if suffix == "html":  # the drawing: its legend names the colour
        assert f"fill='{timeline.COLOURS['checkpoint']}'" in text


# ------------------------------------------------------------- beside the steps
# `--checkpoint-mode async --drain-to`: each save's write goes on in the background on each
# rank and rank 0 copies each committed checkpoint to the shared tier; both are spans of
# their own in the trace and rows of their own in the timeline.

def _events(trace: Path) -> tuple[list[dict], dict]:
    doc = json.loads(trace.read_text())
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"], doc["otherData"]["iobench"]


@pytest.fixture(scope="module")
def traced_async(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(the trace, the results folder, the result) of an async run with a drain: 4 saves
    over 2 epochs."""
    tmp = tmp_path_factory.mktemp("timeline-ckpt-async")
    return _traced_run(tmp, "--epochs", "2", "--checkpoint-mode", "async", "--drain-to",
                       tmp / "pfs")


def test_a_sync_run_without_a_drain_has_nothing_beside_the_steps(traced) -> None:
    trace, _, _ = traced
    events, info = _events(trace)
    assert not [e for e in events if e["name"] in ("checkpoint_write", "drain")]
    assert info["spans"]["checkpoint_write"].startswith("not measured: sync saves")
    assert info["spans"]["drain"].startswith("not measured: this run drained no")
    # the blocked spans name their checkpoint
    assert [e["args"]["checkpoint"] for e in events if e["name"] == "checkpoint"] == [0, 1]
    t = timeline.load_trace(trace)
    assert t.beside == [] and not t.epochs[0].ranks[0].beside
    svg = timeline.epoch_svg(t.epochs[0])
    assert "fill='{}'".format(timeline.COLOURS["drain"]) not in svg
    assert "async write" not in svg and "drain" not in timeline.epoch_line(t.epochs[0])


def test_async_writes_and_drains_are_spans_after_their_saves(traced_async) -> None:
    trace, _, doc = traced_async
    events, info = _events(trace)
    assert info["spans"]["checkpoint_write"].startswith("measured: on each rank")
    assert info["spans"]["drain"].startswith("measured: on rank 0")
    by = {k: sorted((e for e in events if e["name"] == k), key=lambda e: e["ts"])
          for k in ("checkpoint", "checkpoint_write", "drain")}
    saves = doc["checkpoint"]["saves"]
    for kind in by:  # one of each per save, in order, each naming its checkpoint
        assert [e["args"]["checkpoint"] for e in by[kind]] == [s["index"] for s in saves]
        assert {e["pid"] for e in by[kind]} == {0}
    for k, (blocked, write, drain, save) in enumerate(zip(by["checkpoint"],
                                                          by["checkpoint_write"], by["drain"],
                                                          saves, strict=True)):
        for e in (write, drain):
            assert e["cat"] == "checkpoint" and e["args"]["mode"] == "async"
            assert e["args"]["repeat"] == save["repeat"] and e["args"]["epoch"] == save["epoch"]
        w0, w1 = write["ts"], write["ts"] + write["dur"]
        b0, b1 = blocked["ts"], blocked["ts"] + blocked["dur"]
        # handed off inside the blocked span (the step waits for the copy to CPU memory,
        # then goes on), this rank's shard durable during the write, and over (committed:
        # rank 0) before the next save's blocked span ends: that save waits for it
        assert 0 < b0 <= w0 <= b1 and w0 <= write["args"]["shard_durable_us"] <= w1
        if k + 1 < len(saves):
            nxt = by["checkpoint"][k + 1]
            assert w1 <= nxt["ts"] + nxt["dur"]
        assert write["dur"] / 1e6 == pytest.approx(save["save_s"] + save["commit_s"], abs=3e-6)
        assert 0 < write["args"]["bytes"] < save["bytes"]  # its shard, not the metadata
        # the drain: queued once committed, started after it, the result's own figures
        assert w1 <= drain["args"]["queued_us"] <= drain["ts"]
        assert drain["dur"] / 1e6 == pytest.approx(save["drain"]["drain_s"], abs=2e-6)
        assert drain["args"]["bytes"] == save["drain"]["bytes"] == save["bytes"]
        if k:  # one copy at a time, in order
            before = by["drain"][k - 1]
            assert before["ts"] + before["dur"] <= drain["ts"]


def test_the_timeline_draws_and_tells_the_writes_and_drains(traced_async) -> None:
    trace, _, doc = traced_async
    t = timeline.load_trace(trace)
    assert sorted((b.kind, b.checkpoint) for b in t.beside) == sorted(
        (k, i) for k in ("checkpoint_write", "drain") for i in range(4))
    splits = {(e["repeat"], e["epoch"]): e["checkpoint"]["drain"] for e in doc["epochs"]}
    from iobench.core.result_types import DrainSplit

    drawn = set()
    for ep in t.epochs:
        r = ep.ranks[0]
        t0, dur = ep.window
        for b in r.beside:  # attached to each epoch it overlaps
            assert b.start < t0 + dur and b.start + b.dur > t0
            drawn.add((b.kind, b.checkpoint))
        rows = dict(timeline._rows(ep))
        for label, kind in (("rank 0 async write", "checkpoint_write"), ("rank 0 drain", "drain")):
            mine = [b for b in r.beside if b.kind == kind]
            assert (label in rows) == bool(mine)
            for k, s, d in rows.get(label, []):  # clipped to the epoch
                assert k == kind and t0 <= s and s + d <= t0 + dur + 1e-6
        svg = timeline.epoch_svg(ep)
        for kind, word in (("checkpoint_write", "async write"), ("drain", "drain")):
            if any(b.kind == kind for b in r.beside):
                assert f"fill='{timeline.COLOURS[kind]}'" in svg and f">{word}</text>" in svg
        split = DrainSplit.from_dict(splits[(ep.repeat, ep.epoch)])
        line = timeline.epoch_line(ep, split)
        for b in r.beside:
            if b.kind == "drain":
                assert f"the drain of checkpoint {b.checkpoint} ran {b.dur / 1e6:.3f} s" in line
            else:
                assert f"the async write of checkpoint {b.checkpoint} ran" in line
        assert timeline._split_words(split) in line  # the result's split, as it is
        assert f"with a drain in flight: {split.steps_in_flight} step(s)" in line \
            or (split.steps_in_flight == 0 and "with a drain in flight: no step" in line)
    # every save's write overlaps an epoch (it starts inside its blocked span)
    assert {i for k, i in drawn if k == "checkpoint_write"} == {0, 1, 2, 3}
    assert len({timeline.COLOURS[k] for k in timeline.COLOURS}) == len(timeline.COLOURS)


@pytest.mark.parametrize("suffix", ["md", "html"])
def test_the_report_says_the_drains_and_the_split(traced_async, tmp_path, suffix) -> None:
    trace, res, doc = traced_async
    out = tmp_path / f"report.{suffix}"
    assert cli("report", res, "--out", out) == 0
    text = out.read_text()
    drains = [s["drain"] for s in doc["checkpoint"]["saves"]]
    mb = sum(d["bytes"] for d in drains) / 1e6
    assert "4 async write(s) ran beside the steps" in text
    assert "4 drain(s) ran " in text and f"({mb:,.1f} MB)" in text
    apostrophe = "&#x27;" if suffix == "html" else "'"
    assert f"the steps{apostrophe} wait with a drain in flight" in text
    if suffix == "html":
        assert f"fill='{timeline.COLOURS['drain']}'" in text
