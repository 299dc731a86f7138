"""Run one function in several threads released together: their results, the wall time, and the
first failure raised in the caller's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def run_threads(n: int, fn: Callable[[int], T]) -> tuple[list[T], float]:
    """fn(0), ..., fn(n - 1), each in a thread of its own, released together (a barrier):
    their results in order, and the wall seconds from the release to the last one's end."""
    out: list[Any] = [None] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n + 1)

    def body(i: int) -> None:
        start.wait()
        try:
            out[i] = fn(i)
        except BaseException as e:  # surfaced in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter_ns()
    for t in threads:
        t.join()
    seconds = (time.perf_counter_ns() - t0) / 1e9
    if errors:
        raise errors[0]
    return out, seconds
