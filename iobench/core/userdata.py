"""The user's own data (`--data PATH`): detect its layout and describe it as an in-memory manifest.

`user_manifest(path, data_key, label_key)` inspects PATH (opening files
read-only, writing nothing anywhere) and returns a checked `Manifest` whose
root is the user's folder, so the same readers, cache eviction and metrics
serve it as serve generated datasets. The manifest lives in memory only:
nothing is ever written under PATH. What is accepted (docs/training.md,
"Your own data"):

- HDF5 or NetCDF-4: one file, or a folder of files of one kind, each with a
  sample array of N rows (`--data-key`, else detected: the one numeric array
  of 2 or more dimensions, or the largest when it holds >= 4x the bytes of
  the next) and a 1-D integer array of N class labels (`--label-key`, else
  detected: the one 1-D integer array of N rows).
- LMDB (a directory holding `data.mdb`, or a single-file environment): keys
  are the sample indices 0..N-1, as ASCII decimal (zero-padded to one width,
  or not padded) or 8-byte big-endian; each value is the sample's `.npy`
  bytes (one shape and dtype throughout) or JPEG bytes; the labels are one
  more record (`--label-key`, else the one other key) holding a 1-D integer
  `.npy` array of N rows.
- ImageFolder: `PATH/<class>/.../<name>.jpg|.jpeg`, classes = the sorted
  top-level folder names, labels their positions.

Ambiguous or unreadable input is a one-line error naming the option that
fixes it.
"""

from __future__ import annotations

import io
import os
import stat
import time
from pathlib import Path
from typing import Any

import numpy as np

from iobench.core.errors import ConfigError, DatasetError, IobenchError
from iobench.core.formats import FILES, FORMATS, HDF5, LMDB, NETCDF, netcdf4, user_format
from iobench.core.manifest import MANIFEST_NAME, FileEntry, Manifest, check_manifest
from iobench.core.regular import NotRegularFile, file_kind, open_regular, read_regular

USER_DATASET = "user"  # the manifest's `dataset` for data iobench did not generate
# what --data takes, from the format registry (`FormatSpec.user_suffixes`)
H5_SUFFIXES = FORMATS[HDF5].user_suffixes
NC_SUFFIXES = FORMATS[NETCDF].user_suffixes
LMDB_SUFFIXES = FORMATS[LMDB].user_suffixes
JPEG_SUFFIXES = FORMATS[FILES].user_suffixes
DOMINANT = 4  # the largest candidate sample array must hold >= 4x the next one's bytes
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NPY_MAGIC = b"\x93NUMPY"
JPEG_MAGIC = b"\xff\xd8\xff"
KINDS = "an HDF5 or NetCDF-4 file or a folder of them, an LMDB environment, or an ImageFolder "\
    "tree (class/xxx.jpg)"


def _fail(msg: str) -> DatasetError:
    return DatasetError(f"--data {msg}")


def _visible(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def detect_format(path: str | Path) -> str:
    """The iobench format that reads PATH: hdf5, netcdf, lmdb or files (ImageFolder)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--data {p} does not exist; give {KINDS}")
    if p.is_dir():
        if (p / MANIFEST_NAME).is_file():
            raise ConfigError(f"--data {p} is a dataset iobench generated: read it with "
                              f"--storage {p.parent} (--data is for your own data)")
        if (p / "data.mdb").is_file():
            return LMDB
        entries = _visible(p)
        if not entries:
            raise _fail(f"{p} is an empty folder; give {KINDS}")
        if all(e.is_dir() for e in entries):
            return FILES
        kinds = {_entry_kind(e) for e in entries}
        if len(kinds) == 1 and kinds <= {HDF5, NETCDF}:
            return kinds.pop()
        shown = ", ".join(f"{e.name} ({_entry_kind(e)})" for e in entries[:4])
        raise _fail(f"{p} mixes kinds of entries ({shown}{', ...' if len(entries) > 4 else ''}"
                    "): a folder must hold only .h5 files, only .nc files, or only class "
                    "folders; point --data at one file or a folder of one kind")
    special = _special(p)
    if special is not None:
        raise _fail(f"{p} is {special}, not a regular file; give {KINDS}")
    kind = _file_kind(p)
    if kind == "other":
        raise _fail(f"{p} is not a file iobench can read (expected the suffix "
                    f"{', '.join(H5_SUFFIXES + NC_SUFFIXES + LMDB_SUFFIXES)}, or an HDF5 "
                    f"file); give {KINDS}")
    return kind


def _special(p: Path) -> str | None:
    """What `p` is when it is neither a regular file nor a folder ("a FIFO"), else None (a
    missing or unreadable path: the caller's own error names it)."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else file_kind(mode)


def _entry_kind(e: Path) -> str:
    """What an entry of a --data folder is: a format, "folder", "other", or what a special
    file is ("a FIFO": never opened)."""
    if e.is_dir():
        return "folder"
    return _special(e) or _file_kind(e)


def _file_kind(p: Path) -> str:
    kind = user_format(p.suffix)
    if kind in (HDF5, NETCDF, LMDB):
        return kind
    try:
        if read_regular(p, 8) == HDF5_SIGNATURE:
            return HDF5
    except (OSError, NotRegularFile):
        pass
    return "other"


def user_manifest(path: str | Path, data_key: str | None = None,
                  label_key: str | None = None) -> Manifest:
    """A checked, in-memory manifest of the user's data at PATH (nothing is written there)."""
    p = Path(path).resolve()
    try:
        return _build(p, data_key, label_key)
    except IobenchError:
        raise
    except Exception as e:  # a library's own error on unreadable input: one line, not a trace
        raise _fail(f"{p}: cannot read it ({type(e).__name__}: {e}); give {KINDS}") from None


def _build(p: Path, data_key: str | None, label_key: str | None) -> Manifest:
    import iobench

    fmt = detect_format(p)
    if fmt == FILES:
        if data_key or label_key:
            raise ConfigError(f"--data {p} is an ImageFolder tree (labels are its folder "
                              "names): drop --data-key/--label-key")
        parts = _imagefolder(p)
    elif fmt == LMDB:
        if data_key:
            raise ConfigError(f"--data {p} is an LMDB environment (samples are its index "
                              "keys): drop --data-key; --label-key names the labels record")
        parts = _lmdb(p, label_key)
    else:
        parts = _arrays(p, fmt, data_key, label_key)
    root, files, sample, classes, layout, described = parts
    n = sum(f.num_samples for f in files if f.role == "data")
    described = {"path": str(p), "kind": fmt, **described, "num_samples": n,
                 "num_classes": classes, "sample_shape": sample.get("shape"),
                 "sample_dtype": np.dtype(sample["dtype"]).name, "sample_kind": sample["kind"],
                 "files": len(files)}
    m = Manifest(dataset=USER_DATASET, format=fmt, num_samples=n, num_classes=classes,
                 sample=sample, label={"shape": [], "dtype": "int64"}, layout=layout,
                 files=tuple(files), seed=0, iobench_version=iobench.__version__,
                 created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 extra={"user_data": described}, root=root)
    check_manifest(_doc(m), f"the manifest iobench built for --data {p}")
    return m


def shared_manifest(world: Any, path: str | Path, data_key: str | None = None,
                    label_key: str | None = None) -> Manifest:
    """`user_manifest` built once, on rank 0, and sent to every rank (one listing of a large
    tree, not one per rank); an error on rank 0 is raised on every rank."""
    res: tuple[Any, ...] | None = None
    if world.is_root:
        try:
            m = user_manifest(path, data_key, label_key)
            res = ("ok", _doc(m), str(m.root))
        except IobenchError as e:
            res = ("err", type(e), str(e))
    res = world.bcast(res)
    if res[0] == "err":
        raise res[1](res[2])
    return Manifest.from_dict(res[1], root=Path(res[2]))


def _doc(m: Manifest) -> dict[str, Any]:
    """The manifest as its JSON document would be (lists, not tuples)."""
    d = m.to_dict()
    d["files"] = list(d["files"])
    return d


def describe(d: dict[str, Any]) -> str:
    """One line on the user's data (a manifest's `extra.user_data`), for the console."""
    if d.get("sample_kind") == "jpeg":
        what = "JPEG samples"
    else:
        what = f"samples {d.get('sample_dtype')}{d.get('sample_shape')}"
    keys = ", ".join(f"{k} {d[k]!r}" for k in ("data_key", "label_key") if d.get(k))
    how = "detected" if d.get("detected") else "given"
    return (f"your data at {d.get('path')} ({d.get('kind')}, {d.get('files')} file(s), "
            f"{d.get('num_samples')} {what}, {d.get('num_classes')} classes"
            + (f"; {how}: {keys}" if keys else "") + "; read only)")


# -------------------------------------------------------------------- HDF5 and NetCDF files

def _numeric(dtype: Any) -> bool:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return False
    return dt.kind in "biuf" and dt.itemsize > 0 and dt.fields is None


def _inspect(path: Path, fmt: str) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Every array in the file: name -> (shape, dtype)."""
    out: dict[str, tuple[tuple[int, ...], Any]] = {}
    if fmt == HDF5:
        import h5py

        try:
            with h5py.File(path, "r", locking=False) as h:
                def visit(name: str, obj: Any) -> None:
                    if isinstance(obj, h5py.Dataset):
                        out[name] = (tuple(obj.shape), obj.dtype)

                h.visititems(visit)
        except (OSError, ValueError) as e:
            raise _fail(f"{path}: HDF5 cannot open it ({e}); give {KINDS}") from None
        return out
    try:
        with netcdf4().Dataset(path, "r") as nc:
            if not nc.data_model.startswith("NETCDF4"):
                raise _fail(f"{path} is a {nc.data_model} file; iobench reads NetCDF-4 (HDF5 "
                            "based) files: convert it with `nccopy -k nc4 IN OUT`")
            for name, v in nc.variables.items():
                out[name] = (tuple(v.shape), v.dtype)
    except OSError as e:
        raise _fail(f"{path}: netCDF cannot open it ({e}); give {KINDS}") from None
    return out


def _read_labels(path: Path, fmt: str, key: str) -> np.ndarray:
    if fmt == HDF5:
        import h5py

        with h5py.File(path, "r", locking=False) as h:
            return np.asarray(h[key][...])
    with netcdf4().Dataset(path, "r") as nc:
        nc.set_auto_maskandscale(False)
        return np.asarray(nc.variables[key][...])


def _listing(arrays: dict[str, tuple[tuple[int, ...], Any]]) -> str:
    return ", ".join(f"{k} {np.dtype(dt) if _numeric(dt) else dt}{list(s)}"
                     for k, (s, dt) in arrays.items()) or "none"


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return int(np.prod(shape)) * int(np.dtype(dtype).itemsize)


def _choose(path: Path, arrays: dict[str, tuple[tuple[int, ...], Any]],
            data_key: str | None, label_key: str | None) -> tuple[str, str]:
    """(sample array, labels array) of one file, given or detected."""
    if data_key is not None:
        if data_key not in arrays:
            raise ConfigError(f"--data-key {data_key!r}: no such array in {path} (arrays: "
                              f"{_listing(arrays)})")
        shape, dt = arrays[data_key]
        if not _numeric(dt) or len(shape) < 1:
            raise ConfigError(f"--data-key {data_key!r} in {path} is {dt}{list(shape)}, not an "
                              "array of numbers with one row per sample; name another")
    else:
        cands = sorted((k for k, (s, dt) in arrays.items() if _numeric(dt) and len(s) >= 2),
                       key=lambda k: -_nbytes(*arrays[k]))
        if not cands:
            raise _fail(f"{path} holds no array of samples (numbers, 2 or more dimensions, one "
                        f"row per sample; arrays: {_listing(arrays)}); name one with "
                        "--data-key")
        if len(cands) > 1 and _nbytes(*arrays[cands[0]]) < DOMINANT * _nbytes(*arrays[cands[1]]):
            shown = {k: arrays[k] for k in cands}
            raise _fail(f"{path} holds several candidate sample arrays ({_listing(shown)}); "
                        "pick one with --data-key")
        data_key = cands[0]
    n = arrays[data_key][0][0]
    if label_key is not None:
        if label_key not in arrays:
            raise ConfigError(f"--label-key {label_key!r}: no such array in {path} (arrays: "
                              f"{_listing(arrays)})")
        shape, dt = arrays[label_key]
        if not _numeric(dt) or np.dtype(dt).kind not in "iu" or len(shape) != 1:
            raise ConfigError(f"--label-key {label_key!r} in {path} is {dt}{list(shape)}, not "
                              "a 1-D array of integer class labels; name another")
        if shape[0] != n:
            raise ConfigError(f"--label-key {label_key!r} in {path} has {shape[0]} rows but "
                              f"the samples {data_key!r} have {n}; name the labels of these "
                              "samples with --label-key (or the samples with --data-key)")
        return data_key, label_key
    ints = {k: v for k, v in arrays.items() if k != data_key and _numeric(v[1])
            and np.dtype(v[1]).kind in "iu" and len(v[0]) == 1}
    cands = [k for k, (s, _) in ints.items() if s[0] == n]
    if len(cands) == 1:
        return data_key, cands[0]
    if len(cands) > 1:
        raise _fail(f"{path} holds several candidate label arrays of {n} rows "
                    f"({_listing({k: ints[k] for k in cands})}); pick one with --label-key")
    other = f" (1-D integer arrays: {_listing(ints)}, none of {n} rows)" if ints else ""
    raise _fail(f"{path} holds no labels for the {n} samples of {data_key!r}: iobench needs a "
                f"1-D integer array of {n} class labels{other}; name it with --label-key")


def _arrays(p: Path, fmt: str, data_key: str | None, label_key: str | None) -> tuple[Any, ...]:
    paths = _visible(p) if p.is_dir() else [p]
    root = p if p.is_dir() else p.parent
    detected = data_key is None or label_key is None
    files: list[FileEntry] = []
    first: tuple[Path, tuple[int, ...], Any] | None = None
    top = 0
    for f in paths:
        arrays = _inspect(f, fmt)
        if first is not None and not {data_key, label_key} <= set(arrays):
            raise _fail(f"{p}: {f.name} lacks the arrays found in {first[0].name} "
                        f"({data_key!r}, {label_key!r}; it holds {_listing(arrays)}): a "
                        "folder's files must hold the same arrays; give --data one file")
        data_key, label_key = _choose(f, arrays, data_key, label_key)
        shape, dt = arrays[data_key]
        if first is None:
            first = (f, shape[1:], np.dtype(dt))
        elif (shape[1:], np.dtype(dt)) != first[1:]:
            raise _fail(f"{p}: {f.name} holds samples {np.dtype(dt)}{list(shape[1:])} but "
                        f"{first[0].name} {first[2]}{list(first[1])}: a folder's files must "
                        "hold one kind of sample; give --data one file")
        if shape[0] == 0:
            raise _fail(f"{f} holds no samples ({data_key!r} has 0 rows); remove it from the "
                        "folder or give --data one file")
        labels = _read_labels(f, fmt, label_key)
        if labels.size and labels.min() < 0:
            raise _fail(f"{f}: labels {label_key!r} hold negative values (min "
                        f"{int(labels.min())}); iobench needs class ids 0..K-1: name other "
                        "labels with --label-key")
        top = max(top, int(labels.max()) + 1 if labels.size else 0)
        start = sum(e.num_samples for e in files)
        files.append(FileEntry(path=f.relative_to(root).as_posix(), bytes=f.stat().st_size,
                               sha256="", first_sample=start, num_samples=int(shape[0])))
    assert first is not None
    sample = {"kind": "array", "shape": list(first[1]), "dtype": first[2].str}
    layout = {"data_key": data_key, "label_key": label_key, "preprocess": "raw"}
    return root, files, sample, top, layout, {"data_key": data_key, "label_key": label_key,
                                              "detected": detected}


# -------------------------------------------------------------------------------------- LMDB

def _lmdb(p: Path, label_key: str | None) -> tuple[Any, ...]:
    data = p / "data.mdb" if p.is_dir() else p
    scheme, width, index, lk, labels, first = _lmdb_keys(p, data, label_key)
    sample, record, header = _lmdb_record(p, index[0], first)
    layout = {"values": record, "npy_header": header, "key": scheme, "key_width": width,
              "label_key": lk.decode("latin-1"),
              "preprocess": "imagenet" if record == "jpeg" else "raw"}
    files = [FileEntry(path=data.name, bytes=data.stat().st_size, sha256="", first_sample=0,
                       num_samples=len(index))]
    classes = int(labels.max()) + 1 if labels.size else 0
    return data.parent, files, sample, classes, layout, {
        "label_key": lk.decode("latin-1"), "detected": label_key is None,
        "keys": f"{scheme}" + (f" (width {width})" if width else ""), "record": record}


def _lmdb_keys(p: Path, data: Path, label_key: str | None
               ) -> tuple[str, int, list[bytes], bytes, np.ndarray, bytes]:
    """(key scheme, key width, the sample keys in order, the labels key, the labels, the first
    sample's value) of the LMDB environment `data`."""
    import lmdb

    try:
        env = lmdb.open(str(data), subdir=False, readonly=True, lock=False, readahead=False)
    except lmdb.Error as e:
        raise _fail(f"{p}: LMDB cannot open it ({e}); give {KINDS}") from None
    try:
        with env.begin() as txn:
            keys = list(txn.cursor().iternext(keys=True, values=False))
            scheme, width, index, rest = _index_keys(p, keys, label_key)
            lk = _label_record(p, rest, label_key)
            labels = _npy_labels(p, lk, txn.get(lk), len(index))
            first = bytes(txn.get(index[0], b""))  # listed by this transaction: there
    finally:
        env.close()
    return scheme, width, index, lk, labels, first


def _label_record(p: Path, rest: list[bytes], label_key: str | None) -> bytes:
    """The key of the labels record among the keys that are no sample index (`rest`)."""
    if label_key is not None:
        lk = label_key.encode()
        if lk not in rest:
            raise ConfigError(f"--label-key {label_key!r}: no such key in the LMDB "
                              f"environment {p} (other keys: {_keys_shown(rest)})")
    elif len(rest) == 1:
        lk = rest[0]
    else:
        raise _fail(f"{p}: LMDB keys other than the sample indices: "
                    f"{_keys_shown(rest)}; iobench needs exactly one, the labels "
                    "record (a 1-D integer .npy array): name it with --label-key")
    extra = [k for k in rest if k != lk]
    if extra:
        raise _fail(f"{p}: LMDB keys {_keys_shown(extra)} are neither sample indices "
                    "nor the labels record; iobench reads the layout in "
                    "docs/training.md")
    return lk


def _lmdb_record(p: Path, key: bytes, first: bytes) -> tuple[dict[str, Any], str, int]:
    """(sample description, record kind "npy" or "jpeg", .npy header bytes) of the value
    `first` of sample key `key`."""
    if first.startswith(JPEG_MAGIC):
        return {"kind": "jpeg", "shape": None, "dtype": "uint8"}, "jpeg", 0
    if not first.startswith(NPY_MAGIC):
        raise _fail(f"{p}: record {key!r} is neither .npy nor JPEG bytes (first bytes "
                    f"{first[:8]!r}); iobench reads LMDB values that are one or the other "
                    "(docs/training.md)")
    f = io.BytesIO(first)
    try:
        version = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dt = read(f)
    except ValueError as e:
        raise _fail(f"{p}: record {key!r} is not a readable .npy ({e})") from None
    if fortran or not _numeric(dt) or len(first) != f.tell() + _nbytes(shape, dt):
        raise _fail(f"{p}: record {key!r} holds {dt}{list(shape)} (fortran order "
                    f"{fortran}) in {len(first)} bytes; iobench reads C-order numeric .npy "
                    "values")
    return {"kind": "array", "shape": list(shape), "dtype": np.dtype(dt).str}, "npy", f.tell()


def _keys_shown(keys: list[bytes]) -> str:
    return ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "") or "none"


def _index_keys(p: Path, keys: list[bytes], label_key: str | None
                ) -> tuple[str, int, list[bytes], list[bytes]]:
    """(scheme, width, index keys in sample order, other keys)."""
    skip = label_key.encode() if label_key is not None else None
    digits = [k for k in keys if k.isdigit() and k != skip]
    if digits:
        scheme, index = "ascii", digits
        nums = [int(k) for k in digits]
        widths = {len(k) for k in digits}
        width = widths.pop() if len(widths) == 1 and any(k.startswith(b"0") and len(k) > 1
                                                         for k in digits) else 0
    else:
        scheme, width = "be64", 0
        index = [k for k in keys if len(k) == 8 and k != skip]
        nums = [int.from_bytes(k, "big") for k in index]

    def make(i: int) -> bytes:
        return i.to_bytes(8, "big") if scheme == "be64" else b"%0*d" % (width, i)

    if not index:
        raise _fail(f"{p}: no LMDB key is a sample index (ASCII digits or 8-byte big-endian; "
                    f"keys: {_keys_shown(keys)}); iobench reads the layout in docs/training.md")
    order = sorted(range(len(nums)), key=nums.__getitem__)
    index = [index[i] for i in order]
    for i, k in enumerate(index):
        if k != make(i):
            raise _fail(f"{p}: LMDB sample keys must be the indices 0..{len(index) - 1} "
                        f"({scheme}); sample {i} has no key {make(i)!r} (found {k!r})")
    rest = [k for k in keys if k not in set(index)]
    return scheme, width, index, rest


def _npy_labels(p: Path, key: bytes, value: Any, n: int) -> np.ndarray:
    try:
        labels: np.ndarray = np.load(io.BytesIO(bytes(value)), allow_pickle=False)
    except (ValueError, OSError, TypeError) as e:
        raise _fail(f"{p}: the labels record {key!r} is not a .npy array ({e}); name the "
                    "labels record with --label-key") from None
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != n:
        raise _fail(f"{p}: the labels record {key!r} holds {labels.dtype}{list(labels.shape)}"
                    f", not {n} integer class labels; name the labels record with --label-key")
    if labels.size and labels.min() < 0:
        raise _fail(f"{p}: the labels record {key!r} holds negative values; iobench needs "
                    "class ids 0..K-1")
    return labels


# ------------------------------------------------------------------------------- ImageFolder

def _imagefolder(p: Path) -> tuple[Any, ...]:
    classes = [e.name for e in _visible(p)]
    files: list[FileEntry] = []
    for c in classes:
        found = []
        for dirpath, dirnames, names in os.walk(p / c):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(names):
                if name.startswith("."):
                    continue
                f = Path(dirpath) / name
                special = _special(f)
                if special is not None:  # a FIFO would hang the reader that opens it
                    raise _fail(f"{p}: {f.relative_to(p)} is {special}, not a regular file; "
                                "an ImageFolder tree holds JPEG files only: remove it")
                if f.suffix.lower() not in JPEG_SUFFIXES:
                    raise _fail(f"{p}: {f.relative_to(p)} is not a JPEG; iobench reads "
                                "ImageFolder trees of .jpg/.jpeg files (class/xxx.jpg)")
                found.append(f)
        if not found:
            raise _fail(f"{p}: class folder {c!r} holds no JPEG files; remove it or give "
                        "--data a tree whose every class has images")
        for f in found:
            files.append(FileEntry(path=f.relative_to(p).as_posix(), bytes=f.stat().st_size,
                                   sha256="", first_sample=len(files), num_samples=1))
    with open_regular(p / files[0].path) as fh:
        if not fh.read(3) == JPEG_MAGIC:
            raise _fail(f"{p / files[0].path} does not start as a JPEG does; iobench reads "
                        "ImageFolder trees of JPEG files")
    layout = {"classes": classes, "preprocess": "imagenet"}
    return p, files, {"kind": "jpeg", "shape": None, "dtype": "uint8"}, len(classes), layout, {
        "classes": classes[:20] + (["..."] if len(classes) > 20 else []), "detected": True}
