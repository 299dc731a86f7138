"""What a dataset's copies need: staging modes, missing bytes, one version on every node.

Shared by train, stage and preflight: the staging modes, the bytes a node's copy
still lacks, and the check that every node reads one version of the dataset
(where the dataset lives is `iobench.core.dataref`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from iobench.core.cache import share_bytes
from iobench.core.dataref import DatasetRef, dataset_root
from iobench.core.errors import ConfigError
from iobench.core.manifest import FileEntry, Manifest
from iobench.core.world import World

MODES = ("replicate", "shard")


def parse_mode(mode: str) -> str:
    """`mode` when it is a staging mode (replicate, shard); else a ConfigError naming them."""
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


def node_path(path: str | Path, world: World, option: str = "--to") -> Path:
    """`path` with `{node}` and `{host}` replaced by this rank's node index and short host
    name (node-local paths that differ per host, or several "nodes" emulated on one)."""
    try:
        return Path(str(path).format(node=world.node, host=world.hostname.split(".")[0]))
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"{option} {path}: only {{node}} and {{host}} may appear in "
                          f"braces ({e})") from None


def staging_root(dest: str | Path, source: DatasetRef, world: World,
                 option: str = "--to") -> Path:
    """Where this node's copy of `source` goes: `<dest>/<dataset>-<format>` (`node_path`)."""
    return dataset_root(node_path(dest, world, option), source.dataset, source.format)
