"""Interrupted and stuck jobs under `mpiexec -n 2`: every rank stops, nothing looks complete.

SIGINT and SIGTERM (Ctrl-C, `scancel`, a time limit), sent to mpiexec alone or
to the whole process group, end every rank within seconds with 130 or 143 and
a result marked `interrupted` holding the epochs that completed. A frozen rank
(SIGSTOP: a node whose filesystem hangs) is found by the watchdog, which ends
the job naming it and leaves a result marked `incomplete`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli, mpiexec_path

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("sig")
    assert cli("generate", "--dataset", "cifar10", "--samples", "4096", "--storage", s) == 0
    return s


def _start(storage: Path, results: Path, *extra: str, fault: str = "") -> subprocess.Popen:
    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (install the `mpich` extra)")
    # -print-all-exitcodes: hydra prints each rank's own wait status (`_rank_codes`)
    argv = [exe, "-print-all-exitcodes", "-n", "2", sys.executable, "-m", "iobench", "train",
            "--loader", "hdf5", "--storage", str(storage), "--compute-time", "0.02", "--epochs", "20",
            "--workers", "1", "--batch-size", "64", "--results", str(results), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                                 **({"IOBENCH_TEST_FAULT": fault} if fault else {})})


def _wait_for_epoch(proc: subprocess.Popen, timeout: float = 120) -> str:
    """Read rank 0's output until an epoch completed; return what was read."""
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        if line.startswith("epoch 1/"):
            return "".join(out)
    proc.kill()
    pytest.fail("no epoch completed:\n" + "".join(out) + proc.stderr.read())


def _job_processes(root: int) -> list[str]:
    """`pid state cmdline` of every process descended from `root` (a hang's suspects)."""
    rows = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if _descends(int(name), root):
            rows.append(f"{name} {stat[stat.rindex(')') + 2]} {cmd.decode(errors='replace')[:120]}")
    return rows


def _finish(proc: subprocess.Popen, within: float) -> tuple[int, str, str, float]:
    """The job's exit status, stdout, stderr, and how long it took to end."""
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        alive = _job_processes(proc.pid)  # who was still there, for the message
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job was still running {within} s after the signal; its processes "
                    f"then: {alive}\nstdout: {out[-1500:]}\nstderr: {err[-3000:]}")
    return proc.returncode, out, err, time.monotonic() - t0


def _rank_codes(out: str) -> list[int]:
    """Each rank's exit code, from hydra's `Exit codes: [host] S,S` (wait statuses). When a
    rank leaves without MPI_Finalize, hydra SIGKILLs the others and reports each as killed
    (mpiexec then exits 9) or, reaped after its output closed, as exit 0 (mpiexec exits
    130): either fails here."""
    m = re.search(r"Exit codes: \[[^]]*\] ([\d,]+)", out)
    assert m, out[-2000:]
    statuses = [int(s) for s in m.group(1).split(",")]
    killed = [(r, s & 0x7F) for r, s in enumerate(statuses) if s & 0x7F]
    assert not killed, f"(rank, signal) killed: {killed}"
    return [s >> 8 for s in statuses]


def _results(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("target", ["mpiexec", "group"])
def test_a_signal_mid_run_stops_every_rank_and_marks_the_result(storage, tmp_path, sig, code,
                                                                 target) -> None:
    proc = _start(storage, tmp_path / "r")
    _wait_for_epoch(proc)
    if target == "group":  # what a terminal's Ctrl-C does
        os.killpg(proc.pid, sig)
    else:  # `kill -INT <mpiexec>`, a workflow manager
        proc.send_signal(sig)
    rc, out, err, _ = _finish(proc, 30)
    assert rc == code, (rc, err[-2000:])
    assert _rank_codes(out) == [code, code]  # each rank stopped by itself
    assert "Traceback" not in err, err[-3000:]
    (doc,) = _results(tmp_path / "r")
    assert doc["status"] == "interrupted" and 1 <= len(doc["epochs"]) < 20
    assert doc["warnings"][0].startswith("INTERRUPTED")


# The test faults (IOBENCH_TEST_FAULT): rank 0 signals mpiexec, as a Ctrl-C or a workflow
# manager does, right after an epoch's figures are recorded, when rank 1 may already wait
# in the next epoch's first collective; or signals itself during the final write.
@pytest.mark.parametrize("fault, epochs, code", [
    ("rank=0,epoch=1,step=-1,action=sigint", 2, 130),   # between epochs 2 and 3
    ("rank=0,epoch=0,step=-1,action=sigterm", 1, 143),  # between epochs 1 and 2
    ("rank=0,action=sigint-write", 2, 130),             # while the result is written
])
def test_a_signal_between_epochs_or_while_writing(storage, tmp_path, fault, epochs,
                                                  code) -> None:
    """An interrupt at an exact point of the run, under mpiexec -n 2: every rank stops by
    itself with 130/143 (none is killed), and the one result written says interrupted and
    holds the epochs that completed."""
    extra = ("--epochs", "2", "--max-steps", "8") if "write" in fault else ("--max-steps", "8")
    proc = _start(storage, tmp_path / "r", *extra, fault=fault)
    rc, out, err, _ = _finish(proc, 120)
    assert rc == code, (rc, err[-2000:])
    # the write: rank 1 had finished (0); between epochs, both ranks stop
    assert _rank_codes(out) == ([code, 0] if "write" in fault else [code, code])
    assert "Traceback" not in err, err[-3000:]
    (doc,) = _results(tmp_path / "r")
    assert doc["status"] == "interrupted" and len(doc["epochs"]) == epochs, doc["status"]
    assert doc["warnings"][0].startswith("INTERRUPTED")


# start-up: while the parser imports torch (one rank could leave alone there and its peer
# wait for it at the rendezvous: a hang), at the rendezvous, while loader workers start
@pytest.mark.parametrize("sig, after_s", [(signal.SIGINT, 1.0), (signal.SIGINT, 2.5),
                                          (signal.SIGINT, 3.0), (signal.SIGTERM, 3.0)])
def test_a_signal_at_start_up_ends_cleanly(storage, tmp_path, sig, after_s) -> None:
    proc = _start(storage, tmp_path / "r")
    time.sleep(after_s)
    os.killpg(proc.pid, sig)
    rc, _, err, _ = _finish(proc, 30)
    assert rc != 0 and "Traceback" not in err, (rc, err[-3000:])
    assert all(d["status"] != "complete" for d in _results(tmp_path / "r"))


@pytest.mark.parametrize("rank", [0, 1])
def test_one_rank_interrupted_before_the_ranks_meet_stops_them_all(storage, tmp_path,
                                                                   rank) -> None:
    """SIGINT reaches one rank alone while it starts (its parser imports torch) and its peer
    goes on to the rendezvous: that rank must not leave alone (its peer would wait for it
    there); both stop together at their first collective, 130 each, one line."""
    proc = _start(storage, tmp_path / "r", fault=f"rank={rank},action=sigint-start")
    rc, out, err, _ = _finish(proc, 60)
    assert rc == 130, (rc, err[-2000:])
    assert _rank_codes(out) == [130, 130]
    assert "Traceback" not in err, err[-3000:]
    assert err.count("iobench: interrupted (SIGINT)") == 1, err[-2000:]
    assert not _results(tmp_path / "r")


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return False


def _rank_pid(proc: subprocess.Popen, rank: int, timeout: float = 60) -> int:
    """The pid of the python process that is `rank` of the job `proc` started (MPICH's
    launcher starts each rank in a session of its own: found by ancestry)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"PMI_RANK=%d" % rank in env and b"iobench" in cmd \
                    and b"multiprocessing" not in cmd and _descends(int(name), proc.pid):
                return int(name)
        time.sleep(0.2)
    pytest.fail(f"rank {rank} not found")


def test_a_frozen_rank_ends_the_job_naming_it(storage, tmp_path) -> None:
    proc = _start(storage, tmp_path / "r", "--timeout", "10")
    _wait_for_epoch(proc)
    victim = _rank_pid(proc, 1)
    os.kill(victim, signal.SIGSTOP)
    try:
        rc, _, err, _ = _finish(proc, 60)
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    assert rc != 0
    assert "stopped making progress: rank 1" in err, err[-2000:]
    assert "Traceback" not in err
    (doc,) = _results(tmp_path / "r")
    assert doc["status"] == "incomplete" and "rank 1" in doc["status_reason"]
    assert len(doc["epochs"]) >= 1


def test_compare_marks_and_report_leaves_out_an_interrupted_run(storage, tmp_path) -> None:
    """Never averaged with complete runs: compare says so on the run, report leaves it out."""
    proc = _start(storage, tmp_path / "r")
    _wait_for_epoch(proc)
    proc.send_signal(signal.SIGINT)
    _finish(proc, 30)
    assert cli("train", "--loader", "hdf5", "--storage", storage, "--compute-time", "0.01",
               "--epochs", "1", "--max-steps", "3", "--results", tmp_path / "r") == 0
    out = subprocess.run([sys.executable, "-m", "iobench", "compare", str(tmp_path / "r")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "[INTERRUPTED:" in " ".join(out.stdout.split())
    assert cli("report", tmp_path / "r", "--out", tmp_path / "rep.md") == 0
    text = (tmp_path / "rep.md").read_text()
    assert "interrupted run, left out" in text


def _generate(storage: Path, samples: int = 400) -> subprocess.Popen:
    """A multi-job generate that runs for several seconds, in its own process group."""
    return subprocess.Popen(
        [sys.executable, "-m", "iobench", "generate", "--dataset", "cosmoflow", "--samples",
         str(samples), "--samples-per-file", "2", "--jobs", "2", "--storage", str(storage)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _started(storage: Path, timeout: float = 60) -> None:
    journal = storage / "cosmoflow-hdf5" / ".iobench-partial"
    deadline = time.time() + timeout
    while time.time() < deadline and len(list(journal.glob("task-*"))) < 2:
        time.sleep(0.05)


def _processes_of(storage: Path) -> list[str]:
    r = subprocess.run(["pgrep", "-f", f"--storage {storage}$"], capture_output=True, text=True)
    return r.stdout.split()


@pytest.mark.parametrize("sig, target, code", [
    (signal.SIGINT, "main", 130), (signal.SIGTERM, "main", 143), (signal.SIGINT, "group", 130),
])
def test_killing_a_multi_job_generate_prints_no_traceback(tmp_path, sig, target, code) -> None:
    proc = _generate(tmp_path)
    _started(tmp_path)
    if target == "group":  # a terminal's Ctrl-C
        os.killpg(proc.pid, sig)
    else:  # kill, a workflow manager, or Slurm's time limit
        os.kill(proc.pid, sig)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "iobench: interrupted"), err
    deadline = time.time() + 10
    while _processes_of(tmp_path) and time.time() < deadline:
        time.sleep(0.1)
    assert not _processes_of(tmp_path)  # no worker left behind
    assert not (tmp_path / "cosmoflow-hdf5" / "iobench.json").exists()
    assert not list(tmp_path.glob(".*.iobench-lock"))


def test_a_second_writer_is_refused_naming_the_first(tmp_path) -> None:
    # the first writer is stopped (SIGSTOP) once it has written some files, so it holds the
    # lock for as long as the test needs without writing a large dataset
    first = _generate(tmp_path, samples=64)
    try:
        _started(tmp_path)
        os.killpg(first.pid, signal.SIGSTOP)
        r = subprocess.run([sys.executable, "-m", "iobench", "generate", "--dataset",
                            "cosmoflow", "--samples", "64", "--samples-per-file", "2",
                            "--storage", str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"is being written by pid {first.pid} on " in r.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    # its process gone, the lock is stale: the next writer takes over and resumes
    r = subprocess.run([sys.executable, "-m", "iobench", "generate", "--dataset", "cosmoflow",
                        "--samples", "8", "--samples-per-file", "2", "--storage",
                        str(tmp_path / "other")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lock = tmp_path / ".cosmoflow-hdf5.iobench-lock"
    assert lock.exists()  # SIGKILL left it
    r = subprocess.run([sys.executable, "-m", "iobench", "generate", "--dataset", "cosmoflow",
                        "--samples", "64", "--samples-per-file", "2", "--jobs", "2",
                        "--storage", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "kept from an earlier run" in r.stderr, r.stderr
    assert not lock.exists()



@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupt_dropped_inside_a_weakref_callback_is_raised_again() -> None:
    """A signal handler's raise lands wherever the main thread runs bytecode next; inside a
    weakref callback Python prints it and drops it ("Exception ignored in"), and bench-read
    under mpiexec once read on for its 500 epochs after one rank's SIGINT was lost so.
    `interrupts.check()`, called at each batch, raises it again."""
    import weakref

    from iobench.core import interrupts as intr

    class Thing:
        pass

    def callback() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(10_000))  # the handler runs here, inside the callback: its raise dropped

    reached = []
    with pytest.raises(intr.Interrupted) as got, intr.interrupts(grace_s=None):
        thing = Thing()
        weakref.finalize(thing, callback)
        del thing  # the callback runs; the interrupt's raise is lost in it
        reached.append(True)  # so the loop would have gone on
        intr.check()
        pytest.fail("check() did not raise the interrupt that was lost")
    assert reached and got.value.exit_code == 130
    with intr.interrupts(grace_s=None):
        intr.check()  # nothing arrived: a no-op
