"""Progress for a log file (a batch job's output): one line every `IOBENCH_PROGRESS_S` s."""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType

DEFAULT_INTERVAL_S = 60.0
INTERVAL_ENV = "IOBENCH_PROGRESS_S"


def interval_s() -> float:
    """Seconds between two progress lines off a terminal (`IOBENCH_PROGRESS_S`, default 60;
    a value that is not a positive number keeps the default)."""
    try:
        v = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S
    return v if 0 < v < float("inf") else DEFAULT_INTERVAL_S


class LogProgress:
    """While inside, a line to stderr every `interval_s()` with the bytes done so far (from
    `update`), the expected total, the rate and the time elapsed, even while one long file
    is written (a thread prints it; the work never waits for it)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.done = 0
        self.total = 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, max(total, done)

    def line(self) -> str:
        elapsed = time.monotonic() - self._t0
        pct = f" ({self.done / self.total:.0%})" if self.total else ""
        return (f"{self.label}: {self.done / 1e6:.1f} of ~{self.total / 1e6:.1f} MB{pct} "
                f"after {elapsed:.0f} s, {self.done / 1e6 / max(elapsed, 1e-9):.1f} MB/s")

    def _loop(self) -> None:
        while not self._stop.wait(interval_s()):
            print(self.line(), file=sys.stderr, flush=True)

    def __enter__(self) -> LogProgress:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
