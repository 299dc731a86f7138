"""`iobench search`: the largest number of emulated accelerators a storage keeps at AU >= threshold.

Every point is a real cold `iobench train` run of N ranks (one emulated
accelerator each, steps synchronised, `--repeat` honoured), launched by the
launcher (`mpiexec -n {ranks}` by default) from this process. N doubles
from 1 while the AU holds, then bisects between the last pass and the first
failure, never above `max_accelerators`. A point passes when the median over
repetitions of `au_mlperf` (AU without the first step's I/O, as MLPerf
counts it) is at or above the threshold. The result is an `iobench.search`
document (docs/results-schema.md), written atomically.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from iobench.core import launch
from iobench.core.errors import ConfigError, IobenchError
from iobench.core.interrupts import Interrupted
from iobench.core.jsonio import write_json_atomic
from iobench.core.launch import Command, require_launcher
from iobench.core.options import parse_repeat
from iobench.core.result_types import SearchDoc, TrainResult
from iobench.core.results import SEARCH_SCHEMA, SEARCH_SCHEMA_VERSION
from iobench.core.schema import (
    Bool,
    Count,
    Enum,
    List,
    Map,
    NonNeg,
    Num,
    Opt,
    SchemaError,
    Str,
    check,
)
from iobench.core.workloads import WorkloadRun, parse_host_memory, resolve

SCHEMA, SCHEMA_VERSION = SEARCH_SCHEMA, SEARCH_SCHEMA_VERSION  # iobench.core.results says each version


class SearchError(IobenchError):
    """A point of the search could not be measured (its run failed)."""

    exit_code = 1


class SearchInterrupted(Interrupted):
    """SIGINT/SIGTERM during `run_search`: `document` is the search result of the points
    that completed (status `interrupted`)."""

    def __init__(self, signum: int, document: dict[str, Any]) -> None:
        super().__init__(signum)
        self.document = document


@dataclass(frozen=True)
class SearchConfig:
    """What `iobench search` runs. `batch_size` None: the workload's; another batch scales the
    compute time with it, so each accelerator's demand (bytes per second) is the workload's."""

    workload: str
    accelerator: str
    storage: str
    results: str = "iobench-results"
    max_accelerators: int = 64
    repeat: int = 1
    epochs: int = 1
    batch_size: int | None = None
    threshold: float | None = None  # None: the workload's
    workers: int = 2
    launcher: tuple[str, ...] = ("mpiexec", "-n", "{ranks}")
    point_timeout_s: float = 1800.0
    train_args: tuple[str, ...] = ()  # passed on to every `iobench train`
    slowdown: float = 1.0  # emulated compute this many times slower: demand / slowdown
    hosts: int = 0  # client hosts: N spread evenly over them (and the dataset-size rule)
    host_memory_gb: float = 0.0
    # a real model's measured rate (samples/s per accelerator) in place of the workload's
    # compute time (`measured_demand`), and where it was measured
    demand_samples_per_s: float | None = None
    demand_source: str | None = None

    def __post_init__(self) -> None:
        resolve(self.workload, self.accelerator)  # an unknown workload or accelerator
        self._check_counts()
        self._check_launch()

    def _check_counts(self) -> None:
        if self.max_accelerators < 1:
            raise ConfigError(f"--max-accelerators {self.max_accelerators} must be >= 1")
        parse_repeat(self.repeat)
        if self.epochs < 1:
            raise ConfigError(f"--epochs {self.epochs} must be >= 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size} must be >= 1")
        if self.threshold is not None and not 0 < self.threshold <= 1:
            raise ConfigError(f"--au-threshold {self.threshold} must be in (0, 1]")
        if not (self.slowdown >= 1 and math.isfinite(self.slowdown)):
            raise ConfigError(f"--slowdown {self.slowdown} must be a number >= 1")
        if self.demand_samples_per_s is not None and not self.demand_samples_per_s > 0:
            raise ConfigError(f"demand_samples_per_s={self.demand_samples_per_s} must be > 0")

    def _check_launch(self) -> None:
        if not self.launcher or not any("{ranks}" in a for a in self.launcher):
            raise ConfigError(f"--launcher {shlex.join(self.launcher)!r} must contain {{ranks}}, "
                              "e.g. 'srun -n {ranks}' or 'mpiexec -n {ranks}'")
        if not self.point_timeout_s > 0:
            raise ConfigError(f"--point-timeout {self.point_timeout_s} must be > 0 seconds")
        if self.hosts < 0:
            raise ConfigError(f"--hosts {self.hosts} must be >= 0 (0: one host, no spread)")
        parse_host_memory(self.hosts, self.host_memory_gb)  # finite, within any machine
        if self.hosts > self.max_accelerators:
            raise ConfigError(f"--max-accelerators {self.max_accelerators} is under --hosts "
                              f"{self.hosts}: every host runs at least one accelerator; raise "
                              f"--max-accelerators to {self.hosts} or more")

    @property
    def run(self) -> WorkloadRun:
        return resolve(self.workload, self.accelerator)

    @property
    def batch(self) -> int:
        return self.batch_size or self.run.batch

    @property
    def compute_s(self) -> float:
        """The emulated step time: the workload's, x batch / the workload's batch, x slowdown;
        with a measured demand, batch / that rate, x slowdown."""
        if self.demand_samples_per_s is not None:
            return self.batch / self.demand_samples_per_s * self.slowdown
        return self.run.compute_s * self.batch / self.run.batch * self.slowdown

    @property
    def demand_Bps(self) -> float:
        """Bytes per second one emulated accelerator reads at AU 1 in this search."""
        if self.demand_samples_per_s is not None:
            return self.demand_samples_per_s * self.run.workload.sample_bytes / self.slowdown
        return self.run.demand_Bps / self.slowdown

    @property
    def step(self) -> int:
        """Accelerator counts are multiples of this: the hosts, so N spreads evenly over them."""
        return max(1, self.hosts)

    @property
    def limit(self) -> int:
        """The largest count the search may run: --max-accelerators, down to a multiple of
        the hosts."""
        return self.max_accelerators // self.step * self.step

    @property
    def au_threshold(self) -> float:
        return self.threshold if self.threshold is not None else self.run.workload.au_threshold


def measured_demand(res: TrainResult, workload: str) -> tuple[float, str]:
    """(samples/s, where measured) of the real model a training result measured
    (`compute.demand`, per accelerator), for a search of `workload`; a ConfigError when the
    run measured none or read another dataset than the workload's."""
    from iobench.core.workloads import parse_workload

    w, d = parse_workload(workload), res.compute.demand
    if d is None:
        raise ConfigError(f"--demand-from: run {res.run_id} measured no demand (it emulated "
                          "its compute or trained no model); give the result of an `iobench "
                          "train` of a real model, on the accelerator you mean")
    if res.dataset.dataset != w.dataset:
        raise ConfigError(f"--demand-from: run {res.run_id} measured {res.compute.model} on "
                          f"{res.dataset.dataset}, but {w.name} reads {w.dataset}; give a run "
                          f"on {w.dataset}")
    device = res.compute.device.name if res.compute.device and res.compute.device.name \
        else d.device
    return d.samples_per_s, (f"{res.compute.model} (batch {d.batch_size}) on {device}: "
                             f"{d.samples_per_s:.4g} samples/s, measured in run {res.run_id}")


def next_point(passed: dict[int, bool], limit: int, step: int = 1) -> int | None:
    """The next accelerator count to measure, or None when the answer is known.

    Doubling from 1 while every point passes (the last step capped at
    `limit`), then bisection between the largest pass and the smallest
    failure above it. With `step` (the hosts, N spread evenly over them, as
    MLPerf requires) every count is a multiple of `step`: the search runs in
    accelerators per host, so counts that do not divide evenly are never run.
    """
    if step > 1:
        k = next_point({n // step: ok for n, ok in passed.items()}, limit // step)
        return None if k is None else k * step
    good = max((n for n, ok in passed.items() if ok), default=0)
    bad = min((n for n, ok in passed.items() if not ok and n > good), default=None)
    if bad is None:
        if good >= limit:
            return None
        return min(limit, 2 * good) if good else 1
    if bad - good <= 1:
        return None
    return (good + bad) // 2


def answer(passed: dict[int, bool]) -> int:
    """The largest count that passed with every smaller measured count passing too."""
    good = 0
    for n in sorted(passed):
        if not passed[n]:
            break
        good = n
    return good


def train_command(cfg: SearchConfig, n: int, results: Path) -> list[str]:
    """The `iobench train` command line of one point: N ranks under the launcher."""
    w = cfg.run.workload
    require_launcher(cfg.launcher)
    args = ("--loader", w.loader, "--storage", cfg.storage, "--dataset", str(w.dataset),
            "--compute-time", repr(cfg.compute_s), "--batch-size", str(cfg.batch),
            "--no-decode", "--epochs", str(cfg.epochs), "--repeat", str(cfg.repeat),
            "--workers", str(cfg.workers), "--au-threshold", str(cfg.au_threshold),
            "--results", str(results), *cfg.train_args)
    return Command("train", args, cfg.launcher, n, cfg.step).argv()


MIN_MEASURED_STEPS = 10  # per epoch and rank: fewer, and a point's AU is weak evidence (said)


def point_from_result(doc: TrainResult | Mapping[str, Any], n: int,
                      threshold: float) -> dict[str, Any]:
    """One search point from a training result: the medians over repetitions (au is
    `au_mlperf`), the AU's range, and whether it passed."""
    from iobench.core.spread import run_spread

    res = TrainResult.of(doc)
    fewest = min((r.steps for e in res.epochs for r in e.ranks), default=0)
    if fewest < 2:  # MLPerf's AU leaves the first step out: of one step it is 1.0 by itself
        raise SearchError(f"the run of {n} accelerator(s) ({res.run_id}) measured {fewest} "
                          "step(s) per epoch on a rank: its AU (first step left out) measures "
                          "nothing; generate the dataset MLPerf requires (`iobench datasize` "
                          "names it) or lower --batch-size")
    sp = run_spread(res.epochs)
    au = sp.get("au_mlperf")
    if au is None:
        raise SearchError(f"the run of {n} accelerator(s) ({res.run_id}) measured no AU")

    def med(key: str) -> float | None:
        s = sp.get(key)
        return s["median"] if s else None

    steps = [r for e in res.epochs for r in e.ranks if r.compute_mean_s]
    asked = res.config.compute_time_s
    measured = (sum(r.compute_s for r in steps) / sum(r.steps for r in steps)
                if steps else None)
    return {"accelerators": n, "au": au["median"], "au_min": au["min"], "au_max": au["max"],
            "compute_mean_s": measured,
            "compute_overshoot": measured / asked if measured and asked else None,
            "au_first_step_included": med("au"), "samples_per_s": med("samples_per_s"),
            "read_MBps": med("read_MBps"), "repeats": au["n"], "steps_min": fewest,
            "passed": au["median"] >= threshold, "run_id": res.run_id}


def run_search(cfg: SearchConfig, *, log: Callable[[str], None] = print,
               run_id: str | None = None) -> dict[str, Any]:
    """Measure points until the answer is known; return the `iobench.search` document.

    An interrupt (SIGINT/SIGTERM turned into `Interrupted` by the caller)
    stops the running point; the document then says `interrupted`, holds the
    points that completed, and the exception is raised again with it
    raised as `SearchInterrupted` carrying it as `document`.
    """
    from iobench.core import dataref
    from iobench.core.results import new_run_id
    from iobench.workflows.train import TrainConfig

    require_launcher(cfg.launcher)  # before anything runs
    w = cfg.run.workload
    tc = TrainConfig(loader=w.loader, storage=cfg.storage, dataset=str(w.dataset),
                     compute_time_s=cfg.compute_s, batch_size=cfg.batch, decode=False)
    dataset = dataref.resolve(tc)  # a missing dataset: one line naming the generate command
    root, manifest = dataset.root, dataset.manifest
    run_id = run_id or new_run_id()
    doc = _new_document(cfg, run_id, root, manifest)
    passed: dict[int, bool] = {}
    child = launch.Child()
    t0 = time.time()
    try:
        while (n := next_point(passed, cfg.limit, cfg.step)) is not None:
            _warn_once(doc, _datasize_warning(cfg, n, manifest.num_samples))
            log(f"search {w.name}/{cfg.accelerator}: {n} accelerator(s) ...")
            point = _measure(cfg, n, Path(cfg.results) / f"search-{run_id}" / f"n{n}", child)
            doc["points"].append(point)
            _warn_once(doc, _overshoot_warning(cfg, point))
            _warn_once(doc, _few_steps_warning(point))
            passed[n] = point["passed"]
            log(f"  {n} accelerator(s): AU {point['au']:.3f} "
                f"({'pass' if point['passed'] else 'below'} {cfg.au_threshold:.2f}), "
                f"{point['samples_per_s']:.1f} samples/s, {point['read_MBps']:.1f} MB/s")
    except Interrupted as e:
        doc["status"], doc["status_reason"] = "interrupted", f"{e} during the search"
        doc["warnings"].insert(0, f"INTERRUPTED: {e}; the answer covers only the "
                               f"{len(doc['points'])} point(s) that completed")
        _finish(doc, passed, t0)
        raise SearchInterrupted(e.signum, doc) from None
    _finish(doc, passed, t0)
    return doc


def _new_document(cfg: SearchConfig, run_id: str, root: Path, manifest: Any) -> dict[str, Any]:
    """The search document before its first point: what is asked, of which dataset."""
    run, w = cfg.run, cfg.run.workload
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "search", "run_id": run_id,
        "created": "", "status": "complete", "status_reason": None,
        "config": {**asdict(cfg), "launcher": list(cfg.launcher),
                   "train_args": list(cfg.train_args)},
        "workload": {"name": w.name, "accelerator": cfg.accelerator, "batch": cfg.batch,
                     "compute_time_s": cfg.compute_s, "workload_batch": run.batch,
                     "workload_compute_time_s": run.compute_s,
                     "sample_bytes": w.sample_bytes, "demand_MBps": cfg.demand_Bps / 1e6,
                     "workload_demand_MBps": run.demand_Bps / 1e6, "slowdown": cfg.slowdown,
                     "demand_source": cfg.demand_source or "the workload's compute time",
                     "note": w.note},
        "dataset": {"root": str(root), "dataset": manifest.dataset, "format": manifest.format,
                    "num_samples": manifest.num_samples, "total_bytes": manifest.total_bytes,
                    "sample_bytes_mean": manifest.data_bytes / max(1, manifest.num_samples)},
        "threshold": cfg.au_threshold, "max_accelerators": 0, "points": [],
        "warnings": _setting_warnings(cfg),
    }


def _setting_warnings(cfg: SearchConfig) -> list[str]:
    """What the settings change from the workload's own figures."""
    run, out = cfg.run, []
    if cfg.demand_samples_per_s is not None:
        out.append(f"MEASURED DEMAND: {cfg.demand_source}; each accelerator computes "
                   f"{cfg.compute_s:.4g} s a step of {cfg.batch} in place of the workload's "
                   f"{run.compute_s * cfg.batch / run.batch:.4g} s")
    if cfg.slowdown != 1:
        out.append(
            f"SLOWED DOWN: compute {cfg.slowdown:g}x the workload's, so each accelerator "
            f"asks for {cfg.demand_Bps / 1e6:.1f} MB/s instead of {run.demand_Bps / 1e6:.1f}: "
            f"the count answers for a tier {cfg.slowdown:g}x faster than this one")
    if cfg.batch != run.batch:
        out.append(
            f"scaled: batch {cfg.batch} and {cfg.compute_s:.6g} s per step instead of "
            f"{run.batch} and {run.compute_s} s: scaling the batch alone keeps each "
            f"accelerator's demand ({run.demand_Bps / 1e6:.1f} MB/s, the workload's)")
    if cfg.step > 1:
        out.append(
            f"spread over --hosts {cfg.hosts}: only counts that divide evenly are run "
            f"({cfg.step}, {2 * cfg.step}, ...; {{per_host}} in --launcher is N / "
            f"{cfg.hosts}), the others are skipped"
            + (f"; --max-accelerators {cfg.max_accelerators} runs as {cfg.limit}"
               if cfg.limit != cfg.max_accelerators else ""))
    return out


def _measure(cfg: SearchConfig, n: int, where: Path, child: launch.Child) -> dict[str, Any]:
    """Run the point of N accelerators into `where`; its outcome is the exit status and the
    one result document it wrote."""
    from iobench.core.results import load_result

    log = where / "train.log"
    end = launch.run(train_command(cfg, n, where), log, cfg.point_timeout_s, child=child,
                     grace_s=15.0)  # an interrupt: let the ranks write what they have
    found = sorted(where.glob("*.json"))
    if not end.ok or len(found) != 1:
        why = end.why() if not end.ok else f"exit 0 and {len(found)} result files, not 1"
        raise SearchError(f"the run of {n} accelerator(s) failed ({why}) (log: {log})")
    point = point_from_result(load_result(found[0]), n, cfg.au_threshold)
    point["result"] = str(found[0])
    return point


def _warn_once(doc: dict[str, Any], warning: str | None) -> None:
    if warning is not None and warning not in doc["warnings"]:
        doc["warnings"].append(warning)


def _datasize_warning(cfg: SearchConfig, n: int, samples: int) -> str | None:
    need = cfg.run.required_samples(n, cfg.hosts, cfg.host_memory_gb)
    if samples >= need:
        return None
    return (f"{n} accelerator(s): the dataset holds {samples} samples and MLPerf's rule asks "
            f"for {need} (`iobench datasize`); small datasets are cached more easily by the "
            "storage")


def _few_steps_warning(point: dict[str, Any]) -> str | None:
    if point["steps_min"] >= MIN_MEASURED_STEPS:
        return None
    return (f"{point['accelerators']} accelerator(s): {point['steps_min']} step(s) per epoch on "
            f"a rank, fewer than {MIN_MEASURED_STEPS}: the AU leaves the first out, so it rests "
            "on very few steps; a larger dataset (`iobench datasize`) measures it better")


def _overshoot_warning(cfg: SearchConfig, point: dict[str, Any]) -> str | None:
    over = point["compute_overshoot"]
    if over is None or over <= 1.05:
        return None
    return (f"{point['accelerators']} accelerator(s): an emulated step took {over - 1:.0%} "
            f"longer than asked ({point['compute_mean_s']:.4g} s for {cfg.compute_s:.4g} s: a "
            "busy host's sleeps overshoot), so each accelerator asked for less than "
            "the workload's demand and AU is overstated")


def _finish(doc: dict[str, Any], passed: dict[int, bool], t0: float) -> None:
    doc["points"].sort(key=lambda p: p["accelerators"])
    doc["max_accelerators"] = answer(passed)
    doc["elapsed_s"] = time.time() - t0
    doc["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


_POINT = Map({"accelerators": Count, "au": Num, "samples_per_s": Opt(NonNeg),
              "read_MBps": Opt(NonNeg), "passed": Bool})
SEARCH_SPEC = Map({
    "schema": Enum(SCHEMA), "schema_version": Enum(SCHEMA_VERSION), "kind": Enum("search"),
    "run_id": Str, "created": Str, "status": Enum("complete", "interrupted"),
    "config": Map({"workload": Str, "accelerator": Str, "storage": Str}),
    "workload": Map({"name": Str, "demand_MBps": NonNeg}),
    "threshold": NonNeg, "max_accelerators": Count, "points": List(_POINT),
    "warnings": List(Str),
})


def validate(doc: Any, where: str = "search result") -> dict[str, Any]:
    """Check an `iobench.search` document; a ResultError names the first bad field."""
    from iobench.core.results import ResultError

    try:
        checked: dict[str, Any] = check(doc, SEARCH_SPEC, where)
        return checked
    except SchemaError as e:
        raise ResultError(str(e)) from None


def write_search(doc: dict[str, Any], results_dir: str | Path) -> Path:
    """Validate and write `doc` as `results_dir/search-<run_id>.json` (atomic, never over)."""
    validate(doc)
    return write_json_atomic(Path(results_dir) / f"search-{doc['run_id']}.json", doc,
                             exclusive=True)


def answer_line(doc: SearchDoc | Mapping[str, Any]) -> str:
    """The answer in one line."""
    search = SearchDoc.of(doc)
    w = search.workload
    n = search.max_accelerators
    best = next((p for p in search.points if p.accelerators == n), None)
    tail = (f" (AU {best.au:.2f} at {n}; " if best else " (")
    above = [p for p in search.points if not p.passed and p.accelerators > n]
    tail += (f"{above[0].accelerators} gave AU {above[0].au:.2f})" if above
             else "no count above it failed)" if best else "1 accelerator already fails)")
    state = "" if search.status == "complete" else f" [{search.status.upper()}: partial]"
    return (f"{w.name} on {w.accelerator}: {search.dataset.root} keeps {n} "
            f"accelerator(s) at AU >= {search.threshold:.2f}{tail}, {len(search.points)} "
            f"runs{state}")


def physics_estimate(bandwidth_MBps: float, threshold: float, demand_MBps: float) -> int:
    """floor(B / (AU_min x demand)): the accelerators a bandwidth B can feed."""
    return math.floor(bandwidth_MBps / (threshold * demand_MBps) + 1e-9)
