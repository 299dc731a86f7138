"""The report's stall timeline draws checkpoint saves: a real traced run with `--checkpoint-every`.

A tiny cifar10 dataset and the `cnn` model, 4 steps and a save every 2: the trace holds two
`checkpoint` spans (the time each save blocked the steps); the timeline read from it holds
them on the rank's row, in their own colour with a legend entry, and the report's timeline
text says the time they blocked the steps, per epoch and in all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli
from iobench.core import results
from iobench.workflows import timeline

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(the trace, the results folder, the result) of a run with 2 saves."""
    tmp = tmp_path_factory.mktemp("timeline-ckpt")
    assert cli("generate", "--dataset", "cifar10", "--format", "hdf5", "--samples", "128",
               "--storage", tmp / "data") == 0
    trace = tmp / "run.trace.json"
    assert cli("train", "--storage", tmp / "data", "--loader", "hdf5", "--model", "cnn",
               "--batch-size", "32", "--workers", "0", "--max-steps", "4", "--epochs", "1",
               "--checkpoint-every", "2", "--checkpoint-to", tmp / "ck", "--trace", trace,
               "--results", tmp / "res") == 0
    (path,) = results.find_results([tmp / "res"])
    return trace, tmp / "res", results.load_result(path)


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
