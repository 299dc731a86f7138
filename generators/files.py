"""One file per sample: an ImageFolder-style tree readable by any tool.

`train/c<class:04d>/<index:08d>.JPEG` (imagenet) or `.png` (cifar10),
`train/<index:08d>.npy` (cosmoflow), plus `labels.npy` [N, *label_shape] at
the root. Every sample file is a manifest entry, so loaders never list
directories.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from iobench.core.errors import DatasetError
from iobench.core.manifest import FileEntry, check_magic
from iobench.generators.base import (
    Task,
    Writer,
    atomic_file,
    each_sample,
    entry_for,
    per_sample_tasks,
    write_sample_files,
)
from iobench.generators.synth import labels_array

LABELS = "labels.npy"


class FilesWriter(Writer):
    format = "files"

    def sample_path(self, index: int, label: int | None = None) -> str:
        ext = self.spec.files_extension
        if self.spec.num_classes:
            if label is None:
                label = int(labels_array(self.spec, self.seed, index, 1)[0])
            return f"train/c{label:04d}/{index:08d}{ext}"
        return f"train/{index:08d}{ext}"

    def plan(self, num_samples: int, samples_per_file: int) -> list[Task]:
        labels = (labels_array(self.spec, self.seed, 0, num_samples).tolist()
                  if self.spec.num_classes else [None] * num_samples)
        tasks = per_sample_tasks(num_samples, lambda i: self.sample_path(i, labels[i]))
        tasks.append(Task(id=len(tasks), first=0, count=0, files=(LABELS,)))
        self._num_samples = num_samples
        return tasks

    def layout(self, samples_per_file: int) -> dict[str, object]:
        ext = self.spec.files_extension
        tree = "train/c<class:04d>/<index:08d>" if self.spec.num_classes else "train/<index:08d>"
        return {"samples_per_file": 1, "compression": "none", "tree": tree + ext,
                "labels": LABELS}

    def _encoded(self, first: int, count: int
                 ) -> Iterator[tuple[int, tuple[bytes] | tuple[bytes, memoryview]]]:
        """(index, buffers that make up the file) of samples [first, first + count)."""
        for i, x in each_sample(self.spec, self.seed, first, count):
            if isinstance(x, bytes):  # JPEG
                yield i, (x,)
            elif self.spec.files_extension == ".png":
                from PIL import Image

                buf = io.BytesIO()
                Image.fromarray(x).save(buf, format="PNG", compress_level=6)
                yield i, (buf.getvalue(),)
            else:  # .npy: np.save's own header, then the array's memory as it is
                head = io.BytesIO()
                np.lib.format.write_array_header_1_0(
                    head, np.lib.format.header_data_from_array_1_0(x))
                yield i, (head.getvalue(), x.data)

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        if task.count == 0:  # the labels file
            with atomic_file(root / LABELS) as tmp, open(tmp, "wb") as f:
                # a file object: given a path, np.save would append ".npy" to the temporary name
                np.save(f, labels_array(self.spec, self.seed, 0, self._num_samples),
                        allow_pickle=False)
            return [entry_for(root, LABELS, -1, 0, role="labels")]
        return write_sample_files(root, ((rel, i, parts) for rel, (i, parts) in zip(
            task.files, self._encoded(task.first, task.count), strict=True)))

    def check(self, path: Path, entry: FileEntry) -> None:
        with open(path, "rb") as fh:
            check_magic(path, fh.read(8))
        try:
            if entry.role == "labels":
                lab = np.load(path, allow_pickle=False, mmap_mode="r")
                ok = lab.shape[1:] == self.spec.label_shape
                if ok:
                    self.check_labels(path, lab, 0)
            elif path.suffix == ".npy":
                arr = np.load(path, allow_pickle=False, mmap_mode="r")
                ok = arr.shape == self.spec.sample_shape and arr.dtype == self.spec.sample_dtype
            else:
                from PIL import Image

                with Image.open(path) as im:
                    im.verify()
                ok = True
        except DatasetError:
            raise
        except Exception as e:  # PIL and numpy raise many kinds for damaged files
            raise DatasetError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e
        if not ok:
            raise DatasetError(f"{path}: unexpected shape or dtype")
