"""`verify` parses what other readers read: a Zarr array's own zarr.json, not only the
consolidated copy iobench's readers open the store through."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import run_cmd

pytest.importorskip("zarr")


def test_a_garbage_array_zarr_json_is_a_problem(tmp_path: Path) -> None:
    assert run_cmd("generate", "--format", "zarr", "--samples", "32", "--storage",
                   tmp_path).returncode == 0
    root = tmp_path / "cifar10-zarr"
    assert run_cmd("verify", root).returncode == 0
    doc = json.loads((root / "iobench.json").read_text())
    data = b'{"zarr_format": 99, "garbage": true}'
    (root / "samples" / "zarr.json").write_bytes(data)
    for e in doc["files"]:  # resealed: sizes and checksums say nothing is wrong
        if e["path"] == "samples/zarr.json":
            e["bytes"], e["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (root / "iobench.json").write_text(json.dumps(doc))
    r = run_cmd("verify", root)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "samples/zarr.json: the array's metadata differs from the consolidated" in r.stderr
