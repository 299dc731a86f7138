"""The report's pages: its tables and opening answer rendered as one self-contained HTML page
(PNGs embedded) or as Markdown (PNGs beside it)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str | None = None


@dataclass
class Lead:
    """What the report opens with: the answer in a few lines (`points`: a heading and its
    lines each), then each run's verdict."""

    points: list[tuple[str, list[str]]]
    verdicts: Table


PLOT_TITLES = {"stall": "Stall time per epoch, by run", "throughput": "Throughput by workers",
               "au": "AU by storage tier", "limits": "Probe limits and loader MB/s by tier",
               "search": "AU against emulated accelerators (iobench search)"}
_CSS = ("body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;"
        "margin:0.5em 0 1.5em}th,td{border:1px solid #bbb;padding:3px 7px;font-size:0.85em}"
        "th{background:#eee}td.n{text-align:right}td.bad{color:#b00;font-weight:bold}"
        ".note{color:#555;font-size:0.85em}img{max-width:100%}td.ok{color:#070}"
        ".answer{border-left:4px solid #36c;background:#f4f7fc;padding:0.3em 1em;"
        "margin-bottom:1em}.answer h2{margin:0.3em 0}.points>li{margin:0.3em 0}")


def _cls(cell: str) -> str:
    if "FAILED" in cell or cell.startswith("starved"):
        return " class='bad'"
    if cell == "keeps up":
        return " class='ok'"
    return " class='n'" if cell[:1].isdigit() or cell in ("n/a", "never") else ""


def _table_html(t: Table) -> list[str]:
    e = html.escape
    out = [f"<h2>{e(t.title)}</h2><table><tr>"
           + "".join(f"<th>{e(h)}</th>" for h in t.header) + "</tr>"]
    out += ["<tr>" + "".join(f"<td{_cls(c)}>{e(c)}</td>" for c in row) + "</tr>"
            for row in t.rows]
    out.append("</table>")
    if t.note:
        out.append(f"<p class='note'>{e(t.note)}</p>")
    return out


def _lead_html(lead: Lead) -> list[str]:
    e = html.escape
    out = ["<section id='answer' class='answer'><h2>The answer</h2><ul class='points'>"]
    out += [f"<li><b>{e(head)}</b><ul>" + "".join(f"<li>{e(x)}</li>" for x in lines)
            + "</ul></li>" for head, lines in lead.points]
    out.append("</ul></section>")
    return out + _table_html(lead.verdicts)


def render_html(title: str, tables: list[Table], pngs: dict[str, bytes],
                lead: Lead | None = None) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
           f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>"]
    if lead is not None:
        out += _lead_html(lead)
    for t in tables:
        out += _table_html(t)
    for name, data in pngs.items():
        b64 = base64.b64encode(data).decode()
        out.append(f"<h2>{e(PLOT_TITLES[name])}</h2><img alt='{e(name)}' "
                   f"src='data:image/png;base64,{b64}'>")
    out.append("</body></html>\n")
    return "\n".join(out)


def _md_cell(c: str) -> str:
    return c.replace("|", "\\|").replace("\n", " ")


def _table_markdown(t: Table) -> list[str]:
    out = [f"## {t.title}", "", "| " + " | ".join(t.header) + " |",
           "|" + "|".join("---" for _ in t.header) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
    out.append("")
    if t.note:
        out += [f"_{t.note}_", ""]
    return out


def _lead_markdown(lead: Lead) -> list[str]:
    out = ["## The answer", ""]
    for head, lines in lead.points:
        out += [f"- **{head}**", *(f"  - {_md_cell(x)}" for x in lines)]
    return out + ["", *_table_markdown(lead.verdicts)]


def render_markdown(title: str, tables: list[Table], png_names: dict[str, str],
                    lead: Lead | None = None) -> str:
    out = [f"# {title}", ""]
    if lead is not None:
        out += _lead_markdown(lead)
    for t in tables:
        out += _table_markdown(t)
    for name, fname in png_names.items():
        out += [f"## {PLOT_TITLES[name]}", "", f"![{PLOT_TITLES[name]}]({fname})", ""]
    return "\n".join(out)
