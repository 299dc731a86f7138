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
from typing import Any

import numpy as np

from iobench.core.errors import DatasetError
from iobench.core.manifest import (
    CONTAINMENT_FILES,
    Manifest,
    NpyRows,
    refuse_irregular,
)
from iobench.loaders._reader import (
    BatchReader,
    check_files,
    one_file_per_sample_sizes,
    read_each_file,
)
from iobench.loaders._torch import TorchLoader


class FilesReader(BatchReader):
    """Reads batches of one-file-per-sample datasets."""

    format = "files"

    def __init__(self, manifest: Manifest, library_cache: bool = False) -> None:
        super().__init__(manifest, library_cache)
        self.sizes: Any = one_file_per_sample_sizes(manifest, self.files, self.starts)
        # an ImageFolder tree (the user's data, `--data`): a sample's class is the position
        # of its top folder among `classes`, so nothing needs writing beside the images
        self.classes: list[str] | None = manifest.layout.get("classes")
        labels = [f for f in manifest.aux_files if f.role == "labels"]
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

    def warm_up(self) -> None:
        if self.ext == "png":
            from PIL import Image  # noqa: F401

    def labels(self) -> np.ndarray | NpyRows:
        """All labels, [N, *label_shape], read once per process (a compact manifest's: rows
        read when indexed)."""
        st = self._state()
        if "labels" not in st and self.labels_entry is None:
            pos = {c: i for i, c in enumerate(self.classes or ())}
            st["labels"] = np.array([pos[f.path.split("/", 1)[0]] for f in self.files],
                                    dtype=self.label_dtype)
        if "labels" not in st:
            assert self.labels_entry is not None  # else the classes gave the labels above
            path = self.manifest.path_of(self.labels_entry)
            try:
                # a compact manifest's millions of labels: rows read when asked for
                lab = (NpyRows.open(path) if self.manifest.compact
                       else np.load(path, allow_pickle=False))
            except (OSError, ValueError) as e:
                raise self.fail(path, "cannot load the labels", e) from None
            want = (self.manifest.num_samples, *self.label_shape)
            if lab.shape != want:
                raise self.fail(path, f"labels have shape {lab.shape}, expected {want}")
            st["labels"] = (lab if isinstance(lab, NpyRows) and lab.dtype == self.label_dtype
                            else np.asarray(lab[:]).astype(self.label_dtype, copy=False))
        labels: np.ndarray | NpyRows = st["labels"]
        return labels

    # a file's path and size are looked up only to name it in an error (a compact
    # manifest's are table rows): the batch's sizes come in as `size`
    def _read_npy(self, i: int, dest: np.ndarray, fd: int, size: int) -> None:
        try:
            with open(fd, "rb", buffering=0, closefd=False) as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
                if tuple(shape) != dest.shape or dtype != dest.dtype or fortran:
                    raise self.fail(self.paths[i], f"holds {dtype}{list(shape)}, expected "
                                                   f"{dest.dtype}{list(dest.shape)}")
                got = f.readinto(dest.data.cast("B"))
        except (OSError, ValueError) as e:
            raise self.fail(self.paths[i], "not a readable .npy file", e) from None
        if got != dest.nbytes:
            raise self.fail(self.paths[i], f"truncated: {got} of {dest.nbytes} data bytes")

    def _read_bytes(self, i: int, fd: int, size: int) -> bytes:
        try:
            with open(fd, "rb", buffering=0, closefd=False) as f:
                data = f.readall()
        except OSError as e:
            raise self.fail(self.paths[i], "read failed", e) from None
        if len(data) != size:
            raise self.fail(self.paths[i], f"has {len(data)} bytes, the manifest records {size}")
        return data

    def _read_png(self, i: int, dest: np.ndarray, fd: int, size: int) -> None:
        import io

        from PIL import Image

        data = self._read_bytes(i, fd, size)
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
        read = self._read_npy if self.ext == "npy" else self._read_png
        sizes = np.asarray(self.sizes[sorted_idx], dtype=np.int64)  # one read a batch
        size = sizes.tolist()
        read_each_file(self, sorted_idx, self._open_flags,
                       lambda k, i, fd: read(i, out[order[k]], fd, size[k]))
        return self.labels()[sorted_idx], sizes

    def _read_sorted_bytes(self, sorted_idx: np.ndarray
                           ) -> tuple[list[Any], np.ndarray, np.ndarray]:
        parts: list[Any] = [None] * len(sorted_idx)
        sizes = np.asarray(self.sizes[sorted_idx], dtype=np.int64)
        size = sizes.tolist()

        def one(k: int, i: int, fd: int) -> None:
            parts[k] = self._read_bytes(i, fd, size[k])

        read_each_file(self, sorted_idx, self._open_flags, one)
        return parts, self.labels()[sorted_idx], sizes


class FilesLoader(TorchLoader):
    """PyTorch DataLoader over a tree of one file per sample."""

    name = "files"
    reader_cls = FilesReader

    def check(self) -> None:
        # One stat per sample file would cost minutes on a parallel filesystem with
        # millions of files: check the labels file here, each sample file when read.
        check_files(self.manifest, self.manifest.aux_files)
