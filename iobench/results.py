"""Result documents: validate, write atomically under a fresh name, load.

Training results (`iobench.result`): one JSON file per run, `RESULTS/<run id>.json`,
never overwriting an earlier run (docs/results-schema.md documents every field).
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

from iobench.errors import IobenchError, StorageError
from iobench.jsonio import read_json, write_json_atomic
from iobench.schema import (
    ANY,
    Count,
    Enum,
    Int,
    List,
    Map,
    NonNeg,
    Num,
    Opt,
    SchemaError,
    Str,
    check,
)

SCHEMA = "iobench.result"
# v2: repetitions (`config.repeat`, epochs tagged `repeat`, `summary.spread`), the loader's
# start-up apart (`loader`), user-space and server caches (`cache.user_space`,
# `cache.server_cache`), synchronised emulated steps (`compute.steps`). v3: per-node figures of each epoch
# (`epochs[i].per_node`), the batch job (`provenance.job`), node names (`world.nodes`,
# `ranks[r].node_name`), stragglers in the verdict. v1 and v2 still load.
SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)

class ResultError(IobenchError, ValueError):
    """A result document is malformed or cannot be found."""


def new_run_id(host: str | None = None) -> str:
    """`YYYYmmddTHHMMSSZ-<host>-<6 hex>`: sortable by time, unique across hosts and runs."""
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", host or socket.gethostname()).strip("-") or "host"
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{host[:40]}-{secrets.token_hex(3)}"


_NUM = Opt(Num)
_RANK = Map({
    "rank": Count, "host": Str, "steps": Count, "samples": Count, "batch_bytes": Count,
    "wall_s": NonNeg, "stall_s": NonNeg, "compute_s": NonNeg, "first_batch_s": _NUM,
    "stall_fraction": _NUM, "au": _NUM, "wait_p50_s": _NUM, "wait_p95_s": _NUM,
    "wait_p99_s": _NUM, "wait_max_s": _NUM, "os_read_bytes": Opt(Count),
    "cache_resident_fraction_at_start": _NUM,
    "loader": Opt(Map({"workers": Count, "batches": Count, "read_s": NonNeg,
                       "decode_s": NonNeg, "handoff_s": NonNeg,
                       "per_worker": List(Map({"worker": Int, "batches": Count,
                                               "read_s": NonNeg, "decode_s": NonNeg,
                                               "busy_fraction": NonNeg}))},
                      optional=("handoff_s", "per_worker"))),
}, optional=("loader",))
_NODE = Map({
    "node": Count, "name": Str, "host": Str, "ranks": List(Count, min_len=1),
    "samples": Count, "batch_bytes": Count, "wall_s": NonNeg, "stall_s": NonNeg,
    "stall_s_mean": NonNeg, "stall_fraction": _NUM, "samples_per_s": _NUM, "read_MBps": _NUM,
    "os_read_bytes": Opt(Count), "cache_resident_fraction_at_start": _NUM,
    "cache": Opt(Enum("warm", "unknown")),
})
_EPOCH_SUMMARY = Map({
    "ranks": Count, "steps": Count, "samples": Count, "batch_bytes": Count, "wall_s": NonNeg,
    "stall_s_mean": NonNeg, "stall_s_max": NonNeg, "stall_fraction_mean": _NUM,
    "stall_fraction_max": _NUM, "au_mean": _NUM, "au_min": _NUM, "samples_per_s": _NUM,
    "read_MBps": _NUM, "os_read_bytes": Opt(Count), "au_mlperf_mean": _NUM,
    "au_mlperf_min": _NUM,
}, optional=("au_mlperf_mean", "au_mlperf_min"))  # (results before au_mlperf lack them)
_SPREAD = Opt(Map({"median": Num, "min": Num, "max": Num, "cv": _NUM, "n": Count}))
_STAGING = Map({"stage_s": NonNeg, "stage_bytes": Count, "stage_MBps": _NUM,
                "from": ANY, "to": ANY, "skipped_files": Count,
                "spread": Opt(Map({"stage_s": _SPREAD, "stage_MBps": _SPREAD})),
                "repeats": Count},
               optional=("skipped_files", "spread", "repeats", "stage_MBps"))
RESULT_SPEC = Map({
    "schema": Enum(SCHEMA), "schema_version": Enum(*READABLE_VERSIONS), "run_id": Str,
    "created": Str, "kind": Enum("train"),
    "config": Map({"loader": Str, "storage": Str, "dataset": Str, "workers": Count,
                   "batch_size": Count, "shuffle": Str, "epochs": Count,
                   "worker_type": Str, "compute_time_s": _NUM, "repeat": Count},
                  optional=("worker_type", "compute_time_s", "repeat")),
    "world": Map({"size": Int, "num_nodes": Int, "local_size": Int}, optional=("local_size",)),
    "compute": Map({"kind": Enum("model", "emulated", "none"), "model": Opt(Str),
                    "compute_time_s": _NUM, "device": Opt(Map({"type": Str}))},
                   optional=("model", "compute_time_s", "device")),
    "cache": Map({"mode": Enum("cold", "warm")}),
    "dataset": Map({"dataset": Str, "format": Str, "num_samples": Count,
                    "total_bytes": Count, "root": Opt(Str)}, optional=("root",)),
    "provenance": Map({"storage": Map({"path": Str, "fstype": Str, "kind": Str},
                                      optional=("path", "fstype", "kind")),
                       "job": Opt(Map({"scheduler": Str, "id": Opt(Str), "name": Opt(Str),
                                       "nodelist": Opt(Str), "nodes": Opt(Count),
                                       "tasks_per_node": Opt(Count), "partition": Opt(Str)}))},
                      optional=("storage", "job")),
    "epochs": List(Map({
        "repeat": Count, "epoch": Count, "summary": _EPOCH_SUMMARY,
        "ranks": List(_RANK, min_len=1),
        "per_node": List(_NODE, min_len=1),
        "cache": Map({"status": Str, "resident_fraction": _NUM},
                     optional=("status", "resident_fraction")),
        "training": Opt(Map({"loss": _NUM, "accuracy": _NUM}, optional=("loss", "accuracy"))),
    }, optional=("repeat", "per_node"))),
    "summary": Map({"spread": Opt(Map({}, extra=True)),
                    "verdict": Opt(Map({"line": Str, "threshold": NonNeg, "status": Str,
                                        "bottleneck": Str}))},
                   optional=("spread", "verdict")),
    "warnings": List(Str),
    "staging": Opt(_STAGING),
    "tier": Opt(Map({"profile": Map({"name": Str})})),
    "loader": Opt(Map({}, extra=True)),
    "status": Enum("complete", "interrupted", "incomplete"), "status_reason": Opt(Str),
}, optional=("staging", "tier", "loader", "status", "status_reason"), extra=False)


def is_complete(doc: dict[str, Any]) -> bool:
    """Whether a result holds a whole run (results before v2's `status` always do)."""
    return bool(doc.get("status", "complete") == "complete")


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
OTHER_RESULTS = ("iobench.probe", "iobench.sweep", "iobench.bench_read", "iobench.search")


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
