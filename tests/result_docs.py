"""Result documents for tests: a small real `iobench.result` v3 (tests/data/result-v3.json,
written by `iobench train` of main at 918e608) and documents built from it with chosen figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REAL_V3 = Path(__file__).parent / "data" / "result-v3.json"


def real_result() -> dict[str, Any]:
    """A fresh copy of the real v3 result (cifar10, hdf5, 2 workers, 2 epochs, emulated)."""
    return json.loads(REAL_V3.read_text())


def one_pass(value: float) -> dict[str, Any]:
    """The spread of a single pass measuring `value`."""
    return {"median": value, "min": value, "max": value, "cv": None, "n": 1, "values": [value]}


def probe_doc(path: str, sample_read_MBps: float, label: str = "tier") -> dict[str, Any]:
    """An `iobench.probe` document of `path` with its random-read limit (other figures 100)."""
    figures = ("seq_read_MBps", "seq_write_MBps", "rand4k_read_iops", "rand4k_read_MBps",
               "create_per_s", "stat_per_s", "open_read_close_per_s")
    return {"schema": "iobench.probe", "schema_version": 2, "label": label, "created": "x",
            "engine": "python", "direct": False,
            "storage": {"path": path, "fstype": "lustre", "kind": "parallel"},
            "summary": {**dict.fromkeys(figures, 100.0), "sample_read_MBps": sample_read_MBps,
                        "sample_bytes": 3072, "sample_reads": [], "readers_max": 1}}
