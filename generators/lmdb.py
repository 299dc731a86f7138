"""LMDB writer (py-lmdb): one single-file environment per `samples_per_file` samples.

Key: the global sample index as 8-byte big-endian unsigned. Value: the record of
`iobench.core.records` (header, label, payload; no pickle). Shapes and dtypes are in the manifest. Keys are written in order with
`append=True`; memory is initialised, so the same seed gives identical files.

Durability: LMDB's own per-commit syncs are off (`sync`, `metasync`). The file is synced
once, by `written_file`'s fsync after its last commit (overlapping its checksum) and before
the rename that gives it its final name, so the manifest, written after every file, never
lists an unsynced one: the contract of fio's `--end_fsync`. An interrupted write leaves
only the temporary name, which is removed or rewritten.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from iobench.core.datasets import DatasetSpec
from iobench.core.errors import DatasetError
from iobench.core.manifest import FileEntry, check_magic
from iobench.core.records import HEADER, MAGIC, VERSION, key
from iobench.generators.base import (
    ContainerWriter,
    Task,
    file_entry,
    sample_blocks,
    start_writeback,
    written_file,
)
from iobench.generators.synth import fill_samples, labels_array, make_sample

TXN_BYTES = 256 << 20  # record bytes per write transaction (LMDB caps a transaction's dirty pages)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc mallopt parameters


@functools.lru_cache(maxsize=1)
def keep_heap() -> bool:
    """Let this process keep the heap that one transaction's dirty pages took (once per process).

    LMDB mallocs each dirty page (overflow runs of a large record at once) and frees them
    all when the environment closes. With glibc's defaults the freed top of the heap goes
    back to the kernel, so every file faults in and zeroes its pages again (16,384 faults
    and ~500 `brk` calls per 67 MB cifar10 file: a third of the writer's system time).
    Kept, the next file reuses them. The heap stays at its peak (about one transaction's
    pages: <= TXN_BYTES plus page overhead) until the process exits; generation's workers
    exit when it ends. Records up to 32 MB (the most glibc allows) come from the heap too
    instead of a fresh mmap each. The files' bytes do not depend on it: LMDB initialises
    every byte it writes (`meminit`). False where glibc's mallopt is missing.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(p, v) == 1 for p, v in ((_M_TRIM_THRESHOLD, 1 << 30),
                                              (_M_TOP_PAD, 64 << 20),
                                              (_M_MMAP_THRESHOLD, 32 << 20)))


def keys(first: int, count: int) -> list[bytes]:
    """LMDB keys of samples [first, first + count), built together (no call per key)."""
    raw = np.arange(first, first + count, dtype=">u8").tobytes()
    return [raw[k:k + 8] for k in range(0, 8 * count, 8)]


def row_views(rows: np.ndarray) -> list[memoryview]:
    """Each row of a C-contiguous uint8 [n, size] array as a memoryview, built in C (no
    bytecode per row). LMDB takes a memoryview's buffer about 4x faster than an ndarray's
    (putmulti of 16,384 3 KB records: ~20 ms against ~75 ms)."""
    n, size = rows.shape
    # numpy's stubs give ndarray a buffer type only on Python >= 3.12
    flat = memoryview(rows.reshape(-1))  # type: ignore[arg-type]
    return list(map(flat.__getitem__, map(slice, range(0, n * size, size),
                                          range(size, (n + 1) * size, size))))


def encode_record(label: np.ndarray, payload: bytes | np.ndarray) -> bytes:
    lb = np.ascontiguousarray(label).tobytes()
    pb = payload if isinstance(payload, bytes) else np.ascontiguousarray(payload).tobytes()
    return HEADER.pack(MAGIC, VERSION, 0, 0, len(lb), len(pb)) + lb + pb


def _label_nbytes(spec: DatasetSpec) -> int:
    return int(np.prod(spec.label_shape, dtype=np.int64)) * int(np.dtype(spec.label_dtype).itemsize)


class LMDBWriter(ContainerWriter):
    format = "lmdb"
    library_modules = ("lmdb",)

    def jpeg_sizes(self, path: Path, entry: FileEntry) -> list[int]:
        import lmdb

        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                return [HEADER.unpack_from(v)[5] for _, v in txn.cursor()]
        finally:
            env.close()

    def layout(self, samples_per_file: int) -> dict[str, object]:
        return {**super().layout(samples_per_file), "key": ">u8 sample index",
                "record": "<4sBBHII header (IOBR, 1, 0, 0, label bytes, payload bytes), "
                          "label, payload"}

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        import lmdb

        spec, n = self.spec, task.count
        keep_heap()
        groups: Iterable[tuple[int, list[bytes] | list[memoryview]]] = self._records(task)
        if spec.sample_kind == "jpeg":
            groups = list(groups)  # sizes known before the map is sized
            payload = sum(len(r) for _, recs in groups for r in recs)
        else:
            assert spec.sample_nbytes is not None  # array samples have a size
            payload = n * (HEADER.size + _label_nbytes(spec) + spec.sample_nbytes)
        # values over ~2 KB take whole overflow pages; the map is sparse, so be generous
        map_size = 2 * (payload + n * (4096 + 64)) + (64 << 20)
        with written_file(root / task.files[0]) as wf:
            # no sync per commit: written_file syncs the whole file once (module docstring)
            env = lmdb.open(str(wf.tmp), subdir=False, map_size=map_size, lock=False,
                            readahead=False, meminit=True, sync=False, metasync=False)
            try:
                for lo, recs in groups:
                    with env.begin(write=True) as txn:
                        done, _ = txn.cursor().putmulti(zip(keys(task.first + lo, len(recs)),
                                                            recs, strict=True), append=True)
                    if done != len(recs):
                        raise lmdb.Error(f"stored {done} of {len(recs)} records")
                    start_writeback(wf.tmp)
            finally:
                env.close()
        return [file_entry(task.files[0], wf, task.first, n)]

    def _records(self, task: Task) -> Iterator[tuple[int, list[bytes] | list[memoryview]]]:
        """(offset in the task, records) per write transaction; records are buffers."""
        spec, first, n = self.spec, task.first, task.count
        ldt = np.dtype(spec.label_dtype)
        if spec.sample_kind == "jpeg":
            recs: list[bytes] = []
            size = lo = 0
            for i in range(first, first + n):
                payload, label = make_sample(spec, self.seed, i)
                recs.append(encode_record(np.asarray(label, dtype=ldt), payload))
                size += len(recs[-1])
                if size >= TXN_BYTES:
                    yield lo, recs
                    lo, recs, size = i - first + 1, [], 0
            if recs:
                yield lo, recs
            return
        lb, pb = _label_nbytes(spec), spec.sample_nbytes
        assert pb is not None  # array samples have a size
        header = np.frombuffer(HEADER.pack(MAGIC, VERSION, 0, 0, lb, pb), dtype=np.uint8)
        per = max(1, min(n, TXN_BYTES // (HEADER.size + lb + pb)))
        buf = np.empty((per, HEADER.size + lb + pb), dtype=np.uint8)
        buf[:, :HEADER.size] = header
        for lo in range(0, n, per):
            m = min(per, n - lo)
            rows = buf[:m]
            rows[:, HEADER.size:HEADER.size + lb] = labels_array(
                spec, self.seed, first + lo, m).view(np.uint8).reshape(m, lb)
            payload = rows[:, HEADER.size + lb:]
            if pb >= 1 << 20:  # large samples: synthesise into each record
                for j in range(m):
                    fill_samples(spec, self.seed, first + lo + j,
                                 payload[j].view(spec.sample_dtype).reshape(1, *spec.array_shape))
            else:  # small samples: vectorised blocks, copied into the records
                for off, block in sample_blocks(spec, self.seed, first + lo, m):
                    payload[off:off + len(block)] = block.reshape(len(block), -1).view(np.uint8)
            yield lo, row_views(rows)

    def check(self, path: Path, entry: FileEntry) -> None:
        import lmdb

        try:
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False)
        except lmdb.Error as e:
            raise DatasetError(f"{path}: cannot be opened as LMDB ({e})") from e
        try:
            with env.begin() as txn:
                n = env.stat()["entries"]
                first = txn.get(key(entry.first_sample))
                last = txn.get(key(entry.first_sample + entry.num_samples - 1))
                labels = self._scan(path, txn, entry.first_sample)
        except lmdb.Error as e:
            raise DatasetError(f"{path}: damaged LMDB environment ({e})") from e
        finally:
            env.close()
        if n != entry.num_samples or first is None or last is None or first[:4] != MAGIC:
            raise DatasetError(f"{path}: holds {n} records (first/last key present: "
                               f"{first is not None}/{last is not None}), manifest says "
                               f"{entry.num_samples}")
        self.check_labels(path, labels, entry.first_sample)

    def _scan(self, path: Path, txn: Any, first: int) -> np.ndarray:
        """Every record: its key is the next sample's, its header is iobench's with this
        dataset's sizes; returns the labels, in key order."""
        ldt = np.dtype(self.spec.label_dtype)
        lbytes = _label_nbytes(self.spec)
        payload = None if self.spec.sample_kind == "jpeg" else self.spec.sample_nbytes
        out = []
        for j, (k, v) in enumerate(txn.cursor()):
            if bytes(k) != key(first + j):
                raise DatasetError(f"{path}: record {j} has key {bytes(k).hex()}, expected "
                                   f"sample {first + j}'s; records were moved: regenerate it")
            if len(v) < HEADER.size:
                raise DatasetError(f"{path}: sample {first + j}'s record is {len(v)} bytes, "
                                   "shorter than its header: regenerate it")
            magic, _v, _a, _b, nl, npay = HEADER.unpack_from(v)
            if magic != MAGIC or nl != lbytes or (payload is not None and npay != payload) \
                    or len(v) != HEADER.size + nl + npay:
                raise DatasetError(f"{path}: sample {first + j}'s record header is broken "
                                   f"(magic {magic!r}, label {nl} B, payload {npay} B, record "
                                   f"{len(v)} B): regenerate it")
            if self.spec.sample_kind == "jpeg":
                check_magic(path, bytes(v[HEADER.size + nl:HEADER.size + nl + 3]), ".jpeg")
            out.append(np.frombuffer(v, dtype=ldt, count=max(1, lbytes // ldt.itemsize),
                                     offset=HEADER.size))
        return np.asarray(out, dtype=ldt).reshape(len(out), *self.spec.label_shape)
