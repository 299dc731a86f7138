"""`iobench report`: a self-contained HTML/Markdown report of real probe, stage and train results."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import cli
from iobench.core import results
from iobench.core.manifest import FileEntry, Manifest
from iobench.core.result_types import TrainResult
from iobench.core.results import write_document
from iobench.core.spread import run_spread
from iobench.core.world import World
from iobench.loaders.base import Batch, Loader
from iobench.workflows import report
from iobench.workflows.probe import ProbeConfig, probe_storage
from iobench.workflows.stage import StageConfig, stage_dataset
from iobench.workflows.train import TrainConfig, run

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
        write_document(probe_storage(cfg), res, "probe")
    write_document(stage_dataset(StageConfig("cifar10", "hdf5", slow, fast)), res, "stage")
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


# --------------------------------------------------------------------------- repeats

def with_repeats(doc: dict, walls: list[list[float]], tag: str, tagged: bool = True) -> dict:
    """`doc` (a real single-pass result) as an `iobench train --repeat N` result whose
    repetition r has epoch walls `walls[r]` (half of each a stall), per the format of
    `--repeat`: epochs tagged `repeat` (0-based) next to `epoch`, `config.repeat`,
    `summary.spread`; `tagged=False` writes a result from before `--repeat` (no tags, one
    repetition). schema_version stays 1 (results.validate reads 1 only)."""
    d = copy.deepcopy(doc)
    d["run_id"] = f"{doc['run_id']}-{tag}"
    template = doc["epochs"][0]
    d["epochs"] = []
    for r, ws in enumerate(walls):
        for k, w in enumerate(ws):
            e = copy.deepcopy(template)
            e["epoch"] = k
            if tagged:
                e["repeat"] = r
            s = e["summary"]
            s.update({"wall_s": w, "stall_s_max": w / 2, "stall_fraction_max": 0.5,
                      "au_mean": 0.5, "samples_per_s": s["samples"] / w,
                      "read_MBps": s["batch_bytes"] / 1e6 / w})
            d["epochs"].append(e)
    if tagged:
        d["config"]["repeat"] = len(walls)
        d["summary"]["spread"] = run_spread(d["epochs"])
    return results.validate(d)


STAGE_SPREAD = {"median": 4.0, "min": 3.0, "max": 6.0, "cv": 0.35, "n": 3,
                "values": [3.0, 4.0, 6.0]}


@pytest.fixture(scope="module")
def repeated_dir(results_dir, tmp_path_factory) -> Path:
    """The real results with controlled figures: repeated runs (3 repetitions) in place (pfs)
    and on the staged copy (nvme), a v1 single pass in place, and a repeated staging."""
    out = tmp_path_factory.mktemp("report-repeats")
    col = report.load_directory(results_dir)
    for p in results_dir.glob("probe-*.json"):
        shutil.copy(p, out)
    stage = col.stages[0].to_dict()
    stage["repeats"] = 3
    stage["spread"] = {"stage_s": STAGE_SPREAD, "stage_MBps": None}
    (out / "stage-repeated.json").write_text(json.dumps(stage))
    run_of = {(Path(r.config.storage).name, r.config.workers): r.to_dict() for r in col.runs}
    docs = [with_repeats(run_of["slow", 0], [[3.0, 3.0], [3.5, 3.5], [4.0, 4.0]], "pfs0"),
            with_repeats(run_of["fast", 0], [[1.0, 1.0], [1.5, 1.5], [1.2, 1.2]], "nvme0"),
            with_repeats(run_of["fast", 1], [[1.1, 1.1], [1.3, 1.3], [1.4, 1.4]], "nvme1"),
            with_repeats(run_of["slow", 1], [[5.0, 5.0]], "pfs1", tagged=False)]
    for d in docs:
        results.write_result(d, out)
    return out


def test_report_shows_spread_not_significant_and_median_break_even(repeated_dir, tmp_path):
    col = report.load_directory(repeated_dir)
    rows = {r["run_id"].rsplit("-", 1)[1]: r for r in
            (report.run_row(d, col.probes) for d in col.runs)}
    assert rows["pfs0"]["repeats"] == 3 and rows["pfs1"]["repeats"] == 1  # v1 still read
    samples = col.runs[0].epochs[0].summary.samples
    assert rows["pfs0"]["samples_per_s"] == pytest.approx(samples / 3.5)  # the median
    assert rows["pfs0"]["stall_s"] == pytest.approx([1.75, 1.75])
    assert rows["pfs1"]["stall_s"] == pytest.approx([2.5, 2.5])
    # min-max error bars where a run has repetitions, none for a single pass
    from iobench.workflows.compare import error_bars

    below, above = error_bars(rows["pfs0"]["stall_spread"])
    assert below == pytest.approx([0.25, 0.25]) and above == pytest.approx([0.25, 0.25])
    assert error_bars(rows["pfs1"]["stall_spread"]) is None

    out = tmp_path / "r.md"
    assert cli("report", repeated_dir, "--out", out) == 0
    lines = out.read_text().splitlines()

    def line(*needles: str) -> str:
        (hit,) = [ln for ln in lines if all(n in ln for n in needles)]
        return hit

    assert "| samples/s vs best |" in line("| reps |")
    pfs0 = line("| pfs | 0 | 32 |")
    assert "1.75 [1.50-2.00] / 1.75 [1.50-2.00]" in pfs0 and "n.s." not in pfs0
    assert "| best |" in line("| nvme | 0 | 32 |")
    assert "n.s." in line("| nvme | 1 | 32 |")  # within the best run's spread
    assert "| 2.50 / 2.50 |" in line("| pfs | 1 | 32 |")  # the v1 single pass
    stage0 = line("| 4.00 [3.00-6.00] |", "0 workers")
    assert "| 3.50 [3.00-4.00] | 1.20 [1.00-1.50] | 1.74 |" in stage0  # 4 / (3.5 - 1.2)
    stage1 = line("| 4.00 [3.00-6.00] |", "1 workers")
    assert "| 5.00 | 1.30 [1.10-1.40] | 1.08 |" in stage1  # 4 / (5 - 1.3)
    assert len(re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", "\n".join(lines))) == 4


def test_report_refuses_incomparable_pairs(results_dir, tmp_path):
    col = report.load_directory(results_dir)
    docs = [r.to_dict() for r in col.runs]
    for d in docs:
        if Path(d["config"]["storage"]).name == "slow":
            d["config"]["batch_size"] = 16  # no in-place run is comparable any more
    col.runs = [TrainResult.from_dict(d) for d in docs]
    rows = [report.run_row(d, col.probes) for d in col.runs]
    (st,) = report.staging_rows(col, rows)
    assert st["break_even_epochs"] is None and "batch_size 16 vs 32" in st["refused"]
    (table,) = [t for t in report.build_tables(col, rows) if t.title == "Staging cost"]
    assert "not computed: runs not comparable: batch_size 16 vs 32" in table.rows[0][10]


def _browser() -> str | None:
    """A headless Chromium from the system's packages (scripts/install-system-deps.sh)."""
    import shutil

    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    for path in ("/usr/lib/chromium/chromium-headless-shell", "/usr/lib/chromium/chromium"):
        if Path(path).exists():
            return path
    return None


def test_html_report_in_a_real_browser(results_dir, tmp_path):
    """Opened by a headless Chromium: every image decodes to a picture, the page logs no
    console error. The check runs in a copy of the page with a probe script appended (the
    report itself carries no script)."""
    import subprocess

    browser = _browser()
    if browser is None:
        pytest.skip("no headless Chromium installed (scripts/install-system-deps.sh "
                    "installs chromium-headless-shell where apt is available)")
    out = tmp_path / "report.html"
    assert cli("report", results_dir, "--out", out) == 0
    probe = ("<script>window.addEventListener('load', () => {"
             "const imgs = [...document.images];"
             "const ok = imgs.filter(i => i.complete && i.naturalWidth > 100).length;"
             "document.body.setAttribute('data-images', imgs.length + '/' + ok);});</script>")
    page = tmp_path / "probe.html"
    page.write_text(out.read_text() + probe)
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                        "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'data-images="(\d+)/(\d+)"', r.stdout)
    assert m, r.stdout[-2000:]
    assert m.group(1) == m.group(2) == "4", m.group(0)  # all four pictures decoded
    console = [line for line in r.stderr.splitlines() if "CONSOLE" in line]
    assert not [c for c in console if "error" in c.lower() or "Uncaught" in c], console


def test_report_shows_each_multi_node_runs_spread_over_its_nodes(results_dir, tmp_path):
    """A run's per-node figures (v3 `epochs[i].per_node`) become one row of min / median /
    max with the nodes that hold the extremes; single-node runs get no row."""
    col = report.load_directory(results_dir)
    doc = col.runs[0].to_dict()
    doc["run_id"] += "-nodes"
    for ep in doc["epochs"]:
        # three nodes of 100 samples (30 MB) each: 2, 4 and 5 s of wall, n3 stalls most
        ep["per_node"] = [
            {"node": i, "name": f"n{i + 1}", "host": "h", "ranks": [i], "samples": 100,
             "batch_bytes": 30_000_000, "wall_s": w, "stall_s": s, "stall_s_mean": s,
             "stall_fraction": s / w, "samples_per_s": 100 / w, "read_MBps": 30 / w,
             "os_read_bytes": None, "cache_resident_fraction_at_start": 0.0, "cache": None}
            for i, (w, s) in enumerate([(2.0, 0.5), (4.0, 1.0), (5.0, 3.0)])]
    out_dir = tmp_path / "res"
    out_dir.mkdir()
    results.write_result(results.validate(doc), out_dir)
    results.write_result(col.runs[1].to_dict(), out_dir)
    out = tmp_path / "report.md"
    assert cli("report", out_dir, "--out", out) == 0
    text = out.read_text()
    assert "Per-node spread (multi-node runs)" in text
    (row,) = [ln for ln in text.splitlines() if doc["run_id"] in ln and "(n1)" in ln]
    cells = [c.strip() for c in row.strip("|").split("|")]
    epochs = len(doc["epochs"])
    # summed over the epochs: samples/s 100/5 (n3) / 100/4 / 100/2 (n1); stall 0.5 (n1) ..
    assert cells[3:13] == ["3", "20 (n3)", "25", "50 (n1)", "6.0 (n3)", "7.5", "15.0 (n1)",
                           f"{0.5 * epochs:.2f} (n1)", f"{1.0 * epochs:.2f}",
                           f"{3.0 * epochs:.2f} (n3)"], cells
    table = text.split("Per-node spread")[1].split("\n\n")[1]
    assert doc["run_id"] in table and col.runs[1].run_id not in table
