"""The README's main job runs as printed, with only its paths replaced (a newcomer's path)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import VENV_BIN

README = Path(__file__).parent.parent / "README.md"


def main_job() -> list[str]:
    text = README.read_text()
    block = text.split("Then, with your parallel filesystem", 1)[1]
    body = re.search(r"```sh\n(.*?)```", block, re.S)
    assert body, "README: the main-job block is missing"
    return [line for line in body.group(1).splitlines() if line.strip()]


@pytest.mark.slow
def test_readme_main_job_runs_as_printed(tmp_path: Path) -> None:
    lines = main_job()
    assert lines[0].startswith("iobench generate") and lines[-1].startswith("iobench compare")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    out = ""
    for line in lines:
        cmd = line.replace("/lustre/$USER/iob", str(tmp_path / "pfs")).replace(
            "/tmp/nvme", str(tmp_path / "nvme"))
        r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, (cmd, r.stderr[-2000:])
        out = r.stdout
    flat = " ".join(out.split())
    assert "run 2:" in flat and ("pays for itself" in flat or "never pays" in flat), flat[-800:]
    assert (tmp_path / "stall.png").stat().st_size > 0


def parallel_lines() -> dict[str, str]:
    """The README's launch lines of "Running in parallel", by launcher."""
    block = README.read_text().split("## Running in parallel", 1)[1]
    body = re.search(r"```sh\n(.*?)```", block, re.S)
    assert body, "README: the parallel block is missing"
    return {line.split()[0]: line for line in body.group(1).splitlines() if line.strip()}


def _from_a_data_root(tmp_path: Path, line: str) -> subprocess.CompletedProcess[str]:
    """Run a README line from a folder holding `iobench/` (as /lustre/$USER/iobench would)."""
    work = tmp_path / "home"
    (work / "iobench" / "cifar10-hdf5").mkdir(parents=True)
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.dali
def test_readme_torchrun_line_runs_from_a_folder_holding_iobench(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    from conftest import cli

    if not (VENV_BIN / "torchrun").exists():
        pytest.skip("torchrun not installed")
    import torch

    if 0 < torch.cuda.device_count() < 2:  # two ranks need two GPUs, or the CPU
        pytest.skip("2 ranks on a node with 1 GPU: train refuses more ranks than GPUs")
    line = parallel_lines()["torchrun"]
    assert "-m iobench" not in line  # python -m would import ./iobench first
    storage = tmp_path / "nvme"
    assert cli("generate", "--dataset", "cifar10", "--samples", "128", "--storage", storage) == 0
    cmd = (line.replace("--nproc-per-node 4", "--nproc-per-node 2")
           .replace("/tmp/nvme", str(storage))
           + " --epochs 1 --max-steps 2 --batch-size 16 --workers 1 --compute-time 0.001"
           f" --results {tmp_path / 'res'}")
    r = _from_a_data_root(tmp_path, cmd)
    assert r.returncode == 0, (cmd, r.stderr[-3000:])
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "res").glob("*.json")]
    assert doc["world"]["launcher"] == "torchrun" and doc["world"]["size"] == 2


@pytest.mark.mpi
def test_readme_mpiexec_line_runs_from_a_folder_holding_iobench(tmp_path: Path) -> None:
    if not (VENV_BIN / "mpiexec").exists():
        pytest.skip("mpiexec not found (mpich extra)")
    line = parallel_lines()["mpiexec"]
    cmd = (line.replace("-n 8", "-n 2").replace("/lustre/$USER/iob", str(tmp_path / "pfs"))
           + " --samples 4")
    r = _from_a_data_root(tmp_path, cmd)
    assert r.returncode == 0, (cmd, r.stderr[-3000:])
    assert (tmp_path / "pfs" / "cosmoflow-hdf5" / "iobench.json").is_file()
