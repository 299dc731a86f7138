"""Loader wrappers for tests: a shadow clock outside the training loop, and injected latency.

Both wrap a real loader (any `iobench.loaders.base.Loader`) and pass every
call through, so what the training loop measures can be checked against a
clock it does not own, and one rank can be made deliberately slow.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from iobench.loaders.base import Batch, Loader


class Wrapped:
    """Delegates the loader contract the training loop uses to `inner`."""

    def __init__(self, inner: Loader) -> None:
        self.inner = inner
        self.config = inner.config
        self.manifest = inner.manifest

    def steps_per_epoch(self) -> int:
        return self.inner.steps_per_epoch()

    def start(self) -> None:
        self.inner.start()

    def cache_settings(self) -> dict[str, Any]:
        return self.inner.cache_settings()

    def epoch(self, epoch: int) -> Iterator[Batch]:
        return self.inner.epoch(epoch)

    def close(self) -> None:
        self.inner.close()


class ShadowClock(Wrapped):
    """Records, per epoch, when the loop asked for each batch and when it got it (ns).

    `calls[epoch]` is a list of (asked, got) pairs; the last pair's `got` is
    None: that is the call that found the epoch over, right after the last
    step's compute ended.
    """

    def __init__(self, inner: Loader, delay_s: float = 0.0) -> None:
        super().__init__(inner)
        self.delay_s = delay_s
        self.calls: dict[int, list[tuple[int, int | None]]] = {}

    def epoch(self, epoch: int) -> Iterator[Batch]:
        calls = self.calls.setdefault(epoch, [])
        inner = self.inner.epoch(epoch)
        while True:
            asked = time.perf_counter_ns()
            if self.delay_s:
                time.sleep(self.delay_s)  # an injected stall of known length
            try:
                batch = next(inner)
            except StopIteration:
                calls.append((asked, None))
                return
            calls.append((asked, time.perf_counter_ns()))
            yield batch

    def stall_s(self, epoch: int) -> float:
        return sum(got - asked for asked, got in self.calls[epoch] if got is not None) / 1e9

    def wall_s(self, epoch: int) -> float:
        calls = self.calls[epoch]
        return (calls[-1][0] - calls[0][0]) / 1e9

    def steps(self, epoch: int) -> int:
        return sum(1 for _, got in self.calls[epoch] if got is not None)


class Slow(Wrapped):
    """Sleeps `delay_s` before every batch: a rank with slow storage."""

    def __init__(self, inner: Loader, delay_s: float) -> None:
        super().__init__(inner)
        self.delay_s = delay_s

    def epoch(self, epoch: int) -> Iterator[Batch]:
        for batch in self.inner.epoch(epoch):
            time.sleep(self.delay_s)
            yield batch
