"""Batch buffers reused from batch to batch: read straight into them, take them back once free.

Allocating a fresh buffer per batch costs page faults (the kernel zeroes
every new page) and, from a worker process, a copy into a new shared-memory
segment when the batch is sent: for 32 MiB batches that is most of the
loader's time. So each worker keeps a few buffers in shared memory, reads
into them, and sends them (torch then passes only a file descriptor, and the
consumer's mapping is reused).

A buffer is reused only when nothing refers to it any more. In one process
that is torch's own count of references to the buffer's storage (every
tensor, view, numpy array or storage object on it holds one): `LocalPool`.
Across processes (`SharedSlots`), the worker marks a slot lent before it
sends the buffer; the consumer's process keeps one reference per lent slot
and hands the slot back (clears its flag) once its count shows no other
user, checked whenever the consumer asks for a batch. A worker that finds
no free slot allocates a fresh buffer, as before: it never waits, so a
consumer may hold on to any number of batches.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import numpy as np
import torch

_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _users(t: torch.Tensor) -> int:
    """References to `t`'s storage other than the temporary one this call makes."""
    if _use_count is None:  # pragma: no cover - every torch since 2.0 has it
        return 1 << 30  # unknown: never reuse
    s = t.untyped_storage()
    return int(_use_count(s._cdata)) - 1


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    t = _TORCH_DTYPES.get(dtype)
    if t is None:
        t = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    return t


def _typed(buf: torch.Tensor, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    """A [shape] tensor of `dtype` over the first bytes of the uint8 buffer `buf`.

    Called for every batch (twice for a decoded one): math.prod and a cached dtype
    (np.prod and a probe tensor cost 4x the views themselves at a 64-sample batch).
    """
    n = math.prod(shape) * dtype.itemsize
    t = _torch_dtype(dtype)
    v = buf[:n] if t == torch.uint8 else buf[:n].view(t)
    return v.view(shape)


def typed_array(buf: torch.Tensor, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """`_typed` as a numpy array (what readers fill)."""
    return _typed(buf, shape, np.dtype(dtype)).numpy()


def _capacity(nbytes: int) -> int:
    """Bytes to allocate for `nbytes`: a little headroom for variable-size (JPEG) batches."""
    return max(4096, nbytes + nbytes // 8)


class LocalPool:
    """Buffers for batches read in this process (no workers, or thread workers)."""

    def __init__(self, limit: int, pin: bool = False) -> None:
        self.limit, self.pin = limit, pin
        self._bufs: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self.fresh = 0  # buffers handed out unpooled (every pooled one in use)

    def array(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A buffer of `shape` and `dtype` that nothing else refers to (numpy view)."""
        return self.tensor(shape, dtype).numpy()

    def tensor(self, shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            for k, buf in enumerate(self._bufs):
                if _users(buf) == 1:  # only this pool holds it
                    if buf.numel() < nbytes:
                        buf = self._bufs[k] = self._new(_capacity(nbytes))
                    return _typed(buf, shape, dtype)
            if len(self._bufs) < self.limit:
                buf = self._new(_capacity(nbytes))
                self._bufs.append(buf)
                return _typed(buf, shape, dtype)
            self.fresh += 1
        return _typed(self._new(nbytes), shape, dtype)

    def _new(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)


FREE = 0  # slot flags: FREE, HELD (the consumer received it), or the tag of the pass
HELD = -1  # whose worker lent it (sent, not yet received)


class Lease:
    """Where a worker put a batch's samples: slot, the slot buffer's generation, the
    buffer itself when the consumer may not have it mapped yet (else None), and the
    samples' shape and dtype (from the buffer's first byte).

    Not a tuple on purpose: the DataLoader's pin-memory thread copies every tensor
    it finds in tuples, and the buffer must reach the consumer as itself.
    """

    __slots__ = ("buf", "dtype", "gen", "shape", "slot")

    def __init__(self, slot: int, gen: int, buf: torch.Tensor | None, shape: tuple[int, ...],
                 dtype: str) -> None:
        self.slot, self.gen, self.buf, self.shape, self.dtype = slot, gen, buf, shape, dtype

    def __reduce__(self) -> tuple[Any, ...]:
        return (Lease, (self.slot, self.gen, self.buf, self.shape, self.dtype))


class SharedSlots:
    """Shared-memory batch buffers of one loader's worker processes, `per_worker` slots each.

    Built in the consumer's process before the workers start; travels to each
    worker with the dataset object (inherited over fork, or pickled as
    shared memory). `flags[s]` is FREE, HELD, or the tag of the pass (a number
    that grows with every pass over the data) whose worker lent slot s. A slot
    lent by an earlier pass and never received is free again: the DataLoader
    drops a pass's undelivered batches when the next pass starts (an epoch
    left early). The consumer maps each slot buffer once: a worker sends the buffer
    itself only while `known[s]` (the generation the consumer has mapped)
    differs from the buffer's, and otherwise just its `Lease`, so a batch
    costs no file-descriptor passing (a round trip to the worker, which waits
    while the worker holds the GIL in a read).
    """

    def __init__(self, workers: int, per_worker: int, pin: bool = False) -> None:
        self.per_worker = per_worker
        self.pin = pin  # consumer: page-lock each mapped buffer (cudaHostRegister)
        n = max(1, workers) * per_worker
        self.flags = torch.zeros(n, dtype=torch.int64).share_memory_()
        self.known = torch.zeros(n, dtype=torch.int64).share_memory_()
        self._bufs: dict[int, tuple[int, torch.Tensor]] = {}  # worker: slot -> (gen, buffer)
        self._gen = 0  # worker: generations handed out (buffers allocated)
        self._mapped: dict[int, tuple[int, torch.Tensor]] = {}  # consumer: slot -> (gen, buf)
        self._lent: set[int] = set()  # consumer: slots of batches it received
        self.fresh = 0  # worker side: buffers handed out unpooled

    def __getstate__(self) -> dict[str, Any]:
        return {"per_worker": self.per_worker, "pin": False, "flags": self.flags,
                "known": self.known, "_bufs": {}, "_gen": 0, "_mapped": {}, "_lent": set(),
                "fresh": 0}

    # -- worker side ---------------------------------------------------------------------
    def take(self, worker: int, nbytes: int, tag: int) -> tuple[int, int, torch.Tensor]:
        """(slot, generation, uint8 buffer of >= nbytes) for worker `worker`; slot -1: a
        fresh buffer, not pooled (every slot is lent)."""
        flags = self.flags.numpy()
        first = worker * self.per_worker
        free = [s for s in range(first, first + self.per_worker)
                if flags[s] == FREE or 0 < flags[s] < tag]
        if not free:
            self.fresh += 1
            return -1, 0, torch.empty(nbytes, dtype=torch.uint8)
        # prefer a slot whose buffer is big enough already
        fits = [s for s in free if s in self._bufs and self._bufs[s][1].numel() >= nbytes]
        slot = fits[0] if fits else free[0]
        gen, buf = self._bufs.get(slot, (0, None))
        if buf is None or buf.numel() < nbytes:
            # unique across worker processes (pid), so a restarted worker's buffer is
            # never taken for its predecessor's
            self._gen += 1
            gen = (os.getpid() << 24) | (self._gen & 0xFFFFFF)
            buf = torch.empty(_capacity(nbytes), dtype=torch.uint8).share_memory_()
            self._bufs[slot] = (gen, buf)
        flags[slot] = tag
        return slot, gen, buf

    def lease(self, slot: int, gen: int, buf: torch.Tensor, shape: tuple[int, ...],
              dtype: Any) -> Lease:
        """What the worker sends for samples in slot `slot`: the buffer only if unmapped."""
        mapped = int(self.known.numpy()[slot]) == gen
        return Lease(slot, gen, None if mapped else buf, tuple(shape), np.dtype(dtype).str)

    # -- consumer side -------------------------------------------------------------------
    def receive(self, lease: Lease) -> torch.Tensor:
        """The samples a lease points at (a view of the mapped slot buffer); the slot is lent
        until nothing refers to that view or its storage any more."""
        if lease.buf is not None:
            self._unmap(lease.slot)
            if self.pin:
                _register(lease.buf)
            self._mapped[lease.slot] = (lease.gen, lease.buf)
            self.known[lease.slot] = lease.gen
        gen, buf = self._mapped.get(lease.slot, (None, None))
        if gen != lease.gen or buf is None:
            raise RuntimeError(f"loader slot {lease.slot} generation {lease.gen} was never "
                               f"mapped (have {gen}): internal buffer protocol error")
        self._lent.add(lease.slot)
        self.flags[lease.slot] = HELD
        return _typed(buf, lease.shape, np.dtype(lease.dtype))

    def release(self) -> None:
        """Hand back every lent slot nothing refers to any more."""
        for slot in list(self._lent):
            if _users(self._mapped[slot][1]) == 1:  # only `_mapped` refers to it
                self._lent.discard(slot)
                self.flags[slot] = FREE

    def new_workers(self) -> None:
        """Before new worker processes start: forget every mapping not in use (their
        buffers die with the old workers)."""
        known = self.known.numpy()
        for s in list(self._mapped):
            if s not in self._lent:
                self._unmap(s)
                known[s] = 0

    def _unmap(self, slot: int) -> None:
        """Drop the consumer's mapping of `slot` (views still held keep the memory)."""
        entry = self._mapped.pop(slot, None)
        if entry is not None and self.pin:
            _unregister(entry[1])

    def close(self) -> None:
        for s in list(self._mapped):
            self._unmap(s)
        self._lent.clear()
        self._bufs.clear()


def _register(buf: torch.Tensor) -> None:
    """Page-lock a mapped shared buffer in place, so host-to-device copies from it are
    asynchronous DMA with no staging copy (what `pin_memory()` gives, without the copy)."""
    err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel(), 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of a {buf.numel()}-byte loader buffer failed "
                           f"({err}); run without pinned memory")


def _unregister(buf: torch.Tensor) -> None:
    # copies from it have finished: the training loop synchronises after each transfer
    torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
