"""One rank of a command without per-step collectives interrupted alone (generate, stage,
bench-read under `mpiexec -n 2`): the job ends within seconds, 130, instead of hanging.

Not timing-sensitive (a bound of 60 s on an end that takes about 10), so it runs in the
parallel pass; the helpers come from tests/test_interrupts.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_interrupts import _finish, _rank_pid

from conftest import cli, mpiexec_path

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("alone")
    assert cli("generate", "--dataset", "cifar10", "--samples", "4096", "--storage", s) == 0
    return s


def _wait_for_mpi(pid: int, timeout: float = 60) -> None:
    """Until process `pid` has loaded MPI's library (it joins the job in `get_world`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with __import__("contextlib").suppress(OSError):
            if "libmpi" in Path(f"/proc/{pid}/maps").read_text():
                return
        time.sleep(0.1)
    pytest.fail(f"process {pid} never loaded MPI")


def _start_command(argv: list[str], fault: str = "") -> subprocess.Popen:
    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (install the `mpich` extra)")
    return subprocess.Popen([exe, "-n", "2", sys.executable, "-m", "iobench", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                                 **({"IOBENCH_TEST_FAULT": fault} if fault else {})})


@pytest.mark.parametrize("command, after_s", [
    ("generate", None),  # before the rank joined the job (its peer waits for it there)
    ("generate", 1.0), ("bench-read", 1.0), ("stage", 1.0)])
def test_a_command_without_collectives_stops_when_one_rank_alone_is_interrupted(
        storage, tmp_path, command: str, after_s: float | None) -> None:
    """generate, bench-read and stage have no per-step collective to carry an interrupt to
    the other ranks: SIGINT to one rank alone (a `kill`, a scheduler's per-task signal)
    used to leave it waiting in MPI's finalising for a peer that worked on, then waited for
    it for ever. Now the job ends within seconds, 130, no traceback."""
    argv = {"generate": ["generate", "--dataset", "imagenet", "--samples", "3000",
                         "--storage", str(tmp_path / "g")],
            "bench-read": ["bench-read", "--dataset", "cifar10", "--storage", str(storage),
                           "--epochs", "500", "--results", str(tmp_path / "r")],
            "stage": ["stage", "--dataset", "cifar10", "--from", str(storage), "--to",
                      str(tmp_path / "s"), "--repeat", "500", "--no-progress",
                      "--results", str(tmp_path / "r")]}[command]
    proc = _start_command(argv, "rank=1,action=sigint-start" if after_s is None else "")
    if after_s is not None:
        victim = _rank_pid(proc, 1)
        _wait_for_mpi(victim)  # past its imports: in `main`, where iobench handles signals
        time.sleep(after_s)
        os.kill(victim, signal.SIGINT)
    rc, _, err, _ = _finish(proc, 60)
    assert rc == 130, (rc, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    assert "iobench: interrupted" in err, err[-2000:]
