"""Files loader: one file per sample (JPEG, PNG or .npy), one read each, PyTorch DataLoader.

Layout (docs/design.md): `train/<class>/<index:08d>.<ext>` (classification)
or `train/<index:08d>.npy`, every sample file a manifest entry, and
`labels.npy` at the root. Paths and sizes come from the manifest; labels
from `labels.npy`, read once per worker. A batch's files are all opened and
handed to the kernel to fetch (`posix_fadvise(WILLNEED)`) before the first
is read, so their I/O overlaps. `.npy` samples are read with one
`readinto` straight into the batch array after the header; PNG (lossless,
cifar10) is decoded to its stored array even with `decode=False`, so every
loader delivers the same uint8 [B, 32, 32, 3]; JPEG stays encoded.

`payload_bytes`: each sample file's size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from iobench.errors import DatasetError
from iobench.loaders._reader import BatchReader, check_files
from iobench.loaders._torch import TorchLoader
from iobench.manifest import CONTAINMENT_FILES, Manifest, refuse_irregular

OPEN_AT_ONCE = 128  # files open per worker at a time (well under the usual 1024 fd limit)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


class FilesReader(BatchReader):
    """Reads batches of one-file-per-sample datasets."""

    format = "files"

    def __init__(self, manifest: Manifest, library_cache: bool = False) -> None:
        super().__init__(manifest, library_cache)
        n = manifest.num_samples
        if len(self.files) != n or not np.array_equal(self.starts, np.arange(n)):
            raise DatasetError(f"manifest of {manifest.root} lists {len(self.files)} sample files "
                               f"for {n} samples; expected one file per sample: regenerate it")
        self.sizes = np.array([f.bytes for f in self.files], dtype=np.int64)
        # an ImageFolder tree (the user's data, `--data`): a sample's class is the position
        # of its top folder among `classes`, so nothing needs writing beside the images
        self.classes: list[str] | None = manifest.layout.get("classes")
        labels = [f for f in manifest.files if f.role == "labels"]
        if not labels and self.classes is None:
            raise DatasetError(f"manifest of {manifest.root} lists no labels file (role "
                               "'labels'); regenerate the dataset")
        self.labels_entry = labels[0] if labels else None
        if self.labels_entry is not None:
            refuse_irregular(manifest.path_of(self.labels_entry))
        self.ext = self.files[0].path.rsplit(".", 1)[-1].lower()
        # beyond CONTAINMENT_FILES the manifest checked directories, not each file's real
        # path: then a symbolic link is refused when opened
        self._open_flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (
            os.O_NOFOLLOW if len(self.files) > CONTAINMENT_FILES else 0)

    def label_file(self, index: int) -> str:
        if self.labels_entry is None:
            return self.where(index)
        return str(self.manifest.path_of(self.labels_entry))

    def fail(self, path: str | Path, what: str, err: BaseException | None = None
             ) -> DatasetError:
        refuse_irregular(path)  # a FIFO, socket or device: say so rather than "truncated"
        return super().fail(path, what, err)

    def warm_up(self) -> None:
        if self.ext == "png":
            from PIL import Image  # noqa: F401

    def labels(self) -> np.ndarray:
        """All labels, [N, *label_shape], read once per process."""
        st = self._state()
        if "labels" not in st and self.labels_entry is None:
            pos = {c: i for i, c in enumerate(self.classes or ())}
            st["labels"] = np.array([pos[f.path.split("/", 1)[0]] for f in self.files],
                                    dtype=self.label_dtype)
        if "labels" not in st:
            path = self.manifest.path_of(self.labels_entry)
            try:
                lab = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise self.fail(path, "cannot load the labels", e) from None
            want = (self.manifest.num_samples, *self.label_shape)
            if lab.shape != want:
                raise self.fail(path, f"labels have shape {lab.shape}, expected {want}")
            st["labels"] = lab.astype(self.label_dtype, copy=False)
        return st["labels"]

    def _open_batch(self, sorted_idx: np.ndarray) -> list[int]:
        """Open the batch's files and start fetching them all (posix_fadvise WILLNEED)."""
        fds: list[int] = []
        i = -1
        try:
            for i in sorted_idx.tolist():
                # O_NONBLOCK: a FIFO in the tree opens at once (and `fail` names it) instead
                # of waiting for a writer forever
                fd = os.open(self.paths[i], self._open_flags)
                fds.append(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except FileNotFoundError:
            _close_all(fds)
            raise self.fail(self.paths[i], "file is missing") from None
        except OSError as e:
            _close_all(fds)
            raise self.fail(self.paths[i], "cannot open it", e) from None
        return fds

    def _read_npy(self, i: int, dest: np.ndarray, fd: int) -> None:
        path = self.paths[i]
        try:
            with open(fd, "rb", buffering=0, closefd=False) as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
                if tuple(shape) != dest.shape or dtype != dest.dtype or fortran:
                    raise self.fail(path, f"holds {dtype}{list(shape)}, expected "
                                          f"{dest.dtype}{list(dest.shape)}")
                got = f.readinto(memoryview(dest).cast("B"))
        except (OSError, ValueError) as e:
            raise self.fail(path, "not a readable .npy file", e) from None
        if got != dest.nbytes:
            raise self.fail(path, f"truncated: {got} of {dest.nbytes} data bytes")

    def _read_bytes(self, i: int, fd: int) -> bytes:
        path = self.paths[i]
        try:
            with open(fd, "rb", buffering=0, closefd=False) as f:
                data = f.readall()
        except OSError as e:
            raise self.fail(path, "read failed", e) from None
        if len(data) != self.sizes[i]:
            raise self.fail(path, f"has {len(data)} bytes, the manifest records {self.sizes[i]}")
        return data

    def _read_png(self, i: int, dest: np.ndarray, fd: int) -> None:
        import io

        from PIL import Image

        data = self._read_bytes(i, fd)
        try:
            with Image.open(io.BytesIO(data)) as im:
                arr = np.asarray(im)
        except (OSError, ValueError, SyntaxError) as e:
            raise self.fail(self.paths[i], "cannot decode the image", e) from None
        if arr.shape != dest.shape:
            raise self.fail(self.paths[i], f"image is {list(arr.shape)}, expected {list(dest.shape)}")
        dest[...] = arr

    def _read_sorted_arrays(self, sorted_idx: np.ndarray, order: np.ndarray,
                            out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if sorted_idx[0] < 0 or sorted_idx[-1] >= self.manifest.num_samples:
            raise DatasetError(f"sample index out of range [0, {self.manifest.num_samples})")
        read = self._read_npy if self.ext == "npy" else self._read_png
        for c in range(0, len(sorted_idx), OPEN_AT_ONCE):
            chunk = sorted_idx[c:c + OPEN_AT_ONCE]
            fds = self._open_batch(chunk)
            try:
                for i, p, fd in zip(chunk.tolist(), order[c:c + OPEN_AT_ONCE].tolist(), fds,
                                    strict=True):
                    read(i, out[p], fd)
            finally:
                _close_all(fds)
        return self.labels()[sorted_idx], self.sizes[sorted_idx]

    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[Any], np.ndarray, np.ndarray]:
        if sorted_idx[0] < 0 or sorted_idx[-1] >= self.manifest.num_samples:
            raise DatasetError(f"sample index out of range [0, {self.manifest.num_samples})")
        parts: list[Any] = []
        for c in range(0, len(sorted_idx), OPEN_AT_ONCE):
            chunk = sorted_idx[c:c + OPEN_AT_ONCE]
            fds = self._open_batch(chunk)
            try:
                parts.extend(self._read_bytes(i, fd)
                             for i, fd in zip(chunk.tolist(), fds, strict=True))
            finally:
                _close_all(fds)
        return parts, self.labels()[sorted_idx], self.sizes[sorted_idx]


class FilesLoader(TorchLoader):
    """PyTorch DataLoader over a tree of one file per sample."""

    name = "files"
    reader_cls = FilesReader

    def check(self) -> None:
        # One stat per sample file would cost minutes on a parallel filesystem with
        # millions of files: check the labels file here, each sample file when read.
        check_files(self.manifest, tuple(f for f in self.manifest.files if f.role != "data"))
