"""The errors iobench raises for problems a user can fix.

Each subclass also inherits the builtin a caller would expect, so library
users can catch `FileNotFoundError` or `ValueError` as usual, while the CLI
catches `IobenchError` once and prints its message as one line.
"""


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
