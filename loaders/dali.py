"""NVIDIA DALI loader: one pipeline per rank, for every format whose registry entry
(`iobench.formats`) gives it a DALI mode.

- "external_source" (HDF5, NetCDF, LMDB, NPZ, Zarr):
  `fn.external_source(parallel=True, batch=True)` whose
  source is the same per-format `BatchReader` the PyTorch loaders use, run in
  DALI's Python worker processes (`workers` of them; `workers=0` runs it in
  the main process). One call reads one whole batch.
- "native" (files): DALI's own readers, `fn.readers.file` (+ `fn.decoders.image`) for
  JPEG/PNG trees and `fn.readers.numpy` for `.npy`, given this rank's file
  list for the epoch in order (the pipeline is rebuilt each epoch, since the
  readers take their file list when built). They read with plain reads
  (`dont_use_mmap`): mapped pages could not be evicted between epochs, and
  mmap is slow on parallel filesystems.

`workers` sets DALI's Python workers and CPU threads; `worker_type` does not
apply (DALI's workers are always processes). `prefetch` is DALI's
`prefetch_queue_depth`, and batches in flight per worker for the parallel
source.

Order, sharding and shuffling come from `iobench.sampling`, exactly as for
the other loaders, so every loader delivers the same samples in the same
batches. Operators run on the CPU (`device_id=None`) unless
`device="gpu"` and a GPU is present; then JPEG decoding is "mixed" (nvJPEG)
and the rest runs on the GPU, and `Batch.samples` is a CUDA tensor.

Preprocessing ends, as in the PyTorch loaders, at the compact form the
batch's `Finish` turns into the model's float input (with `convert="device"`
where the batch is consumed; with "loader" right here, on DALI's output).
cifar10's crop offsets and flips are fed in from the same pure function of
(seed, epoch, index) as the PyTorch loaders, so decoded cifar10 batches equal
theirs; cosmoflow's are its stored int16, and the same `Finish` (a log1p
table) gives the same float values. imagenet uses DALI's own
`random_resized_crop` and `coin_flip`, whose random draws (and resize filter)
differ from the PyTorch loaders': decoded imagenet batches are comparable in
shape and statistics, not bitwise.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from iobench.errors import ConfigError, DatasetError, IobenchError, UnsupportedError
from iobench.formats import parse_format
from iobench.loaders._preprocess import (
    CIFAR_PAD,
    CROP,
    FINISH,
    DecodeError,
    cifar_params,
    to_batch,
)
from iobench.loaders._reader import BatchReader, EpochOrder, check_files
from iobench.loaders.base import Batch, Loader, LoaderConfig
from iobench.loaders.readers import reader_for
from iobench.manifest import Manifest, check_magic, refuse_irregular

SAMPLE_LAYOUTS = {"cifar10": "HWC", "cosmoflow": "DHWC", "imagenet": ""}


def _dali() -> Any:
    try:
        import nvidia.dali as dali
    except ImportError as e:
        raise UnsupportedError("the 'dali' loader needs NVIDIA DALI: pip install "
                               "'iobench[dali]' (nvidia-dali-cuda130)") from e
    return dali


@runtime_checkable
class _PerFileReader(Protocol):
    """What native mode asks of its reader (the files format's): labels, file sizes."""

    sizes: np.ndarray

    def labels(self) -> np.ndarray: ...


class _BatchSource:
    """DALI batch source: batch `iteration` of epoch `first_epoch + epoch_idx`, read by a BatchReader."""

    def __init__(self, reader: BatchReader, order: EpochOrder, first_epoch: int, batch_size: int,
                 seed: int, cifar_aug: bool) -> None:
        self.reader, self.order, self.first_epoch = reader, order, first_epoch
        self.batch_size, self.seed, self.cifar_aug = batch_size, seed, cifar_aug

    def __call__(self, info: Any) -> tuple[Any, ...]:
        epoch = self.first_epoch + info.epoch_idx
        idx = self.order(epoch)
        start = info.iteration * self.batch_size
        if start >= len(idx):
            raise StopIteration
        b = idx[start:start + self.batch_size]
        raw = self.reader.read(b)
        if raw.offsets is not None:
            o = raw.offsets
            samples: Any = [raw.samples[o[k]:o[k + 1]] for k in range(len(b))]
        else:
            samples = raw.samples
        outs: tuple[Any, ...] = (samples, np.ascontiguousarray(raw.labels), b.copy(),
                                 raw.stored_bytes)
        if self.cifar_aug:
            outs += _cifar_args(self.seed, epoch, b)
        return outs


def _cifar_args(seed: int, epoch: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fn.slice start (row, col; may be negative: zero padding) and mirror flag per sample."""
    oy, ox, flip = cifar_params(seed, epoch, idx)
    start = np.stack([oy - CIFAR_PAD, ox - CIFAR_PAD], axis=1).astype(np.int32)
    return start, flip.astype(np.int32)


class _AugSource:
    """Non-parallel batch source of cifar10 augmentation arguments, for the files readers."""

    def __init__(self, idx: np.ndarray, batch_size: int, seed: int, epoch: int) -> None:
        self.idx, self.batch_size, self.seed, self.epoch = idx, batch_size, seed, epoch

    def __call__(self, info: Any) -> tuple[np.ndarray, np.ndarray]:
        steps = -(-len(self.idx) // self.batch_size)
        it = info.iteration % steps  # DALI may prefetch past the epoch's end: wrap around
        b = self.idx[it * self.batch_size:(it + 1) * self.batch_size]
        if len(b) < self.batch_size:  # the readers pad the last batch by repeating the last sample
            b = np.concatenate([b, np.repeat(b[-1:], self.batch_size - len(b))])
        return _cifar_args(self.seed, self.epoch, b)


def check_native_inputs(m: Manifest, rank: int = 0, world: int = 1, threads: int = 16) -> None:
    """Each data file of a files dataset: a regular file of the manifest's size whose first
    bytes are its kind's (magic bytes); a DatasetError naming the first that is not.

    Once per loader, before any epoch (the cold epochs' eviction follows): one open and
    one small read per file, spread over `threads` threads for a parallel filesystem's
    latency. Rank `rank` of `world` checks every world-th file (a compact table's a chunk
    at a time, never listed), so the ranks together check each file once; the callers
    that build loaders on several ranks (train, bench-read) raise any rank's error on
    every rank before an epoch starts, so no rank hands DALI a file nobody checked.
    """
    import os
    import stat
    from concurrent.futures import ThreadPoolExecutor

    def one(entry: Any) -> str | None:
        path = m.path_of(entry)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            return f"{path}: cannot open it ({e.strerror}); regenerate or re-stage the dataset"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                refuse_irregular(path, fd)
            if st.st_size != entry.bytes:
                return (f"{path} has {st.st_size} bytes but the manifest records {entry.bytes}: "
                        "the file is truncated or was changed; regenerate or re-stage it")
            check_magic(path, os.pread(fd, 8, 0))
        except DatasetError as e:
            return str(e)
        finally:
            os.close(fd)
        return None

    files = m.data_files
    t = m.compact
    mine = range(rank, len(files), world)
    with ThreadPoolExecutor(threads) as pool:
        for c in range(0, len(mine), CHECK_CHUNK):
            part = mine[c:c + CHECK_CHUNK]
            entries = (t.entries_at(np.arange(part.start, part.stop, part.step, dtype=np.int64))
                       if t is not None else [files[i] for i in part])
            for problem in pool.map(one, entries):
                if problem:
                    raise DatasetError(problem)


CHECK_CHUNK = 65_536  # files whose entries are built at a time by `check_native_inputs`


class DaliLoader(Loader):
    """An NVIDIA DALI pipeline over any iobench dataset."""

    name = "dali"

    def __init__(self, dataset: Manifest | str | Path, config: LoaderConfig,
                 rank: int = 0, world: int = 1) -> None:
        super().__init__(dataset, config, rank, world)
        self._dali = _dali()
        m = self.manifest
        self.gpu = config.device == "gpu"
        if self.gpu and not torch.cuda.is_available():
            raise UnsupportedError("device='gpu' but torch sees no CUDA GPU; use device='cpu'")
        self.native = parse_format(m.format).dali == "native"
        if self.native:
            check_files(m, m.aux_files)
            # DALI's own readers and decoders get these files: native code that can crash
            # the process on a truncated or mislabelled file (a PNG named .JPEG), so check
            # what it will get first
            check_native_inputs(m, rank, world)
        else:
            check_files(m)
        self.reader = reader_for(m, config.library_cache)
        if config.shuffle == "block":
            self.reader.prefetch_block = config.block_size
        self.order = EpochOrder(self)
        self.jpeg = m.sample["kind"] == "jpeg"
        self.ext = m.data_files[0].path.rsplit(".", 1)[-1].lower()
        if m.dataset not in SAMPLE_LAYOUTS:
            hint = (f" (your own data, --data): use --loader {m.format}" if m.dataset == "user"
                    else "")
            raise ConfigError(f"the dali loader has no pipeline for dataset {m.dataset!r}{hint}")
        self._pipe: Any = None
        self._next_epoch: int | None = None  # the epoch the live pipeline will deliver next

    def cache_settings(self) -> dict[str, Any]:
        # DALI's own readers (files) keep no data between epochs (no decoder cache is set)
        return {**self.reader.user_cache(), "dali": "no reader or decoder cache"}

    # -- pipeline construction -----------------------------------------------------------
    def _new_pipeline(self, epoch: int) -> Any:
        dali = self._dali
        c = self.config
        return dali.Pipeline(
            batch_size=c.batch_size, num_threads=max(1, c.workers),
            device_id=torch.cuda.current_device() if self.gpu else None,
            seed=(c.seed * 1_000_003 + epoch * 7919 + self.rank) % (2**31 - 1),
            prefetch_queue_depth=c.prefetch, py_num_workers=max(1, c.workers),
            py_start_method="spawn" if self.gpu else "fork", exec_dynamic=True)

    def _preprocess(self, x: Any, aug: tuple[Any, Any] | None) -> Any:
        """DALI graph of the dataset's preprocessing up to its compact form (the batch's
        `Finish` does the rest, as for the PyTorch loaders), or the raw data when
        decode=False."""
        fn, types = self._dali.fn, self._dali.types
        ds = self.manifest.dataset
        if not self.config.decode:
            return x
        if ds == "imagenet":
            img = fn.decoders.image(x, device="mixed" if self.gpu else "cpu",
                                    output_type=types.RGB)
            img = fn.random_resized_crop(img, size=[CROP, CROP], random_area=[0.08, 1.0],
                                         random_aspect_ratio=[3 / 4, 4 / 3])
            return fn.crop_mirror_normalize(img, mirror=fn.random.coin_flip(),
                                            dtype=types.UINT8, output_layout="HWC")
        if ds == "cifar10":
            assert aug is not None
            if self.gpu:
                x = x.gpu()
            x = fn.slice(x, start=aug[0], shape=[32, 32], axes=[0, 1],
                         out_of_bounds_policy="pad", fill_values=0)
            return fn.crop_mirror_normalize(x, mirror=aug[1], dtype=types.UINT8,
                                            output_layout="CHW")
        # cosmoflow: the stored int16; log1p is the batch's Finish (a table lookup)
        return x.gpu() if self.gpu else x

    def _container_pipeline(self, first_epoch: int) -> Any:
        fn = self._dali.fn
        c = self.config
        cifar_aug = self.manifest.dataset == "cifar10" and c.decode
        src = _BatchSource(self.reader, self.order, first_epoch, c.batch_size, c.seed, cifar_aug)
        layout = SAMPLE_LAYOUTS[self.manifest.dataset]
        n_out = 6 if cifar_aug else 4
        pipe = self._new_pipeline(first_epoch)
        with pipe:
            par = {"parallel": True, "prefetch_queue_depth": c.workers * c.prefetch} \
                if c.workers > 0 else {}
            outs = fn.external_source(source=src, num_outputs=n_out, batch=True,
                                      batch_info=True, layout=[layout, "", "", "", "", ""][:n_out],
                                      **par)
            x, labels, idx, nbytes = outs[:4]
            aug = (outs[4], outs[5]) if cifar_aug else None
            pipe.set_outputs(self._preprocess(x, aug), labels, idx, nbytes)
        _build(pipe)
        return pipe

    def _files_pipeline(self, epoch: int, idx: np.ndarray) -> Any:
        fn = self._dali.fn
        c, m = self.config, self.manifest
        rel = [self.reader.files[i].path for i in idx.tolist()]
        pipe = self._new_pipeline(epoch)
        with pipe:
            if self.ext == "npy":
                x = fn.readers.numpy(file_root=str(m.root), files=rel, random_shuffle=False,
                                     pad_last_batch=True, dont_use_mmap=True, name="reader")
            else:
                x, _ = fn.readers.file(file_root=str(m.root), files=rel, random_shuffle=False,
                                       pad_last_batch=True, dont_use_mmap=True, name="reader")
                if not self.jpeg:  # PNG is lossless storage: decode to the stored array
                    x = fn.decoders.image(x, device="cpu", output_type=self._dali.types.RGB)
            aug = None
            if m.dataset == "cifar10" and c.decode:
                aug = fn.external_source(source=_AugSource(idx, c.batch_size, c.seed, epoch),
                                         num_outputs=2, batch=True, batch_info=True)
            pipe.set_outputs(self._preprocess(x, aug))
        _build(pipe)
        return pipe

    # -- iteration ---------------------------------------------------------------------
    def _to_torch(self, tl: Any, n: int) -> torch.Tensor:
        """First n samples of a uniform DALI TensorList as one torch tensor."""
        if hasattr(tl, "as_cpu") and type(tl).__name__.endswith("GPU"):
            # documented here; DALI's __init__ imports it without marking it exported
            from nvidia.dali.plugin.pytorch import feed_ndarray  # type: ignore[attr-defined]

            dense = tl.as_tensor()
            out = torch.empty(tuple(dense.shape()), dtype=_TORCH_DTYPES[str(dense.dtype)],
                              device=torch.device("cuda", torch.cuda.current_device()))
            feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream())
            return out[:n]
        return torch.from_numpy(np.asarray(tl.as_tensor())[:n].copy() if n < len(tl)
                                else np.asarray(tl.as_tensor()))

    def _bytes(self, tl: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [np.asarray(tl[k]) for k in range(n)]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([p.size for p in parts], out=offsets[1:])
        return torch.from_numpy(np.concatenate(parts).astype(np.uint8, copy=False)), \
            torch.from_numpy(offsets)

    def _run(self, pipe: Any, idx_all: np.ndarray | None = None, step: int = 0) -> Any:
        """pipe.run(), with a DALI failure turned into one DatasetError naming the file."""
        try:
            return pipe.run()
        except (StopIteration, IobenchError):
            raise
        except Exception as e:
            self._discard()  # DALI pipelines are unusable after a critical error
            raise self._explain(e, idx_all, step) from None

    def _explain(self, e: BaseException, idx_all: np.ndarray | None, step: int) -> DatasetError:
        if idx_all is not None:
            # DALI's own readers and decoders do not name the file, and our reader's error,
            # raised in a DALI worker, comes back as DALI's text: find the file with our
            # reader, in the batches DALI may have been working on (it prefetches ahead,
            # `prefetch` batches per worker for an external source)
            bs = self.config.batch_size
            ahead = self.config.prefetch * max(1, self.config.workers) + 2
            stop = min(len(idx_all), (step + ahead) * bs)
            try:
                for s in range(step * bs, stop, bs):
                    b = idx_all[s:s + bs]
                    raw = self.reader.read(b)
                    if self.config.decode and self.jpeg:
                        to_batch(self.manifest.dataset, raw, b, 0, 0, True)
            except DecodeError as bad:
                return DatasetError(f"cannot decode sample {bad.index} stored in "
                                    f"{self.reader.where(bad.index)} ({bad.cause}); the file "
                                    "is damaged: regenerate or re-stage the dataset")
            except DatasetError as found:
                return found
        # DALI's text, shown not parsed: on one line, its end (where DALI puts the cause)
        flat = " | ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
        why = (f"...{flat[-300:]}" if len(flat) > 300 else flat) or type(e).__name__
        return DatasetError(f"DALI pipeline failed reading {self.manifest.root}: {why}")

    def epoch(self, epoch: int) -> Iterator[Batch]:
        c, m = self.config, self.manifest
        idx_all = self.order(epoch)
        steps = self.steps_per_epoch()
        files = self.native
        per_file: _PerFileReader | None = None
        if files:
            assert isinstance(self.reader, _PerFileReader), "native mode reads one file a sample"
            per_file = self.reader
        try:
            if files:
                self.close()
                self._pipe = self._files_pipeline(epoch, idx_all)
            elif self._pipe is None or self._next_epoch != epoch:
                self.close()
                self._pipe = self._container_pipeline(epoch)
        except IobenchError:
            raise
        except Exception as e:  # DALI checks its readers' files when it builds
            self._pipe = None
            raise self._explain(e, idx_all if files else None, 0) from None
        self._next_epoch = None  # a pipeline left mid-epoch is rebuilt next time
        pipe = self._pipe
        for k in range(steps):
            idx = idx_all[k * c.batch_size:(k + 1) * c.batch_size]
            n = len(idx)
            outs = self._run(pipe, idx_all, k)
            if per_file is not None:
                labels = torch.from_numpy(np.ascontiguousarray(per_file.labels()[idx]))
                nbytes = int(per_file.sizes[idx].sum())
            else:
                labels = self._to_torch(outs[1], n)
                got = np.asarray(outs[2].as_tensor())
                if not np.array_equal(got, idx):
                    raise DatasetError(f"DALI delivered samples {got[:4]}... where "
                                       f"{idx[:4]}... were due: internal ordering error")
                nbytes = int(np.asarray(outs[3].as_tensor()).sum())
            offsets = None
            finish = FINISH.get(m.dataset) if c.decode else None
            if self.jpeg and not c.decode:
                samples, offsets = self._bytes(outs[0], n)
            else:
                samples = self._to_torch(outs[0], n)
            if finish is not None and c.convert == "loader":
                samples, finish = finish(samples), None
            yield Batch(samples, labels, torch.from_numpy(idx.copy()), nbytes, offsets, finish)
        if not files:
            try:
                self._run(pipe)
            except StopIteration:
                pipe.reset()
                self._next_epoch = epoch + 1

    def close(self) -> None:
        self._discard()
        self._next_epoch = None
        self.reader.close()

    def _discard(self) -> None:
        """Shut the live pipeline down now (its threads and worker processes), and drop it."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            _shutdown(pipe)


def _build(pipe: Any) -> None:
    """`pipe.build()`; a pipeline that fails to build is shut down before the error leaves."""
    try:
        pipe.build()
    except BaseException:
        _shutdown(pipe)
        raise


def _shutdown(pipe: Any) -> None:
    """Stop a DALI pipeline now rather than whenever it is garbage-collected.

    A pipeline sits in reference cycles (and an exception's traceback may hold
    it). Left to the collector, it may be collected inside a process forked in
    the meantime (the next pipeline's workers), and its shutdown there hangs
    for ever. `_shutdown` is what DALI's own `__del__` calls; after it, that
    `__del__` does nothing.
    """
    shutdown = getattr(pipe, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    del pipe
    gc.collect()


_TORCH_DTYPES = {"DALIDataType.FLOAT": torch.float32, "DALIDataType.UINT8": torch.uint8,
                 "DALIDataType.INT16": torch.int16, "DALIDataType.INT64": torch.int64,
                 "DALIDataType.INT32": torch.int32, "DALIDataType.FLOAT16": torch.float16}
