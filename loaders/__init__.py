"""Parallel readers: one module per format plus DALI, registered in one table.

`make_loader(name, dataset, config, rank, world)` builds one; modules are
imported only when first used (DALI is an optional extra).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from iobench.errors import ConfigError, DatasetError, UnsupportedError
from iobench.loaders.base import Batch, Loader, LoaderConfig
from iobench.manifest import Manifest

# loader name -> (module:class, install hint)
LOADERS: dict[str, tuple[str, str]] = {
    "hdf5": ("iobench.loaders.hdf5:HDF5Loader", "pip install h5py"),
    "netcdf": ("iobench.loaders.netcdf:NetCDFLoader", "pip install netCDF4"),
    "lmdb": ("iobench.loaders.lmdb:LMDBLoader", "pip install lmdb"),
    "files": ("iobench.loaders.files:FilesLoader", "pip install simplejpeg pillow"),
    "dali": ("iobench.loaders.dali:DaliLoader", "pip install 'iobench[dali]'"),
}

__all__ = ["LOADERS", "Batch", "Loader", "LoaderConfig", "make_loader"]


def make_loader(name: str, dataset: Manifest | str | Path, config: LoaderConfig,
                rank: int = 0, world: int = 1) -> Loader:
    """Build loader `name` for one rank; the dataset's format must match (except dali)."""
    if name not in LOADERS:
        raise ConfigError(f"unknown loader {name!r}; choose one of: {', '.join(LOADERS)}")
    manifest = dataset if isinstance(dataset, Manifest) else Manifest.load(dataset)
    if name != "dali" and manifest.format != name:
        raise DatasetError(f"loader {name!r} cannot read {manifest.root}: it is a "
                           f"{manifest.format!r} dataset; use --loader {manifest.format} or dali")
    target, hint = LOADERS[name]
    module, _, cls = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise UnsupportedError(f"loader {name!r} needs a missing package ({e.name}): {hint}") from e
    return getattr(mod, cls)(manifest, config, rank=rank, world=world)
