"""The on-disk formats, in one table: what each is, where its writer and reader live, and
what it can do.

Every other module reads format names and capabilities from `FORMATS`: the CLI's
choices, generation and its checks, the loader table, DALI's dispatch, sweeps, the
tests' parametrisation and the docs' format table. Writers and readers are named by
dotted path ("module:Class") and imported only when first used (as fsspec's
registry does), so importing this module costs nothing: the CLI starts without
h5py, netCDF4, zarr or torch. Adding a format is one writer file
(`generators/<fmt>.py`), one reader file (`loaders/<fmt>.py`) and one line below
(docs/design.md, "Adding a format").
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from iobench.core.errors import ConfigError, UnsupportedError

# how DALI reads a format: through iobench's own BatchReader in `fn.external_source`
# (any format with a reader), or with DALI's native file readers (one file per sample)
DALI_MODES = ("external_source", "native")


@dataclass(frozen=True)
class FormatSpec:
    """One on-disk format.

    `samples_per_file`: 1 when every sample is a file of its own, None when a
    file holds `--samples-per-file` samples. `random_access`: one sample can be
    read without reading its neighbours. `chunked`: samples are stored in chunks
    of their own (always, not only when compressed). `compressions`: what
    `--compression` accepts ("none" first). `maps_files`: the reader memory-maps
    its files (pages a live reader maps cannot be evicted). `dali`: one of
    DALI_MODES, or None where the dali loader cannot read it.
    """

    name: str
    suffixes: tuple[str, ...]  # suffixes of its data files (none: a store's chunk files)
    writer: str  # "module:Class" of its generators/ writer
    reader: str  # "module:Class" of its loaders/ BatchReader
    loader: str  # "module:Class" of its loaders/ PyTorch loader
    install: str  # what to install when its library is missing
    library: str  # the library that reads and writes it (docs, error messages)
    samples_per_file: int | None = None
    random_access: bool = True
    chunked: bool = False
    compressions: tuple[str, ...] = ("none",)
    maps_files: bool = False
    dali: str | None = "external_source"
    # suffixes (lower case) of the user's own files that `--data` reads as this format
    user_suffixes: tuple[str, ...] = ()
    # the libraries its writer and reader import when they run (never at import time, so the
    # classes import without them): checked when a class is loaded, to name `install`
    modules: tuple[str, ...] = ()

    @property
    def compressed(self) -> bool:
        """Whether it can store samples compressed (`--compression`)."""
        return len(self.compressions) > 1

    @property
    def per_sample_files(self) -> bool:
        return self.samples_per_file == 1

    def require(self) -> None:
        """An UnsupportedError naming `install` when a library of this format is missing (its
        writer and reader import them only when they run: a worker would fail mid-epoch)."""
        for library in self.modules:
            if not _installed(library):
                raise UnsupportedError(f"the {self.name} format needs a missing package "
                                       f"({library}): {self.install}")

    def writer_class(self) -> type:
        self.require()
        return load_class(self.writer, self.install)

    def reader_class(self) -> type:
        self.require()
        return load_class(self.reader, self.install)

    def loader_class(self) -> type:
        self.require()
        return load_class(self.loader, self.install)


def load_class(target: str, install: str) -> type:
    """The class at `target` ("module:Class"), imported now; an UnsupportedError naming what
    to install when its library is missing."""
    module, _, cls = target.partition(":")
    try:
        found: type = getattr(importlib.import_module(module), cls)
        return found
    except ImportError as e:
        raise UnsupportedError(f"{target} needs a missing package ({e.name}): {install}") from e


def _installed(module: str) -> bool:
    """Whether `module` can be imported (found, not blocked), without importing it (netCDF4
    must not start before `netcdf4()` sets HDF5's locking off)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_G, _L = "iobench.generators", "iobench.loaders"
# the names other modules use for a particular format (the MLPerf workload table, `--data`'s
# detection): imported from here, so that no module but this one spells a format's name
HDF5, NETCDF, LMDB, FILES, NPZ, ZARR = "hdf5", "netcdf", "lmdb", "files", "npz", "zarr"

FORMATS: dict[str, FormatSpec] = {f.name: f for f in (
    FormatSpec(HDF5, (".h5",), f"{_G}.hdf5:HDF5Writer", f"{_L}.hdf5:HDF5Reader",
               f"{_L}.hdf5:HDF5Loader", "pip install h5py", "h5py",
               compressions=("none", "gzip", "lzf"),
               user_suffixes=(".h5", ".hdf5", ".hdf", ".he5"), modules=("h5py",)),
    FormatSpec(NETCDF, (".nc",), f"{_G}.netcdf:NetCDFWriter", f"{_L}.netcdf:NetCDFReader",
               f"{_L}.netcdf:NetCDFLoader", "pip install netCDF4", "netCDF4",
               compressions=("none", "gzip"), user_suffixes=(".nc", ".nc4", ".cdf"),
               modules=("netCDF4",)),
    FormatSpec(LMDB, (".lmdb",), f"{_G}.lmdb:LMDBWriter", f"{_L}.lmdb:LMDBReader",
               f"{_L}.lmdb:LMDBLoader", "pip install lmdb", "py-lmdb", maps_files=True,
               user_suffixes=(".lmdb", ".mdb"), modules=("lmdb",)),
    FormatSpec(FILES, (".JPEG", ".png", ".npy"), f"{_G}.files:FilesWriter",
               f"{_L}.files:FilesReader", f"{_L}.files:FilesLoader",
               "pip install simplejpeg pillow", "Pillow, numpy", samples_per_file=1,
               dali="native", user_suffixes=(".jpg", ".jpeg"), modules=("simplejpeg", "PIL")),
    # DALI's readers.numpy reads .npy, not .npz: DALI reads npz through NPZReader
    FormatSpec(NPZ, (".npz",), f"{_G}.npz:NPZWriter", f"{_L}.npz:NPZReader",
               f"{_L}.npz:NPZLoader", "pip install numpy", "numpy", samples_per_file=1),
    FormatSpec(ZARR, (), f"{_G}.zarr:ZarrWriter", f"{_L}.zarr:ZarrReader",
               f"{_L}.zarr:ZarrLoader", "pip install 'iobench[zarr]'", "zarr (v3)", chunked=True,
               compressions=("none", "zstd", "gzip"), modules=("zarr", "numcodecs")),
)}

DEFAULT_FORMAT = HDF5
# the format the naive per-sample baselines (`naive-h5py`) read
BASELINE_FORMAT = HDF5
COMPRESSIONS: tuple[str, ...] = tuple(dict.fromkeys(c for f in FORMATS.values()
                                                    for c in f.compressions))


def parse_format(name: str) -> FormatSpec:
    """The spec of format `name`, or a ConfigError naming the choices."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(f"unknown format {name!r}; choose one of: {', '.join(FORMATS)}") from None


def parse_compression(fmt: str, compression: str, sample_kind: str = "array") -> str:
    """`compression` if format `fmt` can store this dataset's samples so, else a ConfigError
    naming the choices (JPEG bytes are stored as they are: compressed already)."""
    spec = parse_format(fmt)
    if compression not in COMPRESSIONS:
        raise ConfigError(f"--compression {compression!r}; choose one of: "
                          f"{', '.join(COMPRESSIONS)}")
    if compression not in spec.compressions:
        raise ConfigError(f"--compression {compression!r} is not available for the {fmt} "
                          f"format ({spec.library}); choose one of: "
                          f"{', '.join(spec.compressions)}")
    if compression != "none" and sample_kind == "jpeg":
        raise ConfigError(f"--compression {compression}: JPEG bytes are already compressed; "
                          "use --compression none")
    return compression


def user_format(suffix: str) -> str | None:
    """The format whose reader takes the user's files of this suffix (`--data`), or None."""
    return next((n for n, f in FORMATS.items() if suffix.lower() in f.user_suffixes), None)


def loader_formats(loader: str) -> tuple[str, ...]:
    """The formats loader `loader` reads: its own, or for dali every format DALI reads."""
    if loader == "dali":
        return tuple(n for n, f in FORMATS.items() if f.dali is not None)
    return (loader,) if loader in FORMATS else ()


def netcdf4() -> Any:
    """The netCDF4 module, imported with HDF5 file locking off (set before the HDF5 library
    starts: on shared filesystems locks fail or leave lock files behind); an UnsupportedError
    naming what to install when it is missing."""
    os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
    try:
        import netCDF4
    except ImportError as e:
        raise UnsupportedError(f"the {NETCDF} format needs a missing package ({e.name}): "
                               f"{FORMATS[NETCDF].install}") from e
    return netCDF4


def format_table() -> str:
    """The docs' format table (Markdown), from this registry (docs/design.md holds a copy
    that a test keeps equal)."""
    rows = ["| format | files | library | samples per file | random access | chunked | "
            "compressions | DALI |", "|---|---|---|---|---|---|---|---|"]
    for f in FORMATS.values():
        files = ", ".join(f"`{s}`" for s in f.suffixes) or "one store (directory)"
        rows.append(f"| `{f.name}` | {files} | {f.library} | "
                    f"{f.samples_per_file or '--samples-per-file'} | "
                    f"{'yes' if f.random_access else 'no'} | {'yes' if f.chunked else 'no'} | "
                    f"{', '.join(f.compressions)} | {f.dali or 'no'} |")
    return "\n".join(rows)
