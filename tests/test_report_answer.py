"""`iobench report` leads with the answer: each run's verdict, which tier keeps up, the staging
break-even and what to do; runs told apart by tier label or path; results found in
sub-directories; an AU chart that averages only alike runs; the page in a real browser."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report import _browser, make_npy_dataset, results_dir  # noqa: F401 (a fixture)

from conftest import cli
from iobench.core import results
from iobench.core.errors import ConfigError
from iobench.core.result_types import TrainResult
from iobench.workflows import report, report_plots
from iobench.workflows.train import TrainConfig
from iobench.workflows.verdict import judge


def _sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, re.M)


def test_report_opens_with_each_runs_verdict_and_the_answer(results_dir, tmp_path):  # noqa: F811
    out = tmp_path / "r.md"
    assert cli("report", results_dir, "--out", out) == 0
    text = out.read_text()
    assert _sections(text)[:3] == ["The answer", "Verdict per run", "Environment"]
    answer = text.split("## Verdict per run")[0]
    # which tier keeps up: both tiers, each with its runs' verdict and AU
    assert re.search(r"  - nvme: .*\(2 runs\)|  - nvme: .* of 2 runs", answer), answer
    assert re.search(r"  - pfs: .*(\(2 runs\)| of 2 runs).*, AU 0\.\d\d", answer), answer
    # the staging break-even of each configuration, from the tier staged to the other
    be = re.findall(r"  - pfs -> nvme \(hdf5, (\d) workers, batch 32, shuffle global\): (.+)",
                    answer)
    assert sorted(w for w, _ in be) == ["0", "1"], answer
    assert all(re.match(r"pays for itself after [\d.]+ epochs|not significant|never", t)
               for _, t in be), be
    assert "- **What to do**" in answer
    # one verdict per run, in the run's own words
    col = report.load_directory(results_dir)
    table = text.split("## Verdict per run")[1].split("\n## ")[0]
    lines = [ln for ln in table.splitlines() if ln.startswith("| cifar10: ")]
    assert len(lines) == len(col.runs) == 4
    for run in col.runs:  # the fixture's runs carry none: the report judges them
        v = run.summary.verdict or judge(run)
        assert any(report.verdict_words(v) in ln and v.advice[0] in ln for ln in lines), v.line


def test_html_report_opens_with_the_answer(results_dir, tmp_path):  # noqa: F811
    out = tmp_path / "r.html"
    assert cli("report", results_dir, "--out", out) == 0
    text = out.read_text()
    heads = re.findall(r"<h2>([^<]+)</h2>", text)
    assert heads[:3] == ["The answer", "Verdict per run", "Environment"]
    assert text.index("id='answer'") < text.index("<table>")
    for needle in ("Which tier keeps up", "Staging break-even", "What to do", "pfs -&gt; nvme"):
        assert needle in text.split("<h2>Environment</h2>")[0], needle


def _retier(doc: dict, storage: Path, run_id: str) -> dict:
    """`doc` as if read from `storage` (another directory of the same filesystem)."""
    d = copy.deepcopy(doc)
    d["run_id"] = run_id
    root = str(storage / Path(d["dataset"]["root"]).name)
    d["dataset"]["root"] = root
    d["config"]["storage"] = str(storage)
    d["provenance"]["storage"]["path"] = root
    return d


def test_runs_on_two_unprobed_directories_are_told_apart_by_path(results_dir, tmp_path):  # noqa: F811
    """Without a probe, label or sweep name, two directories of one filesystem used to read
    the same (`local (ext4)`); each is now named with its place."""
    col = report.load_directory(results_dir)
    doc = col.runs[0].to_dict()
    res = tmp_path / "res"
    res.mkdir()
    a, b = _retier(doc, tmp_path / "a", doc["run_id"][:-1] + "a"), \
        _retier(doc, tmp_path / "b", doc["run_id"][:-1] + "b")
    for d in (a, b):
        results.write_result(results.validate(d), res)
    rows = [report.run_row(r, []) for r in report.load_directory(res).runs]
    report.tell_tiers_apart(rows)
    kind = f"{doc['provenance']['storage']['kind']} ({doc['provenance']['storage']['fstype']})"
    assert sorted(r["tier"] for r in rows) == [f"{kind} {tmp_path / 'a'}",
                                                f"{kind} {tmp_path / 'b'}"]
    out = tmp_path / "r.md"
    assert cli("report", res, "--out", out) == 0
    text = out.read_text()
    assert f"@ {kind} {tmp_path / 'a'}," in text and f"@ {kind} {tmp_path / 'b'}," in text
    # one place keeps its plain name
    rows = [report.run_row(r, []) for r in report.load_directory(res).runs][:1]
    report.tell_tiers_apart(rows)
    assert rows[0]["tier"] == kind


def test_train_tier_label_is_stored_and_names_the_tier(tmp_path):
    src, res = tmp_path / "data", tmp_path / "res"
    assert cli("generate", "--dataset", "cifar10", "--samples", "128", "--storage", src) == 0
    for label in ("scratch-a", None):
        assert cli("train", "--loader", "hdf5", "--storage", src, "--compute-time", "0.001",
                   "--epochs", "1", "--max-steps", "2", "--workers", "0", "--batch-size", "32",
                   "--results", res, *(["--tier", label] if label else [])) == 0
    docs = sorted((TrainResult.from_dict(json.loads(p.read_text()))
                   for p in res.glob("*.json")), key=lambda d: d.config.tier or "")
    assert [d.config.tier for d in docs] == [None, "scratch-a"]
    rows = [report.run_row(d, []) for d in docs]
    report.tell_tiers_apart(rows)
    assert rows[1]["tier"] == "scratch-a" and rows[0]["tier"] != "scratch-a"
    out = tmp_path / "r.md"
    assert cli("report", res, "--out", out) == 0
    assert "hdf5 @ scratch-a, w0 b32 global" in out.read_text()


@pytest.mark.parametrize("label", ["", "   ", "a\nb", "x" * 65])
def test_a_bad_tier_label_is_refused_by_name(label):
    with pytest.raises(ConfigError, match="--tier"):
        TrainConfig(loader="hdf5", storage="/nowhere", tier=label)


def test_report_finds_results_in_sub_directories(results_dir, tmp_path):  # noqa: F811
    """As `compare` does: a results folder with a sub-folder per tier or date."""
    res = tmp_path / "res"
    files = sorted(results_dir.glob("*.json"))
    for k, p in enumerate(files):
        sub = res / ("" if k % 3 == 0 else f"tier{k % 3}") / ("deep" if k % 2 else "")
        sub.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, sub / p.name)
    flat, deep = report.load_directory(results_dir), report.load_directory(res)
    assert sorted(r.run_id for r in deep.runs) == sorted(r.run_id for r in flat.runs)
    assert (len(deep.probes), len(deep.stages)) == (len(flat.probes), len(flat.stages))
    (damaged,) = [f for f, _ in deep.skipped]
    assert damaged.endswith("damaged.json") and (res / damaged).is_file()
    out = tmp_path / "r.md"
    assert cli("report", res, "--out", out) == 0
    assert "| pfs |" in out.read_text()


def _bars(fig) -> list[tuple[str, float]]:
    """(series label, height) of every bar of an AU figure."""
    ax = fig.axes[0]
    return [(c.get_label(), round(p.get_height(), 3)) for c in ax.containers for p in c]


def test_au_chart_never_averages_unlike_runs(results_dir):  # noqa: F811
    """A tier's bar was the mean of an emulated run at 0.74 and a `--model none` run at 0.00:
    now pure ingest (no accelerator) is left out and unlike runs get bars of their own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    col = report.load_directory(results_dir)
    rows = [report.run_row(r, col.probes) for r in col.runs]
    rows = [r for r in rows if r["tier"] == "pfs"]  # workers 0 and 1, both emulated
    for r, au in zip(rows, (0.74, 0.5), strict=True):
        r["tier"], r["spread"] = "files", {**r["spread"], "au": {"median": au, "min": au,
                                                                 "max": au, "n": 1}}
    ingest = copy.deepcopy(rows[0])
    ingest.update(compute="none", compute_words="ingest only")
    ingest["spread"]["au"] = {"median": 0.0, "min": 0.0, "max": 0.0, "n": 1}
    fig = report_plots.au_figure(plt, [*rows, ingest])
    bars = _bars(fig)
    plt.close(fig)
    assert sorted(h for _, h in bars) == [0.5, 0.74]  # never (0.74 + 0.5 + 0) / 3
    assert {lab for lab, _ in bars} == {"w0", "w1"}
    # alike runs (same configuration on the same tier) still share one bar
    twin = copy.deepcopy(rows[0])
    twin["spread"]["au"] = {"median": 0.7, "min": 0.7, "max": 0.7, "n": 1}
    fig = report_plots.au_figure(plt, [rows[0], twin])
    assert [h for _, h in _bars(fig)] == [0.72]
    plt.close(fig)
    assert report_plots.au_figure(plt, [ingest]) is None  # nothing to show


def test_report_page_in_a_real_browser_leads_with_the_answer(results_dir, tmp_path):  # noqa: F811
    """Headless Chromium lays the page out: the answer is the first thing on the first
    screen (1280 x 900), above the first table of figures; a screenshot is kept."""
    browser = _browser()
    if browser is None:
        pytest.skip("no headless Chromium installed (scripts/install-system-deps.sh)")
    out = tmp_path / "report.html"
    assert cli("report", results_dir, "--out", out) == 0
    probe = ("<script>window.addEventListener('load', () => {"
             "const a = document.getElementById('answer').getBoundingClientRect();"
             "const h = [...document.querySelectorAll('h2')].map(x => x.textContent);"
             "const env = document.querySelector('table').getBoundingClientRect();"
             "document.body.setAttribute('data-answer', [Math.round(a.top),"
             " Math.round(a.bottom), Math.round(env.top), h[0]].join('|'));});</script>")
    page = tmp_path / "probe.html"
    page.write_text(out.read_text() + probe)
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
            "--virtual-time-budget=5000"]
    r = subprocess.run([*args, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'data-answer="(\d+)\|(\d+)\|(\d+)\|([^"]+)"', r.stdout)
    assert m, r.stdout[-2000:]
    top, bottom, table_top, first = int(m[1]), int(m[2]), int(m[3]), m[4]
    assert first == "The answer" and top < 200 and bottom <= 900, m.group(0)
    assert table_top > bottom  # the verdict table follows the answer
    shot = tmp_path / "report.png"
    r = subprocess.run([*args, f"--screenshot={shot}", out.as_uri()], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and shot.read_bytes().startswith(b"\x89PNG"), r.stderr[-2000:]
    if os.environ.get("IOBENCH_REPORT_SCREENSHOT"):  # to look at it
        shutil.copy(shot, os.environ["IOBENCH_REPORT_SCREENSHOT"])
