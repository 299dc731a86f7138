"""PyTorch `DataLoader` plumbing shared by the hdf5, netcdf, lmdb and files loaders.

The sampler hands each worker a whole batch of indices (`batch_size=None`,
one key per batch), the worker reads it with the format's `BatchReader` and
preprocesses it as one batch. The batch is read (or preprocessed) straight
into a buffer the worker reuses (`_buffers.SharedSlots`: shared memory,
handed back once the consumer lets go of it), so no batch is allocated,
zeroed or copied into shared memory on its way; there is no collate step.
Worker processes run single-threaded (the DataLoader sets torch's threads to 1;
nothing on the read path uses BLAS). Worker failures come back as values and are
re-raised in the main process as the same `iobench` error, naming the file.
`worker_type="thread"` uses a small prefetching thread pool instead
(PyTorch has no thread workers), to show what HDF5's global lock and
netCDF's lack of thread safety cost.
"""

from __future__ import annotations

import collections
import math
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from iobench.core import errors
from iobench.core.errors import DatasetError, UnsupportedError
from iobench.core.manifest import Manifest
from iobench.loaders import _preprocess
from iobench.loaders._buffers import Lease, LocalPool, SharedSlots, typed_array
from iobench.loaders._preprocess import DecodeError, delivers_raw, finish_of, to_batch
from iobench.loaders._reader import BatchReader, EpochOrder, check_files
from iobench.loaders.base import Batch, Loader, LoaderConfig


class WorkerFailure:
    """An exception raised in a worker, carried back as a value (picklable)."""

    def __init__(self, exc: BaseException) -> None:
        self.type_name = type(exc).__name__
        self.message = str(exc)
        self.is_iobench = isinstance(exc, errors.IobenchError)
        self.trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

    def reraise(self) -> None:
        cls = getattr(errors, self.type_name, None) if self.is_iobench else None
        if isinstance(cls, type) and issubclass(cls, errors.IobenchError):
            raise cls(self.message)
        raise RuntimeError(f"loader worker failed with {self.type_name}: {self.message}\n"
                           f"worker traceback:\n{self.trace}")


WARM_UP = -1  # the epoch of a warm-up key: load libraries, read nothing


class Delivery(NamedTuple):
    """A batch from a worker process: small arrays by value (pickled into the pipe), the
    samples as a `Lease` on a shared slot (or a tensor, when no slot was free). Its
    `Finish` is the loader's own (`BatchFetcher.finish`): not pickled with every batch."""

    samples: Lease | torch.Tensor
    labels: np.ndarray
    indices: np.ndarray
    payload_bytes: int
    offsets: np.ndarray | None
    timing: tuple[int, int, int, int] | None


Fetched = Delivery | Batch | WorkerFailure | None  # what a worker hands back for a batch key


class BatchFetcher(Dataset[Fetched]):
    """Map-style dataset whose key is (epoch, indices of one batch, pass tag); returns a
    `Delivery` (process workers) or a `Batch`."""

    def __init__(self, reader: BatchReader, dataset: str, seed: int, decode: bool,
                 convert: str = "device", slots: SharedSlots | None = None,
                 local: LocalPool | None = None) -> None:
        self.reader, self.dataset, self.seed, self.decode = reader, dataset, seed, decode
        self.convert = convert
        self.slots = slots  # shared buffers, used in worker processes
        self.local = local  # buffers of the consumer's own process (no workers, threads)
        self.scratch = LocalPool(2)  # intermediate arrays (raw samples before a crop)
        self.raw_delivered = delivers_raw(dataset, decode, convert)
        self.finish = finish_of(dataset, decode, convert)  # every batch's

    def __getitem__(self, key: tuple[int, np.ndarray, int]
                    ) -> Fetched:
        epoch, idx, tag = key
        if epoch == WARM_UP:
            try:
                self.reader.warm_up()
                _preprocess.warm_up(self.dataset, self.decode)
            except Exception as e:
                return WorkerFailure(e)
            return None
        info = torch.utils.data.get_worker_info()
        lease: list[Lease] = []
        slots = self.slots if info is not None else None

        def deliver(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            if slots is None or info is None:  # one is None exactly when the other is
                pool = self.local if self.local is not None else self.scratch
                return pool.array(shape, dtype)
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            slot, gen, buf = slots.take(info.id, nbytes, tag)
            if slot >= 0:
                lease.append(slots.lease(slot, gen, buf, shape, dtype))
            return typed_array(buf, shape, dtype)

        try:
            t0 = time.perf_counter_ns()
            raw = self.reader.read(idx, deliver if self.raw_delivered else self.scratch.array)
            t1 = time.perf_counter_ns()
            try:
                b = to_batch(self.dataset, raw, idx, self.seed, epoch, self.decode,
                             self.convert, deliver)
                t2 = time.perf_counter_ns()
                b = b._replace(timing=(t1 - t0, t2 - t1, t2, info.id if info is not None else -1))
            except DecodeError as e:
                raise DatasetError(f"cannot decode sample {e.index} stored in "
                                   f"{self.reader.where(e.index)} ({e.cause}); the file is "
                                   "damaged: regenerate or re-stage the dataset") from None
        except Exception as e:  # surfaced in the main process by `unwrap`
            if slots is not None:
                for ls in lease:  # never sent: free again
                    slots.flags[ls.slot] = 0
            return WorkerFailure(e)
        if slots is None:
            return b
        return Delivery(lease[0] if lease else b.samples, b.labels.numpy(), b.indices.numpy(),
                        b.payload_bytes, None if b.offsets is None else b.offsets.numpy(),
                        b.timing)

    def __len__(self) -> int:
        return self.reader.manifest.num_samples


class EpochBatches(Sampler[tuple[int, np.ndarray, int]]):
    """Yields (epoch, batch indices) keys of the epoch set before each `iter()`."""

    def __init__(self, order: EpochOrder, batch_size: int) -> None:
        # no reference to the loader: a cycle through the DataLoader would leave its
        # workers to the garbage collector, which shuts them down only after a timeout
        self.order, self.batch_size = order, batch_size
        self.epoch = 0
        self.start = 0  # samples of the epoch's order left out (a resumed epoch's trained)
        self.tag = 1  # this pass's tag: marks the shared slots its batches are lent in
        self.warm_up = 0  # > 0: the next iteration yields this many warm-up keys only

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, int]]:
        if self.warm_up:
            # the DataLoader hands keys to its workers in turn: one each
            yield from ((WARM_UP, np.empty(0, dtype=np.int64), 0)
                        for _ in range(self.warm_up))
            return
        idx = self.order(self.epoch, self.start)
        bs = self.batch_size
        for s in range(0, len(idx), bs):
            yield self.epoch, idx[s:s + bs], self.tag

    def __len__(self) -> int:
        if self.warm_up:
            return self.warm_up
        return -(-len(self.order(self.epoch, self.start)) // self.batch_size)


def _identity(x: Any) -> Any:
    return x


def _ignore_interrupts(worker_id: int) -> None:
    """Workers leave SIGINT/SIGTERM to the main process, which stops them in order (a worker
    that dies of Ctrl-C mid-hand-off prints tracebacks, and can break the main's pipe)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _a_worker_ended(it: Any) -> bool:
    """Whether a worker process of DataLoader iterator `it` has ended mid-epoch (killed):
    torch says so only in its error's text, so ask the processes themselves."""
    return any(w.exitcode is not None for w in getattr(it, "_workers", ()))


def unwrap(item: Batch | WorkerFailure | None) -> Batch:
    if isinstance(item, WorkerFailure):
        item.reraise()
    return item  # type: ignore[return-value]


def thread_prefetch(fetch: Callable[[Any], Any], keys: Iterator[Any], pool: ThreadPoolExecutor,
                    depth: int) -> Iterator[Any]:
    """Run `fetch` over `keys` on `pool`, at most `depth` in flight, results in key order."""
    pending: collections.deque[Future[Any]] = collections.deque()
    try:
        for key in keys:
            pending.append(pool.submit(fetch, key))
            if len(pending) >= depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


class TorchLoader(Loader):
    """A DataLoader (or thread pool) over one format's `BatchReader`."""

    reader_cls: ClassVar[type[BatchReader]]

    def __init__(self, dataset: Manifest | str | Path, config: LoaderConfig,
                 rank: int = 0, world: int = 1) -> None:
        super().__init__(dataset, config, rank, world)
        m = self.manifest
        if m.format != self.name:
            raise DatasetError(f"loader {self.name!r} cannot read {m.root}: it is a "
                               f"{m.format!r} dataset; use the {m.format!r} or 'dali' loader")
        self.check()
        self.reader = self.reader_cls(m, library_cache=config.library_cache)
        if config.shuffle == "block":  # each block is read whole within a few batches
            self.reader.prefetch_block = config.block_size
        threads = config.workers > 0 and config.worker_type == "thread"
        pin = config.pin_memory and torch.cuda.is_available()
        # enough buffers for the batches in flight plus the two a consumer holds while it
        # asks for the next (more are allocated, not waited for)
        in_flight = config.prefetch + 2
        self.slots = SharedSlots(config.workers, in_flight, pin=pin) \
            if config.workers > 0 and not threads else None
        local = LocalPool(config.workers * config.prefetch + 2 if threads else in_flight,
                          pin=pin) if self.slots is None else None
        self.fetcher = BatchFetcher(self.reader, _preprocess.pipeline(m), config.seed, config.decode,
                                    config.convert, self.slots, local)
        self.finish = self.fetcher.finish  # attached to each batch here, never pickled with it
        self.sampler = EpochBatches(EpochOrder(self), config.batch_size)
        self._dl: DataLoader[Fetched] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def check(self) -> None:
        """Cheap pre-flight in the main process: every data file is there, at its size."""
        check_files(self.manifest)

    def _dataloader(self) -> DataLoader[Fetched]:
        if self._dl is None:
            c = self.config
            kw: dict[str, Any] = {}
            if c.workers > 0:
                kw = {"prefetch_factor": c.prefetch, "persistent_workers": c.persistent_workers,
                      "worker_init_fn": _ignore_interrupts}
            self._dl = DataLoader(self.fetcher, batch_size=None, sampler=self.sampler,
                                  num_workers=c.workers, collate_fn=_identity,
                                  pin_memory=c.pin_memory and torch.cuda.is_available(), **kw)
        return self._dl

    def start(self) -> None:
        """Start the worker processes and import their libraries (one warm-up key each)."""
        c = self.config
        if c.workers > 0 and c.worker_type == "thread":
            self.reader.warm_up()
            _preprocess.warm_up(_preprocess.pipeline(self.manifest), c.decode)
            return
        if c.workers == 0 or not c.persistent_workers:
            # in-process reading (or workers that restart every epoch): import here
            self.reader.warm_up()
            _preprocess.warm_up(_preprocess.pipeline(self.manifest), c.decode)
            return
        self.sampler.warm_up = c.workers
        try:
            for item in self._iterate():
                if item is not None:
                    unwrap(item)
        finally:
            self.sampler.warm_up = 0

    def cache_settings(self) -> dict[str, Any]:
        return self.reader.user_cache()

    def _iterate(self) -> Iterator[Any]:
        """The DataLoader's items, with a worker's death turned into one clear error."""
        it = iter(self._dataloader())
        while True:
            try:
                item = next(it)
            except StopIteration:
                return
            except RuntimeError as e:  # a worker killed (OOM killer, signal), not a read error
                if not _a_worker_ended(it):
                    raise
                self._dl = None  # its workers are gone: start fresh next epoch
                raise UnsupportedError(f"a {self.name} loader worker died: {e}; if it ran "
                                       "out of memory, use fewer --workers or a smaller "
                                       "batch") from e
            yield item

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        c = self.config
        # the keys the sampler hands out start there: the earlier batches are never read
        self.sampler.start = self.start_sample(start_step)
        if c.workers > 0 and c.worker_type == "thread":
            if self._pool is None:
                self._pool = ThreadPoolExecutor(c.workers, thread_name_prefix=f"iobench-{self.name}")
            self.sampler.epoch = epoch
            pin = c.pin_memory and torch.cuda.is_available()
            for item in thread_prefetch(self.fetcher.__getitem__, iter(self.sampler), self._pool,
                                        c.workers * c.prefetch):
                b = unwrap(item)
                yield _pin(b) if pin and not b.samples.is_pinned() else b
            return
        self.sampler.epoch = epoch
        slots = self.slots
        if slots is None:
            for item in self._iterate():
                yield unwrap(item)
            return
        self.sampler.tag += 1
        if self._dl is None or not c.persistent_workers:
            slots.new_workers()
        slots.release()  # what the consumer dropped since the last epoch (left early)
        try:
            for item in self._iterate():
                if isinstance(item, Delivery):
                    x = item.samples
                    samples = slots.receive(x) if isinstance(x, Lease) else x
                    off = None if item.offsets is None else torch.from_numpy(item.offsets)
                    b = Batch(samples, torch.from_numpy(item.labels),
                              torch.from_numpy(item.indices), item.payload_bytes, off,
                              self.finish, item.timing)
                    del samples, x
                else:
                    b = unwrap(item)
                del item
                yield b
                del b
                slots.release()  # the consumer asks for the next batch: take back the dropped
        finally:
            slots.release()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._dl is not None:
            it = getattr(self._dl, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
            self._dl = None
        self.reader.close()
        if self.slots is not None:
            self.slots.close()


def _pin(b: Batch) -> Batch:
    return b._replace(samples=b.samples.pin_memory(), labels=b.labels.pin_memory())
