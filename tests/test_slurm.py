"""A real Slurm in the suite: the job templates of scripts/slurm/, submitted unedited to the
one-box cluster of scripts/slurm/local-cluster.sh (two virtual nodes n1 and n2 on this host).

The cluster is brought up once for the module, or reused when it runs; it is brought down
again only if this module started it. Jobs run with `sbatch --wait` and `srun --mpi=pmi2`
(mpi4py with MPICH from PyPI); their datasets, results and node-local copies live in
`tmp_path`. The PBS and Flux templates cannot run here: they are checked for syntax.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "slurm" / "local-cluster.sh"
TEMPLATES = [*sorted((REPO / "scripts" / "slurm").glob("*.sbatch")),
             *sorted((REPO / "scripts" / "pbs").glob("*.pbs")),
             *sorted((REPO / "scripts" / "flux").glob("*.flux"))]
VENV = Path(sys.executable).parent.parent


def _script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, str]]:
    """The environment a Slurm client needs (SLURM_CONF), with IOBENCH_VENV set to this
    test's environment; skips with the script's reason where Slurm cannot run."""
    if not SCRIPT.is_file():
        pytest.skip(f"{SCRIPT} is missing")
    was_up = _script("status").returncode == 0
    r = _script("up")
    if r.returncode != 0:
        pytest.skip(f"one-box Slurm unavailable: {r.stderr.strip().splitlines()[-1:]}")
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith("export SLURM_CONF="), r.stdout
    env = {**os.environ, "SLURM_CONF": line.split("=", 1)[1], "OMP_NUM_THREADS": "1"}
    if (VENV / "bin" / "iobench").is_file():
        env["IOBENCH_VENV"] = str(VENV)
    try:
        yield env
    finally:
        if not was_up:
            _script("down")


def _sbatch(env: dict[str, str], template: str, *options: str,
            timeout: float = 300) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Submit scripts/slurm/TEMPLATE with `sbatch --wait`; its job id and the finished run."""
    r = subprocess.run(["sbatch", "--parsable", "--wait", *options,
                        str(REPO / "scripts" / "slurm" / template)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    job_id = r.stdout.strip().split(";")[0].splitlines()[0] if r.stdout.strip() else ""
    return job_id, r


def _job_output(cwd: Path, job_id: str) -> str:
    (out,) = cwd.glob(f"*-{job_id}.out")
    return out.read_text()


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_templates_parse_and_refuse_a_job_without_arguments(template: Path) -> None:
    assert subprocess.run(["bash", "-n", str(template)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "IOBENCH_ARGS"}
    r = subprocess.run(["bash", str(template)], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=30)
    assert r.returncode == 2
    assert "IOBENCH_ARGS is empty" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_two_node_job_generates_then_trains_from_both_tiers(slurm: dict[str, str],
                                                            tmp_path: Path) -> None:
    pfs, results, local = tmp_path / "pfs", tmp_path / "results", tmp_path / "local"
    local.mkdir()
    env = {**slurm, "TMPDIR": str(local)}
    gen_args = f"--dataset cifar10 --format hdf5 --storage {pfs} --samples 512"
    gen_id, r = _sbatch(env, "generate.sbatch", "-N", "2", "--ntasks-per-node", "1",
                        "-D", str(tmp_path), f"--export=ALL,IOBENCH_ARGS={gen_args}")
    assert r.returncode == 0, (r.stderr, _job_output(tmp_path, gen_id))
    assert "2 ranks" in _job_output(tmp_path, gen_id)
    assert (pfs / "cifar10-hdf5" / "iobench.json").is_file()

    env["IOBENCH_ARGS"] = (f"--loader hdf5 --storage {pfs} --model none --epochs 1 "
                           f"--workers 0 --batch-size 32 --results {results}")
    job_id, r = _sbatch(env, "stage-train.sbatch", "-N", "2", "--ntasks-per-node", "1",
                        "-D", str(tmp_path))
    out = _job_output(tmp_path, job_id)
    assert r.returncode == 0, (r.stderr, out)
    assert list(local.iterdir()) == []  # the job removed its node-local copies
    docs = sorted((json.loads(p.read_text()) for p in results.glob("*.json")),
                  key=lambda d: d["staging"] is not None)
    assert len(docs) == 2, out
    for doc in docs:
        job = doc["provenance"]["job"]
        assert job == {"scheduler": "slurm", "id": job_id, "name": "iobench-stage-train",
                       "nodelist": "n[1-2]", "nodes": 2, "tasks_per_node": 1,
                       "partition": "debug"}
        assert doc["world"]["nodes"] == ["n1", "n2"] and doc["world"]["num_nodes"] == 2
        (epoch,) = doc["epochs"]
        assert [r["node_name"] for r in epoch["ranks"]] == ["n1", "n2"]
        assert [n["name"] for n in epoch["cache"]["per_node"]] == ["n1", "n2"]
        assert epoch["cache"]["status"] == "cold", epoch["cache"]
        per_node = epoch["per_node"]
        assert [n["name"] for n in per_node] == ["n1", "n2"]
        for n in per_node:  # each node read its half, from a cold cache, and says how fast
            assert n["samples"] == 256 and n["samples_per_s"] > 0 and n["read_MBps"] > 0
            assert n["cache_resident_fraction_at_start"] <= 0.1 and n["cache"] is None
            assert 0 <= n["stall_s"] <= n["wall_s"]
    pfs_run, staged = docs
    assert pfs_run["dataset"]["root"] == str(pfs / "cifar10-hdf5")
    # tier 2 read each node's own copy ({node} in the default IOBENCH_LOCAL)
    assert staged["dataset"]["root"] == str(local / f"iobench-{job_id}" / "0" / "cifar10-hdf5")
    staging = staged["staging"]
    assert [n["name"] for n in staging["per_node"]] == ["n1", "n2"]
    assert all(n["copied_bytes"] == staging["dataset_bytes"] for n in staging["per_node"])
    assert staging["slowest_node"] in ("n1", "n2")
    assert [n["name"] for n in staging["source_cache"]["per_node"]] == ["n1", "n2"]
