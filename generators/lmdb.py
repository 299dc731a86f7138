"""LMDB writer (py-lmdb): one single-file environment per `samples_per_file` samples.

Key: the global sample index as 8-byte big-endian unsigned. Value: a record
that any language can parse and that can never run code (no pickle):

    header  <4s B B H I I  (little-endian, 16 bytes)
            magic b"IOBR", version 1, flags 0, reserved 0,
            label byte count, payload byte count
    label   label bytes (the label dtype, C order)
    payload JPEG bytes, or the sample array (sample dtype, C order)

Shapes and dtypes are in the manifest. Keys are written in order with
`append=True`; memory is initialised, so the same seed gives identical files.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from iobench.errors import DatasetError
from iobench.generators.base import ContainerWriter, Task, atomic_file, entry_for
from iobench.generators.synth import make_sample
from iobench.manifest import FileEntry

HEADER = struct.Struct("<4sBBHII")
MAGIC = b"IOBR"
VERSION = 1


def key(index: int) -> bytes:
    """LMDB key of global sample `index`."""
    return int(index).to_bytes(8, "big")


def encode_record(label: np.ndarray, payload: bytes | np.ndarray) -> bytes:
    lb = np.ascontiguousarray(label).tobytes()
    pb = payload if isinstance(payload, bytes) else np.ascontiguousarray(payload).tobytes()
    return HEADER.pack(MAGIC, VERSION, 0, 0, len(lb), len(pb)) + lb + pb


class LMDBWriter(ContainerWriter):
    format = "lmdb"
    suffix = ".lmdb"

    compression_hint = "LMDB stores values as they are; use --compression none (or hdf5/netcdf)"

    def layout(self, samples_per_file: int) -> dict[str, object]:
        return {**super().layout(samples_per_file), "key": ">u8 sample index",
                "record": "<4sBBHII header (IOBR, 1, 0, 0, label bytes, payload bytes), "
                          "label, payload"}

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        import lmdb

        per = self.spec.sample_nbytes or 600_000  # JPEGs: a generous upper bound
        map_size = (per + 4096 + 64) * task.count * 2 + (64 << 20)
        ldt = np.dtype(self.spec.label_dtype)
        with atomic_file(root / task.files[0]) as tmp:
            env = lmdb.open(str(tmp), subdir=False, map_size=map_size, lock=False,
                            readahead=False, meminit=True, sync=True, metasync=True)
            try:
                with env.begin(write=True) as txn:
                    for i in range(task.first, task.first + task.count):
                        payload, label = make_sample(self.spec, self.seed, i)
                        rec = encode_record(np.asarray(label, dtype=ldt), payload)
                        txn.put(key(i), rec, append=True)
                env.sync(True)
            finally:
                env.close()
        return [entry_for(root, task.files[0], task.first, task.count)]

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
        except lmdb.Error as e:
            raise DatasetError(f"{path}: damaged LMDB environment ({e})") from e
        finally:
            env.close()
        if n != entry.num_samples or first is None or last is None or first[:4] != MAGIC:
            raise DatasetError(f"{path}: holds {n} records (first/last key present: "
                               f"{first is not None}/{last is not None}), manifest says "
                               f"{entry.num_samples}")
