"""The report's stall timeline: a `train --trace` file drawn per epoch (SVG) and told in one line.

`load_timeline(path)` reads the Chrome trace-event JSON that
`iobench.core.trace` writes into `EpochSpans` (per repetition and epoch,
each rank's wait and compute spans and its loader lanes' fetch and decode);
`load_trace(path)` also keeps what ran beside the steps (`Beside`: an async
checkpoint's write, the drain to `--drain-to`), each span attached to every
epoch it overlaps. `epoch_svg` draws one epoch: a row per rank (compute green,
wait red, the time a checkpoint save blocked the steps grey: `train
--checkpoint-every`), a row for its host-to-device copies when timed, a row for
its async checkpoint writes and one for its drains (clipped to the epoch), and a
row per loader lane (fetch blue, decode orange); spans closer than half a pixel
merge, so a drawing stays small whatever the step count. `epoch_line` says the
same in words: the checkpoints' blocked time, their writes and drains, and the
result's split of the stall by drain (`epochs[i].checkpoint.drain`).
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
from iobench.core.result_types import DrainSplit, TrainResult

WIDTH, LABEL, ROW, GAP, TOP = 760, 150, 12, 3, 30  # px
COLOURS = {"compute": "#4caf50", "wait": "#d32f2f", "h2d": "#7b1fa2", "fetch": "#1976d2",
           "decode": "#f57c00", "checkpoint": "#607d8b", "checkpoint_write": "#b0bec5",
           "drain": "#00897b"}
LEGEND = {"checkpoint_write": "async write"}  # a kind's legend text, when not its name
BESIDE = ("checkpoint_write", "drain")  # what ran beside the steps (iobench.core.trace)
MAX_ROWS = 24  # lanes drawn per epoch; the rest are counted
MAX_EPOCHS = 12  # epochs drawn per run; the rest are counted
TITLE = "Stall timeline per epoch (train --trace)"

Span = tuple[float, float]  # (start, duration), microseconds


@dataclass(frozen=True)
class Beside:
    """A checkpoint's work beside the steps on one rank: its async write or its drain."""

    kind: str  # "checkpoint_write" or "drain"
    rank: int
    repeat: int
    checkpoint: int  # the checkpoint's index over the run
    start: float  # microseconds on the trace's clock
    dur: float
    bytes: int

    def overlap(self, window: Span) -> float:
        """Microseconds of this span inside `window` (start, duration)."""
        return max(0.0, min(self.start + self.dur, sum(window)) - max(self.start, window[0]))


@dataclass
class RankSpans:
    """One rank's spans in one epoch (microseconds on the trace's clock)."""

    wait: list[Span] = field(default_factory=list)
    compute: list[Span] = field(default_factory=list)
    h2d: list[Span] = field(default_factory=list)
    checkpoint: list[Span] = field(default_factory=list)  # a save blocked the steps
    beside: list[Beside] = field(default_factory=list)  # async writes, drains (overlapping)
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


@dataclass
class Timeline:
    """A trace's epochs, and every span that ran beside the steps."""

    epochs: list[EpochSpans]
    beside: list[Beside]


def load_timeline(path: str | Path) -> list[EpochSpans]:
    """The epochs of a `train --trace` file, in order; a DatasetError when it cannot be read."""
    return load_trace(path).epochs


def load_trace(path: str | Path) -> Timeline:
    """A `train --trace` file's epochs and the spans beside their steps (each also on every
    epoch it overlaps); a DatasetError when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as err:
        raise DatasetError(f"trace {path} cannot be read: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise DatasetError(f"trace {path} holds no traceEvents list: not a trace iobench wrote")
    try:
        epochs, beside = _epochs(doc["traceEvents"])
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetError(f"trace {path} has an event iobench does not write ({err!r}): "
                           "not a trace of iobench train") from None
    if any(r.window is None for ep in epochs for r in ep.ranks.values()):
        raise DatasetError(f"trace {path} lacks a rank's epoch span: it was cut short or "
                           "not written by iobench train")
    for ep in epochs:
        for b in beside:
            if b.repeat == ep.repeat and b.rank in ep.ranks and b.overlap(ep.window) > 0:
                ep.ranks[b.rank].beside.append(b)
    return Timeline(epochs, beside)


def _epochs(events: list[Any]) -> tuple[list[EpochSpans], list[Beside]]:
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    epochs: dict[tuple[int, int], EpochSpans] = {}
    beside: list[Beside] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        a = e["args"]
        if e["name"] in BESIDE:  # drawn on the epochs it overlaps, not only its save's
            beside.append(Beside(e["name"], int(e["pid"]), int(a["repeat"]),
                                 int(a["checkpoint"]), float(e["ts"]), float(e["dur"]),
                                 int(a.get("bytes", 0))))
            continue
        ep = epochs.setdefault((int(a["repeat"]), int(a["epoch"])),
                               EpochSpans(int(a["repeat"]), int(a["epoch"])))
        _add(ep.ranks.setdefault(int(e["pid"]), RankSpans()), e,
             str(names.get((e["pid"], e["tid"]), f"lane {e['tid']}")))
    return [epochs[k] for k in sorted(epochs)], beside


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
    """(label, spans) per drawn row: each rank, its copies, its checkpoints' async writes
    and drains (clipped to the epoch), its loader lanes."""
    rows: list[tuple[str, list[tuple[str, float, float]]]] = []
    t0 = ep.window[0]
    for rank, r in sorted(ep.ranks.items()):
        rows.append((f"rank {rank}", [("compute", *s) for s in r.compute]
                     + [("wait", *s) for s in r.wait]
                     + [("checkpoint", *s) for s in r.checkpoint]))
        if r.h2d:
            rows.append((f"rank {rank} host-to-device", [("h2d", *s) for s in r.h2d]))
        for kind in BESIDE:
            spans = [(b.kind, max(b.start, t0), b.overlap(ep.window)) for b in r.beside
                     if b.kind == kind]
            if spans:
                rows.append((f"rank {rank} {LEGEND.get(kind, kind)}", spans))
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
    out += _legend({k for _, spans in shown for k, *_ in spans})
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


def _legend(drawn: set[str]) -> list[str]:
    """A colour box and a name for each kind drawn, on a second line when the first is full."""
    out, x, y = [], LABEL, 4
    for kind, colour in COLOURS.items():
        if kind not in drawn:
            continue
        text = LEGEND.get(kind, kind)
        step = max(75, 13 + 6 * len(text) + 12)
        if x + step > WIDTH:
            x, y = LABEL, y + 13
        out.append(f"<rect x='{x}' y='{y}' width='10' height='10' fill='{colour}'/>"
                   f"<text x='{x + 13}' y='{y + 9}'>{text}</text>")
        x += step
    return out


def checkpoint_blocked(ep: EpochSpans) -> tuple[float, int, int] | None:
    """(microseconds, saves, rank) of the rank whose steps checkpoint saves blocked longest
    in this epoch; None when no save blocked them."""
    blocked = {rank: sum(d for _, d in r.checkpoint) for rank, r in ep.ranks.items()
               if r.checkpoint}
    if not blocked:
        return None
    rank = max(blocked, key=lambda k: blocked[k])
    return blocked[rank], len(ep.ranks[rank].checkpoint), rank


def beside_words(ep: EpochSpans, split: DrainSplit | None = None) -> list[str]:
    """The epoch's checkpoint work beside the steps in words: each async write (its slowest
    rank), each drain (its time in this epoch), and the result's split of the steps' wait
    by drain (`epochs[i].checkpoint.drain`, every rank's steps), as given."""
    writes: dict[int, Beside] = {}
    drains: list[Beside] = []
    for r in ep.ranks.values():
        for b in r.beside:
            if b.kind == "drain":
                drains.append(b)
            elif b.checkpoint not in writes or b.dur > writes[b.checkpoint].dur:
                writes[b.checkpoint] = b
    out = [f"the async write of checkpoint {k} ran {b.dur / 1e6:.3f} s beside the steps "
           f"(slowest: rank {b.rank})" for k, b in sorted(writes.items())]
    out += [f"the drain of checkpoint {b.checkpoint} ran {b.dur / 1e6:.3f} s "
            f"({b.bytes / 1e6:,.1f} MB), {b.overlap(ep.window) / 1e6:.3f} s of it in this epoch"
            for b in sorted(drains, key=lambda b: b.start)]
    if split is not None:
        out.append(_split_words(split))
    return out


def _split_words(d: DrainSplit) -> str:
    def per_step(n: int, s: float | None) -> str:
        return f"{n} step(s), {s * 1e3:.2f} ms each" if s is not None else "no step"

    during = per_step(d.steps_in_flight, d.stall_per_step_in_flight_s)
    outside = per_step(d.steps_idle, d.stall_per_step_idle_s)
    return (f"the steps' wait with a drain in flight: {during}, against {outside} without "
            "(every rank's steps after its first, the result's split)")


def epoch_line(ep: EpochSpans, split: DrainSplit | None = None) -> str:
    """One epoch in words: the slowest rank's stall, the longest wait, the loaders' time, the
    time checkpoint saves blocked the steps, their writes and drains beside the steps, and
    `split` (the result's stall by drain, `epochs[i].checkpoint.drain`) when given."""
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
    return "; ".join([line, *beside_words(ep, split)])


def _run_section(run: TrainResult, markdown: bool) -> list[str]:
    """A run's lines (and drawings in HTML) from the trace its result names."""
    path = run.config.trace
    assert path is not None
    head = f"run {run.run_id}: trace {path}"
    try:
        trace = load_trace(path)
    except DatasetError as err:
        return [f"- {head}: {err}" if markdown else f"<p>{html.escape(f'{head}: {err}')}</p>"]
    epochs = trace.epochs
    blocked = [b for b in map(checkpoint_blocked, epochs) if b is not None]
    if blocked:  # the slowest rank's of each epoch: the steps waited for it
        head += (f"; checkpoint saves blocked the steps for {sum(b[0] for b in blocked) / 1e6:.3f}"
                 f" s in all ({sum(b[1] for b in blocked)} save(s))")
    head += _beside_total(trace.beside)
    splits = {(e.repeat, e.epoch): e.checkpoint.drain for e in run.epochs
              if e.checkpoint is not None}
    more = len(epochs) - MAX_EPOCHS
    epochs = epochs[:MAX_EPOCHS]
    lines = [epoch_line(ep, splits.get((ep.repeat, ep.epoch))) for ep in epochs]
    if markdown:
        return [f"- {head}", *[f"  - {line}" for line in lines]] + (
            [f"  - {more} more epoch(s) in the trace"] if more > 0 else [])
    out = [f"<h3>{html.escape(head)}</h3>"]
    for ep, line in zip(epochs, lines, strict=True):
        out += [f"<p>{html.escape(line)}</p>", epoch_svg(ep)]
    if more > 0:
        out.append(f"<p>{more} more epoch(s) in the trace</p>")
    return out


def _beside_total(beside: Sequence[Beside]) -> str:
    """The run's async writes and drains in all (each once, wherever it ran)."""
    out = ""
    writes = {b.checkpoint: b for b in sorted(beside, key=lambda b: b.dur)
              if b.kind == "checkpoint_write"}  # each checkpoint's slowest rank's
    if writes:
        out += (f"; {len(writes)} async write(s) ran beside the steps, the slowest "
                f"{max(b.dur for b in writes.values()) / 1e6:.3f} s")
    drains = [b for b in beside if b.kind == "drain"]
    if drains:
        out += (f"; {len(drains)} drain(s) ran {sum(b.dur for b in drains) / 1e6:.3f} s in all "
                f"({sum(b.bytes for b in drains) / 1e6:,.1f} MB)")
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
