"""The `iobench train` workflow: find the dataset, stage it (--stage-to), train, judge, write.

`train_job(config, world, ...)` is what the CLI calls: it resolves the dataset
once (a `DatasetRef`), copies it to a faster tier first when asked
(`StagePlan`), runs the training loop (`iobench.workflows.train.run`) on the copy, adds
the tier, the staging and the verdict to the result, writes it, and returns a
`TrainOutcome`. It also holds the job's abort policy: a rank that fails alone
ends every rank, and an interrupt keeps the epochs that completed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from iobench.core import distributed, faults, results
from iobench.core.dataref import DatasetRef, resolve
from iobench.core.errors import ConfigError, IobenchError
from iobench.core.fusedaemon import (
    CALIBRATION_READS,
    CALIBRATION_ROUNDS,
    FuseDaemon,
    ReadCost,
    Uncalibrated,
    calibrate,
    find_daemon,
)
from iobench.core.interrupts import Interrupted, act_now
from iobench.core.manifest import Manifest
from iobench.core.metrics import EpochClock
from iobench.core.placement import parse_mode
from iobench.core.trace import check_trace_path
from iobench.core.workloads import WorkloadRun
from iobench.core.world import World, agree
from iobench.loaders import make_loader
from iobench.loaders.base import Loader, LoaderConfig
from iobench.workflows.train import RunInterrupted, TrainConfig, run

MIN_STEPS = 10  # fewer steps per epoch than this: warn (stall percentiles need batches)


@dataclass(frozen=True)
class StagePlan:
    """`--stage-to DIR2`: copy the dataset there first (`iobench stage`), then train from it."""

    dest: str
    mode: str = "replicate"
    warm_source: bool = False  # do not evict the source before the copy
    progress: bool = False  # a progress bar on rank 0
    log_progress: bool = False  # else, off a terminal: a line a minute on rank 0

    def __post_init__(self) -> None:
        parse_mode(self.mode)


@dataclass(frozen=True)
class TrainHooks:
    """What rank 0's console hears while the job runs (each optional)."""

    started: Callable[[DatasetRef], None] | None = None  # every rank has its loader
    progress: Callable[[dict[str, Any]], None] | None = None  # after each epoch
    live: Callable[[int, int, int, EpochClock], None] | None = None  # during an epoch
    live_interval_s: float = 2.0
    tier: Callable[[dict[str, Any]], None] | None = None  # the dataset is on an emulated tier
    warning: Callable[[str], None] | None = None  # a warning, as soon as it is known


@dataclass(frozen=True)
class TrainOutcome:
    """What a training job did: rank 0's result and where it went, and the exit status."""

    exit_code: int
    doc: dict[str, Any] | None = None  # rank 0's result (None elsewhere, or none made)
    path: Path | None = None  # where rank 0 wrote it
    interrupted: str | None = None  # the signal that stopped the job, if one did


def train_job(config: TrainConfig, world: World, *, stage: StagePlan | None = None,
              workload: WorkloadRun | None = None,
              hooks: TrainHooks | None = None) -> TrainOutcome:
    """`iobench train` on this rank, with the job's abort policy: an error every rank
    raised is raised on rank 0 (printed once); one rank's own failure ends every rank
    (exit status 3); an interrupt keeps what completed (`TrainOutcome.interrupted`).
    Call it inside `interrupts(defer=world.size > 1)`: several ranks act on an interrupt
    together, at a collective (`iobench.core.interrupts`; the CLI enters it first thing)."""
    try:
        return run_training(config, world, stage=stage, workload=workload,
                            hooks=hooks or TrainHooks())
    except RunInterrupted as e:  # the result of the epochs that completed, marked interrupted
        path = None
        if e.partial is not None and e.partial["epochs"]:
            path = results.write_result(e.partial, e.partial["config"]["results"])
        return TrainOutcome(e.exit_code, e.partial, path, str(e))
    except Interrupted as e:
        return TrainOutcome(e.exit_code, None, None, str(e))
    except IobenchError as e:
        if e.agreed or world.size == 1:
            if world.is_root:
                raise  # the CLI prints it once
            return TrainOutcome(e.exit_code)
        world.end_job(f"rank {world.rank} failed: {e}")
    except Exception as e:  # a rank failing mid-run must take the job down, not hang it
        if world.size == 1:
            raise
        world.end_job(f"rank {world.rank} failed: {type(e).__name__}: {e}")
    return TrainOutcome(3)


def run_training(config: TrainConfig, world: World, *, stage: StagePlan | None = None,
                 workload: WorkloadRun | None = None,
                 hooks: TrainHooks | None = None) -> TrainOutcome:
    """Resolve the dataset, stage it if asked, train, and write rank 0's result (a
    collective; torch.distributed is set up here)."""
    hooks = hooks or TrainHooks()
    _check_request(config, stage)
    # the watchdog (--timeout without progress) names a stuck rank; a collective's own
    # timeout, later, is only the backstop
    distributed.init_process_group(world, torch.cuda.is_available(), config.timeout_s * 1.5 + 10)
    try:
        dataset = _resolve(config, world, stage)
        staging = None
        if stage is not None:  # stage first, then train from the copy
            config, dataset, staging = _stage(config, dataset, stage, world)
        doc = _train(config, dataset, world, staging, workload, hooks)
        if doc is None:
            act_now()  # no collective is left: an interrupt received since still counts
            return TrainOutcome(0)
        return TrainOutcome(0, doc, _write(doc, config))
    finally:
        distributed.destroy_process_group()


def _check_request(config: TrainConfig, stage: StagePlan | None) -> None:
    """What the config cannot check alone: --amp needs a GPU here; the same on every rank."""
    try:
        if config.amp and not torch.cuda.is_available():
            raise ConfigError("--amp needs a CUDA GPU and none is visible; drop --amp")
    except IobenchError as e:
        e.agreed = True  # same on every rank
        raise


def _resolve(config: TrainConfig, world: World, stage: StagePlan | None = None) -> DatasetRef:
    """The run's dataset, found and checked once; an error is raised on every rank."""
    dataset = err = None
    try:
        dataset = resolve(config, world)
        # never write into the user's data, a dataset, or the copy --stage-to makes
        dataset.refuse_inside(config.results, copies=[stage.dest] if stage else [])
        if config.trace is not None:  # nor a trace into the dataset (--stage-to's source)
            check_trace_path(config.trace, dataset)
        if config.checkpoint is not None:  # nor checkpoints (--checkpoint-to, --drain-to)
            from iobench.workflows.train_checkpoint import check_dirs

            copies = [stage.dest] if stage else []
            check_dirs(config.checkpoint,
                       lambda path, option: dataset.refuse_inside(path, option, copies=copies))
    except IobenchError as e:
        err = e
    agree(world, err)
    assert dataset is not None
    return dataset


def _stage(config: TrainConfig, source: DatasetRef, stage: StagePlan, world: World
           ) -> tuple[TrainConfig, DatasetRef, dict[str, Any]]:
    """Copy the dataset to the plan's tier; the config and dataset the run then reads."""
    from iobench.workflows.stage import stage_copy

    staged, staging = stage_copy(source, stage.dest, stage.mode, world,
                                 progress=stage.progress and world.is_root,
                                 log_progress=stage.log_progress and world.is_root,
                                 warm_source=stage.warm_source,
                                 evict_cmd=None if stage.warm_source else config.evict_cmd,
                                 warm_cache=config.warm_cache)
    # the result records the tier read
    return replace(config, storage=staged.storage), staged, staging


def _train(config: TrainConfig, dataset: DatasetRef, world: World,
           staging: dict[str, Any] | None, workload: WorkloadRun | None,
           hooks: TrainHooks) -> dict[str, Any] | None:
    """Train on `dataset`; rank 0's result with the tier, staging and verdict added."""
    counters, tier = emulated_tier(dataset)
    if tier is not None and world.is_root and hooks.tier is not None:
        hooks.tier(tier)
    world.barrier()  # the ranks' own reads of the mount (the tier's stats) come first
    found = fuse_daemon(dataset, tier, config.warm_cache) if world.is_root else None
    world.barrier()  # the ranks open no file while rank 0 calibrates the daemon
    warnings = _datasize_warning(dataset.manifest, workload, world)
    daemon: tuple[FuseDaemon, ReadCost | None] | None = None
    if found is not None:
        fuse, cost = found
        if isinstance(cost, Uncalibrated):
            warnings.append("the FUSE daemon's writes per read are not calibrated, so its replies "
                            f"are recorded but not turned into reads: {cost.reason}")
            cost = None
        daemon = (fuse, cost)
    counters = with_daemon(counters, daemon)
    if warnings and world.is_root and hooks.warning is not None:
        for w in warnings:
            hooks.warning(w)
    factory = _Factory(config, staging["shuffle_scope"] if staging else None, warnings,
                       hooks.warning if world.is_root else None)
    started = hooks.started
    doc = run(config, factory, world, dataset=dataset, progress=hooks.progress,
              started=(lambda: started(dataset)) if started is not None else None,
              live=hooks.live, live_interval_s=hooks.live_interval_s, counters=counters)
    if doc is None:
        return None
    if daemon is not None:
        daemon_figures(doc, *daemon)
    return complete_result(doc, config, tier, staging, warnings)


def fuse_daemon(dataset: DatasetRef, tier: dict[str, Any] | None, warm: bool = False
                ) -> tuple[FuseDaemon, ReadCost | Uncalibrated | None] | None:
    """The FUSE daemon serving the dataset's mount on this host (the emulated tier's own pid
    when it is one), and what one read costs in its writes, from pages of the first 192
    data files (one file's, or one each of many small ones; None with `warm`: the
    calibration drops those files' pages, which a warm run keeps; `Uncalibrated` with its
    reason where it could not be measured); None where there is no such daemon or its
    /proc is unreadable."""
    daemon = find_daemon(dataset.root, pid=int(tier["pid"]) if tier and tier.get("pid")
                         else None)
    if daemon is None:
        return None
    m = dataset.manifest
    files = [m.path_of(e) for e in m.data_files[:CALIBRATION_READS * CALIBRATION_ROUNDS]]
    if not files or warm:
        return daemon, None
    return daemon, calibrate(daemon, files)


def with_daemon(counters: Callable[[], dict[str, int]] | None,
                daemon: tuple[FuseDaemon, ReadCost | None] | None
                ) -> Callable[[], dict[str, int]] | None:
    """`counters` with the FUSE daemon's writes and bytes added (`daemon_replies`,
    `daemon_reply_bytes`), whose per-epoch deltas `train` stores in `tier_bytes`."""
    if daemon is None:
        return counters
    read = daemon[0].counters

    def both() -> dict[str, int]:
        return {**(counters() if counters is not None else {}), **read()}

    return both


def daemon_figures(doc: dict[str, Any], daemon: FuseDaemon, cost: ReadCost | None) -> None:
    """Add to each epoch's `tier_bytes` holding the daemon's counts what one read cost in
    them (None when the calibration could not run) and what they count (`source`)."""
    source = (f"the FUSE daemon's replies ({daemon.name}, pid {daemon.pid}, /proc/PID/io "
              "syscw and wchar): reads and metadata replies alike, of every process using "
              f"{daemon.mount_point} on this host")
    for epoch in doc["epochs"]:
        figures = epoch.get("tier_bytes")
        if figures and "daemon_replies" in figures:
            figures.update(replies_per_read=cost.replies_per_read if cost else None,
                           reply_overhead_bytes=cost.overhead_bytes if cost else None,
                           source=source)


def complete_result(doc: dict[str, Any], config: TrainConfig, tier: dict[str, Any] | None,
                    staging: dict[str, Any] | None, warnings: list[str]) -> dict[str, Any]:
    """The training result with what the run around it knows: the emulated tier, the
    staging that preceded it (and the time to solution), warnings, and the verdict."""
    from iobench.workflows.verdict import for_run

    doc["warnings"] += [w for w in warnings if w not in doc["warnings"]]
    doc["tier"] = tier
    if staging:
        # one repetition's epochs after one staging (the median repetition's walls)
        walls = doc["summary"]["spread"]["epoch_wall_s"]
        doc["staging"] = {**staging, "time_to_solution_s": staging["stage_s"]
                          + (walls["median"] * config.epochs if walls else 0.0)}
        doc["warnings"] += [w for w in staging.get("warnings", []) if w not in doc["warnings"]]
    doc["summary"]["verdict"] = for_run(doc, config.results, config.au_threshold)
    return doc


def _write(doc: dict[str, Any], config: TrainConfig) -> Path:
    """Write rank 0's result; an interrupt during the write keeps it, marked interrupted."""
    try:
        act_now()  # rank 0 alone from here: an interrupt stops the write at once
        faults.at_result_write()  # tests only: a no-op unless IOBENCH_TEST_FAULT is set
        return results.write_result(doc, config.results)
    except Interrupted as e:  # every epoch ran, but what is written after it says so
        doc["status"], doc["status_reason"] = "interrupted", str(e)
        doc["warnings"].insert(0, f"INTERRUPTED: {e} while the result was written; the "
                               f"result holds the {len(doc['epochs'])} epoch(s) that "
                               "completed")
        raise RunInterrupted(e.signum, doc) from None


class _Factory:
    """Each repetition's loader (with a sharded copy's local shuffle scope), warning once
    when an epoch has too few steps for per-step figures."""

    def __init__(self, config: TrainConfig, scope: str | None, warnings: list[str],
                 warn: Callable[[str], None] | None) -> None:
        self.config, self.scope, self.warnings, self.warn = config, scope, warnings, warn
        self.warned = False

    def __call__(self, m: Manifest, c: LoaderConfig, rank: int, size: int) -> Loader:
        loader = make_loader(self.config.loader, m,
                             replace(c, scope=self.scope) if self.scope else c, rank, size)
        steps = loader.steps_per_epoch()
        if steps < MIN_STEPS and not self.warned:
            self.warned = True
            self.warnings.append(
                f"an epoch has only {steps} step(s) per rank ({m.num_samples} samples, "
                f"{size} rank(s), batch {c.batch_size}): too few for per-step figures; use a "
                "smaller --batch-size" + ("" if self.config.data else " or generate more "
                                          "--samples"))
            if self.warn is not None:
                self.warn(self.warnings[-1])
        return loader


def _datasize_warning(manifest: Manifest, workload: WorkloadRun | None,
                      world: World) -> list[str]:
    """With --workload: a warning when the dataset is under MLPerf's size for this many
    accelerators (`iobench datasize`), else nothing."""
    if workload is None:
        return []
    have = manifest.num_samples
    need = workload.required_samples(world.size)
    if have >= need:
        return []
    return [f"the dataset holds {have:,} samples and MLPerf Storage asks for {need:,} for "
            f"{world.size} x {workload.accelerator} ({workload.workload.name}; iobench "
            "datasize): a smaller dataset is cached more easily by the storage"]


def emulated_tier(dataset: DatasetRef) -> tuple[Callable[[], dict[str, int]] | None,
                                                dict[str, Any] | None]:
    """Counters of the emulated parallel filesystem holding the dataset, if it is on one.

    The kernel does not count FUSE reads (`os_read_bytes` is null there), so the
    daemon's own counters (bytes served, requests, opens) become each epoch's
    `tier_bytes`. They are per mount, so rank 0 reads its node's.
    """
    from iobench import pfs

    root = dataset.root
    tier = pfs.is_emulated(root)
    if tier is None:
        return None, None

    def counters() -> dict[str, int]:
        doc = pfs.stats_for(root) or {}
        return dict(doc.get("counters", {}))

    return counters, tier
