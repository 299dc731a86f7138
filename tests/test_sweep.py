"""`iobench sweep`: a YAML matrix run end to end (probe, stage, train subprocesses, report)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import cli
from iobench.core.errors import ConfigError
from iobench.core.manifest import FileEntry, Manifest
from iobench.workflows.sweep import load_sweep, parse_sweep, plan_runs

ROOT = Path(__file__).resolve().parents[1]


def make_hdf5_dataset(storage: Path, n: int = 96, per_file: int = 48) -> Manifest:
    """A real cifar10 HDF5 dataset in the documented layout (samples, labels per file)."""
    import hashlib

    root = storage / "cifar10-hdf5"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for k, first in enumerate(range(0, n, per_file)):
        m = min(per_file, n - first)
        path = root / f"part-{k:05d}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("samples", data=rng.integers(0, 256, (m, 32, 32, 3), np.uint8))
            f.create_dataset("labels", data=rng.integers(0, 10, m).astype(np.int64))
        entries.append(FileEntry(path.name, path.stat().st_size,
                                 hashlib.sha256(path.read_bytes()).hexdigest(), first, m))
    man = Manifest(dataset="cifar10", format="hdf5", num_samples=n, num_classes=10,
                   sample={"kind": "array", "shape": [32, 32, 3], "dtype": "uint8"},
                   label={"shape": [], "dtype": "int64"},
                   layout={"samples_per_file": per_file, "compression": "none", "chunked": False},
                   files=tuple(entries), seed=0, iobench_version="test",
                   created="2026-01-01T00:00:00Z")
    man.write(root)
    return Manifest.load(root)


def _sweep_yaml(tmp_path: Path) -> Path:
    text = f"""
name: tiny
results: {tmp_path}/results
report: report.html
datasets:
  - name: cifar10
    samples: 96
formats: [hdf5]
loaders: [native]
tiers:
  - name: slow
    path: {tmp_path}/slow
    generate: false
    stage_to: {tmp_path}/fast
    stage_name: fast
  - name: missing
    path: {tmp_path}/missing
    generate: false
workers: [0, 1]
batch_size: [32]
shuffle: [global]
epochs: 1
max_steps: 2
compute_time: 0.001
probe: {{size: 4M, runtime: 0.1, readers: [1], metadata_files: 10, engine: python}}
run_timeout: 300
"""
    p = tmp_path / "tiny.yaml"
    p.write_text(text)
    return p


def test_sweep_end_to_end_skips_done_runs_and_records_failures(tmp_path, capsys):
    make_hdf5_dataset(tmp_path / "slow")
    sweep = _sweep_yaml(tmp_path)
    res = tmp_path / "results"
    code = cli("sweep", sweep)
    out = capsys.readouterr()
    assert code == 1, out  # the "missing" tier's runs failed, and the sweep said so
    assert "failed" in out.err
    (rec_path,) = res.glob("sweep-*.json")
    rec = json.loads(rec_path.read_text())
    assert rec["counts"] == {"done": 4, "skipped": 0, "failed": 2}, rec["runs"]
    failed = [r for r in rec["runs"] if r["status"] == "failed"]
    assert all("generate: false" in r["error"] for r in failed)
    steps = {r["step"] for r in rec["runs"] if r["status"] == "done"}
    assert steps == {"probe", "stage", "train"}
    trains = [json.loads(p.read_text()) for p in res.glob("*.json")
              if '"iobench.result"' in p.read_text()[:200]]
    assert len(trains) == 4
    assert sorted((Path(t["config"]["storage"]).name, t["config"]["workers"])
                  for t in trains) == [("fast", 0), ("fast", 1), ("slow", 0), ("slow", 1)]
    assert len(list(res.glob("probe-*.json"))) == 3  # slow, fast and the empty missing tier
    assert len(list(res.glob("stage-*.json"))) == 1
    html = (res / "report.html").read_text()
    for needle in ("Runs: cifar10", "Staging cost", "Failed sweep runs", "fast", "slow"):
        assert needle in html, needle
    assert html.index("The answer") < html.index("Runs: cifar10")
    # each staging's break-even, in the output and the record: single passes of one epoch
    # have no measured spread, so their numbers stand (significance unknown)
    bes = sorted((b for b in rec["break_evens"] if b["run"]), key=lambda b: b["run"])
    assert [(b["from"], b["to"], b["run"][:15]) for b in bes] == \
        [("slow", "fast", "hdf5, 0 workers"), ("slow", "fast", "hdf5, 1 workers")]
    assert all(b["significant"] is None and b["outcome"] in ("pays off", "never") for b in bes)
    assert all(f"[break-even] {b['text']}" in out.out for b in bes)

    # again: every finished run is found in the results and skipped, nothing restaged
    code = cli("sweep", sweep, "--report", str(tmp_path / "again.md"))
    assert code == 1
    rec2 = max((json.loads(p.read_text()) for p in res.glob("sweep-*.json")),
               key=lambda r: r["created"])
    assert rec2["counts"] == {"done": 0, "skipped": 4, "failed": 2}
    assert not [r for r in rec2["runs"] if r["step"] in ("probe", "stage")]
    assert len([p for p in res.glob("*.json") if '"iobench.result"' in p.read_text()[:200]]) == 4
    assert (tmp_path / "again.md").is_file()


def test_dry_run_lists_the_matrix(tmp_path, capsys):
    sweep = _sweep_yaml(tmp_path)
    assert cli("sweep", sweep, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "6 runs in the matrix" in out and out.count("  run  ") == 6
    assert not (tmp_path / "results").exists()


def test_matrix_pairs_loaders_with_formats():
    cfg = parse_sweep({"datasets": ["cifar10"], "formats": ["hdf5", "lmdb"],
                       "loaders": ["native", "dali", "hdf5"], "workers": [0, 2],
                       "tiers": [{"name": "a", "path": "/x", "stage_to": "/y"}]})
    runs = plan_runs(cfg)
    # hdf5: native (hdf5) + dali; lmdb: native + dali (the hdf5 loader cannot read lmdb)
    assert len(runs) == 2 * 2 * 2 * 2  # tiers a, a-staged x formats x loaders x workers
    assert {(r.format, r.loader) for r in runs} == {("hdf5", "hdf5"), ("hdf5", "dali"),
                                                      ("lmdb", "lmdb"), ("lmdb", "dali")}
    assert {r.tier for r in runs} == {"a", "a-staged"}


@pytest.mark.parametrize("doc, needle", [
    ({"datasets": ["cifar10"], "tiers": [{"name": "a", "path": "/x"}], "wokers": [1]},
     "unknown key(s) 'wokers'"),
    ({"datasets": ["cifar10"], "tiers": [{"name": "a", "path": "/x", "stage": "/y"}]},
     "tiers[0]: unknown key(s) 'stage'"),
    ({"datasets": [{"name": "cifar10", "sample": 5}], "tiers": [{"name": "a", "path": "/x"}]},
     "datasets[0]: unknown key(s) 'sample'"),
    ({"datasets": ["mnist"], "tiers": [{"name": "a", "path": "/x"}]}, "choose one of"),
    ({"datasets": ["cifar10"]}, "'tiers' is required"),
    ({"datasets": ["cifar10"], "tiers": [{"name": "a", "path": "/x"}], "workers": "two"},
     "workers: expected an integer >= 0 or a list, got 'two'"),
    ({"datasets": [{"name": []}], "tiers": [{"name": "a", "path": "/x"}]},
     "datasets[0].name: expected a string, got []"),
    ({"datasets": ["cifar10"], "tiers": [{"name": "a", "path": "/x", "generate": "yes"}]},
     "tiers[0].generate: expected true or false, got 'yes'"),
    ({"datasets": ["cifar10"], "tiers": [{"name": "a", "path": "/x"}], "loaders": ["torch"]},
     "loaders has 'torch'"),
    ({"datasets": ["cifar10"], "tiers": [{"name": "a", "path": "/x"}],
      "probe": {"size": "1G", "duration": 3}}, "probe: unknown key(s) 'duration'"),
    (["not", "a", "mapping"], "expected a mapping"),
])
def test_bad_sweep_files_are_rejected_by_name(doc, needle):
    with pytest.raises(ConfigError) as e:
        parse_sweep(doc, "s.yaml")
    assert needle in str(e.value)


def test_bad_yaml_is_one_line(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("datasets: [cifar10\ntiers: {")
    assert cli("sweep", p) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not valid YAML" in err[0]
    assert cli("sweep", tmp_path / "none.yaml") != 0
    assert "cannot read sweep file" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["laptop.yaml", "cluster.yaml"])
def test_shipped_sweeps_parse(name):
    cfg = load_sweep(ROOT / "scripts" / "sweeps" / name)
    assert plan_runs(cfg)


def test_sweep_mounts_an_emulated_pfs_tier_and_unmounts_it(tmp_path, capsys):
    from iobench.pfs import control

    problem = control.fuse_problem()
    if problem:
        pytest.skip(f"FUSE is not usable here: {problem}")
    backing, mnt = tmp_path / "backing", tmp_path / "pfs"
    make_hdf5_dataset(backing)
    sweep = tmp_path / "pfs.yaml"
    sweep.write_text(f"""
results: {tmp_path}/results
report: report.md
datasets: [{{name: cifar10, samples: 96}}]
tiers:
  - name: pfs
    path: {mnt}
    generate: false
    emulate_pfs: {{backing: {backing}, profile: passthrough}}
workers: [0]
batch_size: [32]
epochs: 1
max_steps: 1
compute_time: 0.001
""")
    code = cli("sweep", sweep)
    out = capsys.readouterr()
    if "emulated parallel filesystem not mounted" in out.out:
        pytest.skip("cannot mount the emulated parallel filesystem here")
    assert code == 0, out
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("*.json")
              if '"iobench.result"' in p.read_text()[:200]]
    assert doc["provenance"]["storage"]["kind"] == "fuse"  # it read through the mount
    assert control.mount_containing(mnt) is None  # unmounted at the end
    assert (tmp_path / "results" / "report.md").is_file()


def test_the_launcher_is_arguments_never_a_shell(tmp_path):
    """A sweep file is code: its launcher runs as given, without a shell, and must exist."""
    from iobench.workflows.sweep import _iobench_cmd, run_sweep

    base = {"datasets": ["cifar10"], "tiers": [{"name": "a", "path": str(tmp_path)}],
            "results": str(tmp_path / "r")}
    cfg = parse_sweep({**base, "launcher": "srun -n {ranks}; rm -rf /", "ranks": 2}, "s.yaml")
    cmd = _iobench_cmd(cfg, ["train"], 2)
    assert cmd[1:5] == ["-n", "2;", "rm", "-rf"]  # plain arguments: no shell reads the ';'
    assert cmd[0].endswith("srun")
    listed = parse_sweep({**base, "launcher": ["mpiexec", "-n", "{ranks}"], "ranks": 2}, "s")
    assert _iobench_cmd(listed, ["train"], 2)[1:3] == ["-n", "2"]
    missing = parse_sweep({**base, "launcher": ["no-such-launcher", "{ranks}"], "ranks": 2}, "s")
    with pytest.raises(ConfigError, match="'no-such-launcher' is not an executable on PATH"):
        run_sweep(missing, write_report=False, log=lambda s: None)
    assert not (tmp_path / "r").exists()  # refused before anything ran
