"""NPZ files laid out otherwise than the dataset's first (a DEFLATE member, another writer)
are read whole and parsed by numpy, as the loader promises, not failed as short reads."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

from conftest import cli
from iobench.loaders import LoaderConfig, make_loader


def _recompress(root: Path, which: int) -> tuple[np.ndarray, np.ndarray]:
    """Rewrite sample `which` as a compressed .npz (same x and y) and reseal the manifest."""
    doc = json.loads((root / "iobench.json").read_text())
    entry = doc["files"][which]
    path = root / entry["path"]
    with np.load(path) as z:
        x, y = z["x"], z["y"]
    buf = io.BytesIO()
    np.savez_compressed(buf, x=x, y=y)
    data = buf.getvalue()
    path.write_bytes(data)
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (root / "iobench.json").write_text(json.dumps(doc))
    return x, y


def test_a_deflate_member_is_read_whole_and_verified(tmp_path: Path) -> None:
    assert cli("generate", "--format", "npz", "--samples", "64", "--storage", tmp_path) == 0
    root = tmp_path / "cifar10-npz"
    x3, y3 = _recompress(root, 3)
    assert cli("verify", "--deep", root) == 0
    loader = make_loader("npz", root, LoaderConfig(batch_size=16, workers=0, shuffle="none",
                                                   decode=False))
    seen = 0
    for b in loader.epoch(0):
        for row, idx in enumerate(b.indices.tolist()):
            if idx == 3:  # the compressed file, read after the first file set the layout
                np.testing.assert_array_equal(np.asarray(b.samples[row]).reshape(x3.shape), x3)
                assert int(np.asarray(b.labels[row])) == int(y3)
            seen += 1
    assert seen == 64
