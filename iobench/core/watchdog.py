"""Never hang, never look complete when not: a per-rank watchdog that ends a stuck job.

`Watchdog` runs a thread on every rank. The training loop reports progress
(`progress(phase)` at every step and phase change); each rank writes a small
heartbeat file (its phase and time) into a directory every rank can see. When
a rank has made no progress for `timeout_s`, it finds the ranks whose
heartbeats went stale (a frozen node stops writing them), says which and in
what phase they were, lets rank 0 write what was measured so far marked
incomplete, and ends the whole job (MPI_Abort; the process exits elsewhere).

The interrupt signals (`Interrupted`, `interrupts()`) live in `iobench.core.interrupts`, a
lower module that `World`'s collectives use too.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from iobench.core.world import World


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
