"""The LMDB value record, shared by its writer (generators/lmdb.py) and reader
(loaders/lmdb.py): a layout any language can parse and that can never run code.

    header  <4s B B H I I  (little-endian, 16 bytes)
            magic b"IOBR", version 1, flags 0, reserved 0,
            label byte count, payload byte count
    label   label bytes (the label dtype, C order)
    payload JPEG bytes, or the sample array (sample dtype, C order)
"""

from __future__ import annotations

import struct

HEADER = struct.Struct("<4sBBHII")
MAGIC = b"IOBR"
VERSION = 1


def key(index: int) -> bytes:
    """LMDB key of global sample `index`: 8 bytes, big-endian, so keys sort by index."""
    return int(index).to_bytes(8, "big")
