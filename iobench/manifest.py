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

from iobench.errors import DatasetError, DatasetNotFoundError
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
