"""The report's stall timeline: a `train --trace` file drawn per epoch (SVG) and told in one line.

`load_timeline(path)` reads the Chrome trace-event JSON that
`iobench.core.trace` writes into `EpochSpans` (per repetition and epoch,
each rank's wait and compute spans and its loader lanes' fetch and decode).
`epoch_svg` draws one epoch: a row per rank (compute green, wait red, the
time a checkpoint save blocked the steps grey: `train --checkpoint-every`), a row
for its host-to-device copies when timed, and a row per loader lane (fetch
blue, decode orange); spans closer than half a pixel merge, so a drawing
stays small whatever the step count. `epoch_line` says the same in words, the
checkpoints' blocked time included.
`add_timelines(page, runs, markdown)` is the report's hook: it adds a
section for every run whose result names a trace.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iobench.core.errors import DatasetError
from iobench.core.result_types import TrainResult

WIDTH, LABEL, ROW, GAP, TOP = 760, 150, 12, 3, 30  # px
COLOURS = {"compute": "#4caf50", "wait": "#d32f2f", "h2d": "#7b1fa2", "fetch": "#1976d2",
           "decode": "#f57c00", "checkpoint": "#607d8b"}
MAX_ROWS = 24  # lanes drawn per epoch; the rest are counted
MAX_EPOCHS = 12  # epochs drawn per run; the rest are counted
TITLE = "Stall timeline per epoch (train --trace)"

Span = tuple[float, float]  # (start, duration), microseconds


@dataclass
class RankSpans:
    """One rank's spans in one epoch (microseconds on the trace's clock)."""

    wait: list[Span] = field(default_factory=list)
    compute: list[Span] = field(default_factory=list)
    h2d: list[Span] = field(default_factory=list)
    checkpoint: list[Span] = field(default_factory=list)  # a save blocked the steps
    # loader lane name -> (kind, start, duration)
    lanes: dict[str, list[tuple[str, float, float]]] = field(default_factory=dict)
    window: Span | None = None  # the epoch span
    longest: tuple[float, float, int] = (0.0, 0.0, 0)  # longest wait: (dur, start, step)


@dataclass
class EpochSpans:
    """Every rank's spans of one epoch of one repetition."""

    repeat: int
    epoch: int
    ranks: dict[int, RankSpans] = field(default_factory=dict)

    @property
    def window(self) -> Span:
        """(start, duration) spanning every rank's epoch."""
        spans = [r.window for r in self.ranks.values() if r.window is not None]
        start = min(s for s, _ in spans)
        return start, max(s + d for s, d in spans) - start


def load_timeline(path: str | Path) -> list[EpochSpans]:
    """The epochs of a `train --trace` file, in order; a DatasetError when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as err:
        raise DatasetError(f"trace {path} cannot be read: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise DatasetError(f"trace {path} holds no traceEvents list: not a trace iobench wrote")
    try:
        epochs = _epochs(doc["traceEvents"])
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetError(f"trace {path} has an event iobench does not write ({err!r}): "
                           "not a trace of iobench train") from None
    if any(r.window is None for ep in epochs for r in ep.ranks.values()):
        raise DatasetError(f"trace {path} lacks a rank's epoch span: it was cut short or "
                           "not written by iobench train")
    return epochs


def _epochs(events: list[Any]) -> list[EpochSpans]:
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    epochs: dict[tuple[int, int], EpochSpans] = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        a = e["args"]
        ep = epochs.setdefault((int(a["repeat"]), int(a["epoch"])),
                               EpochSpans(int(a["repeat"]), int(a["epoch"])))
        _add(ep.ranks.setdefault(int(e["pid"]), RankSpans()), e,
             str(names.get((e["pid"], e["tid"]), f"lane {e['tid']}")))
    return [epochs[k] for k in sorted(epochs)]


def _add(r: RankSpans, e: dict[str, Any], lane: str) -> None:
    kind, span = e["name"], (float(e["ts"]), float(e["dur"]))
    if kind == "epoch":
        r.window = span
    elif kind == "wait":
        r.wait.append(span)
        if span[1] > r.longest[0]:
            r.longest = (span[1], span[0], int(e["args"].get("step", 0)))
    elif kind == "compute":
        r.compute.append(span)
    elif kind == "h2d":
        r.h2d.append(span)
    elif kind == "checkpoint":
        r.checkpoint.append(span)
    elif kind in ("fetch", "decode"):
        r.lanes.setdefault(lane, []).append((kind, *span))


def _rects(spans: Sequence[tuple[str, float, float]], t0: float, scale: float
           ) -> list[tuple[str, float, float]]:
    """(kind, x, width) in pixels, neighbours of one kind closer than half a pixel merged."""
    out: list[tuple[str, float, float]] = []
    for kind, s, d in sorted(spans, key=lambda x: x[1]):
        x, w = (s - t0) * scale, max(d * scale, 0.3)
        if out and out[-1][0] == kind and x - (out[-1][1] + out[-1][2]) < 0.5:
            k, x0, _ = out[-1]
            out[-1] = (k, x0, max(x + w - x0, out[-1][2]))
        else:
            out.append((kind, x, w))
    return out


def _rows(ep: EpochSpans) -> list[tuple[str, list[tuple[str, float, float]]]]:
    """(label, spans) per drawn row: each rank, its copies, its loader lanes."""
    rows: list[tuple[str, list[tuple[str, float, float]]]] = []
    for rank, r in sorted(ep.ranks.items()):
        rows.append((f"rank {rank}", [("compute", *s) for s in r.compute]
                     + [("wait", *s) for s in r.wait]
                     + [("checkpoint", *s) for s in r.checkpoint]))
        if r.h2d:
            rows.append((f"rank {rank} host-to-device", [("h2d", *s) for s in r.h2d]))
        for lane, spans in sorted(r.lanes.items()):
            rows.append((f"rank {rank} {lane.split(':')[0]}", spans))
    return rows


def epoch_svg(ep: EpochSpans) -> str:
    """One epoch drawn as an inline SVG: a row per rank and per loader lane, time in s."""
    t0, dur = ep.window
    scale = (WIDTH - LABEL - 30) / max(dur, 1.0)  # room for the last tick's label
    rows = _rows(ep)
    shown = rows[:MAX_ROWS]
    height = TOP + len(shown) * (ROW + GAP) + 22
    e = html.escape
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' "
           f"font-family='sans-serif' font-size='10'>"]
    x = LABEL
    drawn = {k for _, spans in shown for k, *_ in spans}
    for kind, colour in COLOURS.items():
        if kind not in drawn:
            continue
        out.append(f"<rect x='{x}' y='4' width='10' height='10' fill='{colour}'/>"
                   f"<text x='{x + 13}' y='13'>{kind}</text>")
        x += 75
    for i, (label, spans) in enumerate(shown):
        y = TOP + i * (ROW + GAP)
        out.append(f"<text x='4' y='{y + ROW - 2}'>{e(label)}</text>")
        out += [f"<rect x='{LABEL + rx:.1f}' y='{y}' width='{w:.1f}' height='{ROW}' "
                f"fill='{COLOURS[k]}'/>" for k, rx, w in _rects(spans, t0, scale)]
    y = TOP + len(shown) * (ROW + GAP) + 12
    for k in range(5):
        t = dur * k / 4
        out.append(f"<text x='{LABEL + t * scale:.1f}' y='{y}' text-anchor='middle'>"
                   f"{t / 1e6:.2f} s</text>")
    if len(rows) > len(shown):
        out.append(f"<text x='4' y='{y}'>{len(rows) - len(shown)} more lanes</text>")
    out.append("</svg>")
    return "".join(out)


def checkpoint_blocked(ep: EpochSpans) -> tuple[float, int, int] | None:
    """(microseconds, saves, rank) of the rank whose steps checkpoint saves blocked longest
    in this epoch; None when no save blocked them."""
    blocked = {rank: sum(d for _, d in r.checkpoint) for rank, r in ep.ranks.items()
               if r.checkpoint}
    if not blocked:
        return None
    rank = max(blocked, key=lambda k: blocked[k])
    return blocked[rank], len(ep.ranks[rank].checkpoint), rank


def epoch_line(ep: EpochSpans) -> str:
    """One epoch in words: the slowest rank's stall, the longest wait, the loaders' time, the
    time checkpoint saves blocked the steps."""
    stall = {rank: sum(d for _, d in r.wait) for rank, r in ep.ranks.items()}
    worst = max(stall, key=lambda k: stall[k])
    wall = ep.ranks[worst].window
    wall_us = wall[1] if wall else 0.0
    t0 = ep.window[0]
    rank, r = max(ep.ranks.items(), key=lambda kv: kv[1].longest[0])
    d, s, step = r.longest
    fetch = sum(x[2] for rr in ep.ranks.values() for spans in rr.lanes.values()
                for x in spans if x[0] == "fetch")
    decode = sum(x[2] for rr in ep.ranks.values() for spans in rr.lanes.values()
                 for x in spans if x[0] == "decode")
    line = (f"repeat {ep.repeat + 1} epoch {ep.epoch + 1}: stall {stall[worst] / 1e6:.3f} s "
            f"of {wall_us / 1e6:.3f} s on rank {worst}"
            + (f" ({stall[worst] / wall_us:.0%})" if wall_us > 0 else "")
            + f"; longest wait {d / 1e6:.3f} s at {(s - t0) / 1e6:.2f} s (rank {rank}, "
            f"step {step + 1})")
    if fetch or decode:
        line += f"; loaders fetched for {fetch / 1e6:.2f} s and decoded for {decode / 1e6:.2f} s"
    ck = checkpoint_blocked(ep)
    if ck is not None:
        line += (f"; checkpoint saves blocked the steps for {ck[0] / 1e6:.3f} s ({ck[1]} "
                 f"save(s), rank {ck[2]})")
    return line


def _run_section(run: TrainResult, markdown: bool) -> list[str]:
    """A run's lines (and drawings in HTML) from the trace its result names."""
    path = run.config.trace
    assert path is not None
    head = f"run {run.run_id}: trace {path}"
    try:
        epochs = load_timeline(path)
    except DatasetError as err:
        return [f"- {head}: {err}" if markdown else f"<p>{html.escape(f'{head}: {err}')}</p>"]
    blocked = [b for b in map(checkpoint_blocked, epochs) if b is not None]
    if blocked:  # the slowest rank's of each epoch: the steps waited for it
        head += (f"; checkpoint saves blocked the steps for {sum(b[0] for b in blocked) / 1e6:.3f}"
                 f" s in all ({sum(b[1] for b in blocked)} save(s))")
    more = len(epochs) - MAX_EPOCHS
    epochs = epochs[:MAX_EPOCHS]
    if markdown:
        return [f"- {head}", *[f"  - {epoch_line(ep)}" for ep in epochs]] + (
            [f"  - {more} more epoch(s) in the trace"] if more > 0 else [])
    out = [f"<h3>{html.escape(head)}</h3>"]
    for ep in epochs:
        out += [f"<p>{html.escape(epoch_line(ep))}</p>", epoch_svg(ep)]
    if more > 0:
        out.append(f"<p>{more} more epoch(s) in the trace</p>")
    return out


def add_timelines(page: str, runs: Sequence[TrainResult], markdown: bool) -> str:
    """`page` (a rendered report) with a stall-timeline section for each run that was traced:
    appended to Markdown, before the end of an HTML body. Unchanged when none was."""
    traced = [r for r in runs if r.config.trace is not None]
    if not traced:
        return page
    body = [line for r in traced for line in _run_section(r, markdown)]
    if markdown:
        return page.rstrip("\n") + "\n\n" + "\n".join([f"## {TITLE}", "", *body, ""]) + "\n"
    section = "\n".join([f"<h2>{html.escape(TITLE)}</h2>", *body])
    end = page.rfind("</body>")
    return page[:end] + section + "\n" + page[end:] if end >= 0 else page + section
