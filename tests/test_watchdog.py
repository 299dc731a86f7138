"""`iobench.core.interrupts.interrupts` in one process: how a rank acts on SIGINT/SIGTERM.

Under mpiexec (tests/test_interrupts.py) the ranks must leave by themselves, each
through its normal exit (MPI_Finalize runs at exit): hydra SIGKILLs the other ranks
when one leaves without it. Several ranks act on an interrupt together, after the
same collective.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from iobench.core.interrupts import Interrupted, act_now, interrupts, pending, settle

EXITS_NORMALLY = """
import atexit, os, signal, sys
from iobench.core.interrupts import Interrupted, interrupts
atexit.register(lambda: print("atexit ran", flush=True))  # as mpi4py's MPI_Finalize
try:
    with interrupts(defer={defer}):
        os.kill(os.getpid(), signal.SIGTERM)
        {settle}
except Interrupted as e:
    sys.exit(e.exit_code)
"""


@pytest.mark.parametrize("defer, settle", [
    (False, "pass"),
    (True, "from iobench.core.interrupts import settle; settle([None, signal.SIGTERM])"),
])
def test_a_process_that_stopped_by_itself_exits_normally(defer, settle) -> None:
    """Its grace timer does not hold it at exit and then end it with os._exit (which
    skipped the atexit handlers, MPI_Finalize among them)."""
    r = subprocess.run([sys.executable, "-c", EXITS_NORMALLY.format(defer=defer, settle=settle)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 143, r.stderr
    assert r.stdout == "atexit ran\n", (r.stdout, r.stderr)


def test_several_ranks_act_on_an_interrupt_after_the_same_collective() -> None:
    with interrupts(defer=True):
        assert pending() is None
        settle([None, None])  # nobody interrupted: nothing happens
        os.kill(os.getpid(), signal.SIGINT)  # recorded, not raised
        assert pending() == signal.SIGINT
        with pytest.raises(Interrupted) as e:
            settle([None, signal.SIGTERM])  # what the collective carried: this rank's first
        assert e.value.exit_code == 130 and pending() is None
        settle([signal.SIGINT, None])  # the way out is not interrupted again
    with interrupts(defer=True):  # a rank that got the interrupt only from its peers
        with pytest.raises(Interrupted) as e:
            settle([signal.SIGTERM, None])
        assert e.value.exit_code == 143


def test_with_no_collective_left_an_interrupt_is_raised_at_once() -> None:
    with interrupts(defer=True):
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(Interrupted) as e:
            act_now()  # the pending one
        assert e.value.exit_code == 143
    with interrupts(defer=True):
        act_now()  # nothing pending
        with pytest.raises(Interrupted) as e:
            os.kill(os.getpid(), signal.SIGINT)  # the handler raises, not records
        assert e.value.exit_code == 130

