"""Never hang, never look complete when not: a per-rank watchdog and the interrupt signals.

`Watchdog` runs a thread on every rank. The training loop reports progress
(`progress(phase)` at every step and phase change); each rank writes a small
heartbeat file (its phase and time) into a directory every rank can see. When
a rank has made no progress for `timeout_s`, it finds the ranks whose
heartbeats went stale (a frozen node stops writing them), says which and in
what phase they were, lets rank 0 write what was measured so far marked
incomplete, and ends the whole job (MPI_Abort; the process exits elsewhere).

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
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from iobench.world import World

GRACE_S = 5.0  # after an interrupt, how long a rank may take to stop by itself
DEFER_LIMIT_S = 30.0  # several ranks: how long a recorded interrupt may wait for a collective
EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Interrupted(BaseException):  # like KeyboardInterrupt: not an error
    """SIGINT or SIGTERM arrived; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = EXIT_CODES.get(signum, 128 + signum)


class Watchdog:
    """Ends the job when this rank makes no progress for `timeout_s` (see the module)."""

    def __init__(self, world: World, timeout_s: float, beats: Path | None,
                 on_stuck: Callable[[str], None] | None = None) -> None:
        self.world, self.timeout_s, self.beats = world, timeout_s, beats
        self.on_stuck = on_stuck
        self.phase = "starting"
        self.step = 0
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="iobench-watchdog", daemon=True)
        if beats is not None:
            with contextlib.suppress(OSError):
                beats.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def progress(self, phase: str, step: int | None = None) -> None:
        """This rank is alive and now in `phase` (cheap: called at every step)."""
        self.phase = phase
        if step is not None:
            self.step = step
        self.last = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.beats is not None:
            with contextlib.suppress(OSError):
                (self.beats / f"rank-{self.world.rank}.json").unlink()

    # ---- the thread -------------------------------------------------------------------------
    def _interval(self) -> float:
        return max(0.2, min(5.0, self.timeout_s / 4))

    def _run(self) -> None:
        while not self._stop.wait(self._interval()):
            self._beat()
            now = time.monotonic()
            if now - self.last > self.timeout_s:
                self._end(self._diagnosis(now), 3)

    def _beat(self) -> None:
        if self.beats is None:
            return
        doc = {"rank": self.world.rank, "node": self.world.node, "host": self.world.hostname,
               "phase": self.phase, "step": self.step, "time": time.time()}
        tmp = self.beats / f".rank-{self.world.rank}.tmp"
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.beats / f"rank-{self.world.rank}.json")

    def _diagnosis(self, now: float) -> str:
        me = (f"rank {self.world.rank} made no progress for {now - self.last:.0f} s "
              f"(--timeout {self.timeout_s:g}) while {self.phase}")
        stale = []
        if self.beats is not None:
            for r in range(self.world.size):
                try:
                    doc = json.loads((self.beats / f"rank-{r}.json").read_text())
                except (OSError, ValueError):
                    stale.append(f"rank {r} (no heartbeat)")
                    continue
                age = time.time() - doc["time"]
                if age > 2 * self._interval() + 1:
                    stale.append(f"rank {r} on {doc['host']} (silent for {age:.0f} s, last "
                                 f"{doc['phase']})")
        if stale:
            return f"{me}; stopped making progress: {', '.join(stale)}"
        return me

    def _end(self, message: str, code: int) -> None:
        if self.on_stuck is not None:
            with contextlib.suppress(Exception):  # the job ends either way
                self.on_stuck(message)
        print(f"iobench: error: {message}; ending all {self.world.size} rank(s)",
              file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            self.world.abort(code)
        os._exit(code)


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
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for t in _state.timers:  # the rank stopped by itself: it exits normally
            t.cancel()
        _state = _State()
