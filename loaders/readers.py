"""The batch reader of each format (from the format registry), and a deep check that reads every sample.

`reader_for(manifest)` gives the format's `BatchReader` (what the PyTorch loaders
and DALI's external source read with); `deep_check(manifest)` reads every sample
through it and decodes every JPEG strictly, for `iobench verify --deep`.
"""

from __future__ import annotations

import numpy as np

from iobench.core.errors import DatasetError
from iobench.core.formats import FORMATS
from iobench.core.manifest import Manifest
from iobench.loaders._reader import BatchReader


def reader_for(manifest: Manifest, library_cache: bool = False) -> BatchReader:
    """The `BatchReader` of the manifest's format (`iobench.core.formats.FORMATS`)."""
    spec = FORMATS.get(manifest.format)
    if spec is None:
        raise DatasetError(f"{manifest.root} has format {manifest.format!r}, which no reader "
                           f"reads; formats: {', '.join(FORMATS)}")
    reader: BatchReader = spec.reader_class()(manifest, library_cache)
    return reader


def deep_check(manifest: Manifest, batch: int = 256, first: int = 0, step: int = 1
               ) -> list[str]:
    """Read samples first, first+step, ... with the format's reader (which checks sizes,
    dtypes, shapes, keys and labels), decoding every JPEG in strict mode; the problems
    found, one line each (reading stops at a file's first problem and goes on with the
    next file)."""
    reader = reader_for(manifest)
    problems: list[str] = []
    bad_files: set[str] = set()
    idx = np.arange(first, manifest.num_samples, step, dtype=np.int64)
    for lo in range(0, len(idx), batch):
        part = idx[lo:lo + batch]
        part = part[[reader.where(int(i)) not in bad_files for i in part]]
        if not len(part):
            continue
        try:
            raw = reader.read(part)
        except DatasetError:
            # find each sample's problem (a batch stops at the first)
            for i in part.tolist():
                try:
                    reader.read(np.array([i], dtype=np.int64))
                except DatasetError as e:
                    problems.append(str(e))
                    bad_files.add(reader.where(i))
            continue
        if raw.offsets is not None:  # JPEG bytes: decode each, strictly
            problems += _decode_all(reader, part, raw.samples, raw.offsets, bad_files)
    return problems


def _decode_all(reader: BatchReader, idx: np.ndarray, data: np.ndarray, offsets: np.ndarray,
                bad_files: set[str]) -> list[str]:
    import simplejpeg

    out = []
    for k, i in enumerate(idx.tolist()):
        blob = data[offsets[k]:offsets[k + 1]]
        try:
            simplejpeg.decode_jpeg(blob, colorspace="RGB", strict=True)
        except ValueError as e:
            where = reader.where(i)
            out.append(f"{where}: sample {i} does not decode as a JPEG ({e}); regenerate it")
            bad_files.add(where)
    return out
