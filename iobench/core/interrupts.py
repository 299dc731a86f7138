"""Interrupt signals: SIGINT and SIGTERM as an `Interrupted` exception, alone or with the ranks.

`interrupts()` turns SIGINT and SIGTERM (Ctrl-C, `scancel`, a batch system's
time limit) into an `Interrupted` exception in the main thread, so the run
stops, rank 0 writes a result marked interrupted, and the process exits with
130 or 143. One process raises it at once. Several ranks (`defer=True`) must
stop together: a rank blocked in a collective runs no Python signal handler,
so a rank that left on its own would leave its peers waiting in the collective
it never joins. There the handler only records the signal (`pending()`); the
ranks' collectives carry it (`World`'s, the training loop's per-step one), and
`settle()` raises it on every rank after the same collective. Every rank then
leaves by itself and MPI is finalised: under MPICH's hydra, a rank that exits
without finalising has the others SIGKILLed, and mpiexec then reports 9, or
waits on a rank that never returns. A rank stuck on the way out (a peer frozen)
still exits after GRACE_S (DEFER_LIMIT_S while its interrupt waits for the
ranks' next collective).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

GRACE_S = 5.0  # after an interrupt, how long a rank may take to stop by itself
DEFER_LIMIT_S = 30.0  # several ranks: how long a recorded interrupt may wait for a collective
EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Interrupted(BaseException):  # like KeyboardInterrupt: not an error
    """SIGINT or SIGTERM arrived; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = EXIT_CODES.get(signum, 128 + signum)


class _State:
    """This process's interrupt, while inside `interrupts()`."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the signal received, acted upon or not
        self.defer = False  # several ranks: act on it at a collective, together
        self.raised = False  # Interrupted was raised: the way out has begun
        self.grace_s: float | None = GRACE_S  # None: no deadline on the way out
        self.timers: list[threading.Timer] = []

    def backstop(self, seconds: float, code: int) -> None:
        """End the process with `code` after `seconds` unless `interrupts()` has returned
        by then (a daemon thread: it never holds up a rank's normal exit)."""
        t = threading.Timer(seconds, os._exit, args=(code,))
        t.daemon = True
        t.start()
        self.timers.append(t)

    def interrupt(self, signum: int) -> Interrupted:
        self.signum, self.raised = signum, True
        if self.grace_s is not None:  # whatever blocks on the way out (a frozen peer)
            self.backstop(self.grace_s, EXIT_CODES.get(signum, 128 + signum))
        return Interrupted(signum)


_state = _State()


def pending() -> int | None:
    """The signal this rank received and has not acted upon yet (None: none)."""
    return None if _state.raised else _state.signum


def settle(signums: Iterable[int | None]) -> None:
    """After a collective that carried every rank's `pending()`: raise `Interrupted` on
    every rank when any rank was interrupted (each sees the same `signums`)."""
    got = [s for s in signums if s]
    if got and not _state.raised:
        raise _state.interrupt(_state.signum or got[0])


def act_now() -> None:
    """This rank has no collective left: an interrupt is raised at once from here on, and
    one that is pending now."""
    _state.defer = False
    if _state.signum is not None and not _state.raised:
        raise _state.interrupt(_state.signum)


def check() -> None:
    """Raise the interrupt again where its first raise was lost: Python prints and drops an
    exception raised inside a weakref callback or a `__del__` ("Exception ignored in"), and
    a signal handler's raise lands wherever the main thread runs bytecode next, so a loop
    that would otherwise go on calls this at each step (a no-op while none arrived)."""
    if _state.raised and _state.signum is not None:
        raise Interrupted(_state.signum)


def _unraisable(previous: Callable[[Any], object], unraisable: Any) -> None:
    """Python's report of an exception it dropped: an `Interrupted` is said in one line by
    the command once `check()` raises it again, so it is not printed here with a traceback;
    anything else is reported as before."""
    if not isinstance(unraisable.exc_value, Interrupted):
        previous(unraisable)


@contextlib.contextmanager
def interrupts(on_signal: Callable[[int], None] | None = None,
               grace_s: float | None = GRACE_S, *, defer: bool = False) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise `Interrupted` in the main thread (after
    `on_signal(signum)`); with `defer` (several ranks), at the ranks' next collective
    instead (see the module). The previous handlers are restored on the way out. `grace_s`
    after the interrupt is raised the process exits whatever it is doing; None: no such
    deadline (a single process that waits on nothing but its own children, as `iobench
    search`)."""
    def handler(signum: int, frame: Any) -> None:
        # one interrupt is enough: mpiexec forwards the signal the ranks may have had
        # already, and a second one must not break the way out of the first
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        _state.signum = signum
        if on_signal is not None:
            on_signal(signum)
        if _state.defer:  # the ranks' next collective raises it on every rank
            if grace_s is not None:
                _state.backstop(DEFER_LIMIT_S, EXIT_CODES.get(signum, 128 + signum))
            return
        raise _state.interrupt(signum)

    global _state
    _state = _State()
    _state.defer, _state.grace_s = defer, grace_s
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    old_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_unraisable, old_hook)
    try:
        yield
    finally:
        sys.unraisablehook = old_hook
        for s, h in old.items():
            signal.signal(s, h)
        for t in _state.timers:  # the rank stopped by itself: it exits normally
            t.cancel()
        _state = _State()
