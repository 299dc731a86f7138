"""`iobench diagnose`: storage, loader or neither, from short bounded runs (DS-Analyzer's method)."""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from iobench.core import launch
from iobench.core.errors import ConfigError, DatasetError, IobenchError
from iobench.core.launch import Command
from iobench.core.result_types import TrainResult

SCHEMA = "iobench.diagnose"
SCHEMA_VERSION = 1

STORAGE, LOADER, NONE = "storage", "loader", "none"  # the cause named
MEMORY_RUN, STORAGE_RUN, USER_RUN = "memory", "storage", "run"  # the runs made
RUN_WORDS = {MEMORY_RUN: "(a) in memory, decoding as the run would",
             STORAGE_RUN: "(b) storage, cold, no decode", USER_RUN: "(c) your run"}
KEEPS_UP_AU = 0.90  # MLPerf Storage's threshold, for the note on the user's run
PREWARM_MAX_BYTES = 4 * 10**9  # read a dataset into the page cache only up to this size


class DiagnoseError(IobenchError, RuntimeError):
    """A measurement run failed or left no usable result; `run` names which one."""

    def __init__(self, message: str, run: str = "") -> None:
        super().__init__(message)
        self.run = run


@dataclass(frozen=True)
class Demand:
    """What the accelerator consumes, in samples per second per rank, and where it came from."""

    samples_per_s: float
    source: str  # "compute-time" | "workload" | "measured"
    detail: str

    def __post_init__(self) -> None:
        if not self.samples_per_s > 0:
            raise ConfigError(f"demand samples_per_s={self.samples_per_s} should be > 0")


def demand_of(batch: int, compute_s: float | None = None, measured: float | None = None,
              workload: str | None = None) -> Demand:
    """The demand from a compute time per step (batch / seconds) or a measured rate."""
    if (compute_s is None) == (measured is None):
        raise ConfigError("give the accelerator's demand once: --compute-time SECONDS, "
                          "--workload W --accelerator A, or --demand SAMPLES_PER_S")
    if compute_s is None:
        if not (measured is not None and measured > 0):
            raise ConfigError(f"--demand {measured} should be > 0 samples/s")
        return Demand(measured, "measured", f"{measured:g} samples/s, measured")
    if not compute_s > 0:
        raise ConfigError(f"--compute-time {compute_s} should be > 0 seconds per step")
    source = "workload" if workload else "compute-time"
    what = f"{workload}: " if workload else ""
    return Demand(batch / compute_s, source,
                  f"{what}batch {batch} / {compute_s:g} s per step")


def parse_worker_counts(text: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4): distinct counts >= 0, sorted."""
    try:
        counts = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ConfigError(f"--worker-counts {text!r} should be comma-separated integers, "
                          "e.g. 1,2,4") from None
    if not counts or counts[0] < 0:
        raise ConfigError(f"--worker-counts {text!r} should name one or more counts >= 0")
    return tuple(counts)


def default_worker_counts() -> tuple[int, ...]:
    """1, 2, 4 ... up to the cores this process may use (at least 1, 2)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    top = max(2, min(8, cores or 1))
    return tuple(n for n in (1, 2, 4, 8) if n <= top)


@dataclass(frozen=True)
class DiagnoseConfig:
    """What to diagnose (the dataset, as `iobench train` names it) and how long to look."""

    loader: str
    storage: str
    dataset: str
    batch_size: int
    demand: Demand
    format: str | None = None
    data: str | None = None
    data_key: str | None = None
    label_key: str | None = None
    worker_counts: tuple[int, ...] = (1, 2)
    user_workers: int | None = None  # the user's own run, (c); None skips it
    decode: bool = True
    steps: int = 30  # steps per measurement run (the first is left out of the rate)
    shuffle: str = "global"
    seed: int = 0
    worker_type: str = "process"
    evict_cmd: str | None = None
    results: str = "iobench-results"
    run_timeout_s: float = 300.0
    prewarm_max_bytes: int = PREWARM_MAX_BYTES

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size} should be >= 1")
        if self.steps < 3:
            raise ConfigError(f"--steps {self.steps} should be >= 3 (the first step is left "
                              "out of every rate)")
        if not self.worker_counts or min(self.worker_counts) < 0:
            raise ConfigError(f"worker_counts={self.worker_counts} should be counts >= 0")
        if self.user_workers is not None and self.user_workers < 0:
            raise ConfigError(f"--workers {self.user_workers} should be >= 0")
        if not self.run_timeout_s > 0:
            raise ConfigError(f"--run-timeout {self.run_timeout_s} should be > 0 seconds")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["worker_counts"] = list(self.worker_counts)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DiagnoseConfig:
        return cls(**{**d, "demand": Demand(**d["demand"]),
                      "worker_counts": tuple(d["worker_counts"])})


@dataclass(frozen=True)
class Measurement:
    """One bounded run: its steady rate (first step left out), samples/s per rank."""

    kind: str  # MEMORY_RUN | STORAGE_RUN | USER_RUN
    workers: int
    samples_per_s: float
    steps: int
    au: float | None  # the user's run only: MLPerf's AU (first batch left out)
    resident_fraction: float | None  # of the dataset in the page cache at the measured epoch
    run_id: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Diagnosis:
    """The answer: the cause, what to do, and the figures behind it, in one line."""

    cause: str  # STORAGE | LOADER | NONE
    action: str  # "stage" | "workers" | "gpu-decode" | "none"
    workers: int | None  # the smallest worker count that meets the demand, if any
    storage_ceiling: float  # samples/s, best over the worker counts tried
    memory_ceiling: float  # samples/s, best over the worker counts tried
    demand: float  # samples/s
    line: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DiagnoseResult:
    """The whole diagnosis: its config, every run's figure, and the answer."""

    config: DiagnoseConfig
    memory: tuple[Measurement, ...]
    storage: tuple[Measurement, ...]
    run: Measurement | None
    diagnosis: Diagnosis
    created: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created": self.created,
                "config": self.config.to_dict(),
                "memory": [m.to_dict() for m in self.memory],
                "storage": [m.to_dict() for m in self.storage],
                "run": None if self.run is None else self.run.to_dict(),
                "diagnosis": self.diagnosis.to_dict(), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DiagnoseResult:
        """The result of a document `to_dict` wrote (unknown keys raise TypeError)."""
        return cls(DiagnoseConfig.from_dict(d["config"]),
                   tuple(Measurement(**m) for m in d["memory"]),
                   tuple(Measurement(**m) for m in d["storage"]),
                   None if d["run"] is None else Measurement(**d["run"]),
                   Diagnosis(**d["diagnosis"]), d["created"], tuple(d["notes"]))


def load_diagnosis(path: str | Path) -> DiagnoseResult:
    """Read a diagnosis document written by `write_diagnosis`, checking schema and version."""
    from iobench.core.jsonio import read_json

    doc = read_json(path, schema=SCHEMA, max_version=SCHEMA_VERSION)
    try:
        return DiagnoseResult.from_dict(doc)
    except (KeyError, TypeError) as e:
        raise DatasetError(f"{path} is not a whole iobench.diagnose document ({e}); it was "
                           "damaged or written by another program") from None


# ---- the answer ------------------------------------------------------------------------------

def _smallest_meeting(runs: Sequence[Measurement], demand: float) -> int | None:
    meeting = [m.workers for m in runs if m.samples_per_s >= demand]
    return min(meeting) if meeting else None


def classify(demand: float, memory: Sequence[Measurement],
             storage: Sequence[Measurement]) -> Diagnosis:
    """Storage, loader or neither, from the ceilings alone (never from the user's run).

    The lower of the two best ceilings, when under the demand, is the cause; else the
    pipeline keeps up with N workers, N the smallest count at which both ceilings meet it
    (the answer is `workers` when N is above the fewest tried, `none` otherwise).
    """
    mem = max(m.samples_per_s for m in memory)
    sto = max(m.samples_per_s for m in storage)
    figures = (f"demand {demand:.4g} samples/s; storage ceiling (cold, no decode) {sto:.4g}; "
               f"in-memory ceiling (loader + decode) {mem:.4g}")
    if sto < demand and sto <= mem:
        also = "" if mem >= demand else "; then the loader too (in-memory ceiling under demand)"
        return Diagnosis(STORAGE, "stage", None, sto, mem, demand,
                         f"starved by storage: it delivers at most {sto:.4g} samples/s at any "
                         f"worker count tried, under the demand of {demand:.4g}: stage the "
                         f"data to a faster tier{also} ({figures})")
    if mem < demand:
        top = max(m.workers for m in memory)
        return Diagnosis(LOADER, "gpu-decode", None, sto, mem, demand,
                         f"starved by the loader/CPU: from memory it reaches at most {mem:.4g} "
                         f"samples/s (with up to {top} worker(s)), under the demand of {demand:.4g}: "
                         "more workers if cores are free, or decode on the accelerator "
                         f"(--loader dali); staging will not help ({figures})")
    n_mem = _smallest_meeting(memory, demand)
    n_sto = _smallest_meeting(storage, demand)
    need = max(n_mem or 0, n_sto or 0)
    fewest = min(m.workers for m in memory)
    if need > fewest:
        return Diagnosis(LOADER, "workers", need, sto, mem, demand,
                         f"loader-bound below {need} workers: use --workers {need} (the "
                         f"fewest tried at which storage and loader both meet the demand); "
                         f"no staging needed ({figures})")
    return Diagnosis(NONE, "none", need, sto, mem, demand,
                     f"keeps up: storage and loader both meet the demand with {need} "
                     f"worker(s) ({figures})")


# ---- the runs --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSpec:
    """One planned `iobench train` run: which measurement, at how many workers."""

    kind: str  # MEMORY_RUN | STORAGE_RUN | USER_RUN
    workers: int


def plan_runs(config: DiagnoseConfig) -> list[RunSpec]:
    """(a) in memory and (b) cold without decoding at each worker count, then (c) the
    user's own run when its worker count was given."""
    plan = [RunSpec(MEMORY_RUN, n) for n in config.worker_counts]
    plan += [RunSpec(STORAGE_RUN, n) for n in config.worker_counts]
    if config.user_workers is not None:
        plan.append(RunSpec(USER_RUN, config.user_workers))
    return plan


def train_args(config: DiagnoseConfig, spec: RunSpec, results: Path) -> list[str]:
    """The `iobench train` options of one planned run (after `iobench train`)."""
    c = config
    args = ["--loader", c.loader, "--batch-size", str(c.batch_size), "--workers",
            str(spec.workers), "--worker-type", c.worker_type, "--shuffle", c.shuffle,
            "--seed", str(c.seed), "--max-steps", str(c.steps), "--repeat", "1",
            "--results", str(results), "--timeout", str(min(c.run_timeout_s, 300.0))]
    if c.data is not None:
        args += ["--data", c.data]
        args += ["--data-key", c.data_key] if c.data_key else []
        args += ["--label-key", c.label_key] if c.label_key else []
    else:
        args += ["--storage", c.storage, "--dataset", c.dataset]
    args += ["--format", c.format] if c.format else []
    args += ["--evict-cmd", c.evict_cmd] if c.evict_cmd and spec.kind != MEMORY_RUN else []
    if spec.kind == MEMORY_RUN:  # epoch 1 fills the cache, epoch 2 is measured
        args += ["--model", "none", "--epochs", "2", "--warm-cache"]
        args += [] if c.decode else ["--no-decode"]
    elif spec.kind == STORAGE_RUN:
        args += ["--model", "none", "--epochs", "1", "--no-decode"]
    else:  # the user's run: an accelerator that takes batch / demand seconds per step
        step_s = c.batch_size / c.demand.samples_per_s
        args += ["--compute-time", repr(step_s), "--epochs", "1"]
        args += [] if c.decode else ["--no-decode"]
    return args


def iobench_argv(args: Sequence[str]) -> list[str]:
    """`python -P -m iobench ARGS` (the shared launcher's): this installation's iobench,
    whatever the working directory holds."""
    return Command("train" if not args else args[0], tuple(args[1:])).argv()


def measure(config: DiagnoseConfig, spec: RunSpec, work: Path) -> Measurement:
    """Run one planned measurement as a child `iobench train`; its figures from the
    result document it wrote (the exit status says whether it did)."""
    from iobench.core.results import load_typed

    label = f"{spec.kind}-w{spec.workers}"
    results = work / label
    argv = iobench_argv(["train", *train_args(config, spec, results)])
    done = launch.run(argv, work / f"{label}.log", config.run_timeout_s)
    what = f"the {spec.kind} run with {spec.workers} worker(s)"
    if not done.ok:
        why = (f"ran past --run-timeout {config.run_timeout_s:g} s" if done.timed_out
               else f"exited with status {done.code}")
        raise DiagnoseError(f"{what} {why}: {launch.last_line(done.log)} "
                            f"(command: {shlex.join(argv)})", run=label)
    docs = [load_typed(p) for p in sorted(results.glob("*.json"))] if results.is_dir() else []
    if len(docs) != 1 or not docs[0].complete:
        raise DiagnoseError(f"{what} exited 0 but left no complete result in {results}",
                            run=label)
    return _figures(spec, docs[0], what)


def _figures(spec: RunSpec, doc: TrainResult, what: str) -> Measurement:
    """The measured epoch's steady rate over its wall time after the first batch arrived
    (worker start-up and first opens left out, as MLPerf's AU): the batches delivered in
    it for an ingest run (all but the first), the batches computed in it for the user's
    run (all: the first one's compute falls inside)."""
    epoch = doc.epochs[-1]
    s = epoch.summary
    first = s.first_batch_s_max or 0.0
    steps = s.steps
    if steps < 2 or s.wall_s - first <= 0:
        raise DiagnoseError(f"{what} made {steps} step(s): too few for a rate; use a smaller "
                            "--batch-size or a dataset with more samples", run=spec.kind)
    delivered = s.samples if spec.kind == USER_RUN else s.samples * (steps - 1) / steps
    rate = delivered / (s.wall_s - first)
    au = s.au_mlperf_mean if spec.kind == USER_RUN else None
    return Measurement(spec.kind, spec.workers, rate, steps, au,
                       epoch.cache.resident_fraction, doc.run_id)


# ---- the workflow ----------------------------------------------------------------------------

def prewarm(config: DiagnoseConfig) -> str | None:
    """Read the dataset's files once (as its manifest lists them), so that the in-memory
    runs measure the loader, not the tier; a note when it is too large for that (their
    measured residency then shows it)."""
    from iobench.core import dataref

    ref = dataref.resolve(config)
    total = ref.manifest.total_bytes
    if total > config.prewarm_max_bytes:
        return (f"the dataset ({total / 1e9:.3g} GB) was not read into memory first (over "
                f"{config.prewarm_max_bytes / 1e9:.3g} GB): the in-memory runs rely on their "
                "first epoch; see each one's resident_fraction")
    for entry in ref.manifest.files:
        with open(ref.root / entry.path, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass
    return None


def run_diagnose(config: DiagnoseConfig, *,
                 progress: Callable[[str], None] = lambda _: None) -> DiagnoseResult:
    """Plan, run and classify; the runs go to a temporary directory, the answer nowhere
    (`write_diagnosis` saves it)."""
    from iobench.core.results import now_iso

    notes = [n for n in (prewarm(config),) if n]
    done: dict[str, list[Measurement]] = {MEMORY_RUN: [], STORAGE_RUN: [], USER_RUN: []}
    with tempfile.TemporaryDirectory(prefix="iobench-diagnose-") as tmp:
        for spec in plan_runs(config):
            progress(f"{RUN_WORDS[spec.kind]}, {spec.workers} worker(s) ...")
            m = measure(config, spec, Path(tmp))
            done[spec.kind].append(m)
            progress(f"  {m.samples_per_s:.4g} samples/s")
    memory, storage = tuple(done[MEMORY_RUN]), tuple(done[STORAGE_RUN])
    warm = [m for m in memory if m.resident_fraction is not None and m.resident_fraction < 0.9]
    if warm:
        notes.append("in-memory run(s) started with only " + ", ".join(
            f"{m.resident_fraction:.0%} (w{m.workers})" for m in warm) + " of the dataset "
            "cached: their ceiling may include storage time")
    diagnosis = classify(config.demand.samples_per_s, memory, storage)
    run = done[USER_RUN][0] if done[USER_RUN] else None
    if run is not None:
        notes.append(user_run_note(run, diagnosis))
    return DiagnoseResult(config, memory, storage, run, diagnosis, now_iso(), tuple(notes))


def user_run_note(run: Measurement, diagnosis: Diagnosis) -> str:
    """What the user's own run showed, set against the diagnosis (which it does not change)."""
    au = "" if run.au is None else f", AU {run.au:.3f}"
    seen = (f"your run with {run.workers} worker(s): {run.samples_per_s:.4g} samples/s"
            f"{au} against a demand of {diagnosis.demand:.4g}")
    if diagnosis.workers is not None and run.workers < diagnosis.workers:
        return f"{seen}; below the {diagnosis.workers} workers the pipeline needs"
    if diagnosis.cause == NONE and run.au is not None and run.au < KEEPS_UP_AU:
        return (f"{seen}: it stalls though both ceilings meet the demand, so what is lost is "
                "in the overlap of loading with compute (prefetch, hand-off) or noise on a "
                "busy node; repeat with more --steps")
    return seen


def write_diagnosis(result: DiagnoseResult, results_dir: str | Path) -> Path:
    """Save the diagnosis atomically as a new `diagnose-<time>-<host>.json` in `results_dir`."""
    from iobench.core.results import write_document

    return write_document(result.to_dict(), results_dir, "diagnose")
