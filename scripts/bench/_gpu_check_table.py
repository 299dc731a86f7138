#!/usr/bin/env python3
"""The one table of `gpu_check.sh`: each step's outcome and its figures, from WORKDIR's logs and results."""

from __future__ import annotations

import glob
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any


def outcome(rc: str) -> str:
    return {"0": "ok", "124": "TIMED OUT", "137": "KILLED (timeout)",
            "skipped": "skipped (budget)"}.get(rc, f"FAILED (exit {rc})")


def num(v: float) -> str:
    """A rate: whole numbers from 100 up, else 3 significant digits."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def last_line(log: Path, pattern: str) -> str:
    """The last line of `log` matching `pattern` (regex), stripped, or ''."""
    if not log.exists():
        return ""
    hits = [ln.strip() for ln in log.read_text(errors="replace").splitlines()
            if re.search(pattern, ln)]
    return hits[-1] if hits else ""


def train_figures(work: Path, name: str) -> str:
    """Last epoch's samples/s, MB/s, stall and AU, and the verdict line, of a train step."""
    found = sorted(glob.glob(str(work / "res" / name / "*.json")))
    if not found:
        return "no result file"
    doc: dict[str, Any] = json.loads(Path(found[-1]).read_text())
    s = doc["epochs"][-1]["summary"]
    verdict = last_line(work / "logs" / f"{name}.log", r"^verdict:")
    status = "" if doc.get("status") in (None, "complete") else f"[{doc['status']}] "
    return (f"{status}epoch {len(doc['epochs'])}: {num(s['samples_per_s'])} samples/s, "
            f"{num(s['read_MBps'])} MB/s, stall {100 * s['stall_fraction_max']:.0f}%, "
            f"AU {s['au_mean']:.2f}; {verdict[:160]}")


def ratio_figures(work: Path) -> str:
    path = work / "res" / "dali_vs_native.json"
    if not path.exists():
        return "no result file"
    parts = []
    for r in json.loads(path.read_text())["rows"]:
        m = statistics.median
        parts.append(f"{r['format']} {'decoded' if r['decode'] else 'no decode'}: "
                     f"{m(r['ratio']):.2f} (iobench {num(m(r['iobench_img_s']))} / DALI's own "
                     f"{num(m(r['native_img_s']))} img/s)")
    return "; ".join(parts)


def demand_figures(work: Path) -> str:
    path = work / "res" / "model_demand.json"
    if not path.exists():
        return "no result file"
    return "; ".join(f"{r['model']} batch {r['batch']}: {num(r['samples_per_s'])} samples/s "
                     f"({r['ms_per_step']:.1f} ms/step)"
                     for r in json.loads(path.read_text()))


def figures(work: Path, name: str) -> str:
    log = work / "logs" / f"{name}.log"
    if name == "info":
        return " | ".join(ln.strip() for ln in log.read_text(errors="replace").splitlines()
                          if ln.strip())[:200] if log.exists() else ""
    if name.startswith("gen-"):
        return last_line(log, r"^wrote ")
    if name == "dali-vs-native":
        return ratio_figures(work)
    if name == "demand":
        return demand_figures(work)
    if name.startswith("train-"):
        return train_figures(work, name)
    if name.startswith("pytest"):
        return last_line(log, r"passed|failed|error|no tests ran")
    return ""


def main(argv: list[str]) -> int:
    work, total = Path(argv[1]), argv[2]
    rows = ["| step | outcome | s | figures |", "|---|---|---|---|"]
    for line in (work / "steps.tsv").read_text().splitlines():
        name, rc, secs = line.split("\t")
        try:
            got = figures(work, name) if rc != "skipped" else ""
        except (KeyError, ValueError, IndexError, TypeError) as e:  # a result of another shape
            got = f"(figures unreadable: {type(e).__name__} {e})"
        rows.append(f"| {name} | {outcome(rc)} | {secs} | {got.replace('|', '/')} |")
    print(f"gpu_check: {total} s in all; logs in {work}/logs\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
