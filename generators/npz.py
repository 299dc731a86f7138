"""NPZ writer: one `.npz` per sample, as MLPerf Storage's unet3d reads.

`train/<index:08d>.npz` holds `x` (the sample array, or a JPEG's bytes as uint8
[n]) and `y` (its label), the members `numpy.savez` writes: an uncompressed
(STORED) zip of two `.npy` files, read back with
`numpy.load(path, allow_pickle=False)`. Unlike `numpy.savez` the zip entries
carry a fixed date (1980-01-01), so the same seed gives byte-identical files.
A dataset with a depth spread (unet3d) stores each `x` at its own first-axis
length (`synth.sample_depth`) and says so in the manifest's
`layout.variable_depth`, which the reader turns into crop-or-pad.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from iobench.core.errors import DatasetError
from iobench.core.manifest import FileEntry, check_magic
from iobench.generators.base import (
    Task,
    Writer,
    each_sample,
    per_sample_tasks,
    write_sample_files,
)
from iobench.generators.synth import (
    DEPTH_SPREAD,
    has_depth_spread,
    labels_array,
    sample_depth,
    stored_sample,
)

_DATE = (1980, 1, 1, 0, 0, 0)  # the zip epoch: no clock in the bytes


def npz_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    """The `.npz` of members x and y, as `numpy.savez(f, x=x, y=y)` writes it (STORED,
    zip64 sizes), dated 1980-01-01."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in (("x", x), ("y", y)):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_DATE)
            info.external_attr = 0o600 << 16
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(arr, order="C"), allow_pickle=False)
    return buf.getvalue()


class NPZWriter(Writer):
    format = "npz"

    def sample_path(self, index: int) -> str:
        return f"train/{index:08d}.npz"

    def plan(self, num_samples: int, samples_per_file: int) -> list[Task]:
        return per_sample_tasks(num_samples, self.sample_path)

    def layout(self, samples_per_file: int) -> dict[str, object]:
        out: dict[str, object] = {
            "samples_per_file": 1, "compression": "none", "tree": "train/<index:08d>.npz",
            "members": {"x": "sample (JPEG: its bytes, uint8)", "y": "label"}}
        if has_depth_spread(self.spec):
            # readers crop or zero-pad x's first axis to sample.shape[0] (a fixed patch)
            mean, std = DEPTH_SPREAD[self.spec.name]
            out["variable_depth"] = {"distribution": "lognormal", "mean": mean, "std": std,
                                     "patch": "first sample.shape[0] slices, zeros below"}
        return out

    def write(self, root: Path, task: Task) -> list[FileEntry]:
        labels = labels_array(self.spec, self.seed, task.first, task.count)

        def items() -> Iterator[tuple[str, int, tuple[bytes]]]:
            for rel, (i, x) in zip(task.files, each_sample(self.spec, self.seed, task.first,
                                                           task.count), strict=True):
                arr = (np.frombuffer(x, dtype=np.uint8) if isinstance(x, bytes)
                       else stored_sample(self.spec, self.seed, i, x))
                yield rel, i, (npz_bytes(arr, labels[i - task.first]),)

        return write_sample_files(root, items())

    def jpeg_sizes(self, path: Path, entry: FileEntry) -> list[int]:
        with zipfile.ZipFile(path) as zf, zf.open("x.npy") as f:
            np.lib.format.read_magic(f)
            shape, _, _ = np.lib.format.read_array_header_1_0(f)
        return [int(shape[0])]

    def check(self, path: Path, entry: FileEntry) -> None:
        spec = self.spec
        try:
            with np.load(path, allow_pickle=False) as z:
                names = sorted(z.files)
                x, y = (z["x"], z["y"]) if names == ["x", "y"] else (None, None)
        except DatasetError:
            raise
        except Exception as e:  # zipfile and numpy raise many kinds for damaged files
            raise DatasetError(f"{path}: cannot be read as .npz ({type(e).__name__}: {e})") from e
        if x is None or y is None:
            raise DatasetError(f"{path}: holds members {names}, expected ['x', 'y']")
        if spec.sample_kind == "jpeg":
            if x.dtype != np.uint8 or x.ndim != 1:
                raise DatasetError(f"{path}: x is {x.dtype}{list(x.shape)}, expected JPEG bytes")
            check_magic(path, x[:3].tobytes(), ".jpeg")
        else:
            assert spec.sample_shape is not None
            want = (sample_depth(spec, self.seed, entry.first_sample), *spec.sample_shape[1:])
            if x.shape != want:
                raise DatasetError(f"{path}: x has shape {x.shape}, expected {want}")
            self.check_dtype(path, x.dtype)
        if y.shape != spec.label_shape or y.dtype != np.dtype(spec.label_dtype):
            raise DatasetError(f"{path}: y is {y.dtype}{list(y.shape)}, expected "
                               f"{spec.label_dtype}{list(spec.label_shape)}")
        self.check_labels(path, y.reshape(1, *spec.label_shape), entry.first_sample)
