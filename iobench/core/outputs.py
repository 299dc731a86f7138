"""Check every output path before any work starts: a run of hours must not fail at its end.

`writable_dir(path, option)` creates the directory if needed and proves it
writable with a probe file (`probe_write`); `writable_file(path, option)` does the same for
the directory a file will be written into (and refuses a directory in its
place). Both raise a StorageError naming the option and the fix. `save_png`
writes a matplotlib figure atomically.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from iobench.core.errors import StorageError
from iobench.core.jsonio import atomic_file


def writable_dir(path: str | Path, option: str, create: bool = False) -> Path:
    """`path` after proving a file can be written there. A missing directory is created
    with `create`; without, its nearest existing parent must let us create it (so a run
    that fails later leaves no empty directory behind)."""
    p = Path(path)
    if not p.exists() and not create:
        parent = p.absolute().parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise StorageError(f"{option} {p} cannot be created: {parent} is not writable; "
                               "give a writable directory")
        return p
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(f"{option} {p}: cannot create it ({e.strerror or e}); give a "
                           "writable directory") from e
    if not p.is_dir():
        raise StorageError(f"{option} {p} is not a directory; give a directory")
    try:
        probe_write(p)
    except OSError as e:
        raise StorageError(f"{option} {p} is not writable ({e.strerror or e}); give a writable "
                           "directory") from e
    return p


def probe_write(directory: Path) -> None:
    """Create and remove an empty file in `directory` (named after this host and process, so
    ranks on several nodes do not collide); the OSError when it cannot."""
    probe = directory / f".iobench-write-test-{socket.gethostname()}-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def writable_file(path: str | Path, option: str) -> Path:
    """`path`, after proving its directory writable and that it is not a directory."""
    p = Path(path)
    if p.is_dir():
        raise StorageError(f"{option} {p} is a directory; give a file name")
    if p.exists() and not os.access(p, os.W_OK):
        raise StorageError(f"{option} {p} exists and is not writable; give another file name")
    writable_dir(p.parent if str(p.parent) else Path("."), option)
    return p


def save_png(fig: Any, path: Path, dpi: int = 120) -> Path:
    """Write a matplotlib figure atomically (temporary name, then rename), readable as any
    new file, and close it; a StorageError naming the plot when it cannot be written."""
    import matplotlib.pyplot as plt

    try:
        with atomic_file(path) as f:
            fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight")
    except OSError as e:
        raise StorageError(f"cannot write plot {path}: {e.strerror or e}") from e
    finally:
        plt.close(fig)
    return path
