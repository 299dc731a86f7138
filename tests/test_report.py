"""`iobench report`: a self-contained HTML/Markdown report of real probe, stage and train results."""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import cli
from iobench import report, results
from iobench.loaders.base import Batch, Loader
from iobench.manifest import FileEntry, Manifest
from iobench.probe import ProbeConfig, probe_storage
from iobench.stage import StageConfig, stage_dataset, write_result
from iobench.train import TrainConfig, run
from iobench.world import World

PNG = b"\x89PNG\r\n\x1a\n"


class SlowNpyLoader(Loader):
    """Reads batches of a [N,32,32,3] uint8 .npy file; sleeps `delay_s` per batch on the slow tier."""

    name = "npy"
    delay_s = 0.0

    def epoch(self, epoch: int) -> Iterator[Batch]:
        data = np.load(self.manifest.path_of(self.manifest.files[0]), mmap_mode="r")
        labels = np.load(self.manifest.path_of(self.manifest.files[1]))
        idx = self.indices(epoch)
        b = self.config.batch_size
        for i in range(0, len(idx), b):
            sel = np.sort(idx[i:i + b])
            time.sleep(self.delay_s)
            raw = np.ascontiguousarray(data[sel])
            yield Batch(torch.from_numpy(raw), torch.from_numpy(labels[sel]),
                        torch.from_numpy(sel), raw.nbytes)


def make_npy_dataset(storage: Path, n: int = 128) -> Manifest:
    """A cifar10-shaped dataset as `cifar10-hdf5/` (two .npy files, real checksums)."""
    root = storage / "cifar10-hdf5"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(root / "data.npy", rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8))
    np.save(root / "labels.npy", rng.integers(0, 10, n, dtype=np.int64))
    files = tuple(FileEntry(f, (root / f).stat().st_size,
                            hashlib.sha256((root / f).read_bytes()).hexdigest(),
                            0 if f == "data.npy" else -1, n if f == "data.npy" else 0,
                            "data" if f == "data.npy" else "labels")
                  for f in ("data.npy", "labels.npy"))
    m = Manifest(dataset="cifar10", format="hdf5", num_samples=n, num_classes=10,
                 sample={"kind": "array", "shape": [32, 32, 3], "dtype": "uint8"},
                 label={"shape": [], "dtype": "int64"}, layout={}, files=files, seed=0,
                 iobench_version="test", created="2026-01-01T00:00:00Z")
    m.write(root)
    return Manifest.load(root)


def _train(storage: Path, res: Path, delay_s: float, workers: int) -> None:
    def factory(manifest, config, rank, world):
        loader = SlowNpyLoader(manifest, config, rank, world)
        loader.delay_s = delay_s
        return loader

    cfg = TrainConfig(loader="hdf5", storage=str(storage), epochs=2, batch_size=32,
                      workers=workers, model="none", compute_time_s=0.002, results=str(res))
    results.write_result(run(cfg, factory, World()), res)


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("report")
    slow, fast, res = base / "slow", base / "fast", base / "results"
    slow.mkdir()
    fast.mkdir()
    make_npy_dataset(slow)
    for tier, label in ((slow, "pfs"), (fast, "nvme")):
        cfg = ProbeConfig(storage=tier, file_bytes=4 * 2**20, readers=(1, 2), runtime_s=0.1,
                          sample_bytes=3072, metadata_files=10, engine="python", label=label)
        write_result(probe_storage(cfg), res, "probe")
    write_result(stage_dataset(StageConfig("cifar10", "hdf5", slow, fast)), res, "stage")
    for workers in (0, 1):
        _train(slow, res, 0.02, workers)
        _train(fast, res, 0.0, workers)
    (res / "damaged.json").write_text('{"schema": "iobench.result", "schema_version": 1}')
    (res / "notes.json").write_text('{"anything": "else"}')
    return res


def test_html_report_is_self_contained(results_dir, tmp_path):
    out = tmp_path / "report.html"
    assert cli("report", results_dir, "--out", out) == 0
    text = out.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 4  # stall, throughput, AU, probe limits
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    assert "http://" not in text and "https://" not in text and "<link" not in text
    for needle in ("Environment", "Storage tiers", "Runs: cifar10", "Staging cost",
                   "break-even epochs", "pfs", "nvme", "of probe limit", "damaged.json"):
        assert needle in text, needle


def test_markdown_report_and_figures(results_dir, tmp_path):
    out = tmp_path / "sub" / "report.md"
    assert cli("report", results_dir, "--out", out) == 0
    text = out.read_text()
    pngs = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", text)
    assert len(pngs) == 4
    for name in pngs:
        assert (out.parent / name).read_bytes().startswith(PNG)

    col = report.load_directory(results_dir)
    assert len(col.runs) == 4 and len(col.probes) == 2 and len(col.stages) == 1
    assert [f for f, _ in col.skipped] == ["damaged.json"]
    rows = [report.run_row(r, col.probes) for r in col.runs]
    assert {r["tier"] for r in rows} == {"pfs", "nvme"}
    for r in rows:
        assert r["limit_MBps"] > 0 and r["ratio"] == pytest.approx(r["read_MBps"] / r["limit_MBps"])
        assert len(r["stall_s"]) == 2 and 0 < r["au"] <= 1
    slow = [r for r in rows if r["tier"] == "pfs"]
    assert all(min(r["stall_s"]) > 0.04 for r in slow)  # 4 batches x 20 ms injected stall
    (st,) = [s for s in report.staging_rows(col, rows) if s["run"] and "0 workers" in s["run"]]
    gain = st["epoch_slow_s"] - st["epoch_fast_s"]
    assert gain > 0 and st["break_even_epochs"] == pytest.approx(st["stage_s"] / gain)
    assert "| pfs |" in text and "Staging cost" in text


@pytest.mark.parametrize("case, needle", [
    ("missing", "does not exist"),
    ("empty", "holds no iobench results"),
    ("suffix", "must end in .html or .md"),
])
def test_bad_input_is_one_line(tmp_path, capsys, results_dir, case, needle):
    src, out = results_dir, tmp_path / "r.html"
    if case == "missing":
        src = tmp_path / "nope"
    elif case == "empty":
        src = tmp_path / "empty"
        src.mkdir()
    else:
        out = tmp_path / "r.pdf"
    assert cli("report", src, "--out", out) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not out.exists()
