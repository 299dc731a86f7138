"""The dataset manifest (`iobench.json`): what a dataset root holds.

Written last by the generators (atomically), read by loaders, `verify`,
`stage` and the training loop. Loaders take the layout from here, never from
guesses. See docs/design.md for the per-format layouts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from iobench.core.errors import DatasetError, DatasetNotFoundError
from iobench.core.jsonio import atomic_file, read_json, write_json_atomic
from iobench.core.regular import file_kind as file_kind  # re-exported: generators.verify
from iobench.core.schema import Count, Enum, Int, List, Map, Opt, SchemaError, Str, check

MANIFEST_NAME = "iobench.json"
CONTAINMENT_FILES = 65_536  # up to this many files, each one's real path is checked
SCHEMA = "iobench.manifest"
SCHEMA_VERSION = 2  # 2: the compact file table (`CompactFiles`); 1 (the JSON list) still read
JSON_VERSION = 1  # what a manifest listing every file as JSON is written as (older readers too)
# beyond this many data files generators write the compact form: the same threshold where
# per-file containment checks stop, so the form changes nothing about what is checked
COMPACT_FILES = CONTAINMENT_FILES
TABLE_DIR = "iobench.table"  # the compact form's side arrays, beside iobench.json
TABLE_ARRAYS = ("dir", "bytes", "sha256")


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

    def as_dict(self) -> dict[str, Any]:
        """Its fields by name (`dataclasses.asdict` costs ~100x more per entry)."""
        return dict(self.__dict__)


_NAME = re.compile(r"^(\D*?)(\d+)(\D*)$")  # a data file's name: prefix, index digits, suffix


class CompactFiles(Sequence[FileEntry]):
    """The file table of a compact (version 2) manifest, built per range, never whole.

    Data file i holds samples [i*k, min((i+1)*k, N)) (k = samples_per_file) and is
    `dirs[dir[i]]/<prefix><i:0{width}d><suffix>`; its size and SHA-256 are rows of
    `TABLE_DIR/{bytes,sha256}.npy`, read with pread when asked for (`NpyRows`: a rank
    reads the rows it asks for, a batch's in a few reads, a table of <= 8 MiB whole once,
    and keeps none of the table mapped). Auxiliary files
    (labels, index) are listed as in version 1, after the data files. Indexing and slicing build `FileEntry`s for what is asked, so a rank
    of a 10M-file dataset pays for its slice, not for the table.
    """

    def __init__(self, table: dict[str, Any], aux: Sequence[FileEntry], num_samples: int,
                 root: Path | None, arrays: dict[str, np.ndarray] | None = None) -> None:
        self.num_files: int = table["count"]
        self.samples_per_file: int = table["samples_per_file"]
        self.dirs: tuple[str, ...] = tuple(table["dirs"])
        self.prefix: str = table["prefix"]
        self.width: int = table["width"]
        self.suffix: str = table["suffix"]
        self.data_bytes: int = table["data_bytes"]
        self.aux: tuple[FileEntry, ...] = tuple(aux)
        self.num_samples = num_samples
        self.root = root
        self._arrays = arrays

    # -- the side arrays ------------------------------------------------------------------
    def table_dict(self) -> dict[str, Any]:
        return {"count": self.num_files, "samples_per_file": self.samples_per_file,
                "dirs": list(self.dirs), "prefix": self.prefix, "width": self.width,
                "suffix": self.suffix, "data_bytes": self.data_bytes}

    def arrays(self) -> dict[str, Any]:
        """The side arrays: `NpyRows` read from `root`, or arrays in memory (not written
        yet)."""
        if self._arrays is None:
            if self.root is None:
                raise DatasetError("compact manifest has no root directory; load it with "
                                   "Manifest.load()")
            self._arrays = open_table(self.root, self.num_files)
        return self._arrays

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        if self.root is not None:  # workers reopen the files (an array would travel whole)
            d["_arrays"] = None
        return d

    def write_arrays(self, root: Path) -> None:
        """Write the side arrays under `root` (each atomically), before the manifest."""
        a = self.arrays()
        top = Path(root) / TABLE_DIR
        top.mkdir(exist_ok=True)
        for name in TABLE_ARRAYS:
            src = a[name]
            with atomic_file(top / f"{name}.npy") as f:
                np.lib.format.write_array_header_1_0(f, {
                    "descr": np.lib.format.dtype_to_descr(src.dtype), "fortran_order": False,
                    "shape": tuple(src.shape)})
                for lo in range(0, len(src), 1 << 20):  # a chunk at a time (a stage's copy)
                    f.write(np.ascontiguousarray(src[lo:lo + (1 << 20)]).tobytes())

    # -- data files by position -----------------------------------------------------------
    def name(self, i: int) -> str:
        """Data file i's name within its folder."""
        return f"{self.prefix}{i:0{self.width}d}{self.suffix}"

    def data_entries(self, lo: int, hi: int) -> list[FileEntry]:
        """`FileEntry`s of data files lo..hi-1 (clipped to the table)."""
        lo, hi = max(0, lo), min(self.num_files, hi)
        return self.entries_at(np.arange(lo, hi, dtype=np.int64)) if hi > lo else []

    def entries_at(self, positions: np.ndarray) -> list[FileEntry]:
        """`FileEntry`s of the data files at `positions` (ascending, in 0..count-1)."""
        if not len(positions):
            return []
        a = self.arrays()
        lo, hi = int(positions[0]), int(positions[-1]) + 1
        rows: Any = (slice(lo, hi) if hi - lo == len(positions) else positions)
        dirs = np.asarray(a["dir"][rows])
        sizes = np.asarray(a["bytes"][rows])
        if len(dirs) and (int(dirs.min()) < 0 or int(dirs.max()) >= len(self.dirs)):
            raise DatasetError(f"{self.root}/{TABLE_DIR}/dir.npy names a folder outside the "
                               f"{len(self.dirs)} the manifest lists: the table is damaged; "
                               "regenerate the dataset")
        if len(sizes) and int(sizes.min()) < 0:
            raise DatasetError(f"{self.root}/{TABLE_DIR}/bytes.npy holds a negative size: "
                               "the table is damaged; regenerate the dataset")
        shas = np.asarray(a["sha256"][rows])
        hexes = shas.tobytes().hex()  # one conversion for the chunk, sliced per row below
        known: list[bool] = np.any(shas, axis=1).tolist()  # an all-zero row: no checksum
        k, n = self.samples_per_file, self.num_samples
        pre, suf, width, names = self.prefix, self.suffix, self.width, self.dirs
        return [FileEntry(path=f"{names[d]}/{pre}{i:0{width}d}{suf}", bytes=b,
                          sha256=hexes[64 * j:64 * j + 64] if known[j] else "",
                          first_sample=i * k, num_samples=min(k, n - i * k))
                for j, (i, d, b) in enumerate(zip(positions.tolist(), dirs.tolist(),
                                                  sizes.tolist(), strict=True))]

    def paths_at(self, root: Path, positions: np.ndarray) -> list[str]:
        """Absolute paths (strings) of the data files at `positions` (ascending): what
        eviction walks, without building their entries."""
        if not len(positions):
            return []
        lo, hi = int(positions[0]), int(positions[-1]) + 1
        rows: Any = (slice(lo, hi) if hi - lo == len(positions) else positions)
        dirs = np.asarray(self.arrays()["dir"][rows])
        if int(dirs.min()) < 0 or int(dirs.max()) >= len(self.dirs):
            raise DatasetError(f"{self.root}/{TABLE_DIR}/dir.npy names a folder outside the "
                               f"{len(self.dirs)} the manifest lists: the table is damaged; "
                               "regenerate the dataset")
        tops = [f"{root}/{d}/{self.prefix}" for d in self.dirs]
        suf, width = self.suffix, self.width
        return [f"{tops[d]}{i:0{width}d}{suf}"
                for i, d in zip(positions.tolist(), dirs.tolist(), strict=True)]

    def path_test(self) -> Callable[[str], bool]:
        """Whether a path relative to the root is one of the table's data files: the
        pattern's name of an index below the count, in the folder that index's row names.
        Nothing is listed; the folder column is read whole (4 bytes or less per file) the
        first time a name matches."""
        name = re.compile(re.escape(self.prefix) + r"(\d{" + str(self.width) + "})"
                          + re.escape(self.suffix) + "$")
        folders = {d: k for k, d in enumerate(self.dirs)}
        column: list[np.ndarray] = []

        def test(rel: str) -> bool:
            folder, _, base = rel.rpartition("/")
            m = name.match(base)
            if m is None or folder not in folders:
                return False
            i = int(m.group(1))
            if i >= self.num_files:
                return False
            if not column:
                column.append(np.asarray(self.arrays()["dir"][:]))
            return int(column[0][i]) == folders[folder]

        return test

    # -- Sequence --------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_files + len(self.aux)

    @overload
    def __getitem__(self, i: int) -> FileEntry: ...

    @overload
    def __getitem__(self, i: slice) -> list[FileEntry]: ...

    def __getitem__(self, i: int | slice) -> FileEntry | list[FileEntry]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step == 1:
                return self.data_entries(start, stop) + list(
                    self.aux[max(0, start - self.num_files):max(0, stop - self.num_files)])
            return [self[j] for j in range(start, stop, step)]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"file {i} of {n}")
        return self.data_entries(i, i + 1)[0] if i < self.num_files else self.aux[i - self.num_files]

    def __iter__(self) -> Iterator[FileEntry]:
        for lo in range(0, self.num_files, 65_536):
            yield from self.data_entries(lo, lo + 65_536)
        yield from self.aux

    @property
    def data(self) -> DataFiles:
        return DataFiles(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CompactFiles):
            if (self.table_dict(), self.aux) != (other.table_dict(), other.aux):
                return False
            a, b = self.arrays(), other.arrays()
            return all(np.array_equal(a[k][:], b[k][:]) for k in TABLE_ARRAYS)
        if isinstance(other, Sequence):
            return len(other) == len(self) and all(x == y for x, y in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CompactFiles({self.num_files} data files under {len(self.dirs)} folders)"


class DataPaths(Sequence[Path]):
    """Absolute paths of a compact table's data files by position, each built when asked
    (a reader's `paths`: never a list of millions of them)."""

    def __init__(self, root: Path, table: CompactFiles) -> None:
        self.root, self.table = root, table

    def __len__(self) -> int:
        return self.table.num_files

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if not 0 <= i < self.table.num_files:
            raise IndexError(f"data file {i} of {self.table.num_files}")
        d = int(self.table.arrays()["dir"][i])
        if not 0 <= d < len(self.table.dirs):
            raise DatasetError(f"{self.root}/{TABLE_DIR}/dir.npy names a folder outside the "
                               f"{len(self.table.dirs)} the manifest lists: the table is "
                               "damaged; regenerate the dataset")
        return self.root / self.table.dirs[d] / self.table.name(i)

    def at(self, positions: np.ndarray) -> list[str]:
        """Paths (strings) of the data files at `positions` (ascending), their folders
        read for all at once: a batch's paths, without a read per file."""
        if len(positions) and (int(positions[0]) < 0
                               or int(positions[-1]) >= self.table.num_files):
            raise IndexError(f"data files {positions[0]}..{positions[-1]} of "
                             f"{self.table.num_files}")
        return self.table.paths_at(self.root, positions)


class DataColumn:
    """Per-data-file numbers of a compact table by position, read from its side arrays
    (`sizes`: `NpyRows`), or computed (`starts`, `counts`): indexable by an int or an
    index array like the numpy arrays readers hold for a JSON-list manifest."""

    def __init__(self, table: CompactFiles, what: str) -> None:
        self.table, self.what = table, what

    def __len__(self) -> int:
        return self.table.num_files

    def __getitem__(self, pos: Any) -> Any:
        t = self.table
        if self.what == "bytes":
            return t.arrays()["bytes"][pos]
        first = np.asarray(pos, dtype=np.int64) * t.samples_per_file
        if self.what == "starts":
            return first if first.ndim else int(first)
        counts = np.minimum(t.samples_per_file, t.num_samples - first)
        return counts if counts.ndim else int(counts)


class DataFiles(Sequence[FileEntry]):
    """The data files of a `CompactFiles` table, as a sequence (built per range)."""

    def __init__(self, table: CompactFiles) -> None:
        self.table = table

    def __len__(self) -> int:
        return self.table.num_files

    @overload
    def __getitem__(self, i: int) -> FileEntry: ...

    @overload
    def __getitem__(self, i: slice) -> list[FileEntry]: ...

    def __getitem__(self, i: int | slice) -> FileEntry | list[FileEntry]:
        t = self.table
        if isinstance(i, slice):
            start, stop, step = i.indices(t.num_files)
            if step == 1:
                return t.data_entries(start, stop)
            return [t.data_entries(j, j + 1)[0] for j in range(start, stop, step)]
        if i < 0:
            i += t.num_files
        if not 0 <= i < t.num_files:
            raise IndexError(f"data file {i} of {t.num_files}")
        return t.data_entries(i, i + 1)[0]

    def __iter__(self) -> Iterator[FileEntry]:
        for lo in range(0, self.table.num_files, 65_536):
            yield from self.table.data_entries(lo, lo + 65_536)


class NpyRows:
    """Rows of a .npy file read on demand with pread, never mapped: a memory map of a
    table read at random ends up wholly resident in the process (the kernel maps a 2 MB
    folio around each touched row), so a rank would count the whole table as its own.

    Indexable like a read-only array by an int, a slice or an int array; `[:]` reads it
    all. Picklable: the file descriptor is per process, opened when first needed.

    Random access (an int, an index array: a batch's labels, sizes, folders) costs no
    system call per row: a table of up to WHOLE_BYTES is read whole, once per process,
    and held (a dataset just past the compact threshold pays what its JSON list did);
    a larger one reads a batch's rows with one pread per run of rows less than
    GAP_BYTES apart, so a process holds a batch's rows, never the table.
    """

    WHOLE_BYTES = 8 << 20  # tables up to this are held whole (1M int64 rows); 3 columns
    # of a files dataset: <= 24 MiB a process, nothing at 10M samples
    GAP_BYTES = 16 << 10  # rows closer than this are read in one span (a pread costs ~
    # what copying this much from the page cache does)

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype[Any],
                 offset: int) -> None:
        self.path, self.shape, self.dtype, self.offset = Path(path), shape, dtype, offset
        self.row_shape = shape[1:]
        self.row_bytes = dtype.itemsize * math.prod(self.row_shape)
        self._fd: tuple[int, int] | None = None  # (pid, fd)
        self._whole: np.ndarray | None = None  # the table, once read (<= WHOLE_BYTES)

    @classmethod
    def open(cls, path: str | Path) -> NpyRows:
        """A .npy file's rows (its header read and checked: C order, a plain dtype)."""
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read(f)
            if fortran or dtype.hasobject:
                raise ValueError("not a C-ordered array of numbers")
            return cls(Path(path), tuple(shape), dtype, f.tell())

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None, "_whole": None}  # each process reads its own

    def _held(self) -> np.ndarray | None:
        """The whole table, read on first use, when it is at most WHOLE_BYTES; else None."""
        if self._whole is None and len(self) * self.row_bytes <= self.WHOLE_BYTES:
            self._whole = self._read(0, len(self))
        return self._whole

    def __del__(self) -> None:
        if self._fd is not None and self._fd[0] == os.getpid():
            os.close(self._fd[1])

    def _read(self, first: int, count: int) -> np.ndarray:
        out = np.empty((count, *self.row_shape), dtype=self.dtype)
        if self._fd is None or self._fd[0] != os.getpid():
            self._fd = (os.getpid(), os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))
        view = out.data.cast("B")
        done, at = 0, self.offset + first * self.row_bytes
        while done < len(view):
            n = os.preadv(self._fd[1], [view[done:]], at + done)
            if n <= 0:
                raise DatasetError(f"{self.path} ends before row {first + count}: it is "
                                   "truncated; regenerate or re-stage the dataset")
            done += n
        return out

    def __getitem__(self, key: Any) -> Any:
        n = len(self)
        if isinstance(key, slice):  # a range: one read (a pass over the table holds none)
            start, stop, step = key.indices(n)
            rows = self._read(start, max(0, stop - start)) if stop > start else \
                np.empty((0, *self.row_shape), dtype=self.dtype)
            return rows[::step] if step != 1 else rows
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"row {key} of {n}")
            held = self._held()
            if held is None:
                return self._read(i, 1)[0]
            return held[i].copy() if self.row_shape else held[i]  # never a view of it
        idx = np.asarray(key, dtype=np.int64)
        if idx.size == 0:
            return np.empty((*idx.shape, *self.row_shape), dtype=self.dtype)
        lo, hi = int(idx.min()), int(idx.max()) + 1
        if lo < 0 or hi > n:
            raise IndexError(f"rows {lo}..{hi - 1} of {n}")
        held = self._held()
        if held is not None:
            return held[idx]
        return self._gather(idx)

    def _gather(self, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` (in range): one pread per run of the distinct rows whose gaps are
        under GAP_BYTES (a few runs per batch, not a read per row)."""
        rows, inv = np.unique(idx.ravel(), return_inverse=True)
        gap = max(1, self.GAP_BYTES // max(1, self.row_bytes))
        breaks = np.flatnonzero(np.diff(rows) > gap) + 1
        firsts = np.concatenate(([0], breaks)).tolist()
        ends = np.concatenate((breaks, [len(rows)])).tolist()
        out = np.empty((len(rows), *self.row_shape), dtype=self.dtype)
        if self._fd is None or self._fd[0] != os.getpid():
            self._fd = (os.getpid(), os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))
        fd, rb, base = self._fd[1], self.row_bytes, self.offset
        flat = out.data.cast("B")
        at = rows.tolist()
        for a, b in zip(firsts, ends, strict=True):  # one read per run (a loop over runs)
            lo = at[a]
            if b - a == 1:  # a lone row (most of them, in a big table): straight into place
                if os.preadv(fd, [flat[a * rb:(a + 1) * rb]], base + lo * rb) != rb:
                    out[a] = self._read(lo, 1)[0]  # a short read: retried, or named
            else:
                out[a:b] = self._read(lo, at[b - 1] + 1 - lo)[rows[a:b] - lo]
        return out[inv.reshape(-1)].reshape(*idx.shape, *self.row_shape)


def open_table(root: Path, count: int) -> dict[str, Any]:
    """The compact table's side arrays under `root` (`NpyRows`, read on demand), their
    headers checked (kind, shape); a one-line DatasetError naming a missing or wrong one."""
    want = {"dir": ((count,), "iu"), "bytes": ((count,), "iu"), "sha256": ((count, 32), "u")}
    out = {}
    for name, (shape, kinds) in want.items():
        path = Path(root) / TABLE_DIR / f"{name}.npy"
        refuse_irregular(path)
        try:
            a = NpyRows.open(path)
        except FileNotFoundError:
            raise DatasetError(f"{path} is missing: the compact manifest of {root} needs it; "
                               "regenerate or re-stage the dataset") from None
        except (OSError, ValueError) as e:
            raise DatasetError(f"{path} is not a readable .npy array ({e}); regenerate or "
                               "re-stage the dataset") from None
        if a.shape != shape or a.dtype.kind not in kinds or (name == "sha256"
                                                           and a.dtype.itemsize != 1):
            raise DatasetError(f"{path} holds {a.dtype}{list(a.shape)}, the manifest needs "
                               f"{'uint8' if name == 'sha256' else 'integers'}{list(shape)}: "
                               "it is damaged or from another dataset; regenerate it")
        out[name] = a
    return out


def compact_files(entries: Iterable[FileEntry], num_samples: int,
                  count: int | None = None) -> CompactFiles | None:
    """The compact table of a file list, or None when its data files do not follow one
    naming pattern (`dir/<prefix><index><suffix>`, index = position) with one size of file
    in samples, or do not come first: then the manifest stays a JSON list.

    With `count` (the number of data files), `entries` is streamed: each row goes
    straight into the table's arrays (generate builds a 10M-file table so, from its
    journals, without a list of every entry)."""
    if count is None:
        entries = list(entries)
        count = sum(1 for e in entries if e.role == "data")
    if count < 1:
        return None
    aux: list[FileEntry] = []
    dirs: dict[str, int] = {}
    dir_idx = np.empty(count, dtype=np.int32)
    sizes = np.empty(count, dtype=np.int64)
    shas = np.zeros((count, 32), dtype=np.uint8)
    i = k = width = 0
    prefix = suffix = ""
    for e in entries:
        if e.role != "data":
            aux.append(e)
            continue
        if aux or i >= count:  # a data file after an auxiliary one, or more than counted
            return None
        d, _, name = e.path.rpartition("/")
        if i == 0:
            m = _NAME.match(name)
            k = e.num_samples
            if not d or m is None or k < 1:
                return None
            prefix, width, suffix = m.group(1), len(m.group(2)), m.group(3)
        if (name != f"{prefix}{i:0{width}d}{suffix}" or e.first_sample != i * k
                or e.num_samples != min(k, num_samples - i * k) or not d):
            return None
        dir_idx[i] = dirs.setdefault(d, len(dirs))
        sizes[i] = e.bytes
        if e.sha256:
            try:
                shas[i] = np.frombuffer(bytes.fromhex(e.sha256), dtype=np.uint8)
            except ValueError:  # not a SHA-256 in hex: only the JSON list can hold it
                return None
        i += 1
    if i != count:
        return None
    table = {"count": count, "samples_per_file": k, "dirs": list(dirs), "prefix": prefix,
             "width": width, "suffix": suffix, "data_bytes": int(sizes.sum())}
    arrays = {"dir": dir_idx.astype(np.uint16) if len(dirs) <= 65_536 else dir_idx,
              "bytes": sizes, "sha256": shas}
    return CompactFiles(table, aux, num_samples, None, arrays)


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
    files: Sequence[FileEntry]  # a tuple (version 1), or `CompactFiles` (version 2)
    seed: int
    iobench_version: str
    created: str
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. generation statistics
    root: Path | None = field(default=None, compare=False)

    @property
    def compact(self) -> CompactFiles | None:
        """The compact file table, when the manifest has one (version 2)."""
        return self.files if isinstance(self.files, CompactFiles) else None

    @property
    def total_bytes(self) -> int:
        """Bytes of all files of the dataset."""
        if (t := self.compact) is not None:
            return t.data_bytes + sum(f.bytes for f in t.aux)
        return sum(f.bytes for f in self.files)

    @property
    def data_bytes(self) -> int:
        """Bytes of the files that hold samples (a compact table's from its header)."""
        if (t := self.compact) is not None:
            return t.data_bytes
        return sum(f.bytes for f in self.files if f.role == "data")

    @property
    def data_files(self) -> Sequence[FileEntry]:
        """The files that hold samples, in sample order (built per range when compact)."""
        if (t := self.compact) is not None:
            return t.data
        return tuple(f for f in self.files if f.role == "data")

    @property
    def aux_files(self) -> tuple[FileEntry, ...]:
        """The files that hold no samples (labels, index)."""
        if (t := self.compact) is not None:
            return t.aux
        return tuple(f for f in self.files if f.role != "data")

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
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name != "root"}
        if (t := self.compact) is not None:
            d["files"] = [f.as_dict() for f in t.aux]
            return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **d,
                    "table": t.table_dict()}
        d["files"] = [f.as_dict() for f in self.files]
        return {"schema": SCHEMA, "schema_version": JSON_VERSION, **d}

    @classmethod
    def from_dict(cls, doc: Any, root: Path | None = None) -> Manifest:
        """Build from a manifest document, checked first (`check_manifest`): a manifest is
        input from whoever made the dataset, so nothing in it is used unchecked."""
        where = f"manifest in {root}" if root is not None else "manifest"
        check_manifest(doc, where)
        doc = {k: v for k, v in doc.items() if k not in ("schema", "schema_version")}
        files: Sequence[FileEntry] = tuple(FileEntry(**f) for f in doc.pop("files"))
        table = doc.pop("table", None)
        if table is not None:
            files = CompactFiles(table, files, doc["num_samples"], root)
        return cls(files=files, root=root, **doc)

    def with_compact(self, compact: bool | None = None) -> Manifest:
        """This manifest in the compact form (`compact=True`), the JSON list (`False`), or
        the form its size calls for (None: compact beyond COMPACT_FILES data files, when
        the files follow one naming pattern)."""
        t = self.compact
        if compact is None:
            compact = len(self.files) - len(self.aux_files) > COMPACT_FILES
        if compact and t is None:
            t = compact_files(self.files, self.num_samples)
            return self if t is None else dataclasses.replace(self, files=t)
        if not compact and t is not None:
            return dataclasses.replace(self, files=tuple(t))
        return self

    def write(self, root: str | Path, form: str = "keep", indent: int | None = 1) -> Path:
        """Write atomically as `root/iobench.json` (the compact form's side arrays first,
        in `TABLE_DIR`), in the form it has (`keep`), the one its size calls for (`auto`,
        see `with_compact`), `compact` (when the files follow one pattern) or `json`;
        `indent=None`: one line, with the C encoder (several times faster)."""
        choice = {"keep": "keep", "auto": None, "compact": True, "json": False}
        if form not in choice:
            raise ValueError(f"form {form!r}: one of {', '.join(choice)}")
        m = self if form == "keep" else self.with_compact(choice[form])  # type: ignore[arg-type]
        if (t := m.compact) is not None:
            t.write_arrays(Path(root))
        return write_json_atomic(Path(root) / MANIFEST_NAME, m.to_dict(), indent=indent)

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
        if (t := m.compact) is not None:
            t.arrays()  # their headers, now: a missing or wrong array fails here, not mid-run
        m.check_contained()
        return m

    def check_contained(self) -> None:
        """Every listed file resolves (symbolic links followed) inside the dataset root.

        Files are checked one by one up to CONTAINMENT_FILES of them (each
        folder's real path, and each file that is a symbolic link); beyond
        that, every distinct directory is, and the readers of one-file-per-sample
        datasets open files with O_NOFOLLOW (a million realpath calls on a
        parallel filesystem would cost minutes before the first batch).
        """
        if self.root is None:
            return
        top = os.path.realpath(self.root)
        t = self.compact
        if len(self.files) <= CONTAINMENT_FILES:
            paths = [f.path for f in self.files] + ([TABLE_DIR] if t is not None else [])
        elif t is not None:  # its folders are listed: no pass over the table
            paths = [*t.dirs, TABLE_DIR, *(f.path for f in t.aux)]
        else:
            paths = sorted({os.path.dirname(f.path) or "." for f in self.files})
        if len(self.files) > CONTAINMENT_FILES:
            for rel in paths:
                self._refuse_outside(top, rel)
            return
        # a file that is not a symbolic link resolves to its folder's real path plus its
        # name: one realpath per folder, and one listing of it to find the links (d_type,
        # no stat per file), each of them resolved on its own
        by_folder: dict[str, set[str]] = {}
        for rel in paths:
            folder, _, name = rel.rpartition("/")
            by_folder.setdefault(folder, set()).add(name)
        for folder, names in by_folder.items():
            self._refuse_outside(top, folder or ".")
            for name in _links(os.path.join(top, folder), names):
                self._refuse_outside(top, f"{folder}/{name}" if folder else name)

    def _refuse_outside(self, top: str, rel: str) -> None:
        real = os.path.realpath(os.path.join(top, rel))
        if real != top and not real.startswith(top + os.sep):
            raise DatasetError(f"manifest in {self.root} lists {rel!r}, which resolves to "
                               f"{real}, outside the dataset: refused (a symbolic link out "
                               "of the tree); remove it or regenerate the dataset")


def _links(folder: str, names: set[str]) -> list[str]:
    """Which of `names` in `folder` are symbolic links (all of them when it cannot be listed;
    none when it does not exist, where nothing resolves but the folder)."""
    try:
        with os.scandir(folder) as it:
            return [e.name for e in it if e.name in names and e.is_symlink()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError:
        return sorted(names)


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


# what a whole file of each kind ends with: PNG's IEND chunk (with its CRC), JPEG's EOI
# marker. A file cut short keeps its magic bytes, and a manifest resealed over it (sizes and
# checksums recomputed) keeps it listed; DALI's native decoders are then handed a cut stream
MAGIC_TAILS: dict[str, bytes] = {".png": b"\x00\x00\x00\x00IEND\xaeB`\x82",
                                 ".jpeg": b"\xff\xd9", ".jpg": b"\xff\xd9"}
TAIL_BYTES = max(len(t) for t in MAGIC_TAILS.values())


def check_tail(path: str | Path, tail: bytes, suffix: str | None = None) -> None:
    """A DatasetError when `tail` (a file's last TAIL_BYTES bytes, or all of a shorter
    file) is not how a whole file of its kind (`suffix`, default the path's) ends."""
    suffix = (suffix or Path(path).suffix).lower()
    want = MAGIC_TAILS.get(suffix)
    if want is not None and not bytes(tail).endswith(want):
        raise DatasetError(f"{path}: does not end as a whole {suffix} file does (last bytes "
                           f"{bytes(tail[-len(want):])!r}); it was cut short or damaged: "
                           "regenerate it")


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
    "layout": Map({}, extra=True), "files": List(_ENTRY), "seed": Int,
    "iobench_version": Str, "created": Str, "extra": Map({}, extra=True),
    "table": Map({"count": Count, "samples_per_file": Count, "dirs": List(Str, min_len=1),
                  "prefix": Str, "width": Count, "suffix": Str, "data_bytes": Count},
                 extra=False),
}, optional=("schema", "schema_version", "extra", "table"), extra=False)
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


def _plain_path(p: str) -> bool:
    parts = p.split("/")
    return not (not p or "\0" in p or p.startswith("/") or ".." in parts or "" in parts
                or "." in parts or p == MANIFEST_NAME or "\\" in p)


def _check_table(doc: dict[str, Any], where: str) -> None:
    """A compact table's meaning: plain folders, each once; a name pattern that cannot
    leave its folder; files tiling the samples; no auxiliary file among the data files."""
    t, n = doc["table"], doc["num_samples"]
    for i, d in enumerate(t["dirs"]):
        if not _plain_path(d) or d == TABLE_DIR or d.startswith(TABLE_DIR + "/"):
            raise DatasetError(f"{where}: table.dirs[{i}] {d!r} is not a plain relative path "
                               "inside the dataset: refused")
    if len(set(t["dirs"])) != len(t["dirs"]):
        raise DatasetError(f"{where}: table.dirs lists a folder twice")
    for key in ("prefix", "suffix"):
        v = t[key]
        if any(c in v for c in "/\\\0") or any(c.isdigit() for c in v):
            raise DatasetError(f"{where}: table.{key} {v!r} may hold no '/', '\\', NUL or "
                               "digit (a data file's name is <prefix><index><suffix>): refused")
    if not 1 <= t["width"] <= 20:
        raise DatasetError(f"{where}: table.width {t['width']} is outside 1..20")
    k, c = t["samples_per_file"], t["count"]
    if k < 1 or c < 1 or (c - 1) * k >= n or c * k < n:
        raise DatasetError(f"{where}: table of {c} files of {k} samples does not tile "
                           f"0..{n}: the manifest is damaged")
    name = re.compile(re.escape(t["prefix"]) + r"(\d+)" + re.escape(t["suffix"]) + "$")
    dirs = set(t["dirs"])
    for i, f in enumerate(doc["files"]):
        d, _, base = f["path"].rpartition("/")
        m = name.match(base)
        if f.get("role", "data") == "data" or (d in dirs and m and int(m.group(1)) < c):
            raise DatasetError(f"{where}: files[{i}] ({f['path']}) is a data file, but a "
                               "compact manifest's data files are its table's: refused")
        if f["path"] == TABLE_DIR or f["path"].startswith(TABLE_DIR + "/"):
            raise DatasetError(f"{where}: files[{i}].path {f['path']!r} is inside "
                               f"{TABLE_DIR}/, the table's own folder: refused")


def check_manifest(doc: Any, where: str = "manifest") -> None:
    """The manifest's shape (`MANIFEST_SPEC`), then its meaning: plain relative paths, each
    once; counts in range; data files tiling samples 0..num_samples-1 in order (version 2:
    the compact table's, `_check_table`)."""
    try:
        check(doc, MANIFEST_SPEC, where)
    except SchemaError as e:
        raise DatasetError(str(e)) from None
    n = doc["num_samples"]
    if n < 1 or n > MAX_SAMPLES:
        raise DatasetError(f"{where}: num_samples {n} is outside 1..{MAX_SAMPLES}")
    compact = doc.get("schema_version", JSON_VERSION) >= 2
    if compact != ("table" in doc):
        raise DatasetError(f"{where}: schema_version {doc.get('schema_version', JSON_VERSION)} "
                           f"{'needs' if compact else 'has no'} a compact file table ('table')")
    if not compact and not doc["files"]:
        raise DatasetError(f"{where}: files: expected a list (not empty), got []")
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
        if not _plain_path(p):
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
    if compact:
        _check_table(doc, where)
        return
    if nxt != n:
        raise DatasetError(f"{where}: the data files hold {nxt} samples, num_samples says {n}")
