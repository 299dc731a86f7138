"""LMDB loader: one sorted `getmulti` per file per batch, PyTorch DataLoader.

Layout (docs/design.md): single-file environments, key = global index as
8-byte big-endian, value = the record of `iobench.core.records` (16-byte header,
label bytes, payload bytes). Environments are opened read-only, lock-free and without readahead
(random access on shared filesystems), lazily, once per process (shared by its
threads, closed before a fork); one read transaction per file per batch. Fixed-size payloads are copied once, straight
from the memory map into the batch array. A batch's value pages are requested
together (`madvise(WILLNEED)`, readahead being off), and after each batch the
process unmaps the file (`madvise(DONTNEED)` over its mapping; the pages stay
in the page cache): pages a process maps cannot be evicted, and iobench
evicts the dataset before every epoch.

`payload_bytes`: the value bytes of each record (header, label, payload).

The user's own environments (`--data`, iobench/core/userdata.py) are read by the
same code with the manifest's layout: keys the indices in ASCII (zero-padded
or not) or 8-byte big-endian, each value a `.npy` (payload after its header)
or JPEG bytes, and the labels one more `.npy` record, read once per process.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from iobench.core.records import HEADER, MAGIC, VERSION
from iobench.loaders._reader import (
    BatchReader,
    file_mappings,
    madvise_willneed,
    split_by_file,
    unmap_pages,
)
from iobench.loaders._torch import TorchLoader


class _Environments:
    """This process's LMDB environments, shared by its readers and threads.

    py-lmdb refuses to open an environment twice in one process, and its
    registry of open files survives a fork: a child could never open what its
    parent had open. So every environment is closed just before the process
    forks (waiting for read transactions in flight to end) and reopened on
    next use; the child starts with an empty registry.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.envs: dict[str, Any] = {}  # path -> open environment
        self.maps: dict[str, list[tuple[int, int]]] = {}  # path -> its mapping(s)
        self.users: dict[str, int] = {}  # path -> readers holding it
        self.active = 0  # read transactions in flight

    def acquire(self, path: Path) -> None:
        with self.cond:
            self.users[str(path)] = self.users.get(str(path), 0) + 1

    def release(self, path: Path) -> None:
        with self.cond:
            key = str(path)
            self.users[key] = self.users.get(key, 1) - 1
            if self.users[key] <= 0:
                del self.users[key]
                env = self.envs.pop(key, None)
                self.maps.pop(key, None)
                if env is not None:
                    env.close()

    def begin(self, path: Path, reader: BatchReader) -> Any:
        """The environment at `path`, opened if needed; pair with `end()`."""
        import lmdb

        with self.cond:
            key = str(path)
            env = self.envs.get(key)
            if env is None:
                try:
                    env = lmdb.open(key, subdir=False, readonly=True, lock=False,
                                    readahead=False, meminit=False, max_readers=4096)
                except lmdb.Error as e:
                    raise reader.fail(path, "LMDB cannot open it", e) from None
                self.envs[key] = env
                self.maps[key] = file_mappings(key)
            self.active += 1
            return env

    def end(self, path: Path) -> None:
        """A read transaction on `path` ended: unmap its pages if no other is in flight."""
        with self.cond:
            self.active -= 1
            if self.active == 0:
                # pages a process maps cannot be evicted: let go of them (they stay in the
                # page cache) so the next epoch can start cold with the environment open
                unmap_pages(self.maps.get(str(path), []))
            self.cond.notify_all()

    def before_fork(self) -> None:
        self.cond.acquire()
        while self.active:
            self.cond.wait()
        for env in self.envs.values():
            env.close()
        self.envs.clear()
        self.maps.clear()

    def after_fork_parent(self) -> None:
        self.cond.release()

    def after_fork_child(self) -> None:
        self.__init__()  # type: ignore[misc]


_ENVS = _Environments()
os.register_at_fork(before=_ENVS.before_fork, after_in_parent=_ENVS.after_fork_parent,
                    after_in_child=_ENVS.after_fork_child)


def _keys(idx: np.ndarray, width: int | None = None) -> list[bytes]:
    """The keys of sample indices: 8-byte big-endian (width None), else ASCII decimal
    zero-padded to `width` digits (0: not padded), as the user's data may have them."""
    if width is not None:
        return [b"%0*d" % (width, i) for i in idx.tolist()]
    kb = np.ascontiguousarray(idx, dtype=">u8").tobytes()
    return [kb[i:i + 8] for i in range(0, len(kb), 8)]


class LMDBReader(BatchReader):
    """Reads batches from iobench LMDB environments."""

    format = "lmdb"

    def __init__(self, manifest: Any, library_cache: bool = False) -> None:
        super().__init__(manifest, library_cache)
        self.label_nbytes = int(np.prod(self.label_shape)) * self.label_dtype.itemsize
        self.sample_nbytes = (int(np.prod(self.sample_shape)) * self.sample_dtype.itemsize
                              if self.sample_shape is not None else None)
        # iobench's records (header, label, payload), or the user's data (`--data`): values
        # that are .npy or JPEG bytes, labels in one more record (iobench/core/userdata.py)
        lay = manifest.layout
        self.record: str = lay.get("values", "iobench")
        self.npy_header: int = lay.get("npy_header", 0)
        self.key_width: int | None = lay.get("key_width") if lay.get("key") == "ascii" else None

    def warm_up(self) -> None:
        import lmdb  # noqa: F401

    def user_cache(self) -> dict[str, Any]:
        return {"lmdb": "memory map only, unmapped after each batch (pages can be evicted)"}

    def _hold(self, pos: int) -> None:
        """Count this reader as a user of file `pos`'s environment (once per process)."""
        if getattr(self, "_held_pid", None) != os.getpid():  # new, or inherited over a fork
            self._held: set[int] = set()
            self._held_pid = os.getpid()
        if pos not in self._held:
            _ENVS.acquire(self.paths[pos])
            self._held.add(pos)

    def __getstate__(self) -> dict[str, Any]:
        d = super().__getstate__()
        d.pop("_held", None)
        d.pop("_held_pid", None)
        return d

    def close(self) -> None:
        if getattr(self, "_held_pid", None) == os.getpid():
            for pos in self._held:
                _ENVS.release(self.paths[pos])
            self._held.clear()
        super().close()

    def _get(self, pos: int, local_idx: np.ndarray, fn: Any) -> None:
        """Call fn(k, value) for each sorted key of file `pos`, inside one read transaction."""
        import lmdb

        path = self.paths[pos]
        self._hold(pos)
        env = _ENVS.begin(path, self)
        try:
            with env.begin(buffers=True) as txn:
                keys = _keys(local_idx, self.key_width)
                items = txn.cursor().getmulti(keys)
                if len(items) != len(local_idx):
                    found = {bytes(k) for k, _ in items}
                    missing = [int(i) for i, k in zip(local_idx, keys, strict=True)
                               if k not in found]
                    raise self.fail(path, f"samples {missing[:5]} are missing")
                # readahead is off (random access): ask for every value's pages at once,
                # rather than one synchronous page fault at a time while copying
                values = [v for _, v in items]
                madvise_willneed(values)
                for k, value in enumerate(values):
                    fn(k, value)
        except lmdb.Error as e:
            raise self.fail(path, "LMDB read failed", e) from None
        finally:
            _ENVS.end(path)

    def _labels(self) -> np.ndarray | None:
        """The user's labels record, read once per process (None: labels are in each record)."""
        if self.record == "iobench":
            return None
        st = self._state()
        if "labels" not in st:
            import io

            import lmdb

            path, key = self.paths[0], self.manifest.layout["label_key"].encode("latin-1")
            self._hold(0)
            env = _ENVS.begin(path, self)
            try:
                with env.begin() as txn:
                    value = txn.get(key)
                lab = np.load(io.BytesIO(value or b""), allow_pickle=False)
            except (lmdb.Error, ValueError, OSError) as e:
                raise self.fail(path, f"cannot load the labels record {key!r}", e) from None
            finally:
                _ENVS.end(path)
            if lab.shape != (self.manifest.num_samples,):
                raise self.fail(path, f"labels record {key!r} has shape {lab.shape}, expected "
                                      f"({self.manifest.num_samples},)")
            st["labels"] = lab.astype(self.label_dtype, copy=False)
        labels: np.ndarray = st["labels"]
        return labels

    def _record(self, path: Any, idx: int, value: Any) -> tuple[int, int]:
        """(offset, length) of the payload in one record, checked."""
        if self.record == "iobench":
            nlabel, npayload = self._header(path, idx, value)
            return HEADER.size + nlabel, npayload
        if self.record == "npy":
            if bytes(value[:6]) != b"\x93NUMPY" or len(value) != self.npy_header + \
                    (self.sample_nbytes or 0):
                raise self.fail(path, f"record {idx} is not a .npy of {self.sample_dtype}"
                                      f"{list(self.sample_shape or ())} ({len(value)} bytes)")
            return self.npy_header, len(value) - self.npy_header
        return 0, len(value)  # JPEG: the whole value

    def _header(self, path: Any, idx: int, value: Any) -> tuple[int, int]:
        if len(value) < HEADER.size:
            raise self.fail(path, f"record {idx} is {len(value)} bytes, shorter than its header")
        magic, version, _flags, _res, nlabel, npayload = HEADER.unpack_from(value)
        if magic != MAGIC or version != VERSION or nlabel != self.label_nbytes \
                or len(value) != HEADER.size + nlabel + npayload:
            raise self.fail(path, f"record {idx} has a bad header (magic {magic!r}, version "
                                  f"{version}, {nlabel}+{npayload} bytes in a {len(value)}-byte value)")
        return nlabel, npayload

    def _read_sorted_arrays(self, sorted_idx: np.ndarray, order: np.ndarray,
                            out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels = np.empty((len(sorted_idx), *self.label_shape), dtype=self.label_dtype)
        lab_bytes = labels.reshape(len(sorted_idx), -1).view(np.uint8)
        out_bytes = out.reshape(len(out), -1).view(np.uint8)
        stored = np.empty(len(sorted_idx), dtype=np.int64)
        table = self._labels()
        for pos, s, e in split_by_file(self, sorted_idx):
            path, dest = self.paths[pos], order[s:e].tolist()

            def put(k: int, value: Any, s: int = s, dest: list[int] = dest, path: Any = path
                    ) -> None:
                off, npayload = self._record(path, int(sorted_idx[s + k]), value)
                if npayload != self.sample_nbytes:
                    raise self.fail(path, f"record {int(sorted_idx[s + k])} holds {npayload} "
                                          f"payload bytes, expected {self.sample_nbytes}")
                if table is None:
                    lab_bytes[s + k] = np.frombuffer(value, np.uint8, self.label_nbytes,
                                                     HEADER.size)
                out_bytes[dest[k]] = np.frombuffer(value, np.uint8, npayload, off)
                stored[s + k] = len(value)

            self._get(pos, sorted_idx[s:e], put)
        if table is not None:
            labels[...] = table[sorted_idx]
        return labels, stored

    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[Any], np.ndarray, np.ndarray]:
        parts: list[Any] = [None] * len(sorted_idx)
        labels = np.empty((len(sorted_idx), *self.label_shape), dtype=self.label_dtype)
        lab_bytes = labels.reshape(len(sorted_idx), -1).view(np.uint8)
        stored = np.empty(len(sorted_idx), dtype=np.int64)
        table = self._labels()
        for pos, s, e in split_by_file(self, sorted_idx):
            path = self.paths[pos]

            def put(k: int, value: Any, s: int = s, path: Any = path) -> None:
                off, _ = self._record(path, int(sorted_idx[s + k]), value)
                if table is None:
                    lab_bytes[s + k] = np.frombuffer(value, np.uint8, self.label_nbytes,
                                                     HEADER.size)
                parts[s + k] = bytes(value[off:])  # the buffer dies with the transaction
                stored[s + k] = len(value)

            self._get(pos, sorted_idx[s:e], put)
        if table is not None:
            labels[...] = table[sorted_idx]
        return parts, labels, stored


class LMDBLoader(TorchLoader):
    """PyTorch DataLoader over LMDB environments."""

    name = "lmdb"
    reader_cls = LMDBReader
