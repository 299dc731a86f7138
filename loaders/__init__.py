"""Parallel readers: one module per format (`iobench.core.formats.FORMATS`) plus DALI.

`make_loader(name, dataset, config, rank, world)` builds one; modules are
imported only when first used (DALI is an optional extra).
"""

from __future__ import annotations

from pathlib import Path

from iobench.core.errors import ConfigError, DatasetError
from iobench.core.formats import FORMATS, load_class, loader_formats
from iobench.core.manifest import Manifest
from iobench.loaders.base import Batch, Loader, LoaderConfig

# loader name -> (module:class, install hint): each format's own loader, then DALI's
LOADERS: dict[str, tuple[str, str]] = {
    **{name: (f.loader, f.install) for name, f in FORMATS.items()},
    "dali": ("iobench.loaders.dali:DaliLoader", "pip install 'iobench[dali]'"),
}

__all__ = ["LOADERS", "Batch", "Loader", "LoaderConfig", "make_loader"]


def make_loader(name: str, dataset: Manifest | str | Path, config: LoaderConfig,
                rank: int = 0, world: int = 1) -> Loader:
    """Build loader `name` for one rank; the dataset's format must match (except dali)."""
    if name not in LOADERS:
        raise ConfigError(f"unknown loader {name!r}; choose one of: {', '.join(LOADERS)}")
    manifest = dataset if isinstance(dataset, Manifest) else Manifest.load(dataset)
    if manifest.format not in loader_formats(name):
        also = " or dali" if manifest.format in loader_formats("dali") else ""
        raise DatasetError(f"loader {name!r} cannot read {manifest.root}: it is a "
                           f"{manifest.format!r} dataset; use --loader {manifest.format}{also}")
    FORMATS[manifest.format].require()  # what the format's reader imports (dali's too)
    target, hint = LOADERS[name]
    loader: Loader = load_class(target, hint)(manifest, config, rank=rank, world=world)
    return loader
