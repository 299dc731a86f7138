"""Check a dataset against its manifest: every file present, its size and sha256, and
that it opens with its format's library holding the expected samples."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
from pathlib import Path

from iobench.errors import IobenchError
from iobench.generators import get_writer
from iobench.generators.base import sha256_file
from iobench.manifest import (
    MANIFEST_NAME,
    TABLE_ARRAYS,
    TABLE_DIR,
    FileEntry,
    Manifest,
    file_kind,
)
from iobench.world import World


def check_entry(manifest: Manifest, entry: FileEntry) -> str | None:
    """One problem with `entry` as a line of text, or None when it is fine."""
    path = manifest.path_of(entry)
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"missing: {path}"
    except OSError as e:
        return f"unreadable: {path}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):  # reading a FIFO would wait for a writer forever
        return f"not a regular file ({file_kind(st.st_mode)}): {path}"
    size = st.st_size
    if size != entry.bytes:
        kind = "truncated" if size < entry.bytes else "too long"
        return f"{kind}: {path} has {size} bytes, manifest says {entry.bytes}"
    try:
        digest = sha256_file(path)
    except OSError as e:
        return f"unreadable: {path}: {e.strerror}"
    if digest != entry.sha256:
        return f"checksum mismatch: {path} (sha256 {digest[:12]}..., manifest {entry.sha256[:12]}...)"
    from iobench.datasets import parse_dataset

    writer = get_writer(manifest.format, parse_dataset(manifest.dataset), manifest.seed)
    try:
        writer.check(path, entry)
    except IobenchError as e:
        return f"unreadable: {e}"
    return None


_M: dict[str, Manifest] = {}


def _check_one(entry: FileEntry) -> str | None:
    return check_entry(_M["m"], entry)


def verify_dataset(root: str | Path, jobs: int = 1, world: World | None = None,
                   allow_extra: bool = False) -> list[str]:
    """All problems found (empty when the dataset is intact), on every rank.

    Files are split over MPI ranks (r::R) and, within a rank, `jobs` processes.
    Files in the dataset folder that the manifest does not list are problems too
    (leftovers of an interrupted copy or generation) unless `allow_extra`.
    """
    world = world or World()
    manifest = Manifest.load(root)
    mine = list(manifest.files[world.rank::world.size])
    if jobs > 1 and len(mine) > 1:
        _M["m"] = manifest
        with mp.get_context("fork").Pool(jobs) as pool:
            found = pool.map(_check_one, mine, chunksize=max(1, len(mine) // (jobs * 8)))
    else:
        found = [check_entry(manifest, e) for e in mine]
    problems = [p for p in found if p]
    stray: list[str] = []
    if world.is_root:
        stray = _unlisted(manifest, allow_extra)
    return sorted(sum(world.allgather(problems), []) + stray)


def _unlisted(manifest: Manifest, allow_extra: bool) -> list[str]:
    """Files under the dataset root that the manifest does not list."""
    assert manifest.root is not None  # loaded from its folder
    top = Path(manifest.root)
    listed = {f.path for f in manifest.files} | {MANIFEST_NAME} | (
        {f"{TABLE_DIR}/{n}.npy" for n in TABLE_ARRAYS} if manifest.compact else set())
    out = []
    for dirpath, _dirs, names in os.walk(top):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), top)
            if rel in listed:
                continue
            if n.endswith(".tmp") or ".iobench-partial" in rel:  # generation, stage
                out.append(f"temporary file left behind: {top / rel}")
            elif not allow_extra:
                out.append(f"not in the manifest: {top / rel} (a leftover of an interrupted "
                           "copy?); remove it, or pass --allow-extra")
    return out
