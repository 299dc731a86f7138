"""An interrupt whose raise Python dropped (inside a weakref callback) still stops each command.

A signal handler's raise lands wherever the main thread runs bytecode next; inside a
weakref callback (a batch's buffers freed) Python drops it ("Exception ignored in").
Each command's loop raises it again at its next batch or item (`interrupts.check`):
the run stops with its one-line message and 130, not by the 5 s backstop (no message)
or not at all. Each case runs `iobench` in a process of its own, with one function of
the command's loop wrapped so that its Nth call loses a SIGINT so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli

# module, function, the call that loses the interrupt, then `iobench ARGV...`
DRIVER = """
import os, signal, sys, weakref
import importlib
from iobench.cli import main

module, name, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
mod = importlib.import_module(module)
wrapped, calls = getattr(mod, name), [0]

class Thing:
    pass

def lose_the_interrupt():
    os.kill(os.getpid(), signal.SIGINT)
    sum(range(10_000))  # the handler runs here, inside the callback: its raise dropped

def patched(*args, **kwargs):
    calls[0] += 1
    if calls[0] == nth:
        thing = Thing()
        weakref.finalize(thing, lose_the_interrupt)
        del thing
    return wrapped(*args, **kwargs)

setattr(mod, name, patched)
sys.exit(main(sys.argv[4:]))
"""


def _run(module: str, name: str, nth: int, *argv: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", DRIVER, module, name, str(nth),
                           *map(str, argv)], capture_output=True, text=True, timeout=300)


def _one_line(r: subprocess.CompletedProcess[str], starts: str) -> None:
    assert r.returncode == 130, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith(starts), r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("dropped")
    assert cli("generate", "--dataset", "cifar10", "--samples", "512", "--storage", s) == 0
    return s


def test_train_stops_at_the_next_batch(storage, tmp_path) -> None:
    # the 12th step: 8 steps an epoch, so one epoch completed and is kept
    r = _run("iobench.core.faults", "at_step", 12, "train", "--loader", "hdf5", "--storage",
             storage, "--compute-time", "0.01", "--epochs", "50", "--workers", "0",
             "--batch-size", "64", "--results", tmp_path / "r")
    _one_line(r, "iobench: interrupted (SIGINT) after 1 complete epoch(s)")


def test_generate_stops_at_the_next_task(tmp_path) -> None:
    r = _run("iobench.workflows.generate", "_run_task", 2, "generate", "--dataset", "cifar10",
             "--samples", "64", "--samples-per-file", "4", "--jobs", "1", "--storage", tmp_path)
    _one_line(r, "iobench: interrupted (SIGINT)")
    assert not (tmp_path / "cifar10-hdf5" / "iobench.json").exists()


def test_stage_stops_at_the_next_batch(storage, tmp_path) -> None:
    # lost as the copy is planned (batch_files, in the main thread): stopped at batch one
    r = _run("iobench.workflows.stage", "batch_files", 1, "stage", "--from",
             storage / "cifar10-hdf5", "--to", tmp_path / "dest", "--threads", "1",
             "--results", tmp_path / "r", "--no-progress")
    _one_line(r, "iobench: interrupted (SIGINT)")
