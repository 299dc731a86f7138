"""Files written atomically (temporary name, fsync, rename), and versioned JSON documents."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from iobench.core.errors import DatasetError, StorageError


@contextlib.contextmanager
def atomic_file(path: str | Path, *, text: bool = False,
                exclusive: bool = False) -> Iterator[IO[Any]]:
    """A new file that appears at `path` whole or not at all: the caller writes it under a
    temporary name in the same folder; it is made readable as any new file (mkstemp makes
    0600), fsync'ed, then renamed over `path` (`exclusive=True`: linked, so an existing file
    is never replaced and FileExistsError is raised). An error or an interrupt leaves no
    temporary file behind; an OSError is the caller's to name."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where the folder should be: not "the name is taken"
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR),
                                 str(path.parent)) from None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w" if text else "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)  # fails with FileExistsError, never replaces
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | Path, data: bytes, *, exclusive: bool = False) -> Path:
    """Write `data` to `path` so readers see the old file or the whole new one (`atomic_file`);
    a StorageError naming the path when it cannot be written."""
    path = Path(path)
    try:
        with atomic_file(path, exclusive=exclusive) as f:
            f.write(data)
    except FileExistsError:
        raise
    except OSError as e:
        raise StorageError(f"cannot write {path}: {e.strerror or e}") from e
    return path


def write_json_atomic(path: str | Path, doc: dict[str, Any] | list[Any], *,
                      exclusive: bool = False, indent: int | None = 1) -> Path:
    """Write `doc` to `path` so readers see the old file or the whole new one (`write_atomic`).

    With `exclusive=True` an existing file is never replaced (result files
    must not overwrite an earlier run): `FileExistsError` is raised instead.
    `indent=None` writes one line, with the C encoder (files only iobench reads).
    """
    text = json.dumps(doc, indent=indent, sort_keys=False, default=_default) + "\n"
    return write_atomic(path, text.encode(), exclusive=exclusive)


def read_json(path: str | Path, *, schema: str, max_version: int) -> dict[str, Any]:
    """Read a document written by iobench, checking its `schema` and version."""
    path = Path(path)
    doc = load_json(path)
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise DatasetError(f"{path} is not an iobench {schema!r} document "
                           f"(schema={doc.get('schema') if isinstance(doc, dict) else None!r})")
    version = doc.get("schema_version")
    if not isinstance(version, int) or version > max_version:
        raise DatasetError(f"{path} has schema_version={version!r}; this iobench reads up to "
                           f"{max_version}: upgrade iobench")
    return doc


def load_json(path: str | Path) -> Any:
    """The JSON value in `path`, a regular file (`regular.open_regular`: a FIFO never blocks);
    a DatasetError in one line when it is not a regular file, unreadable, not UTF-8, not JSON
    or nested too deeply."""
    from iobench.core.regular import open_regular

    try:
        with open_regular(path) as f:
            return json.loads(f.read().decode("utf-8"))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); "
                           "it was damaged or not written by iobench") from e
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path} is not UTF-8 text (byte {e.start} is {e.object[e.start]:#04x}):"
                           " it was damaged or is not a document iobench wrote") from None
    except RecursionError:
        raise DatasetError(f"{path} nests JSON too deeply to be a document iobench wrote: it "
                           "was damaged or crafted") from None
    except IsADirectoryError:
        raise DatasetError(f"{path} is a directory, not a JSON document") from None
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e.strerror or e}") from e


def _default(o: Any) -> Any:
    if hasattr(o, "tolist"):  # numpy scalars and arrays
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot serialise {type(o).__name__} to JSON")
