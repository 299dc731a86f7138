"""Run a matrix of training runs from a YAML file, skipping runs already done, then report.

Matrix: datasets x formats x loaders x storage tiers (optionally also staged
to a faster tier) x workers x batch sizes x shuffles. Missing datasets are
generated (`iobench generate`), tiers are probed once (`iobench probe`),
staged copies made once (`iobench stage`), and every training run is its own
`iobench train` subprocess (under `mpiexec` when `ranks` > 1), so one failed
run is recorded and the sweep goes on. A run is skipped when a result with the
same configuration is already in the results directory. At the end the sweep
writes an `iobench.sweep` record (what ran, what failed and why) and the report.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from iobench.core import launch
from iobench.core.breakeven import real
from iobench.core.datasets import DATASETS, dataset_dirname
from iobench.core.errors import ConfigError
from iobench.core.formats import DEFAULT_FORMAT, FORMATS, loader_formats
from iobench.core.launch import Command, require_launcher
from iobench.core.results import SWEEP_SCHEMA, SWEEP_SCHEMA_VERSION
from iobench.core.sampling import SHUFFLES
from iobench.core.schema import (
    ANY,
    Bool,
    Count,
    List,
    Map,
    NonNeg,
    Opt,
    SchemaError,
    SchemaTypeError,
    Spec,
    Str,
    check,
)

SCHEMA, SCHEMA_VERSION = SWEEP_SCHEMA, SWEEP_SCHEMA_VERSION  # iobench.core.results says each version
LOADERS = ("native", *FORMATS, "dali")
TOP_KEYS = {"name", "results", "report", "datasets", "formats", "loaders", "tiers", "workers",
            "batch_size", "shuffle", "epochs", "max_steps", "model", "compute_time", "decode",
            "ranks", "launcher", "probe", "run_timeout", "train_args"}
DATASET_KEYS = {"name", "samples", "samples_per_file", "generate_args"}
TIER_KEYS = {"name", "path", "generate", "stage_to", "stage_name", "stage_args", "write_via",
             "emulate_pfs"}
PFS_KEYS = {"backing", "profile", "open_latency_ms", "read_latency_ms", "bandwidth_MBps", "iops",
            "direct_io", "kernel_cache", "client_cache"}
PROBE_KEYS = {"size", "runtime", "readers", "metadata_files", "engine"}


def _where(src: str, key: str) -> str:
    return f"{src}: {key}"


def _list(doc: dict[str, Any], key: str, src: str, kind: type, default: list[Any]) -> list[Any]:
    v = doc.get(key, default)
    if not isinstance(v, list):
        v = [v]
    if not v or not all(isinstance(x, kind) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{_where(src, key)} must be a non-empty list of {kind.__name__}, "
                          f"got {v!r}")
    return v


def _unknown(doc: Any, allowed: set[str], src: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ConfigError(f"{src} must be a mapping of keys to values, got {type(doc).__name__}")
    bad = sorted(set(doc) - allowed)
    if bad:
        raise ConfigError(f"{src}: unknown key(s) {', '.join(map(repr, bad))}; allowed: "
                          f"{', '.join(sorted(allowed))}")
    return doc


@dataclass(frozen=True)
class DatasetCfg:
    name: str
    samples: int | None = None  # None: the dataset's default
    samples_per_file: int | None = None
    generate_args: tuple[str, ...] = ()  # more `iobench generate` options, verbatim


@dataclass(frozen=True)
class TierCfg:
    name: str
    path: str
    generate: bool = True  # generate missing datasets here (false: they must exist)
    stage_to: str | None = None  # also stage this tier's datasets there and train from the copy
    stage_name: str | None = None  # the staged tier's name (default: "<name>-staged")
    stage_args: tuple[str, ...] = ()  # more `iobench stage` options, verbatim
    write_via: str | None = None  # where `path` is writable (a read-only mount's backing dir)
    # mount an emulated parallel filesystem (iobench emulate-pfs) at `path` for the sweep:
    # {backing: DIR, profile: NAME, ...overrides}; its backing is then the write_via
    emulate_pfs: dict[str, Any] | None = None

    @property
    def staged_name(self) -> str:
        return self.stage_name or f"{self.name}-staged"

    @property
    def writable(self) -> str:
        """Where datasets are generated and probe files written for this tier."""
        if self.emulate_pfs:
            return str(self.emulate_pfs["backing"])
        return self.write_via or self.path


@dataclass(frozen=True)
class SweepConfig:
    """A parsed, validated sweep file. Paths are as written (relative to the current directory)."""

    name: str
    results: str
    report: str | None
    datasets: tuple[DatasetCfg, ...]
    formats: tuple[str, ...]
    loaders: tuple[str, ...]
    tiers: tuple[TierCfg, ...]
    workers: tuple[int, ...]
    batch_size: tuple[int, ...]
    shuffle: tuple[str, ...]
    epochs: int = 2
    max_steps: int | None = None
    model: str = "none"
    compute_time: float | None = None
    decode: bool = True
    ranks: int = 1
    # the command that starts a multi-rank run, as a list of arguments (never a shell):
    # whatever program it names runs, so a sweep file is code (docs/storage.md)
    launcher: tuple[str, ...] = ("mpiexec", "-n", "{ranks}")
    probe: dict[str, Any] | None = None
    run_timeout: float = 3600.0
    train_args: tuple[str, ...] = ()


def _one_or_list(spec: Any) -> Any:
    """A value that may be given alone or as a list of them (`workers: 2` or `[0, 2]`)."""
    return _Either(spec, List(spec))


class _Either(Spec):
    def __init__(self, a: Spec, b: Spec) -> None:
        super().__init__(f"{a.name} or {b.name}")
        self.a, self.b = a, b

    def check(self, v: Any, at: str) -> None:
        try:
            self.a.check(v, at)
        except SchemaError:
            try:
                self.b.check(v, at)
            except SchemaTypeError as e:
                if e.at == at:  # neither fits at this level
                    raise SchemaError(f"{at}: expected {self.name}, got {v!r}") from None
                raise


_ARGS = List(Str)
_NUMBER = _Either(Count, NonNeg)
SWEEP_SPEC = Map({
    "name": Str, "results": Str, "report": Opt(Str),
    "datasets": List(_Either(Str, Map({"name": Str, "samples": Count, "samples_per_file": Count,
                                       "generate_args": _ARGS},
                                      optional=("samples", "samples_per_file", "generate_args"),
                                      extra=False)), min_len=1),
    "formats": _one_or_list(Str), "loaders": _one_or_list(Str),
    "tiers": List(Map({"name": Str, "path": Str, "generate": Bool, "stage_to": Opt(Str),
                       "stage_name": Opt(Str), "stage_args": _ARGS, "write_via": Opt(Str),
                       "emulate_pfs": Opt(Map({"backing": Str, "profile": Str}, extra=True,
                                              optional=("profile",)))},
                      optional=("generate", "stage_to", "stage_name", "stage_args",
                                "write_via", "emulate_pfs"), extra=False), min_len=1),
    "workers": _one_or_list(Count), "batch_size": _one_or_list(Count),
    "shuffle": _one_or_list(Str), "epochs": Count, "max_steps": Opt(Count), "model": Str,
    "compute_time": Opt(_NUMBER), "decode": Bool, "ranks": Count,
    "launcher": _Either(Str, List(Str, min_len=1)), "probe": ANY,
    "run_timeout": _NUMBER, "train_args": _ARGS,
}, optional=tuple(TOP_KEYS - {"datasets", "tiers"}), extra=False)


def parse_sweep(doc: Any, src: str = "sweep") -> SweepConfig:
    """Validate a loaded YAML document; every problem is a ConfigError naming the key
    (`datasets[0].name: expected a string, got []`)."""
    try:
        check(doc, SWEEP_SPEC, src)
    except SchemaError as e:
        raise ConfigError(str(e)) from None
    doc = _unknown(doc, TOP_KEYS, src)
    for k in ("datasets", "tiers"):
        if k not in doc:
            raise ConfigError(f"{src}: the key {k!r} is required")
    datasets = _parse_datasets(doc, src)
    tiers = _parse_tiers(doc, src)
    axes = _parse_axes(doc, src)
    return SweepConfig(
        name=str(doc.get("name", Path(src).stem)), results=str(doc.get("results",
                                                                        "iobench-results")),
        report=doc.get("report", "report.html"), datasets=datasets, tiers=tiers, **axes,
        **_parse_scalars(doc, src))


def _parse_datasets(doc: dict[str, Any], src: str) -> tuple[DatasetCfg, ...]:
    datasets = []
    for i, d in enumerate(doc["datasets"] if isinstance(doc["datasets"], list) else [None]):
        if isinstance(d, str):
            d = {"name": d}
        d = _unknown(d, DATASET_KEYS, f"{src}: datasets[{i}]")
        if d.get("name") not in DATASETS:
            raise ConfigError(f"{src}: datasets[{i}].name={d.get('name')!r}; choose one of: "
                              f"{', '.join(DATASETS)}")
        for k in ("samples", "samples_per_file"):
            if k in d and (not isinstance(d[k], int) or isinstance(d[k], bool) or d[k] < 1):
                raise ConfigError(f"{src}: datasets[{i}].{k}={d[k]!r} must be an integer >= 1")
        datasets.append(DatasetCfg(d["name"], d.get("samples"), d.get("samples_per_file"),
                                   tuple(map(str, d.get("generate_args", [])))))
    return tuple(datasets)


def _parse_tiers(doc: dict[str, Any], src: str) -> tuple[TierCfg, ...]:
    if not isinstance(doc["tiers"], list) or not doc["tiers"]:
        raise ConfigError(f"{src}: tiers must be a non-empty list of {{name, path}} mappings")
    tiers = [_parse_tier(t, f"{src}: tiers[{i}]") for i, t in enumerate(doc["tiers"])]
    names = [t.name for t in tiers] + [t.staged_name for t in tiers if t.stage_to]
    if len(set(names)) != len(names):
        raise ConfigError(f"{src}: tier names must be distinct, got {names}")
    return tuple(tiers)


def _parse_tier(t: Any, at: str) -> TierCfg:
    t = _unknown(t, TIER_KEYS, at)
    for k in ("name", "path"):
        if not isinstance(t.get(k), str) or not t[k]:
            raise ConfigError(f"{at}.{k} is required (a string)")
    if not isinstance(t.get("generate", True), bool):
        raise ConfigError(f"{at}.generate must be true or false")
    pfs = t.get("emulate_pfs")
    if pfs is not None:
        pfs = dict(_unknown(pfs, PFS_KEYS, f"{at}.emulate_pfs"))
        if not isinstance(pfs.get("backing"), str):
            raise ConfigError(f"{at}.emulate_pfs.backing is required: the "
                              "directory the emulated filesystem serves")
        if t.get("write_via"):
            raise ConfigError(f"{at} has emulate_pfs and write_via: the "
                              "emulated tier is written via its backing; drop write_via")
    return TierCfg(t["name"], t["path"], t.get("generate", True), t.get("stage_to"),
                   t.get("stage_name"), tuple(map(str, t.get("stage_args", []))),
                   t.get("write_via"), pfs)


def _parse_axes(doc: dict[str, Any], src: str) -> dict[str, Any]:
    """The matrix's other axes: formats, loaders, shuffles, workers and batch sizes."""
    formats = _list(doc, "formats", src, str, [DEFAULT_FORMAT])
    for f in formats:
        if f not in FORMATS:
            raise ConfigError(f"{src}: formats has {f!r}; choose from: {', '.join(FORMATS)}")
    loaders = _list(doc, "loaders", src, str, ["native"])
    for name in loaders:
        if name not in LOADERS:
            raise ConfigError(f"{src}: loaders has {name!r}; choose from: {', '.join(LOADERS)} "
                              "(native: the format's own loader)")
    shuffle = _list(doc, "shuffle", src, str, ["global"])
    for s in shuffle:
        if s not in SHUFFLES:
            raise ConfigError(f"{src}: shuffle has {s!r}; choose from: {', '.join(SHUFFLES)}")
    workers = _list(doc, "workers", src, int, [2])
    batch = _list(doc, "batch_size", src, int, [64])
    if min(workers) < 0 or min(batch) < 1:
        raise ConfigError(f"{src}: workers must be >= 0 and batch_size >= 1")
    return {"formats": tuple(formats), "loaders": tuple(loaders), "shuffle": tuple(shuffle),
            "workers": tuple(workers), "batch_size": tuple(batch)}


def _parse_probe(doc: dict[str, Any], src: str) -> dict[str, Any] | None:
    probe = doc.get("probe")
    if probe is True:
        probe = {}
    if probe is None or probe is False:
        return None
    return dict(_unknown(probe, PROBE_KEYS, f"{src}: probe"))


def _parse_scalars(doc: dict[str, Any], src: str) -> dict[str, Any]:
    """The single-valued keys: probe, epochs, ranks, steps, compute, timeout, launcher."""
    probe = _parse_probe(doc, src)
    for k, dflt in {"epochs": 2, "ranks": 1}.items():
        v = doc.get(k, dflt)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{src}: {k}={v!r} must be an integer >= 1")
    ms = doc.get("max_steps")
    if ms is not None and (not isinstance(ms, int) or ms < 1):
        raise ConfigError(f"{src}: max_steps={ms!r} must be an integer >= 1 (or absent)")
    ct = doc.get("compute_time")
    if ct is not None and (not isinstance(ct, int | float) or ct < 0):
        raise ConfigError(f"{src}: compute_time={ct!r} must be seconds >= 0 (or absent)")
    rt = doc.get("run_timeout", 3600)
    if not isinstance(rt, int | float) or rt <= 0:
        raise ConfigError(f"{src}: run_timeout={rt!r} must be seconds > 0")
    launcher = doc.get("launcher", ["mpiexec", "-n", "{ranks}"])
    launcher = tuple(shlex.split(launcher) if isinstance(launcher, str) else launcher)
    if not launcher or not any("{ranks}" in a for a in launcher):
        raise ConfigError(f"{src}: launcher must contain {{ranks}}, e.g. [srun, -n, '{{ranks}}']")
    if not isinstance(doc.get("decode", True), bool):
        raise ConfigError(f"{src}: decode must be true or false")
    return {"epochs": doc.get("epochs", 2), "max_steps": ms,
            "model": str(doc.get("model", "none")), "compute_time": ct, "decode": doc.get("decode", True), "ranks": doc.get("ranks", 1),
            "launcher": launcher, "probe": probe, "run_timeout": float(rt),
            "train_args": tuple(map(str, doc.get("train_args", [])))}


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and validate a sweep YAML file (safe loading)."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read sweep file {path}: {e.strerror or e}") from e
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path} is not valid YAML{at}: {getattr(e, 'problem', e)}") from e
    return parse_sweep(doc, str(path))


# ------------------------------------------------------------------------------ the plan

@dataclass(frozen=True)
class RunSpec:
    """One training run of the matrix."""

    dataset: str
    format: str
    loader: str  # concrete loader name
    tier: str
    storage: str
    staged: bool
    workers: int
    batch_size: int
    shuffle: str

    @property
    def label(self) -> str:
        return (f"{self.dataset}-{self.format} {self.loader} @ {self.tier} w{self.workers} "
                f"b{self.batch_size} {self.shuffle}")


def plan_runs(cfg: SweepConfig) -> list[RunSpec]:
    """Every run of the matrix, in a stable order (tier by tier)."""
    tiers: list[tuple[str, str, bool]] = []
    for t in cfg.tiers:
        tiers.append((t.name, t.path, False))
        if t.stage_to:
            tiers.append((t.staged_name, t.stage_to, True))
    runs = []
    for (tier, path, staged), d, fmt, loader, w, b, s in itertools.product(
            tiers, cfg.datasets, cfg.formats, cfg.loaders, cfg.workers, cfg.batch_size,
            cfg.shuffle):
        concrete = fmt if loader == "native" else loader
        if fmt not in loader_formats(concrete):
            continue  # a format's own loader reads only that format; dali those it reads
        runs.append(RunSpec(d.name, fmt, concrete, tier, path, staged, w, b, s))
    return list(dict.fromkeys(runs))


def run_key(cfg: SweepConfig, run: RunSpec) -> tuple[Any, ...]:
    """What identifies a run among the results: its configuration as `iobench train` records it."""
    return (run.dataset, run.format, run.loader, os.path.realpath(run.storage), run.workers,
            run.batch_size, run.shuffle, cfg.epochs, cfg.max_steps, cfg.model if cfg.compute_time
            is None else "none", cfg.compute_time, cfg.decode, cfg.ranks)


def result_key(doc: dict[str, Any]) -> tuple[Any, ...]:
    c = doc["config"]
    model = c["model"] if c.get("compute_time_s") is None else "none"
    return (c["dataset"], doc["dataset"]["format"], c["loader"], os.path.realpath(c["storage"]),
            c["workers"], c["batch_size"], c["shuffle"], c["epochs"], c.get("max_steps"), model,
            c.get("compute_time_s"), c.get("decode", True), doc["world"]["size"])


def done_keys(results_dir: Path) -> set[tuple[Any, ...]]:
    """Configurations of the training results already in `results_dir`."""
    out: set[tuple[Any, ...]] = set()
    if not results_dir.is_dir():
        return out
    for p in results_dir.glob("*.json"):
        try:
            doc = json.loads(p.read_text())
            if doc.get("schema") == "iobench.result":
                out.add(result_key(doc))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # damaged files are the report's to list
    return out


# ---------------------------------------------------------------------------- execution

@dataclass
class Outcome:
    label: str
    status: str  # done | skipped | failed
    seconds: float = 0.0
    error: str | None = None
    log: str | None = None
    step: str = "train"  # generate | probe | stage | train
    config: dict[str, Any] = field(default_factory=dict)


def _iobench_cmd(cfg: SweepConfig, args: list[str], ranks: int = 1) -> list[str]:
    """`iobench ARGS...` as a child, under the sweep's launcher when it has several ranks."""
    return Command(args[0], tuple(args[1:]), cfg.launcher if ranks > 1 else (),
                   ranks).argv()


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:120]


def run_sweep(cfg: SweepConfig, *, dry_run: bool = False, write_report: bool = True,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the sweep; return its record (also written into the results directory)."""
    from iobench.core.results import now_iso, write_document

    results = Path(cfg.results)
    plan = plan_runs(cfg)
    done = done_keys(results)
    todo = [r for r in plan if run_key(cfg, r) not in done]
    log(f"sweep {cfg.name}: {len(plan)} runs in the matrix, {len(plan) - len(todo)} already "
        f"done in {results}, {len(todo)} to run")
    if dry_run:
        for r in plan:
            log(("  skip " if r not in todo else "  run  ") + r.label)
        return {"plan": [asdict(r) for r in plan], "todo": [asdict(r) for r in todo]}
    if cfg.ranks > 1:
        require_launcher(cfg.launcher)
    results.mkdir(parents=True, exist_ok=True)
    sweep = _Sweep(cfg, todo, log)
    started = now_iso()
    try:
        sweep.mount_tiers()
        sweep.make_datasets()
        sweep.probe_tiers()
        sweep.stage_copies()
        sweep.train(plan)
        sweep.break_evens = staging_answers(results, cfg, log)
    finally:
        sweep.unmount()
        record = sweep.record(started)
        log(f"sweep record: {write_document(record, results, 'sweep')}")
    if write_report and cfg.report:
        from iobench.workflows.report import write_report as _write

        out = Path(cfg.report)
        out = out if out.is_absolute() else results / out
        log(f"report: {_write(results, out, f'iobench sweep: {cfg.name}')}")
    return record


class _Sweep:
    """One sweep's steps (each an `iobench` child), what they left, and what blocks a run."""

    def __init__(self, cfg: SweepConfig, todo: list[RunSpec], log: Callable[[str], None]):
        self.cfg, self.todo, self.log = cfg, todo, log
        self.results = Path(cfg.results)
        self.outcomes: list[Outcome] = []
        # (dataset, format, tier) -> why its runs cannot run (a prerequisite failed)
        self.blocked: dict[tuple[str, str, str], str] = {}
        self.unmounted: set[str] = set()  # tiers whose emulated filesystem did not mount
        self.mounts: list[Any] = []
        self.seq = 0
        self.break_evens: list[dict[str, Any]] = []  # staging_answers, once the runs are done

    def step(self, kind: str, label: str, args: list[str], ranks: int = 1) -> Outcome:
        """Run one child; its outcome is its exit status (with the log's last line, shown)."""
        self.seq += 1
        path = self.results / "logs" / f"{self.seq:04d}-{kind}-{_slug(label)}.log"
        argv = _iobench_cmd(self.cfg, args, ranks)
        self.log(f"[{kind}] {label}")
        self.log(f"  $ {shlex.join(argv)}")
        end = launch.run(argv, path, self.cfg.run_timeout)
        err = None if end.ok else end.why() + (" (run_timeout)" if end.timed_out else "")
        out = Outcome(label, "done" if end.ok else "failed", end.seconds, err, str(path), kind)
        if not end.ok:
            self.log(f"  FAILED ({err}); log: {path}")
        self.outcomes.append(out)
        return out

    def mount_tiers(self) -> None:
        """Emulated parallel filesystems, mounted for the sweep only (when a run or its
        probe needs them)."""
        cfg = self.cfg
        probed = _probed(self.results) if cfg.probe is not None else set()
        for t in cfg.tiers:
            unprobed = cfg.probe is not None and (t.name, os.path.realpath(t.path)) not in probed
            if not t.emulate_pfs or not (unprobed or any(r.tier in (t.name, t.staged_name)
                                                         for r in self.todo)):
                continue
            err = _mount_pfs(t, self.mounts, self.log)
            if err:
                self.unmounted.update((t.name, t.staged_name))
                for d in cfg.datasets:
                    for fmt in cfg.formats:
                        self.blocked[(d.name, fmt, t.name)] = err
                        self.blocked[(d.name, fmt, t.staged_name)] = err

    def make_datasets(self) -> None:
        """The datasets on every source tier that some remaining run needs."""
        cfg = self.cfg
        needed = {(r.dataset, r.format, t.name) for r in self.todo for t in cfg.tiers
                  if r.tier in (t.name, t.staged_name)}
        ds_cfg = {d.name: d for d in cfg.datasets}
        for t in cfg.tiers:
            for d in cfg.datasets:
                for fmt in cfg.formats:
                    key = (d.name, fmt, t.name)
                    if key not in needed or key in self.blocked:
                        continue
                    err = _ensure_dataset(cfg, t, ds_cfg[d.name], fmt, self.step)
                    if err:
                        self.blocked[key] = err

    def probe_tiers(self) -> None:
        """A probe per tier (once: a probe of that label and path already there is kept)."""
        if self.cfg.probe is None:
            return
        have = _probed(self.results)
        for name, path in _tier_paths(self.cfg):
            if (name, os.path.realpath(path)) in have or name in self.unmounted:
                continue
            self.step("probe", name, _probe_args(self.cfg, name, path, self.results))

    def stage_copies(self) -> None:
        """Staged copies, once per dataset, format and tier."""
        for t in self.cfg.tiers:
            if t.stage_to:
                for d in self.cfg.datasets:
                    for fmt in self.cfg.formats:
                        self._stage(t, t.stage_to, d.name, fmt)

    def _stage(self, t: TierCfg, to: str, dataset: str, fmt: str) -> None:
        if not any(r.tier == t.staged_name and (r.dataset, r.format) == (dataset, fmt)
                   for r in self.todo):
            return
        source, key = (dataset, fmt, t.name), (dataset, fmt, t.staged_name)
        if source in self.blocked:
            self.blocked[key] = self.blocked[source]
            return
        dest = Path(to) / dataset_dirname(dataset, fmt)
        src = Path(t.path) / dataset_dirname(dataset, fmt)
        if _same_dataset(src, dest) and _staged_before(self.results, dest):
            return  # staged before, and the source has not changed since
        o = self.step("stage", f"{dataset}-{fmt} {t.name} -> {t.staged_name}",
                      ["stage", "--dataset", dataset, "--format", fmt, "--from", t.path,
                       "--to", to, "--results", str(self.results), "--no-progress",
                       *t.stage_args], self.cfg.ranks)
        if o.status == "failed":
            self.blocked[key] = f"staging failed: {o.error}"

    def train(self, plan: list[RunSpec]) -> None:
        """The training runs: each one skipped (done before), blocked, or run."""
        todo = set(self.todo)
        for r in plan:
            if r not in todo:
                self.outcomes.append(Outcome(r.label, "skipped", config=asdict(r)))
                continue
            why = self.blocked.get((r.dataset, r.format, r.tier))
            if why:
                self.outcomes.append(Outcome(r.label, "failed", error=why, config=asdict(r)))
                self.log(f"[train] {r.label}: not run ({why})")
                continue
            o = self.step("train", r.label, _train_args(self.cfg, r, self.results),
                          self.cfg.ranks)
            o.config = asdict(r)

    def unmount(self) -> None:
        for m in self.mounts:
            try:
                m.unmount()
            except Exception as e:  # an unmount failure must not hide the sweep's record
                self.log(f"could not unmount {m.mountpoint}: {e}")

    def record(self, started: str) -> dict[str, Any]:
        """The `iobench.sweep` record: what ran, what failed and why."""
        from iobench.core.results import now_iso

        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "sweep",
            "name": self.cfg.name, "created": now_iso(), "started": started,
            "config": _jsonable(asdict(self.cfg)),
            "runs": [asdict(o) for o in self.outcomes],
            "counts": {s: sum(o.status == s for o in self.outcomes if o.step == "train")
                       for s in ("done", "skipped", "failed")},
            "break_evens": self.break_evens,
        }


def staging_answers(results: Path, cfg: SweepConfig,
                    log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each staging's break-even that the results directory now gives (`iobench report`'s
    staging rows), logged one line each and kept for the record: where the two epoch times
    are within their spread, `not significant` instead of a number (`outcome`)."""
    from iobench.core.breakeven import outcome
    from iobench.core.errors import IobenchError
    from iobench.workflows.report import break_even_words, load_directory, staging_rows

    try:
        rows = staging_rows(load_directory(results))
    except IobenchError as e:
        log(f"[break-even] not computed: {e}")
        return []
    tiers = [(real(path), name) for name, path in _tier_paths(cfg)]
    out = []
    for s in rows:
        src, dest = _tier_of(s["from"], tiers), _tier_of(s["to"], tiers)
        text = (f"{s['dataset']}-{s['format']} {src} -> {dest}"
                + (f" ({s['run']})" if s["run"] else "") + f": {break_even_words(s)}")
        log(f"[break-even] {text}")
        what = outcome(s)
        out.append({"dataset": s["dataset"], "format": s["format"], "from": src, "to": dest,
                    "run": s["run"], "stage_s": s["stage_s"], "epoch_slow_s": s["epoch_slow_s"],
                    "epoch_fast_s": s["epoch_fast_s"], "outcome": what,
                    "break_even_epochs": s["break_even_epochs"] if what == "pays off" else None,
                    "significant": s["significant"], "spread_over": s["spread_over"],
                    "text": text})
    return out


def _tier_of(root: str, tiers: list[tuple[str, str]]) -> str:
    """The name of the sweep's tier holding dataset root `root` (a real path), else the path."""
    named = [(path, name) for path, name in tiers
             if root == path or root.startswith(path.rstrip("/") + "/")]
    return max(named)[1] if named else root


def _tier_paths(cfg: SweepConfig) -> list[tuple[str, str]]:
    """(name, path) of every tier the sweep reads, the staged ones after the others."""
    return [(t.name, t.path) for t in cfg.tiers] + \
           [(t.staged_name, t.stage_to) for t in cfg.tiers if t.stage_to]


def _probe_args(cfg: SweepConfig, name: str, path: str, results: Path) -> list[str]:
    """`iobench probe`'s arguments for one tier (its write-via place made first)."""
    via = next((t.writable for t in cfg.tiers if t.name == name and t.writable != t.path),
               None)
    Path(via or path).mkdir(parents=True, exist_ok=True)
    args = ["probe", "--storage", path, "--label", name, "--results", str(results),
            "--sample-size", _sample_sizes(cfg)]
    if via:
        args += ["--write-via", via]
    for k, v in (cfg.probe or {}).items():
        args += [f"--{k.replace('_', '-')}",
                 ",".join(map(str, v)) if isinstance(v, list) else str(v)]
    return args


def _jsonable(o: Any) -> Any:
    return json.loads(json.dumps(o, default=str))


def _train_args(cfg: SweepConfig, r: RunSpec, results: Path) -> list[str]:
    args = ["train", "--loader", r.loader, "--storage", r.storage, "--dataset", r.dataset,
            "--workers", str(r.workers), "--batch-size", str(r.batch_size), "--shuffle",
            r.shuffle, "--epochs", str(cfg.epochs), "--results", str(results)]
    if r.loader == "dali":
        args += ["--format", r.format]
    if cfg.max_steps is not None:
        args += ["--max-steps", str(cfg.max_steps)]
    if cfg.compute_time is not None:
        args += ["--compute-time", str(cfg.compute_time)]
    else:
        args += ["--model", cfg.model]
    if not cfg.decode:
        args += ["--no-decode"]
    return [*args, *cfg.train_args]


def _ensure_dataset(cfg: SweepConfig, tier: TierCfg, d: DatasetCfg, fmt: str,
                    step: Callable[..., Outcome]) -> str | None:
    """None when the dataset is (now) on the tier; else why not."""
    from iobench.core.errors import IobenchError
    from iobench.core.manifest import Manifest

    root = Path(tier.path) / dataset_dirname(d.name, fmt)
    if (root / "iobench.json").is_file():
        try:
            m = Manifest.load(root)
        except IobenchError as e:
            return f"{root}: {e}"
        if d.samples is not None and m.num_samples != d.samples:
            return (f"{root} holds {m.num_samples} samples, the sweep asks for {d.samples}: "
                    "remove it or change datasets.samples")
        return None
    if not tier.generate:
        return (f"no dataset at {root} and tier {tier.name!r} has generate: false; generate it "
                "there first")
    args = ["generate", "--dataset", d.name, "--format", fmt, "--storage", tier.writable]
    if d.samples is not None:
        args += ["--samples", str(d.samples)]
    if d.samples_per_file is not None:
        args += ["--samples-per-file", str(d.samples_per_file)]
    Path(tier.writable).mkdir(parents=True, exist_ok=True)
    o = step("generate", f"{d.name}-{fmt} on {tier.name}", [*args, *d.generate_args], cfg.ranks)
    if o.status != "done":
        return f"generation failed: {o.error}"
    if not (root / "iobench.json").is_file():
        return f"generated into {tier.writable}, but {root} does not show it"
    return None


def _mount_pfs(tier: TierCfg, mounts: list[Any], log: Callable[[str], None]) -> str | None:
    """Mount the tier's emulated parallel filesystem; None, or why it could not."""
    from iobench.core.errors import IobenchError
    from iobench.pfs import control

    opts = dict(tier.emulate_pfs or {})
    backing = Path(opts.pop("backing"))
    profile = opts.pop("profile", "lustre-light")
    backing.mkdir(parents=True, exist_ok=True)
    log(f"[emulate-pfs] mount {tier.path} over {backing} (profile {profile}; EMULATED)")
    try:
        mounts.append(control.mount(backing, tier.path, profile, **opts))
    except (IobenchError, TypeError) as e:
        log(f"  FAILED: {e}")
        return f"emulated parallel filesystem not mounted: {e}"
    return None


def _sample_sizes(cfg: SweepConfig) -> str:
    """The sweep's datasets' mean stored bytes per sample (from their manifests where they
    exist), for the probe's random reads."""
    from iobench.workflows.probe import sample_size_for

    sizes = []
    for d in cfg.datasets:
        for t in cfg.tiers:
            sizes.append(sample_size_for(d.name, t.path))
            break
    return ",".join(str(s) for s in dict.fromkeys(sizes))


def _probed(results: Path) -> set[tuple[str, str]]:
    out = set()
    for p in results.glob("probe-*.json"):
        try:
            doc = json.loads(p.read_text())
            out.add((doc["label"], doc["storage"]["path"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _same_dataset(src: Path, dest: Path) -> bool:
    """Whether `dest` holds a complete copy of the dataset now at `src` (same files)."""
    from iobench.core.errors import IobenchError
    from iobench.core.manifest import Manifest

    try:
        return Manifest.load(src).files == Manifest.load(dest).files
    except IobenchError:
        return False


def _staged_before(results: Path, dest: Path) -> bool:
    real = os.path.realpath(dest)
    for p in results.glob("stage-*.json"):
        try:
            if os.path.realpath(json.loads(p.read_text())["to"]["root"]) == real:
                return True
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return False
