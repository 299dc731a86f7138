"""LMDB loader: one sorted `getmulti` per file per batch, PyTorch DataLoader.

Layout (docs/design.md): single-file environments, key = global index as
8-byte big-endian, value = 16-byte header `<4s B B H I I>` (magic `IOBR`,
version 1, flags, reserved, label bytes, payload bytes), label bytes, payload
bytes. Environments are opened read-only, lock-free and without readahead
(random access on shared filesystems), lazily in each worker and thread; a
read transaction per batch. Fixed-size payloads are copied once, straight
from the memory map into the batch array.

`payload_bytes`: the value bytes of each record (header, label, payload).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from iobench.loaders._reader import BatchReader, split_by_file
from iobench.loaders._torch import TorchLoader

HEADER = struct.Struct("<4sBBHII")
MAGIC = b"IOBR"
VERSION = 1


def _keys(idx: np.ndarray) -> list[bytes]:
    kb = np.ascontiguousarray(idx, dtype=">u8").tobytes()
    return [kb[i:i + 8] for i in range(0, len(kb), 8)]


class LMDBReader(BatchReader):
    """Reads batches from iobench LMDB environments."""

    format = "lmdb"

    def __init__(self, manifest: Any) -> None:
        super().__init__(manifest)
        self.label_nbytes = int(np.prod(self.label_shape)) * self.label_dtype.itemsize
        self.sample_nbytes = (int(np.prod(self.sample_shape)) * self.sample_dtype.itemsize
                              if self.sample_shape is not None else None)

    def _env(self, pos: int) -> Any:
        st = self._state()
        env = st.get(pos)
        if env is None:
            import lmdb

            path = self.paths[pos]
            try:
                env = lmdb.open(str(path), subdir=False, readonly=True, lock=False,
                                readahead=False, meminit=False, max_readers=4096)
            except lmdb.Error as e:
                raise self.fail(path, "LMDB cannot open it", e) from None
            st[pos] = env
        return env

    def _close_state(self, state: dict[str, Any]) -> None:
        for env in state.values():
            env.close()

    def _get(self, pos: int, local_idx: np.ndarray, fn: Any) -> None:
        """Call fn(k, value) for each sorted key of file `pos`, inside one read transaction."""
        import lmdb

        path = self.paths[pos]
        try:
            with self._env(pos).begin(buffers=True) as txn:
                items = txn.cursor().getmulti(_keys(local_idx))
                if len(items) != len(local_idx):
                    found = {bytes(k) for k, _ in items}
                    missing = [int(i) for i, k in zip(local_idx, _keys(local_idx), strict=True)
                               if k not in found]
                    raise self.fail(path, f"samples {missing[:5]} are missing")
                for k, (_, value) in enumerate(items):
                    fn(k, value)
        except lmdb.Error as e:
            raise self.fail(path, "LMDB read failed", e) from None

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
        hl = HEADER.size + self.label_nbytes
        for pos, s, e in split_by_file(self, sorted_idx):
            path, dest = self.paths[pos], order[s:e].tolist()

            def put(k: int, value: Any, s: int = s, dest: list[int] = dest, path: Any = path
                    ) -> None:
                _, npayload = self._header(path, int(sorted_idx[s + k]), value)
                if npayload != self.sample_nbytes:
                    raise self.fail(path, f"record {int(sorted_idx[s + k])} holds {npayload} "
                                          f"payload bytes, expected {self.sample_nbytes}")
                lab_bytes[s + k] = np.frombuffer(value, np.uint8, self.label_nbytes,
                                                 HEADER.size)
                out_bytes[dest[k]] = np.frombuffer(value, np.uint8, npayload, hl)
                stored[s + k] = len(value)

            self._get(pos, sorted_idx[s:e], put)
        return labels, stored

    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[Any], np.ndarray, np.ndarray]:
        parts: list[Any] = [None] * len(sorted_idx)
        labels = np.empty((len(sorted_idx), *self.label_shape), dtype=self.label_dtype)
        lab_bytes = labels.reshape(len(sorted_idx), -1).view(np.uint8)
        stored = np.empty(len(sorted_idx), dtype=np.int64)
        hl = HEADER.size + self.label_nbytes
        for pos, s, e in split_by_file(self, sorted_idx):
            path = self.paths[pos]

            def put(k: int, value: Any, s: int = s, path: Any = path) -> None:
                self._header(path, int(sorted_idx[s + k]), value)
                lab_bytes[s + k] = np.frombuffer(value, np.uint8, self.label_nbytes,
                                                 HEADER.size)
                parts[s + k] = bytes(value[hl:])  # the buffer dies with the transaction
                stored[s + k] = len(value)

            self._get(pos, sorted_idx[s:e], put)
        return parts, labels, stored


class LMDBLoader(TorchLoader):
    """PyTorch DataLoader over LMDB environments."""

    name = "lmdb"
    reader_cls = LMDBReader
