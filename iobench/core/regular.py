"""Open only regular files: a FIFO, socket or device that a user or a listing names never blocks."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from iobench.core.errors import DatasetError


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (for errors naming it)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


class NotRegularFile(DatasetError):
    """A path that names a FIFO, a socket, a device or a directory where a file was expected;
    `kind` says which, in words ("a FIFO")."""

    def __init__(self, path: str | Path, kind: str) -> None:
        super().__init__(f"{path} is {kind}, not a regular file")
        self.path, self.kind = str(path), kind


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for binary reading, when it is a regular file (symbolic links followed).

    The open never waits (O_NONBLOCK: a FIFO with no writer opens at once) and the check is
    made on the open descriptor, so nothing can swap the file in between; a NotRegularFile
    otherwise. Missing or unreadable files raise the usual OSError.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, file_kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int | None = None) -> bytes:
    """The bytes of regular file `path` (its first `limit` bytes when given); see
    `open_regular`."""
    with open_regular(path) as f:
        return f.read() if limit is None else f.read(limit)
