"""Hostile input to every parser iobench has: one clear error (an IobenchError), never a crash.

Hypothesis generates JSON-like documents (and raw bytes) for the result,
manifest and sweep parsers, both free-form and as mutations of a valid
document, so the fuzzing reaches past the first key check.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iobench.core.errors import IobenchError
from iobench.core.jsonio import read_json
from iobench.core.manifest import Manifest
from iobench.core.results import validate
from iobench.workflows.sweep import parse_sweep

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(),
                    st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=25)


def _paths(valid: dict) -> list[tuple]:
    """Every key and (first three) list index in a document, as a path from the top."""
    paths: list[tuple] = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append((*path, k))
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node[:3]):
                paths.append((*path, i))
                walk(v, (*path, i))

    walk(valid, ())
    return paths


_DROP = object()


def _mutated(valid: dict, path: tuple, value) -> dict | None:
    """A copy of `valid` with the value at `path` replaced (or its key dropped, for `_DROP`)."""
    doc = copy.deepcopy(valid)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if value is _DROP:
        if not isinstance(parent, dict):
            return None
        parent.pop(path[-1])
    else:
        parent[path[-1]] = copy.deepcopy(value)
    return doc


def _mutations(valid: dict) -> st.SearchStrategy:
    """A valid document with one value somewhere replaced by anything, or a key dropped."""
    paths = _paths(valid)

    @st.composite
    def mutate(draw):
        path = draw(st.sampled_from(paths))
        parent = valid
        for k in path[:-1]:
            parent = parent[k]
        drop = draw(st.booleans()) and isinstance(parent, dict)
        return _mutated(valid, path, _DROP if drop else draw(json_values))

    return mutate()


def _must_refuse_cleanly(fn, doc) -> None:
    with contextlib.suppress(IobenchError):  # refused with a clear error: fine
        fn(doc)


def _valid_manifest(tmp: Path) -> dict:
    from conftest import cli

    assert cli("generate", "--dataset", "cifar10", "--samples", "64", "--storage", tmp) == 0
    return json.loads((tmp / "cifar10-hdf5" / "iobench.json").read_text())


@pytest.fixture(scope="module")
def manifest_doc(tmp_path_factory) -> dict:
    return _valid_manifest(tmp_path_factory.mktemp("fuzz-manifest"))


@pytest.fixture(scope="module")
def result_doc(tmp_path_factory, manifest_doc) -> dict:
    from conftest import cli
    from iobench.core import results

    d = tmp_path_factory.mktemp("fuzz-result")
    _valid_manifest(d)
    assert cli("train", "--loader", "hdf5", "--storage", d, "--model", "none", "--epochs", "1",
               "--workers", "0", "--results", d / "r") == 0
    return json.loads(results.find_results([d / "r"])[0].read_text())


SWEEP = {"name": "fuzz", "results": "r", "datasets": [{"name": "cifar10", "samples": 64}],
         "formats": ["hdf5"], "loaders": ["native"], "tiers": [{"name": "local", "path": "x"}],
         "workers": [0, 2], "batch_size": [32], "shuffle": ["global"], "epochs": 1}


@SETTINGS
@given(doc=json_values)
def test_result_validation_free_form(doc) -> None:
    _must_refuse_cleanly(validate, doc)


@SETTINGS
@given(data=st.data())
def test_result_validation_mutated(result_doc, data) -> None:
    doc = data.draw(_mutations(result_doc))
    _must_refuse_cleanly(validate, doc)


@SETTINGS
@given(doc=json_values)
def test_manifest_free_form(doc) -> None:
    _must_refuse_cleanly(lambda d: Manifest.from_dict(d, Path("/nowhere")), doc)


@SETTINGS
@given(data=st.data())
def test_manifest_mutated(manifest_doc, data) -> None:
    doc = data.draw(_mutations(manifest_doc))
    _must_refuse_cleanly(lambda d: Manifest.from_dict(d, Path("/nowhere")), doc)


@SETTINGS
@given(doc=json_values)
def test_sweep_free_form(doc) -> None:
    _must_refuse_cleanly(parse_sweep, doc)


@SETTINGS
@given(data=st.data())
def test_sweep_mutated(data) -> None:
    doc = data.draw(_mutations(SWEEP))
    _must_refuse_cleanly(parse_sweep, doc)


@SETTINGS
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_a_json_document(tmp_path, raw) -> None:
    p = tmp_path / "doc.json"
    p.write_bytes(raw)
    _must_refuse_cleanly(lambda _: read_json(p, schema="iobench.result", max_version=2), None)


def test_deeply_nested_json(tmp_path) -> None:
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(IobenchError, match="nests JSON too deeply"):
        read_json(p, schema="iobench.result", max_version=2)


@SETTINGS
@given(data=st.data())
def test_what_validates_compares_reports_and_gets_a_verdict(result_doc, data) -> None:
    """Whatever passes validation types as a result, and compare, report and the verdict can
    read it."""
    doc = data.draw(_mutations(result_doc))
    try:
        validate(doc)
    except IobenchError:
        return
    _read_by_everything(doc, result_doc)


def _read_by_everything(doc: dict, valid: dict) -> None:
    import io

    from rich.console import Console

    from iobench.core.result_types import TrainResult
    from iobench.workflows import compare, report

    assert TrainResult.from_dict(doc).to_dict() == doc  # what validates is typed, and back
    compare.render_table([doc, valid], console=Console(file=io.StringIO()))
    compare.run_verdict(doc)
    report.run_row(doc, [])


def test_every_path_of_a_result_with_each_kind_of_wrong_value(result_doc) -> None:
    """The same property as above, swept instead of sampled: each key of a real result dropped
    or replaced by null, a string, a mapping (empty or not), a list or a negative number, one at a time. Random draws
    found such holes one per CI run (a list for a number, a mapping without its `profile`);
    this finds them all at once."""
    failures = []
    for path in _paths(result_doc):
        for value in (_DROP, None, "x", {}, {"x": {}}, [{}], -1):
            doc = _mutated(result_doc, path, value)
            if doc is None:
                continue
            try:
                validate(doc)
            except IobenchError:
                continue
            try:
                _read_by_everything(doc, result_doc)
            except Exception as e:  # collected, then reported together
                failures.append(f"{'/'.join(map(str, path))} = {value!r}: "
                                f"{type(e).__name__}: {e}")
    assert not failures, "validated but could not be read:\n" + "\n".join(failures[:20])
