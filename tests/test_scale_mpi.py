"""Under `mpiexec -n 2`: samples that do not divide by the ranks never hang a job, and MPI
never starts inside a loader's worker processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import mpiexec_path, run_mpi
from iobench.core.manifest import Manifest

pytestmark = pytest.mark.mpi

ODD = 43  # samples: 2 ranks read 21 each per epoch, and one sample waits for the next
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> Manifest:
    from iobench.workflows.generate import GenerateConfig, generate_dataset

    return generate_dataset(GenerateConfig(dataset="cifar10", format="files",
                                           storage=tmp_path_factory.mktemp("odd"),
                                           samples=ODD, samples_per_file=1, seed=5))


@pytest.mark.parametrize("shuffle", ["global", "block", "none"])
def test_odd_samples_each_read_at_most_once_per_epoch_equal_steps(odd, shuffle):
    """docs/cluster.md, iobench.core.sampling: every rank reads N // world samples per epoch
    (equal steps, so no collective waits for a rank that has run out); the N mod world
    left over are the only ones skipped, and they change from epoch to epoch."""
    r = run_mpi(2, odd.root, "files", "--shuffle", shuffle, "--workers", 2, "--epochs", 3,
                "--batch-size", 5, module="iobench.loaders._coverage", timeout=240)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["num_samples"] == ODD
    skipped = []
    for (a, b), steps in zip(doc["epochs"], doc["steps"], strict=True):
        assert len(a) == len(b) == ODD // 2
        assert steps == [5, 5]  # ceil(21 / 5) on both ranks
        seen = a + b
        assert len(set(seen)) == len(seen) == ODD - 1  # none twice, one left over
        skipped.append(set(range(ODD)) - set(seen))
    if shuffle != "none":
        assert len({min(s) for s in skipped}) > 1  # not the same sample every epoch


@pytest.mark.parametrize("mode", ["replicate", "shard"])
def test_odd_samples_stage_and_train_finish_on_two_ranks(odd, tmp_path, mode):
    """`train --stage-to` with 43 one-sample files (44 with the labels): the stage copies
    each file once, and training reads 21 samples per rank each epoch (shard mode: the
    ranks own 22 and 21 files, and both read the smaller count) without hanging."""
    r = run_mpi(2, "train", "--loader", "files", "--storage", odd.root.parent,
                "--stage-to", tmp_path / "fast", "--stage-mode", mode, "--epochs", 2,
                "--batch-size", 5, "--workers", 2, "--compute-time", 0.001,
                "--results", tmp_path / "res", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (path,) = (tmp_path / "res").glob("*.json")
    doc = json.loads(path.read_text())
    st = doc["staging"]
    assert st["copied_files"] == len(odd.files) == ODD + 1  # each file once (one node)
    assert st["stage_bytes"] == odd.total_bytes
    assert [n["copied_bytes"] for n in st["per_node"]] == [odd.total_bytes]
    for ep in doc["epochs"]:
        assert ep["summary"]["samples"] == 2 * (ODD // 2)
        assert [r["samples"] for r in ep["ranks"]] == [ODD // 2, ODD // 2]
        assert [r["steps"] for r in ep["ranks"]] == [5, 5]
    staged = Manifest.load(tmp_path / "fast" / "cifar10-files")
    assert staged.files == odd.files


def test_loader_workers_never_start_mpi(odd, tmp_path):
    """Each rank has MPI up (mpi4py imported and initialised); its loader's worker
    processes, forked by iobench's DataLoader or spawned, import no mpi4py of their own
    (a spawned worker holds none at all), so none can initialise MPI, whose launcher
    environment (PMI_*) they inherit."""
    import subprocess

    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (install the `mpich` extra)")
    out = tmp_path / "probe"
    out.mkdir()
    r = subprocess.run([exe, "-n", "2", sys.executable, str(TESTS / "mpi_worker_probe.py"),
                        str(odd.root), str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["counts"] == [[21, 21], [21, 21]]
    docs = [json.loads(p.read_text()) for p in out.glob("*.json")]
    for context in ("fork", "spawn"):
        mine = [d for d in docs if d["context"] == context]
        assert {d["rank"] for d in mine} == {0, 1}
        assert len({d["pid"] for d in mine}) >= 2  # worker processes, not the ranks
        for d in mine:
            assert d["environ_pmi"], d  # the launcher's environment did reach the worker
            assert d["imported_here"] == [], d
            if context == "spawn":
                assert d["mpi4py"] == [], d


WAITER = """
import json, pathlib, sys, time
from iobench.core.world import get_world
w = get_world()
t0 = time.process_time()
if w.rank == 0:
    time.sleep(1.5)
got = w.allgather(w.rank)
out = pathlib.Path(sys.argv[1]) / f"rank-{w.rank}.json"
out.write_text(json.dumps({"got": got, "cpu_s": time.process_time() - t0}))
"""


def test_a_rank_waiting_in_a_collective_sleeps_rather_than_spins(tmp_path: Path) -> None:
    """MPICH's blocking collectives poll at a full core: a rank waiting 1.5 s in allgather
    for a slower one used 1.5 CPU-s, taken from the copy threads, loader workers or tier
    daemons sharing its host. iobench's collectives wait in a nonblocking barrier with
    sleeps (`core.world.wait_politely`), and still gather every rank's value."""
    import subprocess

    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (install the `mpich` extra)")
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    r = subprocess.run([exe, "-n", "2", sys.executable, str(script), str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    docs = {i: json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in (0, 1)}
    assert docs[0]["got"] == docs[1]["got"] == [0, 1]
    assert docs[1]["cpu_s"] < 0.5  # spinning would be about 1.5


GEN_WAITER = """
import json, pathlib, sys, time
from iobench.core.world import get_world
from iobench.workflows import generate
w = get_world()
slow = int(sys.argv[2])  # the rank whose task takes 1.5 s (asleep: no CPU of its own)

def task(writer, root, t):
    if t == slow:
        time.sleep(1.5)
    return (t, 1, 10, False)

generate._run_task = task
t0 = time.process_time()
done, err = generate._run_mpi(None, pathlib.Path(sys.argv[1]), [0, 1], w, None, 20)
out = pathlib.Path(sys.argv[1]) / f"gen-{slow}-{w.rank}.json"
out.write_text(json.dumps({"done": sorted(d[0] for d in done), "err": err is not None,
                           "cpu_s": time.process_time() - t0}))
"""


@pytest.mark.parametrize("slow", [0, 1])
def test_generate_ranks_waiting_for_the_others_sleep_rather_than_spin(tmp_path: Path,
                                                                      slow: int) -> None:
    """`generate` under MPI: rank 0 gathers the others' finished tasks, then broadcasts the
    outcome. A rank done first waits 1.5 s for the other (rank 1 in the broadcast, rank 0
    for the last messages) asleep, not in MPICH's polling, and rank 0 still has every task."""
    import subprocess

    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (install the `mpich` extra)")
    script = tmp_path / "gen_waiter.py"
    script.write_text(GEN_WAITER)
    r = subprocess.run([exe, "-n", "2", sys.executable, str(script), str(tmp_path), str(slow)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    docs = {i: json.loads((tmp_path / f"gen-{slow}-{i}.json").read_text()) for i in (0, 1)}
    assert docs[0]["done"] == [0, 1] and not docs[0]["err"] and not docs[1]["err"]
    assert docs[1 - slow]["cpu_s"] < 0.5, docs  # spinning would be about 1.5
