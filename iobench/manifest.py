"""The dataset manifest (`iobench.json`): what a dataset root holds.

Written last by the generators (atomically), read by loaders, `verify`,
`stage` and the training loop. Loaders take the layout from here, never from
guesses. See docs/design.md for the per-format layouts.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iobench.errors import ConfigError, DatasetError, DatasetNotFoundError
from iobench.jsonio import read_json, write_json_atomic
from iobench.schema import Count, Enum, Int, List, Map, Opt, SchemaError, Str, check

MANIFEST_NAME = "iobench.json"
CONTAINMENT_FILES = 65_536  # up to this many files, each one's real path is checked
SCHEMA = "iobench.manifest"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FileEntry:
    """One file of a dataset, relative to the dataset root.

    `role` is "data" for files holding samples [first_sample,
    first_sample + num_samples), or "labels" / "index" for auxiliary files
    (then first_sample = -1 and num_samples = 0).
    """

    path: str
    bytes: int
    sha256: str
    first_sample: int
    num_samples: int
    role: str = "data"


@dataclass(frozen=True)
class Manifest:
    """A dataset's identity and layout. `root` is where it was read from."""

    dataset: str
    format: str
    num_samples: int
    num_classes: int
    sample: dict[str, Any]  # {"kind": "jpeg"|"array", "shape": [...]|None, "dtype": str}
    label: dict[str, Any]  # {"shape": [...], "dtype": str}
    layout: dict[str, Any]  # format-specific, see docs/design.md
    files: tuple[FileEntry, ...]
    seed: int
    iobench_version: str
    created: str
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. generation statistics
    root: Path | None = field(default=None, compare=False)

    @property
    def total_bytes(self) -> int:
        """Bytes of all files of the dataset."""
        return sum(f.bytes for f in self.files)

    @property
    def data_files(self) -> tuple[FileEntry, ...]:
        """The files that hold samples, in sample order."""
        return tuple(f for f in self.files if f.role == "data")

    def path_of(self, entry: FileEntry) -> Path:
        """Absolute path of a file of this dataset."""
        if self.root is None:
            raise DatasetError("manifest has no root directory; load it with Manifest.load()")
        return self.root / entry.path

    def identity(self) -> dict[str, Any]:
        """The short identity that result files record."""
        return {"dataset": self.dataset, "format": self.format, "num_samples": self.num_samples,
                "total_bytes": self.total_bytes, "seed": self.seed, "created": self.created,
                "root": str(self.root) if self.root else None}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("root")
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **d}

    @classmethod
    def from_dict(cls, doc: Any, root: Path | None = None) -> Manifest:
        """Build from a manifest document, checked first (`check_manifest`): a manifest is
        input from whoever made the dataset, so nothing in it is used unchecked."""
        where = f"manifest in {root}" if root is not None else "manifest"
        check_manifest(doc, where)
        doc = {k: v for k, v in doc.items() if k not in ("schema", "schema_version")}
        files = tuple(FileEntry(**f) for f in doc.pop("files"))
        return cls(files=files, root=root, **doc)

    def write(self, root: str | Path) -> Path:
        """Write atomically as `root/iobench.json`."""
        return write_json_atomic(Path(root) / MANIFEST_NAME, self.to_dict())

    @classmethod
    def load(cls, root: str | Path) -> Manifest:
        """Read `root/iobench.json`, checked, with every file it lists inside `root`
        (symbolic links resolved); clear errors when missing, damaged or escaping."""
        root = Path(root)
        path = root / MANIFEST_NAME
        if not root.is_dir():
            raise DatasetNotFoundError(f"no dataset at {root}: directory does not exist")
        if not path.is_file():
            raise DatasetNotFoundError(f"no iobench dataset at {root}: {MANIFEST_NAME} is missing "
                                       "(generation did not finish, or this is not a dataset)")
        m = cls.from_dict(read_json(path, schema=SCHEMA, max_version=SCHEMA_VERSION),
                          root=root.resolve())
        m.check_contained()
        return m

    def check_contained(self) -> None:
        """Every listed file resolves (symbolic links followed) inside the dataset root.

        Files are checked one by one up to CONTAINMENT_FILES of them; beyond
        that, every distinct directory is, and the readers of one-file-per-sample
        datasets open files with O_NOFOLLOW (a million realpath calls on a
        parallel filesystem would cost minutes before the first batch).
        """
        if self.root is None:
            return
        top = os.path.realpath(self.root)
        paths = ([f.path for f in self.files] if len(self.files) <= CONTAINMENT_FILES
                 else sorted({os.path.dirname(f.path) or "." for f in self.files}))
        for rel in paths:
            real = os.path.realpath(os.path.join(top, rel))
            if real != top and not real.startswith(top + os.sep):
                raise DatasetError(f"manifest in {self.root} lists {rel!r}, which resolves to "
                                   f"{real}, outside the dataset: refused (a symbolic link out "
                                   "of the tree); remove it or regenerate the dataset")


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (for errors naming it)."""
    import stat

    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def bad_label(labels: Any, num_classes: int) -> int | None:
    """The row of the first class label outside 0..num_classes-1, or None (also when the
    dataset has no classes)."""
    import numpy as np

    labels = np.asarray(labels)
    if not num_classes or labels.size == 0:
        return None
    bad = ((labels < 0) | (labels >= num_classes)).reshape(len(labels), -1).any(axis=1)
    return int(np.argmax(bad)) if bad.any() else None


def refuse_irregular(path: str | Path, fd: int | None = None) -> None:
    """A DatasetError when `path` (or the open `fd`) exists and is not a regular file: a
    FIFO would hang whatever reads it, a device or socket is not data iobench wrote."""
    import stat

    try:
        mode = (os.fstat(fd) if fd is not None else os.stat(path)).st_mode
    except OSError:
        return  # missing or unreadable: the caller's own error names it
    if not stat.S_ISREG(mode):
        raise DatasetError(f"{path} is {file_kind(mode)}, not a regular file: a dataset holds "
                           "regular files only; remove it and regenerate or re-stage the "
                           "dataset")


# what a file of each kind starts with (the decoders trust it; a PNG named .JPEG is not one)
MAGIC_BYTES: dict[str, bytes] = {".png": b"\x89PNG\r\n\x1a\n", ".jpeg": b"\xff\xd8\xff",
                                 ".jpg": b"\xff\xd8\xff", ".npy": b"\x93NUMPY"}


def check_magic(path: str | Path, head: bytes, suffix: str | None = None) -> None:
    """A DatasetError when `head` (a file's or blob's first bytes) is not what its kind
    (`suffix`, default the path's) starts with."""
    suffix = (suffix or Path(path).suffix).lower()
    want = MAGIC_BYTES.get(suffix)
    if want is not None and not bytes(head[:len(want)]) == want:
        raise DatasetError(f"{path}: does not start as a {suffix} "
                           f"file does (first bytes {bytes(head[:8])!r}); it is damaged or "
                           "another kind of file: regenerate it")


def locate(storage: str | Path, dataset: str | None = None, fmt: str | None = None
           ) -> tuple[str, str, Path]:
    """(dataset, format, root) of the one iobench dataset under a storage root.

    `storage` is a storage root holding `<dataset>-<format>/` directories, or a
    dataset root itself. `dataset` and `fmt` narrow the choice; when they are
    not given and exactly one dataset matches, it is the one, so commands can
    take `--dataset`/`--format` from what is there. Several matches or none are
    one-line errors naming the options that fix them.
    """
    from iobench.datasets import DATASETS, dataset_dirname
    from iobench.formats import DEFAULT_FORMAT, FORMATS

    root = Path(storage)
    if (root / MANIFEST_NAME).is_file():
        m = Manifest.load(root)
        if (dataset or m.dataset, fmt or m.format) != (m.dataset, m.format):
            raise DatasetError(f"{root} holds {m.dataset}/{m.format}, not "
                               f"{dataset or m.dataset}/{fmt or m.format}: drop --dataset/"
                               "--format or give the ones it holds")
        return m.dataset, m.format, root
    if not root.exists():
        raise DatasetNotFoundError(f"{root} does not exist; give the storage root you "
                                   "generated into (iobench generate --storage DIR)")
    if not root.is_dir():
        raise DatasetNotFoundError(f"{root} is not a directory; give the storage root you "
                                   "generated into (iobench generate --storage DIR)")
    found = [(d, f) for d in ([dataset] if dataset else DATASETS)
             for f in ([fmt] if fmt else FORMATS)
             if (root / dataset_dirname(d, f) / MANIFEST_NAME).is_file()]
    if len(found) == 1:
        d, f = found[0]
        return d, f, root / dataset_dirname(d, f)
    if not found:
        d, f = dataset or "cifar10", fmt or DEFAULT_FORMAT
        what = (f"no dataset {dataset_dirname(dataset, fmt)} under {root}: "
                f"{root / dataset_dirname(dataset, fmt)} does not exist" if dataset and fmt
                else f"no {dataset or fmt or 'iobench'} dataset under {root}")
        raise DatasetNotFoundError(f"{what}; generate it with `iobench generate --dataset {d} "
                                   f"--format {f} --storage {root}`")
    names = ", ".join(f"{d}-{f}" for d, f in found)
    hint = "--format" if dataset else "--dataset and --format"
    raise ConfigError(f"{root} holds several datasets ({names}); pick one with {hint}")


# ------------------------------------------------------------------------ checking a manifest

_ENTRY = Map({"path": Str, "bytes": Count, "sha256": Str, "first_sample": Int,
              "num_samples": Count, "role": Enum("data", "labels", "index")},
             optional=("role",), extra=False)
MANIFEST_SPEC = Map({
    "schema": Enum(SCHEMA), "schema_version": Int, "dataset": Str, "format": Str,
    "num_samples": Count, "num_classes": Count,
    "sample": Map({"kind": Enum("array", "jpeg"), "shape": Opt(List(Count)), "dtype": Str},
                  optional=("shape",)),
    "label": Map({"shape": List(Count), "dtype": Str}),
    "layout": Map({}, extra=True), "files": List(_ENTRY, min_len=1), "seed": Int,
    "iobench_version": Str, "created": Str, "extra": Map({}, extra=True),
}, optional=("schema", "schema_version", "extra"), extra=False)
MAX_SAMPLES = 2**40  # more samples than any dataset: a count beyond is damage, not data
MAX_SAMPLE_BYTES = 2**40


def _dtype(value: str, where: str) -> None:
    import numpy as np

    try:
        dt = np.dtype(value)
    except (TypeError, ValueError):
        raise DatasetError(f"{where}: {value!r} is not a numpy dtype") from None
    if dt.kind not in "biuf" or dt.itemsize == 0:  # no objects (pickle), no void or strings
        raise DatasetError(f"{where}: dtype {value!r} is not a plain number type")


def check_manifest(doc: Any, where: str = "manifest") -> None:
    """The manifest's shape (`MANIFEST_SPEC`), then its meaning: plain relative paths, each
    once; counts in range; data files tiling samples 0..num_samples-1 in order."""
    try:
        check(doc, MANIFEST_SPEC, where)
    except SchemaError as e:
        raise DatasetError(str(e)) from None
    n = doc["num_samples"]
    if n < 1 or n > MAX_SAMPLES:
        raise DatasetError(f"{where}: num_samples {n} is outside 1..{MAX_SAMPLES}")
    for part in ("sample", "label"):
        _dtype(doc[part]["dtype"], f"{where}: {part}.dtype")
        shape = doc[part].get("shape")
        if shape is not None:
            itemsize = 8  # the largest plain number type
            if math.prod(shape) * itemsize > MAX_SAMPLE_BYTES or any(d == 0 for d in shape):
                raise DatasetError(f"{where}: {part}.shape {shape} is not a sample's shape")
    seen: set[str] = set()
    nxt = 0
    for i, f in enumerate(doc["files"]):
        p = f["path"]
        parts = p.split("/")
        if (not p or "\0" in p or p.startswith("/") or ".." in parts or "" in parts
                or "." in parts or p == MANIFEST_NAME or "\\" in p):
            raise DatasetError(f"{where}: files[{i}].path {p!r} is not a plain relative path "
                               "inside the dataset: refused")
        if p in seen:
            raise DatasetError(f"{where}: files[{i}].path {p!r} is listed twice")
        seen.add(p)
        if f.get("role", "data") == "data":
            if f["first_sample"] != nxt or f["num_samples"] < 1:
                raise DatasetError(f"{where}: files[{i}] ({p}) holds samples "
                                   f"{f['first_sample']}..{f['first_sample'] + f['num_samples']}"
                                   f", but the data files must tile 0..{n} in order (next: "
                                   f"{nxt})")
            nxt += f["num_samples"]
            if nxt > n:
                break
    if nxt != n:
        raise DatasetError(f"{where}: the data files hold {nxt} samples, num_samples says {n}")
