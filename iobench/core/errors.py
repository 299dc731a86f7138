"""The errors iobench raises for problems a user can fix.

Each subclass also inherits the builtin a caller would expect, so library
users can catch `FileNotFoundError` or `ValueError` as usual, while the CLI
catches `IobenchError` once and prints its message as one line.
"""

import errno


class IobenchError(Exception):
    """Base of every error that is the user's to fix; the message says how."""

    exit_code = 2
    # True when every rank raised this error together (set by `iobench.core.world.agree`, or
    # where every rank meets the same error before any collective): the CLI prints it
    # once, on rank 0, and ends without aborting the job.
    agreed: bool = False


class ConfigError(IobenchError, ValueError):
    """An option or configuration value is invalid."""


class DatasetNotFoundError(IobenchError, FileNotFoundError):
    """No dataset (or no manifest) where one was expected."""


class DatasetError(IobenchError, ValueError):
    """A dataset exists but is damaged, incomplete or of another kind."""


class StorageError(IobenchError, OSError):
    """A storage location is missing, unwritable, full or unsupported."""


class DistributedError(IobenchError, RuntimeError):
    """A rank failed or the ranks disagree."""

    exit_code = 3


class UnsupportedError(IobenchError, RuntimeError):
    """A feature needs something this machine lacks (FUSE, a GPU, DALI...)."""


# errno values that say the storage or the machine failed, not iobench: the fix for each
STORAGE_ERRNOS: dict[int, str] = {
    errno.ENOTCONN: "a FUSE mount whose daemon is gone: unmount it (`fusermount3 -u -z MNT`, "
                    "or `iobench emulate-pfs --unmount MNT --lazy`) and mount it again",
    errno.ESTALE: "a stale network file handle: remount the filesystem",
    errno.EIO: "an I/O error from the storage: check the device or the filesystem's servers",
    errno.ENOSPC: "the filesystem is full: free space or choose another location",
    errno.EDQUOT: "your quota is exhausted: free space or choose another location",
    errno.EROFS: "a read-only filesystem: choose a writable location",
    errno.EACCES: "permission denied: fix the permissions or choose another location",
    errno.EPERM: "operation not permitted: fix the permissions or choose another location",
    errno.ETIMEDOUT: "the storage timed out: check its servers and the network",
    errno.EHOSTDOWN: "the storage's host is down: check its servers and the network",
    errno.EHOSTUNREACH: "the storage's host is unreachable: check the network",
    errno.ENOLINK: "the link to the storage is severed: check its servers and the network",
    errno.ENODEV: "no such device: the filesystem is gone or unmounted",
    errno.ENXIO: "no such device or address: the filesystem is gone or unmounted",
    errno.EREMOTEIO: "a remote I/O error from the storage's servers",
}


def storage_error(e: BaseException) -> StorageError | None:
    """`e` as a StorageError of one line (the path, the system's words, the fix) when it is an
    OSError whose errno says the storage failed (a dead FUSE mount, a full disk: STORAGE_ERRNOS),
    else None (an OSError of another kind stays a bug to report)."""
    if not isinstance(e, OSError) or isinstance(e, IobenchError) or e.errno not in STORAGE_ERRNOS:
        return None
    where = f"{e.filename}: " if e.filename is not None else ""
    return StorageError(f"{where}{e.strerror or errno.errorcode.get(e.errno, e.errno)}: "
                        f"{STORAGE_ERRNOS[e.errno]}")
