"""What a format's writer and reader share, kept in one place.

The LMDB value record, shared by its writer (generators/lmdb.py) and reader
(loaders/lmdb.py): a layout any language can parse and that can never run code.

    header  <4s B B H I I  (little-endian, 16 bytes)
            magic b"IOBR", version 1, flags 0, reserved 0,
            label byte count, payload byte count
    label   label bytes (the label dtype, C order)
    payload JPEG bytes, or the sample array (sample dtype, C order)
"""

from __future__ import annotations

import contextlib
import struct
import warnings
from collections.abc import Iterator

HEADER = struct.Struct("<4sBBHII")
MAGIC = b"IOBR"
VERSION = 1


def key(index: int) -> bytes:
    """LMDB key of global sample `index`: 8 bytes, big-endian, so keys sort by index."""
    return int(index).to_bytes(8, "big")


@contextlib.contextmanager
def zarr_quiet() -> Iterator[None]:
    """zarr-python warns that consolidated metadata and variable-length bytes are not (yet)
    in the v3 specification; iobench's Zarr stores use both on purpose (xarray reads them).
    Used by the Zarr writer (generators/zarr.py) and reader (loaders/zarr.py)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(not part in the Zarr format 3|does not "
                                                  "have a Zarr V3 specification)")
        yield
