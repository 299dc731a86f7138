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
stops where it is, rank 0 writes a result marked interrupted, and the process
exits with 130 or 143; a rank stuck in a blocking call on the way out (a
collective whose peer is gone) exits anyway after GRACE_S.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from iobench.world import World

GRACE_S = 5.0  # after an interrupt, how long a rank may take to stop by itself
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


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


@contextlib.contextmanager
def interrupts(on_signal: Callable[[int], None] | None = None,
               grace_s: float | None = GRACE_S) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise `Interrupted` in the main thread (after
    `on_signal(signum)`); the previous handlers are restored on the way out. `grace_s`
    after the signal the process exits whatever it is doing; None: no such deadline (a
    single process that waits on nothing but its own children, as `iobench search`)."""
    def handler(signum: int, frame: Any) -> None:
        # one interrupt is enough: mpiexec forwards the signal the ranks may have had
        # already, and a second one must not break the way out of the first
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        code = EXIT_CODES.get(signum, 128 + signum)
        # whatever blocks on the way out (a collective whose peer is gone), the rank ends
        if grace_s is not None:
            threading.Timer(grace_s, lambda: os._exit(code)).start()
        if on_signal is not None:
            on_signal(signum)
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
