"""Zarr v3 loader: zarr-python selections per batch, decoded into the batch, PyTorch DataLoader.

Layout (docs/design.md): the dataset root is a Zarr group; `samples` (or `jpeg`,
variable-length bytes) has one inner chunk per sample and one shard file per
`samples_per_file` samples, `labels` one chunk per shard. A batch of small samples
(and of JPEGs) is one zarr-python orthogonal selection in batch order, decoded
straight into the batch array (`out=`), whose inner chunks zarr fetches
concurrently; a batch of large samples (over SMALL_SAMPLE bytes, e.g. cosmoflow's
16 MB) is one basic selection per run of consecutive samples, READ_THREADS at a
time, each decoded straight into its rows. zarr reads an inner chunk with a
partial read of its shard, located through the shard index. Labels are read once per shard
and process, and so are the shard indexes, which give each sample's stored size
and let a batch's chunks be prefetched together (`posix_fadvise(WILLNEED)`). zarr-python's LocalStore keeps no chunk cache: nothing carries samples from
one cold epoch to the next. Reading runs on zarr's own I/O thread in each process
(zarr resets it after a fork, so DataLoader workers each start their own).

`payload_bytes`: each sample's inner chunk as stored (from the shard index: the
array bytes, or their compressed bytes, and a 4-byte crc32c); JPEG the JPEG bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from iobench.core.errors import IobenchError
from iobench.core.manifest import Manifest
from iobench.core.records import zarr_quiet
from iobench.loaders._reader import BatchReader, contiguous_runs, split_by_file, willneed
from iobench.loaders._torch import TorchLoader

_INDEX_ENTRY = 16  # a shard index entry: (offset, nbytes), two little-endian uint64
_INDEX_CRC = 4  # the index's crc32c, after it (zarr's default index codecs)


_POOL: dict[int, ThreadPoolExecutor] = {}  # pid -> this process's read threads
READ_THREADS = 8  # runs of a batch of large samples read at once
SMALL_SAMPLE = 1 << 20  # bytes; up to this, a batch is one orthogonal selection


def _pool() -> ThreadPoolExecutor:
    """This process's read threads (a forked worker starts its own)."""
    pool = _POOL.get(os.getpid())
    if pool is None:
        _POOL.clear()
        pool = _POOL[os.getpid()] = ThreadPoolExecutor(READ_THREADS,
                                                       thread_name_prefix="iobench-zarr")
    return pool



class ZarrReader(BatchReader):
    """Reads batches from an iobench Zarr v3 store."""

    format = "zarr"

    def __init__(self, manifest: Manifest, library_cache: bool = False) -> None:
        super().__init__(manifest, library_cache)
        self.data_name = "jpeg" if self.kind == "jpeg" else "samples"
        self.item = (int(np.prod(self.sample_shape)) * self.sample_dtype.itemsize
                     if self.sample_shape is not None else 0)

    def warm_up(self) -> None:
        import zarr  # noqa: F401 - a third of a second: in the worker, before the clock

    def user_cache(self) -> dict[str, Any]:
        return {"zarr": "no chunk cache (LocalStore reads every chunk from its file)"}

    def _arrays(self) -> dict[str, Any]:
        """This process's and thread's open group: its arrays and per-shard caches."""
        st = self._state()
        if "data" not in st:
            import zarr
            from zarr.storage import LocalStore

            try:
                with zarr_quiet():
                    g = zarr.open_group(LocalStore(self.root, read_only=True),
                                        mode="r")
                    data = g[self.data_name]
                    if not isinstance(data, zarr.Array):
                        raise ValueError(f"{self.data_name} is a group, not an array")
                    # samples per shard: the shard index has this many entries, the last
                    # shard's included (whatever it holds)
                    per = (data.shards or data.chunks)[0]
                    st.update(data=data, labels=g["labels"], per=per, label_of={},
                              index_of={})
            except (KeyError, ValueError, OSError) as e:
                raise self.fail(self.root / "zarr.json", "zarr cannot open the group",
                                e) from None
        return st

    def _shard_labels(self, pos: int) -> np.ndarray:
        st = self._arrays()
        lab = st["label_of"].get(pos)
        if lab is None:
            lo, n = int(self.starts[pos]), int(self.counts[pos])
            lab = st["label_of"][pos] = self._guard(
                lambda: st["labels"][lo:lo + n], [pos]).astype(self.label_dtype, copy=False)
        labels: np.ndarray = lab
        return labels

    def _shard_index(self, pos: int) -> np.ndarray:
        """Shard `pos`'s index, [n, 2] (byte offset, stored bytes) of each sample's inner
        chunk, read once per process (zarr's sharding format: the index at the shard's end,
        little-endian uint64 pairs, then its crc32c)."""
        st = self._arrays()
        index = st["index_of"].get(pos)
        if index is None:
            per, path = st["per"], self.paths[pos]
            size = per * _INDEX_ENTRY + _INDEX_CRC
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    tail = os.pread(fd, size, os.fstat(fd).st_size - size)
                finally:
                    os.close(fd)
            except OSError as e:
                raise self.fail(path, "cannot read its shard index", e) from None
            if len(tail) != size:
                raise self.fail(path, f"shard index is {len(tail)} bytes, expected {size}")
            entries = np.frombuffer(tail[:-_INDEX_CRC], dtype="<u8").reshape(per, 2)
            index = st["index_of"][pos] = entries[:int(self.counts[pos])].astype(np.int64)
        found: np.ndarray = index
        return found

    def _guard(self, read: Callable[[], Any], shards: list[int]) -> Any:
        """`read()`, with a failure inside zarr turned into an error naming the shard file."""
        try:
            with zarr_quiet():
                return read()
        except IobenchError:
            raise
        except Exception as e:  # zarr and its codecs raise many kinds for damaged files
            culprit = shards[0]
            data = self._arrays()["data"]
            for pos in shards if len(shards) > 1 else ():  # which shard is it?
                lo = int(self.starts[pos])
                try:
                    with zarr_quiet():
                        data[lo:lo + int(self.counts[pos])]
                except Exception:
                    culprit = pos
                    break
            raise self.fail(self.paths[culprit], "zarr cannot read it",
                            RuntimeError(f"{type(e).__name__}: {e}")) from None

    def _meta(self, sorted_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Labels and stored bytes of a sorted batch, and the shards it touches; the batch's
        inner chunks are handed to the kernel to fetch (posix_fadvise WILLNEED) before zarr
        reads them one by one, so a cold batch's I/O is in flight together."""
        labels = np.empty((len(sorted_idx), *self.label_shape), dtype=self.label_dtype)
        stored = np.empty(len(sorted_idx), dtype=np.int64)
        shards = []
        for pos, s, e in split_by_file(self, sorted_idx):
            local = sorted_idx[s:e] - self.starts[pos]
            labels[s:e] = self._shard_labels(pos)[local]
            index = self._shard_index(pos)[local]
            stored[s:e] = index[:, 1]
            try:
                fd = os.open(self.paths[pos], os.O_RDONLY)
                try:
                    willneed(fd, list(zip(index[:, 0].tolist(), index[:, 1].tolist(),
                                          strict=True)))
                finally:
                    os.close(fd)
            except OSError as e:
                raise self.fail(self.paths[pos], "cannot open it", e) from None
            shards.append(pos)
        return labels, stored, shards

    def _read_sorted_arrays(self, sorted_idx: np.ndarray, order: np.ndarray,
                            out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from zarr.core.buffer import default_buffer_prototype

        labels, stored, shards = self._meta(sorted_idx)
        data, nd = self._arrays()["data"], default_buffer_prototype().nd_buffer
        if self.item <= SMALL_SAMPLE:
            # one orthogonal selection in batch order, decoded into the batch array itself
            in_batch_order = np.empty_like(sorted_idx)
            in_batch_order[order] = sorted_idx
            self._guard(lambda: data.get_orthogonal_selection(
                (in_batch_order,), out=nd.from_numpy_array(out)), shards)
            return labels, stored
        # large samples: one basic selection per run of consecutive samples, decoded straight
        # into its rows of the batch, the runs read concurrently (an orthogonal selection
        # indexes every element: seconds per batch of 16 MB samples)
        runs = []
        for a, b in contiguous_runs(sorted_idx):
            dest = order[a:b]
            direct = b - a == 1 or bool(np.all(np.diff(dest) == 1))
            buf = out[int(dest[0]):int(dest[0]) + b - a] if direct else \
                np.empty((b - a, *out.shape[1:]), dtype=out.dtype)
            runs.append((int(sorted_idx[a]), buf, None if direct else dest))

        def one(run: tuple[int, np.ndarray, np.ndarray | None]) -> None:
            lo, buf, dest = run
            data.get_basic_selection(slice(lo, lo + len(buf)), out=nd.from_numpy_array(buf))
            if dest is not None:
                out[dest] = buf

        self._guard(lambda: list(_pool().map(one, runs)), shards)
        return labels, stored

    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[Any], np.ndarray, np.ndarray]:
        labels, _, shards = self._meta(sorted_idx)
        data = self._arrays()["data"]
        blobs = self._guard(lambda: data.get_orthogonal_selection((sorted_idx,)), shards)
        parts = list(blobs)
        return parts, labels, np.array([len(p) for p in parts], dtype=np.int64)


class ZarrLoader(TorchLoader):
    """PyTorch DataLoader over a Zarr v3 store (zarr-python)."""

    name = "zarr"
    reader_cls = ZarrReader
