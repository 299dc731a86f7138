"""The dataset manifest (`iobench.json`): what a dataset root holds.

Written last by the generators (atomically), read by loaders, `verify`,
`stage` and the training loop. Loaders take the layout from here, never from
guesses. See docs/design.md for the per-format layouts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iobench.errors import ConfigError, DatasetError, DatasetNotFoundError
from iobench.jsonio import read_json, write_json_atomic

MANIFEST_NAME = "iobench.json"
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
    def from_dict(cls, doc: dict[str, Any], root: Path | None = None) -> Manifest:
        doc = {k: v for k, v in doc.items() if k not in ("schema", "schema_version")}
        known = {f.name for f in dataclasses.fields(cls)} - {"root"}
        unknown = sorted(set(doc) - known)
        missing = sorted(k for k in known - set(doc) if k != "extra")
        if unknown or missing:
            raise DatasetError(f"manifest in {root} has unknown keys {unknown} / lacks {missing}")
        try:
            files = tuple(FileEntry(**f) for f in doc.pop("files"))
        except TypeError as e:
            raise DatasetError(f"manifest in {root} has a malformed file entry: {e}") from e
        return cls(files=files, root=root, **doc)

    def write(self, root: str | Path) -> Path:
        """Write atomically as `root/iobench.json`."""
        return write_json_atomic(Path(root) / MANIFEST_NAME, self.to_dict())

    @classmethod
    def load(cls, root: str | Path) -> Manifest:
        """Read `root/iobench.json`; clear errors when missing or damaged."""
        root = Path(root)
        path = root / MANIFEST_NAME
        if not root.is_dir():
            raise DatasetNotFoundError(f"no dataset at {root}: directory does not exist")
        if not path.is_file():
            raise DatasetNotFoundError(f"no iobench dataset at {root}: {MANIFEST_NAME} is missing "
                                       "(generation did not finish, or this is not a dataset)")
        return cls.from_dict(read_json(path, schema=SCHEMA, max_version=SCHEMA_VERSION),
                             root=root.resolve())


def locate(storage: str | Path, dataset: str | None = None, fmt: str | None = None
           ) -> tuple[str, str, Path]:
    """(dataset, format, root) of the one iobench dataset under a storage root.

    `storage` is a storage root holding `<dataset>-<format>/` directories, or a
    dataset root itself. `dataset` and `fmt` narrow the choice; when they are
    not given and exactly one dataset matches, it is the one, so commands can
    take `--dataset`/`--format` from what is there. Several matches or none are
    one-line errors naming the options that fix them.
    """
    from iobench.datasets import DATASETS, FORMATS, dataset_dirname

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
        d, f = dataset or "cifar10", fmt or "hdf5"
        what = (f"no dataset {dataset_dirname(dataset, fmt)} under {root}: "
                f"{root / dataset_dirname(dataset, fmt)} does not exist" if dataset and fmt
                else f"no {dataset or fmt or 'iobench'} dataset under {root}")
        raise DatasetNotFoundError(f"{what}; generate it with `iobench generate --dataset {d} "
                                   f"--format {f} --storage {root}`")
    names = ", ".join(f"{d}-{f}" for d, f in found)
    hint = "--format" if dataset else "--dataset and --format"
    raise ConfigError(f"{root} holds several datasets ({names}); pick one with {hint}")
