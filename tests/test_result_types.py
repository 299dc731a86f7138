"""Typed results: every document that loads today still loads (v1, v2, v3), round trips, and
reads the same; the schema page documents the typed fields; compare and report print what
they printed before the readers were typed (golden output written by main at 918e608)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from iobench.core import results
from iobench.core.result_types import (
    ProbeDoc,
    ResultError,
    SweepDoc,
    TrainResult,
    schema_markdown,
)
from iobench.workflows import compare, report
from iobench.workflows.verdict import verdict
from result_docs import REAL_V3, probe_doc, real_result

DATA = Path(__file__).parent / "data"
DOCS = Path(__file__).parent.parent / "docs" / "results-schema.md"


def as_v2(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as `iobench train` wrote it before v3: no per-node figures, job or node names."""
    d = copy.deepcopy(doc)
    d["schema_version"] = 2
    for e in d["epochs"]:
        e.pop("per_node")
        for r in e["ranks"]:
            r.pop("node_name", None)
    d["provenance"].pop("job")
    d["world"].pop("nodes", None)
    d["summary"]["verdict"].pop("stragglers")
    return d


def as_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as written before v2: no repetitions, loader start-up, spread or status."""
    d = as_v2(doc)
    d["schema_version"] = 1
    for e in d["epochs"]:
        e.pop("repeat")
    for k in ("repeat",):
        d["config"].pop(k)
    for k in ("loader", "status", "status_reason"):
        d.pop(k, None)
    d["summary"].pop("spread")
    return d


@pytest.mark.parametrize("version", [as_v1, as_v2, lambda d: d])
def test_every_version_loads_round_trips_and_gets_the_same_verdict(version) -> None:
    doc = version(real_result())
    res = TrainResult.from_dict(doc)
    assert res.to_dict() == doc and TrainResult.from_dict(res.to_dict()) == res
    assert results.validate(res.to_dict())
    assert res.repetitions == 1 and len(res.epochs) == 2 and res.complete
    assert res.epochs[0].ranks[0].loader is not None
    assert verdict(res)["line"] == verdict(doc)["line"]


def test_a_real_v3_result_loads_typed() -> None:
    res = results.load_typed(REAL_V3)
    assert res.to_dict() == real_result()
    assert res.epochs[0].per_node[0].name and res.provenance.storage.fstype
    assert res.summary.verdict is not None and res.summary.verdict.line.startswith("verdict:")
    # a record built in code writes every field; it reads back the same
    built = TrainResult(**{f.name: getattr(res, f.name) for f in dataclasses.fields(res)
                           if f.name != "absent"})
    assert TrainResult.from_dict(built.to_dict()) == res


def test_bad_documents_are_refused_by_name() -> None:
    doc = real_result()
    doc["epochs"][0]["summary"]["wall_s"] = "fast"
    with pytest.raises(ResultError, match=r"epochs\[0\]\.summary\.wall_s"):
        TrainResult.from_dict(doc)
    doc = real_result()
    doc["surprise"] = 1
    with pytest.raises(ResultError, match="unknown key"):
        TrainResult.from_dict(doc)
    with pytest.raises(ResultError, match="label"):
        ProbeDoc.from_dict({"schema": "iobench.probe"})
    assert SweepDoc.from_dict({}).runs == ()


def test_the_schema_page_documents_every_typed_field() -> None:
    """docs/results-schema.md holds `schema_markdown()` between its markers: every field of
    every record, and no field that is gone (regenerate with `python -m iobench.core.result_types`)."""
    text = DOCS.read_text()
    m = re.search(r"<!-- typed-fields:begin -->\n(.*)<!-- typed-fields:end -->", text, re.S)
    assert m, "docs/results-schema.md lacks its typed-fields block"
    assert m.group(1) == schema_markdown()


def _golden_runs() -> list[dict[str, Any]]:
    """The real result and a copy twice as slow whose verdict is worked out, not recorded."""
    doc = real_result()
    other = copy.deepcopy(doc)
    other["run_id"] = doc["run_id"][:-6] + "abcdef"
    del other["summary"]["verdict"]
    for e in other["epochs"]:
        e["summary"]["wall_s"] *= 2
        e["summary"]["samples_per_s"] /= 2
    return [doc, other]


def test_compare_prints_what_it_printed_before() -> None:
    console = Console(record=True, width=250, highlight=False)
    compare.render_table(_golden_runs(), console=console)
    assert console.export_text() == (DATA / "compare-golden.txt").read_text()


def test_report_tables_are_what_they_were_before(tmp_path) -> None:
    d = tmp_path / "res"
    d.mkdir()
    for x in _golden_runs():
        (d / f"{x['run_id']}.json").write_text(json.dumps(x))
    probe = probe_doc(str(Path(real_result()["dataset"]["root"]).parent), 5.0, "local")
    (d / "probe-x.json").write_text(json.dumps(probe))
    sweep = {"schema": "iobench.sweep", "schema_version": 1,
             "config": {"tiers": [{"name": "t", "path": "/nowhere", "stage_to": "/x"}]},
             "runs": [{"label": "a run", "status": "failed", "error": "it broke"}]}
    (d / "sweep-x.json").write_text(json.dumps(sweep))
    report.write_report(d, tmp_path / "r.md", title="golden")
    assert (tmp_path / "r.md").read_text() == (DATA / "report-golden.md").read_text()


# ------------------------------------------------------------------ epochs[i].tier_bytes, typed

def test_an_epochs_tier_bytes_are_typed_and_round_trip() -> None:
    """The emulated tier's counters are typed (`bytes_served`, `read_requests`); another
    source's (GlusterFS bricks') and the daemon's other counters are kept as they are; an
    old document without the key reads None and writes none back."""
    doc = real_result()
    emulated = {"bytes_served": 8_000_000, "read_requests": 250, "opens": 3,
                "read_service_s": 0.5}
    doc["epochs"][0]["tier_bytes"] = emulated
    doc["epochs"][1]["tier_bytes"] = {"brick_read_bytes": 7_000_000}
    run = TrainResult.from_dict(copy.deepcopy(doc))
    t0, t1 = (e.tier_bytes for e in run.epochs)
    assert t0 is not None and (t0.bytes_served, t0.read_requests) == (8_000_000, 250)
    assert dict(t0.extra) == {"opens": 3, "read_service_s": 0.5}
    assert t1 is not None and (t1.bytes_served, t1.read_requests) == (None, None)
    assert run.to_dict() == doc
    old = real_result()
    for e in old["epochs"]:
        del e["tier_bytes"]
    run = TrainResult.from_dict(copy.deepcopy(old))
    assert [e.tier_bytes for e in run.epochs] == [None, None] and run.to_dict() == old
    doc["epochs"][0]["tier_bytes"] = {"bytes_served": -1, "read_requests": 2}
    with pytest.raises(ResultError, match="bytes_served"):
        TrainResult.from_dict(doc)


def test_project_takes_bytes_per_request_from_the_typed_epochs() -> None:
    """`project`'s k (samples per tier request) from the typed result alone, median epoch:
    no second read of the file (the run is never written anywhere here)."""
    from iobench.core.projection import Figure, TierLimits
    from iobench.workflows.project import samples_per_request

    doc = real_result()
    sample = doc["dataset"]["total_bytes"] / doc["dataset"]["num_samples"]  # 3176 bytes
    doc["epochs"][0]["tier_bytes"] = {"bytes_served": int(sample * 40), "read_requests": 10}
    doc["epochs"][1]["tier_bytes"] = {"bytes_served": int(sample * 60), "read_requests": 10}
    tier = TierLimits(Figure(1e9, "bw"), Figure(1e5, "md"))
    k = samples_per_request(TrainResult.from_dict(doc), tier)
    assert k is not None and k.value == pytest.approx(5.0, rel=1e-3)
    assert k.source.startswith("measured: the run's tier counters")
    for e in doc["epochs"]:  # no counters: none measured, and no probe's requests either
        e["tier_bytes"] = None
    assert samples_per_request(TrainResult.from_dict(doc), tier) is None
