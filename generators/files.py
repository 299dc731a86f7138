"""One file per sample: an ImageFolder-style tree readable by any tool.

`train/c<class:04d>/<index:08d>.JPEG` (imagenet) or `.png` (cifar10),
`train/<index:08d>.npy` (cosmoflow), plus `labels.npy` [N, *label_shape] at
the root. Every sample file is a manifest entry, so loaders never list
directories.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

from iobench.errors import DatasetError
from iobench.generators.base import (
    Task,
    Writer,
    atomic_file,
    entry_for,
    make_sample,
    sample_blocks,
)
from iobench.generators.synth import labels_array
from iobench.manifest import FileEntry, check_magic

TASK_SAMPLES = 256  # samples per unit of work (and per resume record)
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
        tasks = [Task(id=k, first=f, count=min(TASK_SAMPLES, num_samples - f),
                      files=tuple(self.sample_path(i, labels[i])
                                  for i in range(f, min(f + TASK_SAMPLES, num_samples))))
                 for k, f in enumerate(range(0, num_samples, TASK_SAMPLES))]
        tasks.append(Task(id=len(tasks), first=0, count=0, files=(LABELS,)))
        self._num_samples = num_samples
        return tasks

    def layout(self, samples_per_file: int) -> dict[str, object]:
        ext = self.spec.files_extension
        tree = "train/c<class:04d>/<index:08d>" if self.spec.num_classes else "train/<index:08d>"
        return {"samples_per_file": 1, "compression": "none", "tree": tree + ext,
                "labels": LABELS}

    def _encoded(self, first: int, count: int):
        """(index, buffers that make up the file) of samples [first, first + count)."""
        spec = self.spec
        if spec.sample_kind == "jpeg":
            for i in range(first, first + count):
                yield i, (make_sample(spec, self.seed, i)[0],)
            return
        for lo, block in sample_blocks(spec, self.seed, first, count):
            for j, arr in enumerate(block):
                if spec.files_extension == ".png":
                    from PIL import Image

                    buf = io.BytesIO()
                    Image.fromarray(arr).save(buf, format="PNG", compress_level=6)
                    yield first + lo + j, (buf.getvalue(),)
                else:  # .npy: np.save's own header, then the array's memory as it is
                    head = io.BytesIO()
                    np.lib.format.write_array_header_1_0(
                        head, np.lib.format.header_data_from_array_1_0(arr))
                    yield first + lo + j, (head.getvalue(), arr.data)

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        if task.count == 0:  # the labels file
            with atomic_file(root / LABELS) as tmp, open(tmp, "wb") as f:
                # a file object: given a path, np.save would append ".npy" to the temporary name
                np.save(f, labels_array(self.spec, self.seed, 0, self._num_samples),
                        allow_pickle=False)
            return [entry_for(root, LABELS, -1, 0, role="labels")]
        entries = []
        for rel, (i, parts) in zip(task.files, self._encoded(task.first, task.count),
                                   strict=True):
            final = root / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            digest, size = hashlib.sha256(), 0
            with atomic_file(final) as tmp, open(tmp, "wb") as f:
                for part in parts:
                    f.write(part)
                    digest.update(part)
                    size += memoryview(part).nbytes
            entries.append(FileEntry(path=rel, bytes=size, sha256=digest.hexdigest(),
                                     first_sample=i, num_samples=1))
        return entries

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
