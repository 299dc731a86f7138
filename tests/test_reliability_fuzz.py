"""A small, fast hostile-input corpus for `make test` (issue 32): emulator profiles, probe
results turned into profiles, and result documents as `report` reads them, free-form and as
mutations of valid ones. Each is refused with an IobenchError or accepted with the right types;
nothing else escapes (tests/test_fuzz.py covers manifests, sweeps and training results)."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import _mutations, json_values

from iobench.core.errors import IobenchError
from iobench.pfs.profiles import PROFILES, Profile, load_profile, profile_from_probe
from result_docs import probe_doc, real_result

FAST = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])

PROFILE = PROFILES["lustre-busy"].to_dict()
PROBE = {**probe_doc("/lustre/x", 300.0),
         "summary": {**probe_doc("/lustre/x", 300.0)["summary"], "cold_open_ms_p50": 0.4,
                     "close_ms_p50": 0.1, "cold_read_ms_p50": 0.3, "readers_max": 4}}


def _a_sound_profile(p: Profile) -> None:
    """What an accepted profile must be: strings where strings go, finite figures >= 0."""
    assert isinstance(p.name, str) and p.name.strip() and isinstance(p.imitates, str)
    for figure in (p.metadata_ms, p.read_ms, p.bandwidth_MBps, p.iops):
        assert figure is None or (type(figure) in (int, float) and math.isfinite(figure)
                                  and figure >= 0)
    assert all(isinstance(s, str) for s in p.sources)
    assert p.describe().startswith("EMULATED")
    assert Profile.from_dict(p.to_dict()) == p


def _profile_or_refused(fn: Any, arg: Any) -> None:
    with contextlib.suppress(IobenchError):
        _a_sound_profile(fn(arg))


@FAST
@given(doc=json_values)
def test_free_form_profiles(doc: Any) -> None:
    if isinstance(doc, dict):
        _profile_or_refused(Profile.from_dict, doc)


@FAST
@given(doc=_mutations(PROFILE))
def test_mutated_profiles(doc: Any) -> None:
    if doc is not None:
        _profile_or_refused(Profile.from_dict, doc)


@FAST
@given(doc=_mutations(PROBE))
def test_mutated_probe_results_as_profiles(doc: Any) -> None:
    if doc is not None:
        _profile_or_refused(profile_from_probe, doc)


@FAST
@given(raw=st.one_of(st.binary(max_size=200), _mutations(
    {"schema": "iobench.pfs-profile", "schema_version": 1, "profile": PROFILE}).map(
    lambda d: json.dumps(d).encode())))
def test_profile_files_of_any_bytes(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "profile.json"
    path.write_bytes(raw)
    _profile_or_refused(load_profile, str(path))


# ---------------------------------------------------------------- result documents, as report

def _read_folder(folder: Path) -> None:
    """`report`'s reading of a results folder: documents it cannot read are listed, never
    raised; a folder with nothing readable is an IobenchError."""
    from iobench.workflows.report import load_directory

    with contextlib.suppress(IobenchError):
        col = load_directory(folder)
        assert all(isinstance(name, str) and isinstance(why, str) for name, why in col.skipped)


RESULT = real_result()


@FAST
@given(doc=st.one_of(_mutations(RESULT), _mutations(probe_doc("/p", 100.0)), json_values))
def test_report_reads_hostile_documents(tmp_path: Path, doc: Any) -> None:
    folder = tmp_path / "results"
    folder.mkdir(exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    (folder / "doc.json").write_text(json.dumps(doc))
    _read_folder(folder)


@FAST
@given(raw=st.binary(max_size=300))
def test_report_reads_any_bytes(tmp_path: Path, raw: bytes) -> None:
    from iobench.core.results import read_document

    folder = tmp_path / "results"
    folder.mkdir(exist_ok=True)
    (folder / "doc.json").write_bytes(raw)
    with contextlib.suppress(IobenchError):
        read_document(folder / "doc.json")
    _read_folder(folder)
