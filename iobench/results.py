"""Result documents (`iobench.result` v1): validate, write atomically under a fresh run id, load.

One JSON file per run, `RESULTS/<run id>.json`, never overwriting an earlier
run (docs/results-schema.md documents every field).
"""

from __future__ import annotations

import re
import secrets
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iobench.errors import IobenchError
from iobench.jsonio import read_json, write_json_atomic

SCHEMA = "iobench.result"
# v2: repetitions (`config.repeat`, epochs tagged `repeat`, `summary.spread`), the loader's
# start-up apart (`loader`), user-space and server caches (`cache.user_space`,
# `cache.server_cache`), synchronised emulated steps (`compute.steps`). v1 still loads.
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)

# top-level keys every result has (values may be null where the schema says so)
REQUIRED: tuple[str, ...] = ("schema", "schema_version", "run_id", "created", "kind", "config",
                             "world", "compute", "cache", "dataset", "provenance", "epochs",
                             "summary", "warnings")
OPTIONAL: tuple[str, ...] = ("staging", "tier", "loader")  # --stage-to; an emulated pfs tier
EPOCH_REQUIRED: tuple[str, ...] = ("epoch", "summary", "ranks", "cache", "training")
RANK_REQUIRED: tuple[str, ...] = ("rank", "host", "steps", "samples", "batch_bytes", "wall_s",
                                  "stall_s", "compute_s", "first_batch_s", "stall_fraction", "au",
                                  "wait_p50_s", "wait_p95_s", "wait_p99_s", "wait_max_s",
                                  "os_read_bytes", "cache_resident_fraction_at_start")


class ResultError(IobenchError, ValueError):
    """A result document is malformed or cannot be found."""


def new_run_id(host: str | None = None) -> str:
    """`YYYYmmddTHHMMSSZ-<host>-<6 hex>`: sortable by time, unique across hosts and runs."""
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", host or socket.gethostname()).strip("-") or "host"
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{host[:40]}-{secrets.token_hex(3)}"


def validate(doc: Any, where: str = "result") -> dict[str, Any]:
    """Check a result document's structure; raise ResultError naming the first problem."""
    if not isinstance(doc, dict):
        raise ResultError(f"{where}: not a JSON object")
    missing = [k for k in REQUIRED if k not in doc]
    unknown = sorted(set(doc) - set(REQUIRED) - set(OPTIONAL))
    if missing or unknown:
        raise ResultError(f"{where}: missing keys {missing}, unknown keys {unknown}")
    if doc["schema"] != SCHEMA or doc["schema_version"] not in READABLE_VERSIONS:
        raise ResultError(f"{where}: schema {doc['schema']!r} v{doc['schema_version']!r}, "
                          f"expected {SCHEMA!r} v{' or v'.join(map(str, READABLE_VERSIONS))}")
    if not isinstance(doc["epochs"], list):
        raise ResultError(f"{where}: 'epochs' must be a list")
    for i, ep in enumerate(doc["epochs"]):
        miss = [k for k in EPOCH_REQUIRED if k not in ep]
        if miss:
            raise ResultError(f"{where}: epochs[{i}] lacks {miss}")
        if not ep["ranks"]:
            raise ResultError(f"{where}: epochs[{i}] has no ranks")
        for r in ep["ranks"]:
            miss = [k for k in RANK_REQUIRED if k not in r]
            if miss:
                raise ResultError(f"{where}: epochs[{i}] rank {r.get('rank')} lacks {miss}")
    if doc["compute"].get("kind") not in ("model", "emulated", "none"):
        raise ResultError(f"{where}: compute.kind={doc['compute'].get('kind')!r}, expected "
                          "model, emulated or none")
    return doc


def write_result(doc: dict[str, Any], results_dir: str | Path) -> Path:
    """Validate and write `doc` as `results_dir/<run_id>.json`; never overwrites a file.

    If the name is taken (a clash of the random suffix), a fresh run id is
    drawn and `doc["run_id"]` updated. Returns the path written.
    """
    validate(doc)
    for _ in range(5):
        path = Path(results_dir) / f"{doc['run_id']}.json"
        try:
            return write_json_atomic(path, doc, exclusive=True)
        except FileExistsError:
            doc["run_id"] = new_run_id()
    raise ResultError(f"cannot find a free result name in {results_dir}")


def load_result(path: str | Path) -> dict[str, Any]:
    """Read and validate one result file."""
    path = Path(path)
    if not path.is_file():
        raise ResultError(f"no result file {path}; pass result .json files or directories "
                          "holding them (default: ./iobench-results)")
    return validate(read_json(path, schema=SCHEMA, max_version=SCHEMA_VERSION), str(path))


def schema_of(path: Path) -> str | None:
    """The `schema` of an iobench JSON document (cheap: its first bytes), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(300).decode("utf-8", "replace")
    except OSError:
        return None
    m = re.search(r'"schema":\s*"(iobench\.[a-z_]+)"', head)
    return m.group(1) if m else None


def is_result_file(path: Path) -> bool:
    """Whether `path` holds an `iobench.result` document (cheap check of the schema key)."""
    return schema_of(path) == SCHEMA


@dataclass
class Found:
    """The documents `find_documents` found: training results, staging results, and the
    rest (probe, sweep, bench-read, not iobench's) with why each was set aside."""

    results: list[Path] = field(default_factory=list)
    stages: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


STAGE_SCHEMA = "iobench.stage"


def find_documents(paths: Iterable[str | Path]) -> Found:
    """Training and staging results named by `paths`: files as given, directories searched
    with their sub-directories (sorted by path). Other iobench documents (probe, sweep,
    bench-read) and other JSON are set aside with a reason; a directory holding no
    training result is an error, and so is a path that does not exist.
    """
    found = Found()
    paths = list(paths)
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(f for f in p.rglob("*.json") if f.is_file())
            before = len(found.results)
            for f in files:
                _sort_into(found, f)
            if len(found.results) == before:
                raise ResultError(f"directory {p} holds no iobench training results (*.json, "
                                  "searched with its sub-directories); give the --results "
                                  "directory of `iobench train`")
        elif p.is_file():
            _sort_into(found, p, given=True)
        else:
            raise ResultError(f"no result file or directory {p}")
    if not found.results:
        raise ResultError(f"no iobench training results among {', '.join(map(str, paths))}: "
                          "give `iobench train` result files or their --results directory")
    return found


# Documents iobench writes into a results directory beside training results.
OTHER_RESULTS = ("iobench.probe", "iobench.sweep", "iobench.bench_read")


def _sort_into(found: Found, path: Path, given: bool = False) -> None:
    schema = schema_of(path)
    if schema == STAGE_SCHEMA:
        found.stages.append(path)
    elif schema in OTHER_RESULTS:
        found.skipped.append((path, f"an {schema} document, not a training result"))
    elif schema == SCHEMA or given:
        found.results.append(path)  # a file named on the command line: loading it says why not


def find_results(paths: Iterable[str | Path]) -> list[Path]:
    """The training result files named by `paths` (see `find_documents`)."""
    return find_documents(paths).results
