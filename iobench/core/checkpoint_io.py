"""Shard I/O for DCP at the storage's speed: write-behind on writes, large O_DIRECT reads, tensors decoded without running pickles.

DCP's `FileSystemWriter` serializes one tensor after another (`torch.save`, about a
millisecond each) into a buffered file and fsyncs it at the end: the storage idles while
Python serializes, then the fsync writes everything. `WriteBehindFS` starts the write-back
of every WRITE_BEHIND bytes as soon as they are in the page cache (`sync_file_range`), so
the storage writes while the next tensors are serialized and the final fsync waits only
for the tail. The bytes on storage are DCP's own, unchanged.

DCP's `FileSystemReader` reads each tensor with a buffered read and `torch.load` (a
pure-Python restricted unpickler, about two milliseconds a tensor). `read_ranges` reads
each shard in offset order in ranges of READ_RANGE bytes, O_DIRECT where the filesystem
allows it (each read straight from storage, as fio's direct read), READ_AHEAD ranges in
flight while the one before is decoded; `tensor_bytes` decodes a tensor's `torch.save`
record with the C unpickler restricted to a tensor's own record (no class is loaded, no
code runs) and copies its bytes straight into the target, falling back to
`torch.load(weights_only=True)` for anything else.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import errno
import io
import itertools
import math
import mmap
import os
import pickle
import queue
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

WRITE_BEHIND = 16 << 20  # bytes: the write-back of each such piece starts once it is written
READ_RANGE = 16 << 20  # bytes per read (items coalesced up to it; a larger item alone)
READ_AHEAD = 2  # ranges read (each by its own thread) while the one before is decoded
_ALIGN = 4096  # O_DIRECT: offsets, lengths and buffers aligned to the block size
_SFR_WRITE = 2  # SYNC_FILE_RANGE_WRITE: start the write-back, do not wait

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


# ------------------------------------------------------------------------------ writing

class WriteBehindFile(io.BufferedWriter):
    """A file written through the page cache whose write-back starts every WRITE_BEHIND
    bytes (a hint: where the filesystem refuses it, writes go on as plain buffered ones)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(io.FileIO(path, "wb"), buffer_size=1 << 20)
        self._started = 0  # bytes whose write-back was started

        self._pos = 0  # bytes written (torch.save writes ~20 pieces a tensor: no lseek each)

    def write(self, b: Any) -> int:
        n = super().write(b)
        self._pos += n
        if self._pos - self._started >= WRITE_BEHIND and _sync_file_range is not None:
            self.flush()
            start_write_back(self.fileno(), self._started, self._pos - self._started)
            self._started = self._pos
        return n


def start_write_back(fd: int, start: int, length: int) -> None:
    """Start writing bytes [start, start + length) of `fd` back to storage, without waiting
    (`sync_file_range`; a hint: nothing where this libc has none or the filesystem refuses)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, start, length, _SFR_WRITE)


class _NoClose(io.IOBase):
    """What DCP wraps each item's stream in (its `NoCloseWriter`: close flushes, the file
    stays open), defined once: DCP defines the class anew for every tensor."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return int(self.raw.write(b))

    def close(self) -> None:
        if not self.closed:  # the wrapper closes, once; the file stays open
            self.raw.flush()
            super().close()


def plain_transforms() -> Any:
    """DCP's stream transforms without extensions (its default), as `_NoClose` wrappers;
    None where this torch has no such hook (its own transforms are then kept)."""
    try:
        from torch.distributed.checkpoint.filesystem import _StorageWriterTransforms
    except ImportError:
        return None

    class _Plain(_StorageWriterTransforms):
        def transform_save_stream(self, write_item: Any, raw_stream: Any
                                  ) -> tuple[Any, list[str]]:
            return _NoClose(raw_stream), []

    return _Plain()


@contextlib.contextmanager
def no_zip_crc() -> Iterator[None]:
    """`torch.save` without the CRC-32 of each record (torch.load never checks it; computing
    it costs a pass over every byte, about 2 GB/s): DCP's files are otherwise the same."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # an older torch: its records keep their CRC
        yield
        return
    before = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = before


def write_behind_fs() -> Any:
    """DCP's local `FileSystem`, writing its files as `WriteBehindFile`s."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class _WriteBehindFS(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
            if mode != "wb":
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with WriteBehindFile(path) as stream:
                yield stream

    return _WriteBehindFS()


@contextlib.contextmanager
def lean_dcp() -> Iterator[None]:
    """A DCP save or load without two CPU costs that are not the checkpoint's: DCP's debug
    events (two log records per tensor, built and then dropped by its NullHandler: 0.1-0.4 s
    a save of 1,164 tensors here, and as much again for the records of its per-key
    `_stateful_to_state_dict`, which is swapped for the same without them), and a full
    garbage collection over the objects the process held before (torch's ~250,000: 0.2-0.7 s
    whenever one falls inside). The logger's level, DCP's function and the collector's
    generations are as they were afterwards."""
    import gc
    import logging

    log: logging.Logger | None
    try:
        from torch.distributed.checkpoint.logger import _dcp_logger as log
    except ImportError:
        log = None
    dropped = log is not None and not log.propagate and all(
        isinstance(h, logging.NullHandler) for h in log.handlers)
    level = log.level if log is not None else logging.NOTSET
    if dropped and log is not None and log.getEffectiveLevel() < logging.INFO:
        log.setLevel(logging.INFO)
    frozen = gc.get_freeze_count() == 0  # someone else's freeze is left alone
    if frozen:
        gc.freeze()  # what exists now is not scanned; collected later, as before
    saver, stock = _stateful_hook() if dropped else (None, None)
    if saver is not None:
        saver._stateful_to_state_dict = _stateful_to_state_dict
    try:
        yield
    finally:
        if saver is not None:
            saver._stateful_to_state_dict = stock
        if frozen:
            gc.unfreeze()
        if log is not None:
            log.setLevel(level)


def _stateful_hook() -> tuple[Any, Any]:
    """DCP's saver module and its `_stateful_to_state_dict`, (None, None) if it has none."""
    try:
        from torch.distributed.checkpoint import state_dict_saver as saver
    except ImportError:
        return None, None
    stock = getattr(saver, "_stateful_to_state_dict", None)
    return (saver, stock) if stock is not None else (None, None)


def _stateful_to_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """DCP's `_stateful_to_state_dict` (each Stateful value's `state_dict()`, the rest as it
    is) without the two debug records it builds per key (0.15-0.25 s a save of 1,164)."""
    import torch
    from torch.distributed.checkpoint.stateful import Stateful

    return {k: v if type(v) is torch.Tensor else v.state_dict() if isinstance(v, Stateful)
            else v for k, v in state_dict.items()}


# ------------------------------------------------------------------------------ reading

class ShardFile:
    """One shard file read by absolute ranges: O_DIRECT where the filesystem allows it,
    buffered elsewhere (tmpfs, some FUSE filesystems)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.direct = hasattr(os, "O_DIRECT")
        try:
            self.fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if self.direct else 0))
        except OSError as e:
            if not self.direct or e.errno != errno.EINVAL:
                raise
            self.direct, self.fd = False, os.open(path, os.O_RDONLY)

    def read(self, start: int, end: int, buf: mmap.mmap) -> memoryview:
        """Bytes [start, end) of the file (fewer at its end), into `buf` (page-aligned, at
        least end - start bytes)."""
        view = memoryview(buf)
        got = 0
        while got < end - start:
            try:
                n = os.preadv(self.fd, [view[got:end - start]], start + got)
            except OSError as e:  # a filesystem that opens O_DIRECT but refuses its reads
                if not self.direct or e.errno != errno.EINVAL:
                    raise
                fd = os.open(self.path, os.O_RDONLY)
                os.close(self.fd)
                self.direct, self.fd = False, fd
                continue
            if n == 0:
                break
            got += n
        return view[:got]

    def close(self) -> None:
        os.close(self.fd)


class Buffers:
    """`count` page-aligned read buffers, reused: a fresh one costs a page fault and the
    zeroing of every page, as much as the copy out of it."""

    def __init__(self, count: int) -> None:
        self._free: queue.SimpleQueue[mmap.mmap | None] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(None)  # made when first needed, as large as needed

    def take(self, size: int) -> mmap.mmap:
        """A free buffer of at least `size` bytes (waits for one to be given back)."""
        buf = self._free.get()
        return buf if buf is not None and len(buf) >= size else mmap.mmap(
            -1, max(size, READ_RANGE))

    def give(self, buf: mmap.mmap) -> None:
        self._free.put(buf)


Item = tuple[int, int, Any]  # offset in the file, length, DCP's read request


def ranges(items: list[Item]) -> list[tuple[int, int, list[Item]]]:
    """(start, end, items): block-aligned ranges of about READ_RANGE bytes that cover the
    items, in offset order."""
    out: list[tuple[int, int, list[Item]]] = []
    for off, length, req in sorted(items, key=lambda x: x[0]):
        end = -(-(off + length) // _ALIGN) * _ALIGN
        if out and end - out[-1][0] <= READ_RANGE:
            start, last, held = out[-1]
            out[-1] = (start, max(last, end), [*held, (off, length, req)])
        else:
            out.append((off - off % _ALIGN, end, [(off, length, req)]))
    return out


def read_ranges(root: Path, storage_data: dict[Any, Any], items: list[Any],
                planner: Any) -> None:
    """DCP's read of `items` (a load plan's) from the shard files under `root`: each file
    in offset order, READ_AHEAD ranges at once, each read by a worker thread that also
    copies the plain tensors in it into their targets (the rest is loaded here, in order)."""
    from concurrent.futures import ThreadPoolExecutor

    per_file: dict[str, list[Item]] = {}
    for req in items:
        md = storage_data[req.storage_index]
        per_file.setdefault(md.relative_path, []).append((md.offset, md.length, req))
    buffers = Buffers(READ_AHEAD + 1)
    with ThreadPoolExecutor(READ_AHEAD) as pool:
        for rel, reqs in per_file.items():
            f = ShardFile(root / rel)
            todo = iter([(r, _targets(r[2], planner)) for r in ranges(reqs)])
            ahead = collections.deque(pool.submit(_fetch, f, r, targets, buffers)
                                      for r, targets in itertools.islice(todo, READ_AHEAD))
            try:
                while ahead:
                    done, buf = ahead.popleft().result()
                    nxt = next(todo, None)
                    if nxt is not None:
                        ahead.append(pool.submit(_fetch, f, *nxt, buffers))
                    for view, length, req, target in done:
                        load_item(view, length, req, target, planner, root / rel)
                    del done
                    buffers.give(buf)
            finally:
                for fut in ahead:
                    fut.cancel()
                    with contextlib.suppress(BaseException):
                        fut.result()
                f.close()


def _targets(held: list[Item], planner: Any) -> list[Any]:
    """The tensor each item of a range is read into (None for bytes items)."""
    from torch.distributed.checkpoint.planner import LoadItemType

    return [None if req.type == LoadItemType.BYTE_IO else planner.resolve_tensor(req).detach()
            for _, _, req in held]


Fetched = tuple[memoryview | None, int, Any, Any]  # bytes left to load (None: copied)


def _fetch(f: ShardFile, rng: tuple[int, int, list[Item]], targets: list[Any],
           buffers: Buffers) -> tuple[list[Fetched], mmap.mmap]:
    """A worker's part: read one range, copy each plain whole tensor in it straight into
    its target (numpy's copy: one memcpy without the GIL; torch's copy_ splits it over
    OpenMP threads, which on busy cores costs several times the copy itself)."""
    import numpy
    import torch

    start, end, held = rng
    buf = buffers.take(end - start)
    data = f.read(start, end, buf)
    out: list[Fetched] = []
    for (off, length, req), target in zip(held, targets, strict=True):
        view = data[off - start:off - start + length]
        raw = None
        if target is not None and len(view) == length and target.is_contiguous() \
                and not any(req.storage_offsets) \
                and tuple(req.lengths) == tuple(target.size()):
            raw = tensor_bytes(view, target.dtype, tuple(target.size()))
        if raw is not None:
            target.reshape(-1).view(torch.uint8).numpy()[:] = numpy.frombuffer(raw, numpy.uint8)
        out.append((None if raw is not None else view, length, req, target))
    return out, buf


class DamagedShard(ValueError):
    """A shard's bytes are not what its metadata says (short, or not a tensor's record)."""


def load_item(view: memoryview | None, length: int, req: Any, target: Any, planner: Any,
              where: Path) -> None:
    """One item of a load plan into its target (`view` None: copied there already), as
    DCP's reader loads it: bytes to the planner, tensors with `torch.load(weights_only=
    True)`, narrowed to the request, their shape checked."""
    import torch
    from torch.distributed._shard._utils import narrow_tensor_by_index

    if view is not None and len(view) < length:
        raise DamagedShard(f"{where} ends before the item {req.storage_index.fqn}: the "
                           "checkpoint is damaged")
    if view is not None and target is None:
        planner.load_bytes(req, io.BytesIO(view))
        return
    if view is not None:
        tensor = torch.load(io.BytesIO(view), map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        if target.size() != tensor.size():
            raise DamagedShard(f"{where}: {req.storage_index.fqn} holds "
                               f"{tuple(tensor.size())}, the plan asks {tuple(target.size())}")
        target.copy_(tensor)
    planner.commit_tensor(req, target)


# torch.save's legacy storage class names (in its data.pkl) -> dtype names
_STORAGES = {"FloatStorage": "float32", "BFloat16Storage": "bfloat16",
             "HalfStorage": "float16", "DoubleStorage": "float64", "LongStorage": "int64",
             "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
             "ByteStorage": "uint8", "BoolStorage": "bool"}


class _NotPlain(Exception):
    """The record is not one plain tensor: decode it the slow, general way."""


class _TensorPickle(pickle.Unpickler):
    """Reads a tensor's `data.pkl` as the arguments of `_rebuild_tensor_v2`, loading no
    class and calling nothing (any other global: _NotPlain)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda *args: ("tensor", args)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGES:
            return ("storage-type", _STORAGES[name])
        raise _NotPlain(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return pid


_KNOWN: dict[tuple[Any, ...], tuple[bytes, int, bytes]] = {}


def tensor_bytes(view: memoryview, dtype: Any, size: tuple[int, ...]) -> memoryview | None:
    """The bytes of the tensor `torch.save` wrote into `view`, when it is one contiguous
    little-endian tensor of `dtype` and `size`; None for anything else. A record whose every
    byte but the tensor's equals one decoded before (the same head and tail: iobench's own
    records, and any written without their CRC-32) is not decoded again."""
    key = (dtype, size, len(view))
    known = _KNOWN.get(key)
    if known is not None:
        head, n, tail = known
        if bytes(view[:len(head)]) == head and bytes(view[len(head) + n:]) == tail:
            return view[len(head):len(head) + n]
    span = _tensor_span(view, dtype, size)
    if span is None:
        return None
    start, n = span
    if known is None:
        _KNOWN[key] = (bytes(view[:start]), n, bytes(view[start + n:]))
    return view[start:start + n]


def _tensor_span(view: memoryview, dtype: Any, size: tuple[int, ...]) -> tuple[int, int] | None:
    """(start, length) in `view` of the bytes of the tensor `torch.save` wrote there (see
    `tensor_bytes`), decoded from its zip directory and its `data.pkl`; None if not plain."""
    try:
        spans = record_spans(view)
        order = spans.get("byteorder")
        if order is not None and bytes(view[order[0]:order[0] + order[1]]) != b"little":
            return None
        pkl = spans["data.pkl"]
        kind, args = _TensorPickle(io.BytesIO(view[pkl[0]:pkl[0] + pkl[1]])).load()
        storage, offset, shape, stride = args[:4]
        tag, (_, dtype_name), key, _, numel = storage
        data_start, data_len = spans[f"data/{key}"]
    except (_NotPlain, pickle.UnpicklingError, KeyError, ValueError, TypeError, EOFError,
            struct.error):
        return None
    n = math.prod(shape)
    item = dtype.itemsize
    if (kind, tag) != ("tensor", "storage") or dtype_name != str(dtype).removeprefix("torch.") \
            or tuple(shape) != size or tuple(stride) != _contiguous(shape) \
            or offset + n > numel or data_len != numel * item:
        return None
    return data_start + offset * item, n * item


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


_END = struct.Struct("<4s4H2LH")  # end of central directory (22 bytes, no comment)
_END64_LOCATOR = struct.Struct("<4sLQL")  # zip64 end of central directory locator (20)
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")  # a central directory entry (46 bytes)
_LOCAL = struct.Struct("<4s2B4HL2L2H")  # a local file header (30 bytes)
_FULL = 0xFFFFFFFF  # a 32-bit field whose value is in the zip64 extra field


def record_spans(view: memoryview) -> dict[str, tuple[int, int]]:
    """(start, size) of each record of a `torch.save` archive (uncompressed zip members) in
    `view`, by name without the archive's folder, from its central directory; a ValueError
    for anything else (compressed, truncated, a comment after the directory)."""
    end = len(view) - _END.size
    sig, _, _, _, count, _, cd, _ = _END.unpack(view[end:])
    if sig != b"PK\x05\x06":
        raise ValueError("no end of central directory")
    if cd == _FULL or count == 0xFFFF:  # zip64: the locator before it says where its record is
        sig, _, end64, _ = _END64_LOCATOR.unpack(view[end - 20:end])
        if sig != b"PK\x06\x07" or bytes(view[end64:end64 + 4]) != b"PK\x06\x06":
            raise ValueError("no zip64 end of central directory")
        count, cd = struct.unpack("<QQ", view[end64 + 32:end64 + 40]
                                  .tobytes() + view[end64 + 48:end64 + 56].tobytes())
    out: dict[str, tuple[int, int]] = {}
    for _ in range(count):
        f = _CENTRAL.unpack(view[cd:cd + 46])
        if f[0] != b"PK\x01\x02" or f[6] != 0:  # stored only
            raise ValueError("not a stored record")
        name_len, extra_len, comment_len, offset = f[12], f[13], f[14], f[18]
        name = bytes(view[cd + 46:cd + 46 + name_len]).decode()
        size = f[11]
        if _FULL in (size, offset):
            size, offset = _zip64(view[cd + 46 + name_len:cd + 46 + name_len + extra_len],
                                  size, f[10], offset)
        h = _LOCAL.unpack(view[offset:offset + 30])
        start = offset + 30 + h[10] + h[11]
        if h[0] != b"PK\x03\x04" or start + size > len(view):
            raise ValueError("record past the end")
        out[name.split("/", 1)[-1]] = (start, size)
        cd += 46 + name_len + extra_len + comment_len
    return out


def _zip64(extra: memoryview, size: int, csize: int, offset: int) -> tuple[int, int]:
    """(size, local header offset) from a central entry's zip64 extra field, which holds,
    in this order, the fields whose 32-bit value is _FULL."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack("<HH", extra[pos:pos + 4])
        if tag == 1:
            vals = list(struct.unpack(f"<{length // 8}Q", extra[pos + 4:pos + 4 + length
                                                               - length % 8]))
            if size == _FULL:
                size = vals.pop(0)
            if csize == _FULL:
                vals.pop(0)
            if offset == _FULL:
                offset = vals.pop(0)
            return size, offset
        pos += 4 + length
    raise ValueError("zip64 extra field missing")
