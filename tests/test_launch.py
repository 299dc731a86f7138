"""The one launcher of child processes (iobench.core.launch): argv from a config, immune to the
working directory, the outcome from the exit status; `sweep` and `search` run from a folder
that holds an `iobench/` directory (a data root such as /lustre/$USER/iobench)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import VENV_BIN, cli, mpiexec_path
from iobench import __version__
from iobench.core.errors import ConfigError
from iobench.core.launch import TIMED_OUT, Command, python_argv, require_launcher, run

needs_mpi = pytest.mark.skipif(mpiexec_path() is None, reason="mpiexec not found (mpich extra)")


def data_root_folder(tmp_path: Path) -> Path:
    """A working directory holding `iobench/` as a data root does (no Python in it)."""
    work = tmp_path / "lustre-user"
    (work / "iobench" / "cifar10-hdf5").mkdir(parents=True)
    return work


def checkout_folder(tmp_path: Path) -> Path:
    """A working directory holding another `iobench` package that must never run."""
    work = tmp_path / "checkout"
    (work / "iobench").mkdir(parents=True)
    (work / "iobench" / "__init__.py").write_text("raise SystemExit('the decoy iobench ran')\n")
    return work


@pytest.mark.parametrize("folder", [data_root_folder, checkout_folder])
@pytest.mark.parametrize("dash_p", [True, False], ids=["-P", "py3.10"])
def test_the_child_python_imports_the_installed_iobench(tmp_path: Path, folder,
                                                        dash_p: bool) -> None:
    """Both forms (-P on 3.11+, the -c program 3.10 gets) run this iobench from such a
    folder; plain `python -m iobench` runs the decoy package instead."""
    if dash_p and sys.version_info < (3, 11):
        pytest.skip("python -P needs Python 3.11")
    cwd = folder(tmp_path)
    r = subprocess.run([*python_argv("iobench", dash_p), "--version"], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and __version__ in r.stdout + r.stderr, r.stderr
    if folder is checkout_folder:
        bad = subprocess.run([sys.executable, "-m", "iobench", "--version"], cwd=cwd,
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "decoy" in bad.stderr


def test_a_command_is_arguments_under_its_launcher(tmp_path: Path) -> None:
    plain = Command("train", ("--epochs", "1"))
    assert plain.argv() == [*python_argv(), "train", "--epochs", "1"]
    spread = Command("train", (), ("env", "N={ranks}", "PER_HOST={per_host}"), 8, 4)
    assert spread.argv()[1:3] == ["N=8", "PER_HOST=2"] and spread.argv()[0].endswith("env")
    with pytest.raises(ValueError, match="6 ranks do not spread evenly over 4 hosts"):
        Command("train", (), ("env",), 6, 4)
    with pytest.raises(ConfigError, match="'no-such-mpiexec' is not an executable on PATH"):
        require_launcher(("no-such-mpiexec", "-n", "{ranks}"))


def test_the_outcome_is_the_exit_status_never_the_text(tmp_path: Path) -> None:
    """A child that prints an iobench error line but exits 0 succeeded; one that exits 3
    silently failed; the last line is only shown."""
    said = run([sys.executable, "-c", "print('iobench: error: not really')"], tmp_path / "a.log",
               60)
    assert said.ok and said.code == 0
    silent = run([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "b.log", 60)
    assert not silent.ok and silent.code == 3 and silent.why().startswith("exit 3: ")
    assert (tmp_path / "b.log").read_text().startswith("$ ")  # the command, then its output


def test_a_timeout_ends_the_whole_process_group(tmp_path: Path) -> None:
    """At the limit the child and what it started (ranks, loader workers) are killed."""
    pidfile = tmp_path / "grandchild.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    end = run(["bash", "-c", script], tmp_path / "t.log", 2)
    assert end.code == TIMED_OUT and end.timed_out and "timed out after 2 s" in end.why()
    pid = int(pidfile.read_text())
    for _ in range(300):  # SIGKILL is delivered asynchronously: let it land
        if not _runs(pid, b"sleep"):
            break
        time.sleep(0.1)
    assert not _runs(pid, b"sleep"), f"the grandchild {pid} still runs"


def _runs(pid: int, name: bytes) -> bool:
    """Whether process `pid` runs `name` (not gone, not a zombie, not a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and cmdline.startswith(name)


def _tiny_sweep(tmp_path: Path, storage: Path) -> Path:
    p = tmp_path / "tiny.yaml"
    p.write_text(f"""
results: {tmp_path}/results
report: report.md
datasets: [{{name: cifar10, samples: 96}}]
formats: [hdf5]
tiers: [{{name: root, path: {storage}, generate: false}}]
workers: [0]
batch_size: [32]
epochs: 1
max_steps: 1
compute_time: 0.001
run_timeout: 300
""")
    return p


def test_sweep_runs_from_a_folder_holding_iobench(tmp_path: Path) -> None:
    """The sweep's data root is ./iobench (as /lustre/$USER/iobench would be), and the
    sweep runs from the folder above it: every child still imports the installed iobench."""
    from test_sweep import make_hdf5_dataset

    work = data_root_folder(tmp_path)
    storage = work / "iobench" / "tier"
    make_hdf5_dataset(storage)
    r = subprocess.run([str(VENV_BIN / "iobench"), "sweep", str(_tiny_sweep(tmp_path, storage))],
                       cwd=work, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("sweep-*.json")]
    assert rec["counts"] == {"done": 1, "skipped": 0, "failed": 0}, rec["runs"]


@needs_mpi
def test_search_runs_from_a_folder_holding_iobench(tmp_path: Path) -> None:
    work = data_root_folder(tmp_path)
    storage = work / "iobench"
    assert cli("generate", "--workload", "cosmoflow", "--accelerator", "h100", "--samples", "24",
               "--storage", storage) == 0
    r = subprocess.run([str(VENV_BIN / "iobench"), "search", "--workload", "cosmoflow",
                        "--accelerator", "h100", "--storage", "iobench", "--results",
                        str(tmp_path / "res"), "--max-accelerators", "1", "--au-threshold",
                        "0.01"], cwd=work, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    (path,) = (tmp_path / "res").glob("search-*.json")
    doc = json.loads(path.read_text())
    assert (doc["status"], doc["max_accelerators"]) == ("complete", 1)
