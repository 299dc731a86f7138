"""Dataset writers, one module per format (named in iobench/core/formats.py), and the synthesis of every sample; generation itself is iobench.workflows.generate."""

from __future__ import annotations

from iobench.core.datasets import DatasetSpec
from iobench.core.formats import parse_format
from iobench.core.manifest import Manifest
from iobench.generators.base import Writer


def get_writer(fmt: str, spec: DatasetSpec, seed: int, compression: str = "none") -> Writer:
    """Build the writer for format `fmt` (its module imported now, not before)."""
    writer: Writer = parse_format(fmt).writer_class()(spec, seed, compression)
    return writer


def synthesis_version(manifest: Manifest) -> int:
    """The synthesis version a dataset's samples come from (1 when the manifest predates it)."""
    return int(manifest.extra.get("synthesis_version", 1))
