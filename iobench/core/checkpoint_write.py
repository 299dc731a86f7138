"""The benchmark's shard writer: DCP's file byte for byte, each tensor's record from a template and its own memory, no torch.save per tensor.

DCP's `FileSystemWriter` (one file a rank, `torch.save` records) writes every tensor as
`torch.save(tensor)`: a pickle and a zip archive, 0.3-1.5 ms a tensor on this project's
machines, which for a shard of 1,164 small tensors is more time than the storage's. With
the records' CRC-32 off (`checkpoint_io.no_zip_crc`, as iobench writes them), a plain
tensor's record is a head, the tensor's own bytes and a tail, and the head and tail are the
same for every tensor of one dtype and shape. `write_shard` therefore `torch.save`s the
first tensor of each dtype and shape, keeps its head and tail, and writes every tensor as
head, memory, tail: the same bytes at the same offsets as DCP's writer (a test compares the
two files), read by DCP's own `FileSystemReader`. The bytes move as DCP's do, minus its
copies: a large tensor's memory in one `writev` with the head before it, small records
gathered into writes of about GATHER bytes, the write-back of every WRITE_BEHIND bytes
started as soon as they are written (`sync_file_range`, as `checkpoint_io.WriteBehindFile`,
so the final fsync waits only for the tail); the writes run in one writer thread while the
next records are prepared. A tensor that is not plain (not contiguous, a subclass, one that
requires grad, empty) is `torch.save`d, as DCP does.
"""

from __future__ import annotations

import collections
import io
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from iobench.core.checkpoint_io import WRITE_BEHIND, record_spans, start_write_back

GATHER = 1 << 20  # bytes: records smaller than this are gathered into one write
# bytes per write call, a large tensor's memory split into such calls: on this project's VM
# (Linux 6.18, ext4) one buffered write of 2 MiB or more, or a writev of 1 MiB pieces adding
# up to it, cost 5-7x the time of the same bytes in 1 MiB calls (2 GB: 5.3-7.2 s against
# 0.8-1.1 s; docs/results.md section 12); fio's and most tools' block is 1 MiB too
MAX_CALL = 1 << 20
_IOV_MAX = 1024  # pieces per writev (Linux's limit)
INFLIGHT = 2  # batches handed to the writer thread and not yet written


class ShardWriter:
    """One shard file written sequentially from pieces (bytes-like objects, each written
    from its own memory) by one writer thread, so that the next records are prepared while
    the kernel copies the last ones into the page cache; fsync'ed at the end."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        self.pos = 0  # bytes written or queued: the file offset of the next piece
        self._pending: list[memoryview] = []
        self._pending_n = 0
        self._written = 0
        self._started = 0  # bytes whose write-back was started
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="iobench-shard-writer")
        self._inflight: collections.deque[Future[None]] = collections.deque()

    def add(self, *pieces: Any) -> None:
        """Queue `pieces` (kept alive by their views until written) at `pos`; handed to the
        writer once GATHER bytes are queued."""
        for p in pieces:
            view = memoryview(p).cast("B")
            self._pending.append(view)
            self._pending_n += len(view)
            self.pos += len(view)
        if self._pending_n >= GATHER:
            self.flush()

    def flush(self) -> None:
        """Hand what is queued to the writer (at most INFLIGHT batches wait: a failed write
        is raised here, at the latest by `sync_close`)."""
        if self._pending:
            self._inflight.append(self._thread.submit(self._write, self._pending))
            self._pending, self._pending_n = [], 0
        while len(self._inflight) > INFLIGHT:
            self._inflight.popleft().result()

    def _write(self, pending: list[memoryview]) -> None:
        """The writer's part: write `pending` in calls of at most MAX_CALL bytes (a short
        write resumed where it stopped), starting the write-back of every WRITE_BEHIND
        bytes as soon as they are written."""
        todo = collections.deque(pending)
        while todo:
            call: list[memoryview] = []
            size = 0
            while todo and size < MAX_CALL and len(call) < _IOV_MAX:
                piece = todo.popleft()
                if size + len(piece) > MAX_CALL:  # its rest opens the next call
                    todo.appendleft(piece[MAX_CALL - size:])
                    piece = piece[:MAX_CALL - size]
                call.append(piece)
                size += len(piece)
            n = os.writev(self.fd, call)
            self._written += n
            todo.extendleft(reversed(unwritten(call, n)))
            if self._written - self._started >= WRITE_BEHIND:
                start_write_back(self.fd, self._started, self._written - self._started)
                self._started = self._written

    def sync_close(self) -> None:
        """Write the rest, fsync, close."""
        try:
            self.flush()
            while self._inflight:
                self._inflight.popleft().result()
            os.fsync(self.fd)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop writing (what is in flight ends first) and close the file."""
        self._thread.shutdown(wait=True, cancel_futures=True)
        os.close(self.fd)


def unwritten(call: list[memoryview], n: int) -> list[memoryview]:
    """What of the pieces of one write call a write of `n` bytes did not take, in order."""
    for i, piece in enumerate(call):
        if n < len(piece):
            return [piece[n:], *call[i + 1:]]
        n -= len(piece)
    return []


_TEMPLATES: dict[tuple[Any, ...], tuple[bytes, bytes] | None] = {}


def crc_off() -> bool:
    """Whether `torch.save` writes its records without their CRC-32 now."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return False
    return config.save.compute_crc32 is False


def record_parts(tensor: Any, crc_is_off: bool | None = None
                 ) -> tuple[bytes, memoryview, bytes] | None:
    """`torch.save(tensor)`'s bytes as (head, the tensor's own memory, tail), byte for byte,
    without serializing it: for a plain contiguous CPU tensor whose storage is its own, the
    head and tail of the first tensor of its dtype and shape that `torch.save` wrote (they
    hold no byte of the data once the CRC-32 is off; `crc_is_off`, when given, says whether
    it is); None for any other tensor, or while the CRC is on."""
    import torch

    if crc_is_off is None:
        crc_is_off = crc_off()
    if not crc_is_off or type(tensor) is not torch.Tensor or tensor.layout != torch.strided \
            or tensor.device.type != "cpu" or tensor.requires_grad or tensor.numel() == 0 \
            or not tensor.is_contiguous() or tensor.storage_offset() != 0 \
            or tensor.untyped_storage().nbytes() != tensor.nbytes or tensor.is_conj() \
            or tensor.is_neg() or tensor.is_quantized:
        return None
    key = (tensor.dtype, tuple(tensor.shape))
    if key not in _TEMPLATES:
        buf = io.BytesIO()
        torch.save(tensor, buf)
        rec = buf.getvalue()
        start, size = record_spans(memoryview(rec))["data/0"]
        _TEMPLATES[key] = (rec[:start], rec[start + size:]) if size == tensor.nbytes else None
    parts = _TEMPLATES[key]
    if parts is None:
        return None
    raw: Any = tensor.reshape(-1).view(torch.uint8).numpy()
    return parts[0], memoryview(raw), parts[1]


def fast_path(writer: Any) -> bool:
    """Whether `write_shard` writes what this DCP writer would: one file a rank, one thread,
    torch.save records, no stream extensions."""
    try:
        from torch.distributed.checkpoint.filesystem import SerializationFormat
    except ImportError:
        return False
    return bool(writer.single_file_per_rank and writer.thread_count == 1
                and getattr(writer, "serialization_format", None)
                == SerializationFormat.TORCH_SAVE
                and not getattr(getattr(writer, "transforms", None), "extensions", ()))


def write_shard(writer: Any, plan: Any, planner: Any) -> Any:
    """DCP's `FileSystemWriter.write_data` for one file a rank (`fast_path`), with the same
    bytes at the same offsets: the bytes items, then every tensor as its `torch.save`
    record (`record_parts`, else `torch.save` itself), fsync'ed; a Future of the results."""
    from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _StorageInfo
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
    out = ShardWriter(writer.fs.concat_path(writer.path, name))
    results = []
    off = crc_off()
    try:
        items = sorted(plan.items, key=lambda wi: wi.type != WriteItemType.BYTE_IO)
        for item in items:  # stable: the bytes items first, then the tensors, as DCP's
            offset = out.pos
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                out.add(bytes(data.getbuffer()))
            else:
                out.add(*_tensor_pieces(data, off))
            results.append(WriteResult(index=item.index, size_in_bytes=out.pos - offset,
                                       storage_data=_StorageInfo(name, offset,
                                                                 out.pos - offset)))
    except BaseException:
        out.abandon()
        raise
    out.sync_close()  # (a failed write or fsync: raised here, the file closed)
    fut: Any = Future()
    fut.set_result(results)
    return fut


def _tensor_pieces(tensor: Any, crc_is_off: bool) -> tuple[Any, ...]:
    """A tensor's `torch.save` record in pieces, the tensor as DCP's loader hands it over
    (detached, on the CPU, cloned when its storage holds more than it)."""
    tensor = tensor.detach().cpu()
    if tensor.untyped_storage().size() != tensor.nbytes:
        tensor = tensor.clone()
    parts = record_parts(tensor, crc_is_off)
    if parts is not None:
        return parts
    import torch

    buf = io.BytesIO()
    torch.save(tensor, buf)
    return (buf.getbuffer(),)
