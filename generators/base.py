"""The writer contract: how a format lays out files, writes them, and checks them."""

from __future__ import annotations

import contextlib
import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from iobench.datasets import DatasetSpec
from iobench.errors import ConfigError
from iobench.manifest import FileEntry


@dataclass(frozen=True)
class Task:
    """One unit of generation work: samples [first, first + count) into `files`.

    Container formats write one file per task; the `files` format writes one
    file per sample, grouped into tasks. A task with `count == 0` writes an
    auxiliary file (e.g. the `files` format's labels.npy).
    """

    id: int
    first: int
    count: int
    files: tuple[str, ...]  # paths relative to the dataset root


class Writer(ABC):
    """Writes and checks one on-disk format (layouts: docs/design.md)."""

    format: ClassVar[str]
    compressions: ClassVar[tuple[str, ...]] = ("none",)
    compression_hint: ClassVar[str] = "use --compression none"

    def __init__(self, spec: DatasetSpec, seed: int, compression: str = "none") -> None:
        if compression not in self.compressions:
            raise ConfigError(f"--compression {compression!r} is not available for the "
                              f"{self.format} format; {self.compression_hint}")
        if compression != "none" and spec.sample_kind == "jpeg":
            raise ConfigError(f"--compression {compression} on {spec.name}: JPEG bytes are "
                              "already compressed; use --compression none")
        self.spec, self.seed, self.compression = spec, seed, compression

    @abstractmethod
    def plan(self, num_samples: int, samples_per_file: int) -> list[Task]:
        """Split the dataset into tasks, in sample order."""

    @abstractmethod
    def write(self, root: Path, task: Task) -> list[FileEntry]:
        """Write the task's files (temporary name, then rename) and describe them."""

    @abstractmethod
    def check(self, path: Path, entry: FileEntry) -> None:
        """Open `path` with the format's own library; raise DatasetError if it does not
        hold `entry.num_samples` samples in the expected layout."""

    def layout(self, samples_per_file: int) -> dict[str, object]:
        """Format-specific layout details recorded in the manifest."""
        return {"samples_per_file": samples_per_file, "compression": self.compression}


def part_name(k: int, suffix: str) -> str:
    return f"part-{k:05d}{suffix}"


def sha256_file(path: Path, bufsize: int = 16 << 20) -> str:
    """Hex sha256 of a file, read in 16 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(bufsize)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def entry_for(root: Path, rel: str, first: int, count: int, role: str = "data") -> FileEntry:
    p = root / rel
    return FileEntry(path=rel, bytes=p.stat().st_size, sha256=sha256_file(p),
                     first_sample=first, num_samples=count, role=role)


def tmp_path_for(final: Path) -> Path:
    """Temporary name in the same directory (so the rename is atomic)."""
    return final.with_name(f".{final.name}.tmp")


@contextlib.contextmanager
def atomic_file(final: Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success fsync it and rename it to `final`.

    On any failure (out of space included) the temporary file is removed, so
    a dataset never holds a half-written file under its final name.
    """
    tmp = tmp_path_for(final)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        for p in (tmp, Path(f"{tmp}-lock")):
            if p.exists():
                p.unlink()


class ContainerWriter(Writer):
    """A format that packs `samples_per_file` samples into each `part-NNNNN<suffix>` file."""

    suffix: ClassVar[str]

    def plan(self, num_samples: int, samples_per_file: int) -> list[Task]:
        tasks = []
        for k, first in enumerate(range(0, num_samples, samples_per_file)):
            count = min(samples_per_file, num_samples - first)
            tasks.append(Task(id=k, first=first, count=count, files=(part_name(k, self.suffix),)))
        return tasks

    def layout(self, samples_per_file: int) -> dict[str, object]:
        return {**super().layout(samples_per_file), "chunked": self.compression != "none"}
