"""Zarr v3 writer (zarr-python): the dataset root is one sharded Zarr group.

Arrays: `samples` [N, *shape] (or, for JPEG datasets, `jpeg` [N] of variable-length
bytes) with one inner chunk per sample and one shard (one file) per
`samples_per_file` samples, and `labels` [N, *label_shape] with one chunk per
shard's samples; dimension names (`sample`, `d0`, ...; `param`) and consolidated
metadata let `xarray.open_zarr(root)` open it. Inner chunks are stored as they
are, or compressed with zstd (level 3) or gzip (level 4), and end in their crc32c. Each task encodes its
shard and labels chunk with zarr-python in memory and writes them like every
other writer (temporary name, fsync, rename, sha256); the metadata (`zarr.json`
files) is one more task. Every file is a manifest entry: shards "data", labels
chunks "labels", `zarr.json` files "index".
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from iobench.core.errors import DatasetError
from iobench.core.manifest import FileEntry, check_magic
from iobench.core.records import zarr_quiet
from iobench.generators.base import Task, Writer, file_entry, written_file
from iobench.generators.synth import fill_samples, labels_array, make_jpeg

if TYPE_CHECKING:
    from zarr.core.array_spec import ArrayConfigParams

_LEVELS = {"zstd": 3, "gzip": 4}



class ZarrWriter(Writer):
    format = "zarr"
    library_modules = ("zarr", "numcodecs")

    @property
    def data_name(self) -> str:
        return "jpeg" if self.spec.sample_kind == "jpeg" else "samples"

    def _group(self, num_samples: int, samples_per_file: int) -> tuple[Any, dict[str, Any]]:
        """The group, in a fresh in-memory store (and that store's dict of keys)."""
        import zarr
        from zarr.codecs import Crc32cCodec, GzipCodec, ZstdCodec
        from zarr.storage import MemoryStore

        spec, n, per = self.spec, num_samples, samples_per_file
        keys: dict[str, Any] = {}
        # every inner chunk ends in its crc32c: a damaged sample is an error, not noise
        codecs = {"none": (), "zstd": (ZstdCodec(level=_LEVELS["zstd"]),),
                  "gzip": (GzipCodec(level=_LEVELS["gzip"]),)}[self.compression]
        codecs = (*codecs, Crc32cCodec())
        keep: ArrayConfigParams = {"write_empty_chunks": True}  # every shard and chunk is a file, zeros or not
        with zarr_quiet():
            g = zarr.create_group(store=MemoryStore(keys), zarr_format=3,
                                  attributes={"dataset": spec.name, "iobench": "samples and "
                                              "labels by sample index; see iobench.json"})
            if spec.sample_kind == "jpeg":
                g.create_array("jpeg", shape=(n,), dtype=zarr.dtype.VariableLengthBytes(),
                               chunks=(1,), shards=(per,), compressors=codecs, fill_value=b"",
                               dimension_names=("sample",), config=keep)
            else:
                shape = spec.array_shape
                g.create_array("samples", shape=(n, *shape), dtype=spec.sample_dtype,
                               chunks=(1, *shape), shards=(per, *shape), compressors=codecs,
                               fill_value=0, config=keep,
                               dimension_names=("sample", *(f"d{i}" for i in range(len(shape)))))
            lshape = spec.label_shape
            g.create_array("labels", shape=(n, *lshape), dtype=spec.label_dtype,
                           chunks=(per, *lshape), compressors=None, fill_value=0, config=keep,
                           dimension_names=("sample", *(("param",) if lshape else ())))
            zarr.consolidate_metadata(g.store)
        return g, keys

    def _keys(self, k: int) -> tuple[str, str]:
        """The store keys (file paths) of shard k and its labels chunk."""
        tail = "/0" * (len(self.spec.sample_shape) if self.spec.sample_shape else 0)
        ltail = "/0" * len(self.spec.label_shape)
        return f"{self.data_name}/c/{k}{tail}", f"labels/c/{k}{ltail}"

    def plan(self, num_samples: int, samples_per_file: int) -> list[Task]:
        self._shape = (num_samples, samples_per_file)
        tasks = [Task(id=k, first=first, count=min(samples_per_file, num_samples - first),
                      files=self._keys(k))
                 for k, first in enumerate(range(0, num_samples, samples_per_file))]
        meta = ("zarr.json", f"{self.data_name}/zarr.json", "labels/zarr.json")
        return [*tasks, Task(id=len(tasks), first=0, count=0, files=meta)]

    def layout(self, samples_per_file: int) -> dict[str, object]:
        return {"samples_per_file": samples_per_file, "compression": self.compression,
                "chunked": True, "store": "the dataset root is a Zarr v3 group",
                "arrays": {self.data_name: "one inner chunk per sample, one shard per file",
                           "labels": "one chunk per shard"}}

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        g, keys = self._group(*self._shape)
        spec, n = self.spec, task.count
        if n == 0:  # the metadata
            return [self._put(root, rel, keys[rel].to_bytes(), -1, 0, "index")
                    for rel in task.files]
        lo, hi = task.first, task.first + n
        with zarr_quiet():
            if spec.sample_kind == "jpeg":
                blobs = np.empty(n, dtype=object)
                blobs[:] = [make_jpeg(spec, self.seed, i) for i in range(lo, hi)]
                g["jpeg"][lo:hi] = blobs
            else:
                block = np.empty((n, *spec.array_shape), dtype=spec.sample_dtype)
                fill_samples(spec, self.seed, lo, block)
                g["samples"][lo:hi] = block
                del block
            g["labels"][lo:hi] = labels_array(spec, self.seed, lo, n)
        data, lab = task.files
        written = sorted(k for k in keys if not k.endswith("zarr.json"))
        if written != sorted(task.files):  # zarr-python changed its key encoding
            raise DatasetError(f"zarr wrote keys {written}, iobench expected {list(task.files)}")
        return [self._put(root, data, keys[data].to_bytes(), lo, n, "data"),
                self._put(root, lab, keys[lab].to_bytes(), -1, 0, "labels")]

    @staticmethod
    def _put(root: Path, rel: str, data: bytes, first: int, count: int, role: str
             ) -> FileEntry:
        final = root / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        with written_file(final) as wf:
            wf.tmp.write_bytes(data)
        return file_entry(rel, wf, first, count, role)

    def _open(self, path: Path, entry: FileEntry) -> Any:
        """The group that holds `path` (the dataset root: `path` less `entry.path`)."""
        import zarr
        from zarr.storage import LocalStore

        root = Path(str(path)[:-len(entry.path)])
        with zarr_quiet():
            return zarr.open_group(LocalStore(root, read_only=True), mode="r")

    @staticmethod
    def _check_array_metadata(path: Path, entry: FileEntry) -> None:
        """An array's own `zarr.json` is the metadata the root's consolidated copy holds for
        it (iobench's readers open the store through that copy; any other Zarr reader reads
        this file), parsed, not only hashed: a DatasetError when it is not."""
        from iobench.core.jsonio import load_json

        root = Path(str(path)[:-len(entry.path)])
        name = entry.path[:-len("/zarr.json")]
        try:
            own = load_json(path)
            whole = load_json(root / "zarr.json")
            held = whole["consolidated_metadata"]["metadata"][name]
        except (KeyError, TypeError):
            raise DatasetError(f"{root / 'zarr.json'}: its consolidated metadata holds no "
                               f"{name!r}; regenerate the dataset") from None
        if own != held:
            raise DatasetError(f"{path}: the array's metadata differs from the consolidated "
                               "copy in the store's zarr.json (damaged or edited); regenerate "
                               "the dataset")

    def jpeg_sizes(self, path: Path, entry: FileEntry) -> list[int]:
        g = self._open(path, entry)
        with zarr_quiet():
            blobs = g["jpeg"][entry.first_sample:entry.first_sample + entry.num_samples]
        return [len(b) for b in blobs]

    def check(self, path: Path, entry: FileEntry) -> None:
        spec = self.spec
        if entry.path.endswith("/zarr.json"):
            self._check_array_metadata(path, entry)
        try:
            g = self._open(path, entry)
            with zarr_quiet():
                data, labels = g[self.data_name], g["labels"]
                if entry.role == "data":
                    got = data[entry.first_sample:entry.first_sample + entry.num_samples]
                elif entry.role == "labels":
                    k = int(entry.path.split("/")[2])
                    per = labels.chunks[0]
                    self.check_labels(path, labels[k * per:(k + 1) * per], k * per)
                    return
        except DatasetError:
            raise
        except Exception as e:  # zarr and its codecs raise many kinds for damaged stores
            raise DatasetError(f"{path}: cannot be read as Zarr ({type(e).__name__}: {e})") from e
        n = labels.shape[0]
        want = (n,) if spec.sample_kind == "jpeg" else (n, *spec.array_shape)
        if data.shape != want or labels.shape[1:] != spec.label_shape:
            raise DatasetError(f"{path}: the store holds {self.data_name} {list(data.shape)} and "
                               f"labels {list(labels.shape)}, expected {list(want)}")
        if entry.role != "data":
            return
        if spec.sample_kind == "jpeg":
            for j, blob in enumerate(got):
                check_magic(f"{path} (sample {entry.first_sample + j})", blob[:3], ".jpeg")
        else:
            self.check_dtype(path, data.dtype)
