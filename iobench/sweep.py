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
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from iobench.datasets import DATASETS, dataset_dirname
from iobench.errors import ConfigError
from iobench.formats import DEFAULT_FORMAT, FORMATS, loader_formats
from iobench.results import SWEEP_SCHEMA, SWEEP_SCHEMA_VERSION
from iobench.sampling import SHUFFLES
from iobench.schema import (
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

SCHEMA, SCHEMA_VERSION = SWEEP_SCHEMA, SWEEP_SCHEMA_VERSION  # iobench.results says each version
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


def parse_sweep(doc: Any, src: str = "sweep") -> SweepConfig:  # noqa: C901 - split on branch i27-launcher
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
    tiers = []
    if not isinstance(doc["tiers"], list) or not doc["tiers"]:
        raise ConfigError(f"{src}: tiers must be a non-empty list of {{name, path}} mappings")
    for i, t in enumerate(doc["tiers"]):
        t = _unknown(t, TIER_KEYS, f"{src}: tiers[{i}]")
        for k in ("name", "path"):
            if not isinstance(t.get(k), str) or not t[k]:
                raise ConfigError(f"{src}: tiers[{i}].{k} is required (a string)")
        if not isinstance(t.get("generate", True), bool):
            raise ConfigError(f"{src}: tiers[{i}].generate must be true or false")
        pfs = t.get("emulate_pfs")
        if pfs is not None:
            pfs = dict(_unknown(pfs, PFS_KEYS, f"{src}: tiers[{i}].emulate_pfs"))
            if not isinstance(pfs.get("backing"), str):
                raise ConfigError(f"{src}: tiers[{i}].emulate_pfs.backing is required: the "
                                  "directory the emulated filesystem serves")
            if t.get("write_via"):
                raise ConfigError(f"{src}: tiers[{i}] has emulate_pfs and write_via: the "
                                  "emulated tier is written via its backing; drop write_via")
        tiers.append(TierCfg(t["name"], t["path"], t.get("generate", True), t.get("stage_to"),
                             t.get("stage_name"), tuple(map(str, t.get("stage_args", []))),
                             t.get("write_via"), pfs))
    names = [t.name for t in tiers] + [t.staged_name for t in tiers if t.stage_to]
    if len(set(names)) != len(names):
        raise ConfigError(f"{src}: tier names must be distinct, got {names}")
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
    probe = doc.get("probe")
    if probe is True:
        probe = {}
    if probe is not None and probe is not False:
        probe = dict(_unknown(probe, PROBE_KEYS, f"{src}: probe"))
    else:
        probe = None
    ints = {"epochs": 2, "ranks": 1}
    for k, dflt in ints.items():
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
    return SweepConfig(
        name=str(doc.get("name", Path(src).stem)), results=str(doc.get("results",
                                                                        "iobench-results")),
        report=doc.get("report", "report.html"), datasets=tuple(datasets),
        formats=tuple(formats), loaders=tuple(loaders), tiers=tuple(tiers),
        workers=tuple(workers), batch_size=tuple(batch), shuffle=tuple(shuffle),
        epochs=doc.get("epochs", 2), max_steps=ms, model=str(doc.get("model", "none")),
        compute_time=ct, decode=doc.get("decode", True), ranks=doc.get("ranks", 1),
        launcher=launcher, probe=probe,
        run_timeout=float(rt), train_args=tuple(map(str, doc.get("train_args", []))))


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


def _executable(name: str) -> str | None:
    """`name` resolved on PATH (or beside this Python, where the mpich extra puts mpiexec)."""
    found = shutil.which(name)
    if found is None and os.sep not in name:
        beside = Path(sys.executable).parent / name
        found = str(beside) if beside.exists() and os.access(beside, os.X_OK) else None
    return found


def _iobench_cmd(cfg: SweepConfig, args: list[str], ranks: int = 1) -> list[str]:
    cmd = [sys.executable, "-m", "iobench", *args]
    if ranks <= 1:
        return cmd
    launcher = [a.replace("{ranks}", str(ranks)) for a in cfg.launcher]
    launcher[0] = _executable(launcher[0]) or launcher[0]
    return [*launcher, *cmd]


def _error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("iobench: error:")]
    return (errs[-1] if errs else lines[-1] if lines else "no output")[:500]


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[int, str, float]:
    """Run a command with output to `log`; (exit code, error line, seconds). Kills its whole
    process group on timeout (mpiexec and its ranks, loader workers)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS":
                                     os.environ.get("OMP_NUM_THREADS", "1")})
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return 124, f"timed out after {timeout:.0f} s (run_timeout)", time.perf_counter() - t0
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    seconds = time.perf_counter() - t0
    return code, ("" if code == 0 else _error_line(log.read_text())), seconds


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:120]


def run_sweep(cfg: SweepConfig, *, dry_run: bool = False, write_report: bool = True,  # noqa: C901 - split on branch i27-launcher
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the sweep; return its record (also written into the results directory)."""
    from iobench.results import now_iso, write_document

    results = Path(cfg.results)
    logs = results / "logs"
    plan = plan_runs(cfg)
    done = done_keys(results)
    todo = [r for r in plan if run_key(cfg, r) not in done]
    log(f"sweep {cfg.name}: {len(plan)} runs in the matrix, {len(plan) - len(todo)} already "
        f"done in {results}, {len(todo)} to run")
    if dry_run:
        for r in plan:
            log(("  skip " if r not in todo else "  run  ") + r.label)
        return {"plan": [asdict(r) for r in plan], "todo": [asdict(r) for r in todo]}
    if cfg.ranks > 1 and _executable(cfg.launcher[0]) is None:
        raise ConfigError(f"launcher {cfg.launcher[0]!r} is not an executable on PATH; name "
                          "the launcher program (mpiexec, srun, ...) or install it")
    results.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    started = now_iso()
    failed_prereq: dict[tuple[str, str, str], str] = {}
    seq = [0]

    def step(kind: str, label: str, args: list[str], ranks: int = 1) -> Outcome:
        seq[0] += 1
        path = logs / f"{seq[0]:04d}-{kind}-{_slug(label)}.log"
        log(f"[{kind}] {label}")
        log(f"  $ {shlex.join(_iobench_cmd(cfg, args, ranks))}")
        code, err, secs = _run(_iobench_cmd(cfg, args, ranks), path, cfg.run_timeout)
        out = Outcome(label, "done" if code == 0 else "failed", secs, err or None, str(path),
                      kind)
        if code != 0:
            log(f"  FAILED ({err}); log: {path}")
        outcomes.append(out)
        return out

    mounts: list[Any] = []
    try:
        # 0. emulated parallel filesystems, mounted for the sweep only (when a run or its
        # probe needs them)
        probed = _probed(results) if cfg.probe is not None else set()
        for t in cfg.tiers:
            unprobed = cfg.probe is not None and (t.name, os.path.realpath(t.path)) not in probed
            if t.emulate_pfs and (unprobed or any(r.tier in (t.name, t.staged_name)
                                                  for r in todo)):
                err = _mount_pfs(t, mounts, log)
                if err:
                    for d in cfg.datasets:
                        for fmt in cfg.formats:
                            failed_prereq[(d.name, fmt, t.name)] = err
                            failed_prereq[(d.name, fmt, t.staged_name)] = err
        # 1. datasets on every source tier that some remaining run needs
        needed = {(r.dataset, r.format, t.name) for r in todo for t in cfg.tiers
                  if r.tier in (t.name, t.staged_name)}
        ds_cfg = {d.name: d for d in cfg.datasets}
        for t in cfg.tiers:
            for d in cfg.datasets:
                for fmt in cfg.formats:
                    if (d.name, fmt, t.name) not in needed or (d.name, fmt, t.name) in failed_prereq:
                        continue
                    err = _ensure_dataset(cfg, t, ds_cfg[d.name], fmt, step)
                    if err:
                        failed_prereq[(d.name, fmt, t.name)] = err
        # 2. a probe per tier (once: a probe of that label and path already there is kept)
        if cfg.probe is not None:
            have = _probed(results)
            for name, path in [(t.name, t.path) for t in cfg.tiers] + \
                              [(t.staged_name, t.stage_to) for t in cfg.tiers if t.stage_to]:
                if (name, os.path.realpath(path)) in have or not _probe_ok(path, failed_prereq,
                                                                            name):
                    continue
                via = next((t.writable for t in cfg.tiers if t.name == name
                            and t.writable != t.path), None)
                Path(via or path).mkdir(parents=True, exist_ok=True)
                args = ["probe", "--storage", path, "--label", name, "--results", str(results),
                        "--sample-size", _sample_sizes(cfg)]
                if via:
                    args += ["--write-via", via]
                for k, v in cfg.probe.items():
                    args += [f"--{k.replace('_', '-')}",
                             ",".join(map(str, v)) if isinstance(v, list) else str(v)]
                step("probe", name, args)
        # 3. staged copies (once per dataset, format and tier)
        for t in cfg.tiers:
            if not t.stage_to:
                continue
            for d in cfg.datasets:
                for fmt in cfg.formats:
                    if not any(r.tier == t.staged_name and (r.dataset, r.format) == (d.name, fmt)
                               for r in todo):
                        continue
                    if (d.name, fmt, t.name) in failed_prereq:
                        failed_prereq[(d.name, fmt, t.staged_name)] = \
                            failed_prereq[(d.name, fmt, t.name)]
                        continue
                    dest = Path(t.stage_to) / dataset_dirname(d.name, fmt)
                    src = Path(t.path) / dataset_dirname(d.name, fmt)
                    if _same_dataset(src, dest) and _staged_before(results, dest):
                        continue  # staged before, and the source has not changed since
                    o = step("stage", f"{d.name}-{fmt} {t.name} -> {t.staged_name}",
                             ["stage", "--dataset", d.name, "--format", fmt, "--from", t.path,
                              "--to", t.stage_to, "--results", str(results), "--no-progress",
                              *t.stage_args], cfg.ranks)
                    if o.status == "failed":
                        failed_prereq[(d.name, fmt, t.staged_name)] = f"staging failed: {o.error}"
        # 4. the training runs
        for r in plan:
            if r not in todo:
                outcomes.append(Outcome(r.label, "skipped", config=asdict(r)))
                continue
            why = failed_prereq.get((r.dataset, r.format, r.tier))
            if why:
                outcomes.append(Outcome(r.label, "failed", error=why, config=asdict(r)))
                log(f"[train] {r.label}: not run ({why})")
                continue
            o = step("train", r.label, _train_args(cfg, r, results), cfg.ranks)
            o.config = asdict(r)
    finally:
        for m in mounts:
            try:
                m.unmount()
            except Exception as e:  # an unmount failure must not hide the sweep's record
                log(f"could not unmount {m.mountpoint}: {e}")
        record = {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "sweep",
            "name": cfg.name, "created": now_iso(), "started": started,
            "config": _jsonable(asdict(cfg)),
            "runs": [asdict(o) for o in outcomes],
            "counts": {s: sum(o.status == s for o in outcomes if o.step == "train")
                       for s in ("done", "skipped", "failed")},
        }
        record_path = write_document(record, results, "sweep")
        log(f"sweep record: {record_path}")
    if write_report and cfg.report:
        from iobench.report import write_report as _write

        out = Path(cfg.report)
        out = out if out.is_absolute() else results / out
        log(f"report: {_write(results, out, f'iobench sweep: {cfg.name}')}")
    return record


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
    from iobench.errors import IobenchError
    from iobench.manifest import Manifest

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
    from iobench.errors import IobenchError
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


def _probe_ok(path: str, failed: dict[tuple[str, str, str], str], tier: str) -> bool:
    return not any(k[2] == tier and "not mounted" in v for k, v in failed.items())


def _sample_sizes(cfg: SweepConfig) -> str:
    """The sweep's datasets' mean stored bytes per sample (from their manifests where they
    exist), for the probe's random reads."""
    from iobench.probe import sample_size_for

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
    from iobench.errors import IobenchError
    from iobench.manifest import Manifest

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
