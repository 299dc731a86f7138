"""Fault injection for iobench's own tests: a no-op unless `IOBENCH_TEST_FAULT` is set.

Tests set `IOBENCH_TEST_FAULT="rank=R,epoch=E,step=S,action=A"` in a run's environment
to check how a failure or a signal at a known point is handled (tests/test_interrupts.py,
tests/test_train_mpi.py). Actions: `raise` (a RuntimeError), `kill` (SIGKILL to this
rank), `sigint`/`sigterm` (to the launcher, as a terminal's Ctrl-C or a scheduler would)
at a training step, or between epochs with step -1; `sigint-write` (SIGINT while rank 0
writes the result); `sigint-start` (SIGINT to rank R alone as it starts, before the ranks
meet, while its peers go on to the rendezvous). `iobench checkpoint` (tests/test_checkpoint.py)
reads `epoch` as the checkpoint's index and step 0 as "this rank's shard is on storage,
before the metadata": `kill` and `sigint` there, and `fill` (another writer fills the
filesystem just before the write). `train --checkpoint-every` reads `epoch` as the save's
index and acts on `kill-save` (SIGKILL once this rank's shard is written, before the
metadata; tests/test_train_checkpoint.py) and `fill` (tests/test_train_resume.py).
Production code calls `planned` once and `at_step` / `at_result_write` / `at_start` at its
hook points; nothing else reads the variable.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

FAULT_ENV = "IOBENCH_TEST_FAULT"


@dataclass(frozen=True)
class Fault:
    """Where (rank, epoch, step; step -1: between epochs) and what (`action`) to inject."""

    rank: int
    epoch: int
    step: int
    action: str


def planned() -> Fault | None:
    """The fault the environment asks for, or None (always None outside iobench's tests)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    kv = dict(p.split("=", 1) for p in spec.split(","))
    return Fault(rank=int(kv["rank"]), epoch=int(kv.get("epoch", 0)),
                 step=int(kv.get("step", 0)), action=kv.get("action", "raise"))


def at_step(fault: Fault | None, rank: int, epoch: int, step: int) -> None:
    """Inject `fault` if it is due here. step -1: between epochs (after the epoch's figures
    are recorded); `sigint`/`sigterm` go to the launcher."""
    if fault is None or (fault.rank, fault.epoch, fault.step) != (rank, epoch, step):
        return
    if fault.action in ("sigint", "sigterm"):
        os.kill(_launcher_pid(), signal.SIGINT if fault.action == "sigint" else signal.SIGTERM)
        time.sleep(1)  # the handler runs here (several ranks: it records the signal)
        return
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.action == "raise":  # (sigint-write is at_result_write's)
        raise RuntimeError(f"injected fault ({FAULT_ENV}) at epoch {epoch} step {step}")


def at_result_write() -> None:
    """SIGINT to this process as rank 0 writes the result, if the environment asks for it."""
    fault = planned()
    if fault is not None and fault.action == "sigint-write":
        os.kill(os.getpid(), signal.SIGINT)


def at_start() -> None:
    """SIGINT to this process alone before the ranks meet, if the environment asks for it
    for this rank (as the launcher numbers it: MPI's PMI_RANK, torchrun's RANK)."""
    fault = planned()
    rank = os.environ.get("PMI_RANK", os.environ.get("RANK", "0"))
    if fault is not None and fault.action == "sigint-start" and str(fault.rank) == rank:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the handler runs here


def _launcher_pid() -> int:
    """The process a terminal's Ctrl-C reaches: mpiexec (the parent of this rank's hydra
    proxy, as each rank runs in a session of its own), else this process."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as f:
            grandparent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{grandparent}/comm") as f:
            if f.read().strip().startswith("mpiexec"):
                return grandparent
    except (OSError, ValueError, IndexError):
        pass
    return os.getpid()
