"""Where a run's dataset lives and what its copies need: shared by train, stage and preflight.

The helpers these workflows used to import from one another: the dataset root
a run reads (`resolve_dataset`), the staging modes, the bytes a node's copy
still lacks, and the check that every node reads one version of the dataset.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from iobench.cache import share_bytes
from iobench.datasets import dataset_dirname
from iobench.errors import ConfigError, DatasetNotFoundError
from iobench.formats import DEFAULT_FORMAT, loader_formats
from iobench.manifest import FileEntry, Manifest
from iobench.world import World

MODES = ("replicate", "shard")


class DatasetRequest(Protocol):
    """The fields of a run that name its dataset (`iobench.train.TrainConfig` has them)."""

    @property
    def loader(self) -> str: ...
    @property
    def storage(self) -> str: ...
    @property
    def dataset(self) -> str: ...
    @property
    def format(self) -> str | None: ...
    @property
    def data(self) -> str | None: ...


def resolve_dataset(config: DatasetRequest) -> Path:
    """The dataset root `STORAGE/<dataset>-<format>`; a clear error naming `iobench generate`.
    With `--data`, the user's folder (or the folder of the user's file)."""
    if config.data is not None:
        p = Path(config.data).resolve()
        return p if p.is_dir() else p.parent
    storage = Path(config.storage)
    if not storage.is_dir():
        raise DatasetNotFoundError(f"--storage {storage} is not a directory; give the directory "
                                   "you generated into (iobench generate --storage DIR)")
    if config.format is not None or config.loader != "dali":
        fmt = config.format or config.loader
    else:  # dali: whichever format exists
        found = [f for f in loader_formats("dali")
                 if (storage / dataset_dirname(config.dataset, f) / "iobench.json").is_file()]
        if len(found) > 1:
            raise ConfigError(f"{storage} holds {config.dataset} in several formats "
                              f"({', '.join(found)}); pick one with --format")
        fmt = found[0] if found else DEFAULT_FORMAT
    root = storage / dataset_dirname(config.dataset, fmt)
    if not (root / "iobench.json").is_file():
        raise DatasetNotFoundError(
            f"no {config.dataset} dataset in {fmt} format at {root}; create it with: "
            f"iobench generate --dataset {config.dataset} --format {fmt} --storage {storage}")
    return root


def parse_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"unknown staging mode {mode!r}; choose one of: {', '.join(MODES)}")
    return mode


def need_bytes(entries: Iterable[FileEntry], dest_root: Path) -> int:
    """Bytes of `entries` that `dest_root` lacks: each file missing there or of another size.
    Streams `entries` (a compact manifest's share is never listed); where `dest_root` does
    not exist yet, nothing is looked at there: the need is every byte."""
    if not dest_root.is_dir():
        return share_bytes(entries)
    need = 0
    for e in entries:
        try:
            have = os.stat(dest_root / e.path).st_size
        except OSError:
            have = -1
        if have != e.bytes:
            need += e.bytes
    return need


def check_same_dataset(world: World, manifest: Manifest) -> None:
    """Raise on every rank (agreed) unless every node loaded the same dataset version as
    rank 0 (the manifest's identity, root aside): the cheap part of `version`, which `train`
    and `stage` run at their start. A collective."""
    mine = {k: v for k, v in manifest.identity().items() if k != "root"}
    seen = world.allgather((world.node_name, mine))
    ref_node, ref = seen[0]
    bad = sorted({node for node, ident in seen if ident != ref})
    if bad:
        other = next(ident for node, ident in seen if node == bad[0])
        diff = ", ".join(f"{k} {other[k]!r} vs {ref[k]!r}" for k in ref if other.get(k) != ref[k])
        err = ConfigError(f"node(s) {', '.join(bad)} see another version of the dataset than "
                          f"{ref_node} ({diff}): every node must read the same copy; run "
                          "`iobench preflight` and fix the stale copy")
        err.agreed = True  # every rank raises it
        raise err
