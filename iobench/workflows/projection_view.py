"""Projection documents beside measured results: found apart, shown in their own sections labelled PROJECTION.

`iobench project` writes `iobench.projection` documents into a results
directory; `find_documents` sets them aside from the training results, and
`compare` and `report` show them here, each in a table of its own whose title
says it is a projection (a model's prediction, not a measurement), never in
the tables of measured runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iobench.core.errors import IobenchError
from iobench.core.jsonio import read_json
from iobench.core.results import schema_of
from iobench.workflows.project import (
    SCHEMA,
    SCHEMA_VERSION,
    TABLE_HEADER,
    ProjectionDoc,
    figure_source,
    point_cells,
    saturation_words,
    span_text,
)

NOT_MEASURED = "projection, not measured"


@dataclass(frozen=True)
class Section:
    """A table of a report: its title, header, rows and a note under it."""

    title: str
    header: list[str]
    rows: list[list[str]]
    note: str | None = None


def find_projections(paths: Iterable[str | Path]
                     ) -> tuple[list[tuple[str, ProjectionDoc]], list[tuple[str, str]]]:
    """The projection documents among `paths` (files, or directories searched with their
    sub-directories), named by their path under a directory; and (name, why) for each one
    that cannot be read."""
    found: list[tuple[str, ProjectionDoc]] = []
    bad: list[tuple[str, str]] = []
    for p in map(Path, paths):
        files = sorted(f for f in p.rglob("*.json") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            if not f.is_file() or schema_of(f) != SCHEMA:
                continue
            name = str(f.relative_to(p)) if p.is_dir() else str(f)
            try:
                doc = read_json(f, schema=SCHEMA, max_version=SCHEMA_VERSION)
                found.append((name, ProjectionDoc.from_dict(doc, name)))
            except IobenchError as e:
                bad.append((name, f"{NOT_MEASURED}, unreadable: {e}"))
    return found, bad


def _stops(doc: ProjectionDoc) -> str:
    s = doc.saturation
    return ("not below 10 million nodes" if s.nodes is None
            else f"N = {s.nodes:,}: {s.resource}")


def lead_lines(projections: Sequence[tuple[str, ProjectionDoc]]) -> list[str]:
    """One line per projection for the report's answer: what it projects, its AU with the
    spread at the last N, where the tier stops keeping up; labelled a projection."""
    out = []
    for name, doc in projections:
        last = point_cells(doc.points[-1])
        out.append(f"PROJECTION, not measured ({name}): {doc.dataset} ({doc.format}) at "
                   f"N = {doc.points[0].nodes:,}-{doc.points[-1].nodes:,} nodes; AU "
                   f"{last[1]} at N = {last[0]}; the tier stops keeping up at "
                   f"{_stops(doc)} (its tables below)")
    return out


def report_sections(name: str, doc: ProjectionDoc) -> list[Section]:
    """A projection's two tables: per node count (AU, stall, staging, break-even, the limit,
    with the spread), then its inputs (measured or given) and the model's assumptions."""
    where = saturation_words(doc)
    note = (f"{doc.label}: a model's prediction from one node's measured results "
            "(docs/projection.md), not a measurement, and never averaged with the measured "
            f"runs. [spread]: {doc.model.spread_note} {where[:1].upper()}{where[1:]}."
            + "".join(f" WARNING: {w}." for w in doc.warnings))
    points = Section(title=f"PROJECTION, not measured: {doc.dataset} ({doc.format}) at "
                           f"N nodes, {name}",
                     header=list(TABLE_HEADER),
                     rows=[list(point_cells(p)) for p in doc.points], note=note)
    m = doc.model
    rows = [["input", f.name, f"{f.value:.4g}{span_text(f.span, '.4g')} {f.unit}",
             figure_source(f)] for f in doc.figures]
    rows += [["model", "method", "", m.method],
             ["model", "latency per batch", f"{m.latency_s:.4g} s", m.latency_note],
             ["model", "node-local write per chunk", f"{m.local_write_s:.4g} s",
              m.staging_note],
             ["model", "simulation", "", m.simulation]]
    rows += [["assumption", "", "", a] for a in m.assumptions]
    inputs = Section(title=f"PROJECTION, not measured: inputs and assumptions, {name}",
                     header=["kind", "figure", "value", "source or statement"], rows=rows)
    return [points, inputs]


def all_report_sections(projections: Sequence[tuple[str, ProjectionDoc]]) -> list[Section]:
    """Every projection's sections, in the order found."""
    return [s for name, doc in projections for s in report_sections(name, doc)]


def compare_table(projections: Sequence[tuple[str, ProjectionDoc]]) -> Any:
    """The rich table `compare` prints apart from the runs: one row per projection."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"iobench compare: projections ({NOT_MEASURED}; a model's "
                               "prediction from one node, not compared with the runs above)"))
    for col in ("file", "dataset", "nodes", "AU [spread] at the first N",
                "AU [spread] at the last N", "stops keeping up"):
        table.add_column(escape(col), justify="left" if col in ("file", "dataset") else "right")
    for name, doc in projections:
        first, last = point_cells(doc.points[0]), point_cells(doc.points[-1])
        stops = _stops(doc)
        table.add_row(escape(name), f"{doc.dataset} ({doc.format})",
                      f"{doc.points[0].nodes:,}-{doc.points[-1].nodes:,}",
                      escape(f"{first[1]} (N = {first[0]})"),
                      escape(f"{last[1]} (N = {last[0]})"), escape(stops))
    return table


def print_compare(paths: Iterable[str | Path], console: Any = None) -> None:
    """Print the projections among `paths` apart, labelled, after compare's tables (nothing
    when there are none)."""
    import sys

    from rich.console import Console

    projections, bad = find_projections(paths)
    if not projections and not bad:
        return
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    if projections:
        console.print(compare_table(projections))
    for name, why in bad:
        console.print(f"compare: skipped {name}: {why}", markup=False)
