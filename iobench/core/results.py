"""Result documents: validate, write atomically under a fresh name, load.

Training results (`iobench.result`): one JSON file per run, `RESULTS/<run id>.json`,
never overwriting an earlier run (docs/results-schema.md documents every field; the
typed records and the schema derived from them are in `iobench.core.result_types`).
The other workflows' documents (stage, probe, sweep, pfs-profile) are written
by `write_document` as `RESULTS/<prefix>-<time>-<host>.json`, never overwriting.
"""

from __future__ import annotations

import datetime
import re
import secrets
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iobench.core.errors import StorageError
from iobench.core.jsonio import load_json, read_json, write_json_atomic
from iobench.core.regular import NotRegularFile, read_regular
from iobench.core.result_types import (
    READABLE_VERSIONS,
    SCHEMA,
    SCHEMA_VERSION,
    ResultError,
    TrainResult,
)
from iobench.core.schema import SchemaError, check

__all__ = ["READABLE_VERSIONS", "RESULT_SPEC", "SCHEMA", "SCHEMA_VERSION", "Found", "ResultError",
           "TrainResult", "find_documents", "find_results", "load_result", "load_typed",
           "new_run_id", "now_iso", "read_document", "schema_of", "validate", "write_document",
           "write_result"]

RESULT_SPEC = TrainResult.spec()  # derived from the typed records (iobench.core.result_types)


def new_run_id(host: str | None = None) -> str:
    """`YYYYmmddTHHMMSSZ-<host>-<6 hex>`: sortable by time, unique across hosts and runs."""
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", host or socket.gethostname()).strip("-") or "host"
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{host[:40]}-{secrets.token_hex(3)}"


def validate(doc: Any, where: str = "result") -> dict[str, Any]:
    """Check a result document against `RESULT_SPEC`; raise ResultError naming the first
    bad field by its path (docs/results-schema.md documents every field)."""
    try:
        checked: dict[str, Any] = check(doc, RESULT_SPEC, where)
        return checked
    except SchemaError as e:
        raise ResultError(str(e)) from None


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


def now_iso() -> str:
    """UTC time with microseconds (orders results written within one second)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


def write_document(doc: dict[str, Any], results_dir: str | Path, prefix: str) -> Path:
    """Write a workflow's document atomically as `results_dir/<prefix>-<time>-<host>[-k].json`,
    a new name: never overwrites an earlier file. Returns the path written."""
    results_dir = Path(results_dir)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    host = socket.gethostname().split(".")[0]
    for k in range(1000):
        name = f"{prefix}-{stamp}-{host}" + (f"-{k}" if k else "") + ".json"
        try:
            return write_json_atomic(results_dir / name, doc, exclusive=True)
        except FileExistsError:
            continue
    raise StorageError(f"cannot find a free result name in {results_dir}")


def load_result(path: str | Path) -> dict[str, Any]:
    """Read and validate one result file."""
    path = Path(path)
    if not path.is_file():
        raise ResultError(f"no result file {path}; pass result .json files or directories "
                          "holding them (default: ./iobench-results)")
    return validate(read_json(path, schema=SCHEMA, max_version=SCHEMA_VERSION), str(path))


def load_typed(path: str | Path) -> TrainResult:
    """Read, validate and type one result file."""
    return TrainResult.parse(load_result(path))


def read_document(path: str | Path) -> Any:
    """The JSON value of a document file a user or a directory listing names: only a regular
    file is opened (a FIFO never blocks); a DatasetError in one line when it is not one, or
    is unreadable, not UTF-8 or not JSON (`jsonio.load_json`)."""
    return load_json(path)


def schema_of(path: Path) -> str | None:
    """The `schema` of an iobench JSON document (cheap: its first bytes), or None."""
    try:
        head = read_regular(path, 300).decode("utf-8", "replace")
    except (OSError, NotRegularFile):
        return None
    m = re.search(r'"schema":\s*"(iobench\.[a-z_]+)"', head)
    return m.group(1) if m else None


@dataclass
class Found:
    """The documents `find_documents` found: training results, staging results, and the
    rest (probe, sweep, bench-read, not iobench's) with why each was set aside."""

    results: list[Path] = field(default_factory=list)
    stages: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


# The other documents a results directory holds, named here so that the code reading them
# (compare, report, verdict) needs no import of the workflow that writes them.
STAGE_SCHEMA = "iobench.stage"
# v2: source_cache, os_read_bytes, repeats/repetitions/spread; v3: per_node, slowest_node
STAGE_SCHEMA_VERSION = 3
PROBE_SCHEMA = "iobench.probe"
PROBE_SCHEMA_VERSION = 2  # v2: open_stat_close, first-byte latency, cache status, evict_cmd, profile
SWEEP_SCHEMA = "iobench.sweep"
SWEEP_SCHEMA_VERSION = 1
SEARCH_SCHEMA = "iobench.search"
SEARCH_SCHEMA_VERSION = 1


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
OTHER_RESULTS = ("iobench.probe", "iobench.sweep", "iobench.bench_read", "iobench.search",
                 "iobench.diagnose", "iobench.projection")


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
