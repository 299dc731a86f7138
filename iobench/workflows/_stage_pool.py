"""Copy worker processes for `iobench stage`: batches of files out, counters and errors back.

Threads of one interpreter copying thousands of small files a second spend their
time taking turns at its lock; forked processes each run the per-file loop on a
core of their own. The parent hands each worker a batch at a time (two queued,
so none idles), adds up what each batch returns, and follows the copied bytes
through a shared array the workers add to (a progress bar, without a message per
chunk). Workers ignore SIGINT and SIGTERM: the parent decides. After an error or
an interrupt it raises the shared stop flag; each worker stops at its next chunk
or file, removes its batch's temporary files, and exits; `close` (the caller's,
after its timed copy) waits for every one of them. A worker dies with its parent
(PR_SET_PDEATHSIG) should the parent be killed outright.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.sharedctypes import RawArray
from typing import Any, Generic, TypeVar, cast

from iobench.core.errors import StorageError

B = TypeVar("B")
QUEUED = 2  # batches handed to a worker before its first result: it never waits for work
POLL_S = 0.2  # how often the parent looks at the bytes copied and at a pending interrupt
JOIN_S = 3.0  # how long the stopping workers may take, all told (under interrupts.GRACE_S)
_PR_SET_PDEATHSIG = 1


class Shared:
    """Flags the parent and its workers share: [0] stop, [1 + i] bytes worker i copied."""

    def __init__(self, workers: int) -> None:
        self.array = RawArray(ctypes.c_longlong, workers + 1)

    @property
    def stopped(self) -> bool:
        return bool(self.array[0])

    def stop(self) -> None:
        self.array[0] = 1

    def copied(self) -> int:
        return sum(self.array[1:])

    def add(self, slot: int, n: int) -> None:
        """Worker `slot` copied `n` more bytes (one writer per slot: no lock)."""
        self.array[slot] += n


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _serve(conn: Connection, work: Callable[[B, int], dict[str, float]], parent: int,
           slot: int) -> None:
    """A worker's loop: run `work` on each batch received (with the worker's slot in the
    shared array), send back its counters or its error, until told to end (None) or the
    parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    try:
        if os.getppid() == parent:  # else the parent died before PR_SET_PDEATHSIG was set
            _loop(conn, work, slot)
    finally:  # no flush of the parent's buffered output, no exit handlers: they are its own
        os._exit(0)


def _loop(conn: Connection, work: Callable[[B, int], dict[str, float]], slot: int) -> None:
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        try:
            reply: tuple[str, Any] = ("ok", work(batch, slot))
        except BaseException as e:  # every failure goes to the parent
            reply = ("error", e)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError):
            conn.send(("error", StorageError(f"copy worker failed: {reply[1]!r}")))
        except (BrokenPipeError, OSError):
            return


class Pool(Generic[B]):
    """`workers` forked copy processes running `work` on batches; a context manager that
    never leaves a worker behind."""

    def __init__(self, workers: int, work: Callable[[B, int], dict[str, float]],
                 shared: Shared) -> None:
        self.shared = shared
        ctx = multiprocessing.get_context("fork")
        for stream in (sys.stdout, sys.stderr):  # nothing buffered is forked (and lost)
            with contextlib.suppress(Exception):
                stream.flush()
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._queued: dict[Connection, int] = {}
        try:
            for i in range(workers):
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=_serve, args=(theirs, work, os.getpid(), i + 1),
                                name="iobench-stage", daemon=True)
                p.start()
                theirs.close()
                self._conns.append(mine)
                self._procs.append(p)
                self._queued[mine] = 0
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Pool[B]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, batches: Iterable[B], on_result: Callable[[dict[str, float]], None],
            on_poll: Callable[[], None]) -> BaseException | None:
        """Hand out every batch, `on_result` for each batch's counters, `on_poll` every
        POLL_S; the first error (then nothing more is handed out), or None."""
        todo: Iterator[B] = iter(batches)
        error: BaseException | None = None
        for conn in self._conns:
            for _ in range(QUEUED):
                self._hand(conn, todo)
        while any(self._queued.values()):
            for ready in wait([c for c, n in self._queued.items() if n], POLL_S):
                conn = cast("Connection[Any, Any]", ready)  # one of ours: wait() returns them
                kind, value = self._receive(conn)
                if kind == "ok":
                    on_result(value)
                elif error is None and not self.shared.stopped:
                    error = value
                    self.shared.stop()
                if error is None and not self.shared.stopped:
                    self._hand(conn, todo)
            on_poll()
        return error

    def _hand(self, conn: Connection, todo: Iterator[B]) -> None:
        batch = next(todo, None)
        if batch is not None:
            conn.send(batch)
            self._queued[conn] += 1

    def _receive(self, conn: Connection) -> tuple[str, Any]:
        try:
            reply: tuple[str, Any] = conn.recv()
        except (EOFError, OSError):  # the worker died (killed, out of memory)
            self._queued[conn] = 0
            return "error", StorageError("a copy worker process died; run the stage again "
                                         "(it resumes)")
        self._queued[conn] -= 1
        return reply

    def close(self) -> None:
        """Stop the workers (after their current batch, which they clean up) and wait for
        them; one that will not stop in JOIN_S is killed (its temporary file is left to
        the next run, which removes it)."""
        self.shared.stop()
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        deadline = time.monotonic() + JOIN_S  # all of them together: under GRACE_S
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
