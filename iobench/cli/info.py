"""Show library versions, CPU, memory and GPUs, and the filesystem that holds PATH."""

from __future__ import annotations

import argparse
import json

from iobench.core import sysinfo


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="a directory whose filesystem to describe")
    p.add_argument("--json", action="store_true", help="print one JSON document instead")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    raise AssertionError


def main(args: argparse.Namespace) -> int:
    doc = sysinfo.provenance(args.path)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("host", doc["host"])
    t.add_row("os", doc["os"])
    t.add_row("cpu", f"{doc['cpu_model']} x {doc['cpu_count']} "
                     f"({doc['cpu_affinity']} usable by this process)")
    t.add_row("memory", _fmt_bytes(doc["memory_bytes"]))
    gpus = doc["gpus"]
    t.add_row("gpus", ", ".join(f"{g['index']}: {g['name']} ({_fmt_bytes(g['memory_bytes'])})"
                                for g in gpus) if gpus else "none")
    for name, v in doc["versions"].items():
        t.add_row(name, v or "not installed")
    if "storage" in doc:
        s = doc["storage"]
        t.add_row("path", s["path"])
        t.add_row("filesystem", f"{s['fstype']} {s['options']}")
        t.add_row("storage kind", s["kind"])
        t.add_row("mount", f"{s['mount_point']} (source {s['source']})")
        t.add_row("free space", f"{_fmt_bytes(s['free_bytes'])} of {_fmt_bytes(s['total_bytes'])}")
    Console(highlight=False).print(t)
    return 0
