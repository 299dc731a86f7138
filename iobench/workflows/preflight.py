"""Fail fast before a long run: what every node must have, checked on every node in seconds.

`preflight(config, world)` is a collective (every rank calls it) that checks,
on each node (by its local rank 0, the others wait), that:

- `dataset`: the storage path holds the dataset and its manifest loads;
- `version`: the manifest is the same file on every node (sha256 of its bytes, and
  of a compact manifest's side tables), so no node reads an older or half-copied
  version;
- `files`: a spot check of the dataset's files (the first, the last and up to
  `SPOT_FILES` between, each node a different set) exist with the manifest's
  sizes; not every file, which on a million-file dataset would be its own
  metadata storm;
- `staging` (with `stage_to`): the node's staging directory has the free space
  the copy needs (what is not already there);
- `eviction`: the node can empty a file's pages from its page cache: it reads
  part of one data file (each node its own file, so that nodes sharing a host
  cannot evict for each other), evicts it, and measures what stayed;
- `ranks`: every node runs the same number of ranks.

Each check's answer names every node that failed and why; rank 0 prints them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iobench.core import cache
from iobench.core.dataref import DatasetRef, locate
from iobench.core.errors import ConfigError, IobenchError
from iobench.core.manifest import MANIFEST_NAME, TABLE_DIR, FileEntry, Manifest
from iobench.core.placement import need_bytes, node_path, parse_mode, staging_root
from iobench.core.world import World

CHECKS = ("dataset", "version", "files", "staging", "eviction", "ranks")
SPOT_FILES = 16  # files each node checks besides the first and the last
EVICT_PROBE_BYTES = 8 << 20  # how much of a file the eviction check reads (bytes)


@dataclass(frozen=True)
class PreflightConfig:
    """What to check: the dataset under `storage`, and optionally a staging target."""

    storage: str
    dataset: str | None = None
    format: str | None = None
    stage_to: str | None = None  # `{node}` and `{host}` as in `iobench stage --to`
    stage_mode: str = "replicate"
    eviction: bool = True
    warn_above: float = cache.DEFAULT_WARN_ABOVE

    def __post_init__(self) -> None:
        parse_mode(self.stage_mode)
        if not 0.0 <= self.warn_above <= 1.0:
            raise ConfigError(f"warn_above={self.warn_above} must be a fraction in [0, 1]")


def dataset_sha256(root: Path, manifest: Manifest) -> str:
    """sha256 of what says which dataset a node holds: its manifest's bytes and, for a
    compact manifest, its side tables (sizes and checksums live there, not in the JSON)."""
    h = hashlib.sha256()
    paths = [root / MANIFEST_NAME]
    if manifest.compact is not None:
        paths += sorted((root / TABLE_DIR).glob("*.npy"))
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _spot(manifest: Manifest, node: int) -> list[FileEntry]:
    """The first and last file, and up to SPOT_FILES others spread over the list, starting
    at an offset that differs per node (together the nodes cover more of it)."""
    files = manifest.files
    n = len(files)
    if n <= SPOT_FILES + 2:
        return list(files)
    step = n / SPOT_FILES
    picks = {0, n - 1} | {int((k + (node * 0.37) % 1) * step) % n for k in range(SPOT_FILES)}
    return [files[i] for i in sorted(picks)]


def _staging_need(cfg: PreflightConfig, dataset: DatasetRef, world: World,
                  ranks: list[int]) -> tuple[str, bool, str]:
    """(check, ok, detail) for the node's staging target."""
    from iobench.core.sysinfo import mount_of

    assert cfg.stage_to is not None
    manifest = dataset.manifest
    dest = node_path(cfg.stage_to, world, "--stage-to")
    root = staging_root(cfg.stage_to, dataset, world, "--stage-to")
    scope = "local" if cfg.stage_mode == "shard" else "global"
    # share by share, as the node's ranks will copy them: a compact dataset is never listed
    need = sum(need_bytes(cache.rank_share(manifest, ranks, i, world.size, scope), root)
               for i in range(len(ranks)))
    probe = dest
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        return ("staging", False, f"{probe} (on the way to {dest}) is not writable")
    free = shutil.disk_usage(probe).free
    where = f"{dest} ({mount_of(probe).fstype})"
    if free < need:
        return ("staging", False, f"{where} has {free / 1e9:.3g} GB free, the copy needs "
                f"{need / 1e9:.3g} GB: free space, or use --stage-mode shard")
    return ("staging", True, f"{where}: {free / 1e9:.3g} GB free for {need / 1e9:.3g} GB")


def _eviction(cfg: PreflightConfig, manifest: Manifest, world: World) -> tuple[str, bool | None,
                                                                              str]:
    """Read part of this node's probe file, evict it, measure what stayed."""
    if manifest.compact is not None:  # millions of files: the node's own, not a list of all
        first = world.node % len(manifest.data_files)
        data = [f for f in manifest.data_files[first:first + 64] if f.bytes > 0][:1]
    else:
        data = [f for f in manifest.data_files if f.bytes > 0]
    if not data:
        return ("eviction", None, "no data file to try")
    entry = data[world.node % len(data)]
    path = manifest.path_of(entry)
    want = min(entry.bytes, EVICT_PROBE_BYTES)
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < want:
            chunk = f.read(min(1 << 20, want - got))
            if not chunk:
                break
            got += len(chunk)
    ev, res = cache.evict_and_measure([path])
    if ev.errors:
        return ("eviction", False, f"cannot evict {entry.path}: {ev.errors[0]}")
    if res.unknown_files:
        return ("eviction", None, f"residency of {entry.path} unknown: this process may not "
                "ask the kernel about a file it cannot write (run as its owner or root)")
    left = res.resident_bytes / got if got else 0.0
    if left > cfg.warn_above:
        return ("eviction", False, f"{left:.0%} of the {got / 1e6:.3g} MB read from "
                f"{entry.path} stayed in the page cache after POSIX_FADV_DONTNEED: cold epochs "
                "would read memory (a shim or filesystem that ignores the advice?)")
    return ("eviction", True, f"{got / 1e6:.3g} MB of {entry.path} read and evicted, "
            f"{left:.0%} left")


def _node_checks(cfg: PreflightConfig, world: World, ranks: list[int]) -> list[tuple[str,
                                                                                  bool | None,
                                                                                  str]]:
    """This node's answers (on its local rank 0): [(check, ok, detail)], ok None = unknown."""
    out: list[tuple[str, bool | None, str]] = []
    try:
        dataset = locate(cfg.storage, cfg.dataset, cfg.format)
        root, manifest = dataset.root, dataset.manifest
    except (IobenchError, OSError) as e:
        return [("dataset", False, str(e))]
    out.append(("dataset", True, f"{manifest.dataset}/{manifest.format} at {root}"))
    out.append(("version", True, dataset_sha256(root, manifest)))
    bad = []
    spot = _spot(manifest, world.node)
    for entry in spot:
        try:
            size = os.stat(manifest.path_of(entry)).st_size
        except OSError as err:
            bad.append(f"{entry.path}: {err.strerror}")
            continue
        if size != entry.bytes:
            bad.append(f"{entry.path}: {size} bytes, the manifest says {entry.bytes}")
    out.append(("files", not bad, f"{len(bad)} of {len(spot)} files checked are wrong, first: "
                f"{bad[0]}" if bad else f"{len(spot)} of {len(manifest.files)} files checked"))
    if cfg.stage_to is not None:
        try:
            out.append(_staging_need(cfg, dataset, world, ranks))
        except (IobenchError, OSError, KeyError, ValueError) as e:
            out.append(("staging", False, f"--stage-to {cfg.stage_to}: {e}"))
    if cfg.eviction:
        try:
            out.append(_eviction(cfg, manifest, world))
        except OSError as e:
            out.append(("eviction", False, f"{e.filename}: {e.strerror}"))
    return out


def preflight(cfg: PreflightConfig, world: World) -> dict[str, Any]:
    """Run the checks on every node (a collective); every rank returns the same report:
    `ok` (every check passed on every node), `seconds`, `nodes` (names), and `checks`:
    for each check, `ok` (None where some node could not tell) and `nodes`: for each node
    its `name`, `ok` and `detail`."""
    t0 = time.perf_counter()
    ranks = cache.node_ranks(world)
    local_index = ranks.index(world.rank)
    mine = None
    if local_index == 0:
        try:
            mine = _node_checks(cfg, world, ranks)
        except Exception as e:  # every node must answer, or the others would wait forever
            mine = [("dataset", False, f"{type(e).__name__}: {e}")]
    answers = world.allgather((world.node, world.node_name, len(ranks), mine))
    nodes = sorted({(a[0], a[1], a[2]) for a in answers})
    checks: dict[str, dict[str, Any]] = {}
    for _, name, _, got in sorted((a for a in answers if a[3] is not None),
                                     key=lambda a: a[0]):
        for check, ok, detail in got:
            c = checks.setdefault(check, {"ok": True, "nodes": []})
            c["nodes"].append({"name": name, "ok": ok, "detail": detail})
    if "version" in checks:  # the same manifest everywhere: rank 0's node is the reference
        ref = checks["version"]["nodes"][0]["detail"]
        for n in checks["version"]["nodes"]:
            n["ok"] = n["detail"] == ref
            n["detail"] = (f"manifest sha256 {n['detail'][:12]}" if n["ok"] else
                           f"manifest sha256 {n['detail'][:12]} differs from "
                           f"{checks['version']['nodes'][0]['name']}'s {ref[:12]}: this node "
                           "sees another version of the dataset (regenerated, or a stale copy)")
    counts = {name: k for _, name, k in nodes}
    checks["ranks"] = {"ok": True, "nodes": [
        {"name": name, "ok": len(set(counts.values())) == 1,
         "detail": f"{k} rank(s)" if len(set(counts.values())) == 1 else
         f"{k} rank(s), other nodes {sorted(set(counts.values()) - {k})}: give every node "
         "the same ranks (--ntasks-per-node)"} for name, k in counts.items()]}
    for c in checks.values():
        oks = [n["ok"] for n in c["nodes"]]
        c["ok"] = False if False in oks else (None if None in oks else True)
    order = [k for k in CHECKS if k in checks]
    return {"ok": all(checks[k]["ok"] is not False for k in order)
            and all(checks[k]["ok"] is True for k in order if k != "eviction"),
            "seconds": time.perf_counter() - t0, "nodes": [name for _, name, _ in nodes],
            "checks": {k: checks[k] for k in order}}


def lines(report: dict[str, Any]) -> list[str]:
    """The report in words: one line per check, naming the nodes that failed."""
    out = []
    for k, c in report["checks"].items():
        bad = [n for n in c["nodes"] if n["ok"] is False]
        unknown = [n for n in c["nodes"] if n["ok"] is None]
        if bad:
            out.append(f"{k}: FAILED on {', '.join(n['name'] for n in bad)}: "
                       + "; ".join(f"{n['name']}: {n['detail']}" for n in bad))
        elif unknown:
            out.append(f"{k}: unknown on {', '.join(n['name'] for n in unknown)}: "
                       f"{unknown[0]['detail']}")
        else:
            out.append(f"{k}: ok on {len(c['nodes'])} node(s) ({c['nodes'][0]['detail']})")
    verdict = "ok" if report["ok"] else "FAILED"
    out.append(f"preflight {verdict}: {len(report['nodes'])} node(s) "
               f"({', '.join(report['nodes'])}) in {report['seconds']:.2f} s")
    return out
