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
from iobench.generators.base import Task, Writer, atomic_file, entry_for
from iobench.generators.synth import labels_array, make_label, make_sample
from iobench.manifest import FileEntry

TASK_SAMPLES = 256  # samples per unit of work (and per resume record)
LABELS = "labels.npy"


class FilesWriter(Writer):
    format = "files"

    compression_hint = "per-sample files are stored as JPEG/PNG/.npy; use --compression none"

    def sample_path(self, index: int) -> str:
        ext = self.spec.files_extension
        if self.spec.num_classes:
            label = make_label(self.spec, self.seed, index)
            return f"train/c{int(label):04d}/{index:08d}{ext}"
        return f"train/{index:08d}{ext}"

    def plan(self, num_samples: int, samples_per_file: int) -> list[Task]:
        tasks = [Task(id=k, first=f, count=min(TASK_SAMPLES, num_samples - f),
                      files=tuple(self.sample_path(i)
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

    def _encode(self, payload: bytes | np.ndarray) -> bytes:
        if isinstance(payload, bytes):
            return payload
        buf = io.BytesIO()
        if self.spec.files_extension == ".png":
            from PIL import Image

            Image.fromarray(payload).save(buf, format="PNG", compress_level=6)
        else:
            np.save(buf, payload, allow_pickle=False)
        return buf.getvalue()

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        if task.count == 0:  # the labels file
            with atomic_file(root / LABELS) as tmp, open(tmp, "wb") as f:
                # a file object: given a path, np.save would append ".npy" to the temporary name
                np.save(f, labels_array(self.spec, self.seed, 0, self._num_samples),
                        allow_pickle=False)
            return [entry_for(root, LABELS, -1, 0, role="labels")]
        entries = []
        for rel, i in zip(task.files, range(task.first, task.first + task.count), strict=True):
            payload, _ = make_sample(self.spec, self.seed, i)
            data = self._encode(payload)
            final = root / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(final) as tmp:
                tmp.write_bytes(data)
            entries.append(FileEntry(path=rel, bytes=len(data),
                                     sha256=hashlib.sha256(data).hexdigest(),
                                     first_sample=i, num_samples=1))
        return entries

    def check(self, path: Path, entry: FileEntry) -> None:
        try:
            if entry.role == "labels":
                lab = np.load(path, allow_pickle=False, mmap_mode="r")
                ok = lab.shape[1:] == self.spec.label_shape
            elif path.suffix == ".npy":
                arr = np.load(path, allow_pickle=False, mmap_mode="r")
                ok = arr.shape == self.spec.sample_shape and arr.dtype == self.spec.sample_dtype
            else:
                from PIL import Image

                with Image.open(path) as im:
                    im.verify()
                ok = True
        except Exception as e:  # PIL and numpy raise many kinds for damaged files
            raise DatasetError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e
        if not ok:
            raise DatasetError(f"{path}: unexpected shape or dtype")
