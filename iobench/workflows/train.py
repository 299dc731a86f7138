"""The training loop of `iobench train`: real (or emulated) compute, data stall measured per step.

`run(config, loader_factory, world)` trains on one rank of a job and returns
the result document (on rank 0; None elsewhere). The loader comes from
`loader_factory`, so other tiers and wrappers (staging, emulated parallel
filesystems) plug in without touching the loop; `counters` lets such a tier
report its own byte counts per epoch.

Clock reads (METRICS.md): per step, `wait` runs from the end of the previous
step's compute (or the epoch start, just before the iterator is created) to
the batch being usable on the device (host-to-device copy included, then
synchronised); `compute` from there to the end of the optimizer step (after
`torch.cuda.synchronize()` on a GPU). The reads tile the epoch, so
`stall_s + sum(compute_s) == wall_s` by construction.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from iobench.core import cache, faults, hostcpu, procio, sysinfo
from iobench.core.dataref import DatasetRef, resolve
from iobench.core.datasets import DATASETS, parse_dataset
from iobench.core.errors import (
    ConfigError,
    IobenchError,
    StorageError,
)
from iobench.core.formats import FORMATS, loader_formats, parse_format
from iobench.core.interrupts import Interrupted, pending
from iobench.core.manifest import Manifest
from iobench.core.metrics import EpochClock, epoch_summary, node_summaries, rank_figures
from iobench.core.models import (
    build_model,
    channels_last,
    channels_last_model,
    count_parameters,
    parse_model,
    resolve_model,
)
from iobench.core.options import parse_evict_cmd, parse_repeat
from iobench.core.placement import check_same_dataset
from iobench.core.results import SCHEMA, SCHEMA_VERSION, new_run_id
from iobench.core.sampling import parse_shuffle
from iobench.core.spread import run_spread
from iobench.core.trace import StepClocks, Trace, check_trace_path, epoch_part, write_trace
from iobench.core.userdata import USER_DATASET
from iobench.core.watchdog import Watchdog
from iobench.core.world import World, agree
from iobench.loaders.base import WORKER_TYPES, Loader, LoaderConfig, batches
from iobench.workflows.train_checkpoint import (
    CheckpointPlan,
    TrainCheckpoints,
    check_for_run,
    epoch_record,
)

LOADER_NAMES: tuple[str, ...] = (*FORMATS, "dali")
# residency above this after eviction means eviction did not take
RESIDENT_WARN_FRACTION = 0.10

LoaderFactory = Callable[[Manifest, LoaderConfig, int, int], Loader]


@dataclass(frozen=True)
class TrainConfig:
    """Everything one `iobench train` run needs; validated when built."""

    loader: str
    storage: str  # directory holding <dataset>-<format>/
    dataset: str = "cifar10"
    format: str | None = None  # on-disk format; only for dali (others read their own)
    model: str = "auto"  # auto | none | a name in iobench.core.models.MODELS
    compute_time_s: float | None = None  # emulated accelerator: seconds per step
    epochs: int = 3
    batch_size: int = 64  # samples per step per rank
    workers: int = 2  # loader workers per rank
    worker_type: str = "process"
    shuffle: str = "global"
    seed: int = 0
    max_steps: int | None = None  # per epoch
    decode: bool = True
    warm_cache: bool = False
    drop_caches: bool = False  # root only: also drop the node's page cache before each epoch
    lr: float | None = None  # None: the model's default
    amp: bool = False  # CUDA only: bfloat16 autocast
    channels_last: bool = False
    timeout_s: float = 300.0  # bound on any collective (dead rank detection)
    results: str = "iobench-results"
    repeat: int = 1  # independent cold repetitions of the whole run
    step_sync: bool = True  # emulated/no compute: each step waits for every rank's batch
    server_cache_gb: float | None = None  # storage servers' cache (GPFS pagepool, OSS RAM)
    au_threshold: float = 0.90  # the verdict: AU at or above this keeps up (MLPerf Storage)
    evict_cmd: str | None = None  # the site's command that empties server caches, per node
    # the user's own data instead of a generated dataset (iobench/core/userdata.py); then
    # `dataset` is "user" and `storage` the same path
    data: str | None = None
    data_key: str | None = None  # its sample array (HDF5/NetCDF), else detected
    label_key: str | None = None  # its labels array or LMDB record, else detected
    tier: str | None = None  # the storage tier's name in reports (--tier); None: its path
    trace: str | None = None  # a per-step trace of every rank goes there (iobench.core.trace)
    # --checkpoint-every N: the model saved while it trains (iobench.workflows.train_checkpoint)
    checkpoint: CheckpointPlan | None = None

    def __post_init__(self) -> None:
        parse_loader(self.loader)
        self._check_dataset()
        if self.format is not None:
            parse_loader_format(self.loader, self.format)
        self._check_compute()
        for name in ("epochs", "batch_size", "repeat"):
            parse_count(name, getattr(self, name))
        parse_count("workers", self.workers, least=0)
        if self.max_steps is not None:
            parse_count("max_steps", self.max_steps)
        if self.worker_type not in WORKER_TYPES:
            raise ConfigError(f"--worker-type {self.worker_type!r}; choose one of {WORKER_TYPES}")
        parse_shuffle(self.shuffle)
        parse_tier_label(self.tier)
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"--lr {self.lr} must be a positive number")
        if not self.timeout_s > 0:
            raise ConfigError(f"--timeout {self.timeout_s} must be > 0 seconds")
        self._check_cache()
        if self.checkpoint is not None:
            check_for_run(self.checkpoint, self.compute_kind, self.repeat)

    def _check_dataset(self) -> None:
        """A generated dataset by name, or the user's data (`--data`) with its keys."""
        if self.data is None:
            parse_dataset(self.dataset)
            if self.data_key or self.label_key:
                raise ConfigError("--data-key/--label-key name arrays of your own data: add "
                                  "--data PATH, or drop them")
        elif self.dataset != USER_DATASET:
            raise ConfigError(f"--data reads your own data; dataset {self.dataset!r} is for "
                              "--storage: drop one of them")
        elif self.compute_time_s is None and self.model != "none":
            raise ConfigError(f"--model {self.model}: iobench's models train on its generated "
                              "datasets only; with --data use --model none (pure ingest) or "
                              "--compute-time SECONDS (an emulated accelerator)")

    def _check_compute(self) -> None:
        """A real model, an emulated step (--compute-time) or none, and what each allows."""
        if self.model not in ("auto", "none") and self.data is None:
            resolve_model(self.model, self.dataset)
        if self.compute_time_s is not None:
            parse_compute_time(self.compute_time_s)
            if self.model not in ("auto", "none"):
                raise ConfigError(f"--compute-time emulates the compute, --model "
                                  f"{self.model} runs a real one: give one of them")
        if not self.decode and self.compute_kind == "model":
            raise ConfigError("--no-decode leaves samples undecoded, which no model can train "
                              "on: add --model none (pure ingest) or --compute-time SECONDS")
        if self.amp and self.compute_kind != "model":
            raise ConfigError("--amp only applies to a real model; drop it or pick --model")
        if not self.step_sync and self.compute_kind == "model":
            raise ConfigError("--no-step-sync applies to --compute-time and --model none; a "
                              "real model is synchronised by DDP's all-reduce")

    def _check_cache(self) -> None:
        """Eviction (--drop-caches, --evict-cmd), the server cache rule and the verdict."""
        from iobench.workflows.verdict import parse_threshold

        if self.drop_caches and (self.warm_cache or not os.access("/proc/sys/vm/drop_caches",
                                                                  os.W_OK)):
            raise ConfigError("--drop-caches needs root (a writable /proc/sys/vm/drop_caches) "
                              "and a cold-cache run (no --warm-cache)")
        parse_threshold(self.au_threshold)
        parse_evict_cmd(self.evict_cmd, self.warm_cache)
        if self.server_cache_gb is not None and not (self.server_cache_gb >= 0
                                                     and math.isfinite(self.server_cache_gb)):
            raise ConfigError(f"--server-cache-gb {self.server_cache_gb} must be a number of "
                              "GB >= 0")

    @property
    def compute_kind(self) -> str:
        """`model` (real training), `emulated` (--compute-time) or `none` (pure ingest)."""
        if self.compute_time_s is not None:
            return "emulated"
        return "none" if self.model == "none" else "model"

    @property
    def model_name(self) -> str | None:
        """The concrete model trained, or None when there is no real model."""
        return resolve_model(self.model, self.dataset) if self.compute_kind == "model" else None

    def loader_config(self, device: str = "cpu") -> LoaderConfig:
        return LoaderConfig(batch_size=self.batch_size, workers=self.workers,
                            worker_type=self.worker_type, shuffle=self.shuffle, seed=self.seed,
                            decode=self.decode, pin_memory=device == "gpu",
                            persistent_workers=True, device=device,
                            library_cache=self.warm_cache, max_steps=self.max_steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_loader(loader: str) -> str:
    """`loader` when iobench has it (a format's own reader, or dali)."""
    if loader not in LOADER_NAMES:
        raise ConfigError(f"unknown loader {loader!r}; choose one of: {', '.join(LOADER_NAMES)}")
    return loader


def parse_tier_label(label: str | None) -> str | None:
    """`--tier NAME`: a short one-line name for the storage tier (None: none given)."""
    if label is not None and not (label.strip() and label.isprintable() and len(label) <= 64):
        raise ConfigError(f"--tier {label!r} must be a short name on one line (1-64 printable "
                          "characters), e.g. --tier nvme")
    return label


def parse_loader_format(loader: str, fmt: str) -> str:
    """`fmt` when `loader` reads it: `--format` is for dali, the others read their own."""
    parse_format(fmt)
    if fmt not in loader_formats(loader) and loader == "dali":
        raise ConfigError(f"--loader dali cannot read {fmt} datasets; use --loader {fmt}")
    if loader != "dali" and fmt != loader:
        raise ConfigError(f"--format {fmt} does not fit --loader {loader} (it reads {loader} "
                          "datasets); --format is for --loader dali only")
    return fmt


def parse_compute_time(seconds: float) -> float:
    """An emulated step's seconds: finite and >= 0."""
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ConfigError(f"--compute-time {seconds} must be a finite number of seconds >= 0")
    return seconds


def parse_count(name: str, value: int, least: int = 1) -> int:
    """A count option (`name` as the config field) when it is at least `least`."""
    if name == "repeat":
        return parse_repeat(value)
    if value < least:
        raise ConfigError(f"--{name.replace('_', '-')} {value} must be >= {least}")
    return value


def check_results_dir(path: str | Path) -> Path:
    """Create the results directory if needed and prove it writable (before any training)."""
    from iobench.core.outputs import writable_dir

    return writable_dir(path, "--results", create=True)


def _torch_threads(world: World, config: TrainConfig) -> int:
    """Intra-op threads per rank: the rank's share of cores minus what its workers need."""
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()  # the user (or launcher) decided
    total = os.cpu_count() or 1
    avail = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    per_rank = avail if avail < total else max(1, avail // max(world.local_size, 1))
    return max(1, per_rank - config.workers)


def emulate_compute(seconds: float, start_ns: int) -> int:
    """Busy the host until `start_ns + seconds` (sleep, then spin the last ms); return the end."""
    target = start_ns + int(seconds * 1e9)
    remaining = target - time.perf_counter_ns()
    if remaining > 2_000_000:
        time.sleep((remaining - 1_000_000) / 1e9)
    now = time.perf_counter_ns()
    while now < target:
        now = time.perf_counter_ns()
    return now


def describe_device(device: torch.device) -> dict[str, Any]:
    """What computes: the GPU's name and CUDA build, or the CPU model and its cores."""
    if device.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(device),
                "cuda": torch.version.cuda, "torch": torch.__version__}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"type": "cpu", "name": sysinfo.cpu_model(), "cores": cores,
            "cuda": torch.version.cuda, "torch": torch.__version__}


def device_words(d: dict[str, Any]) -> str:
    """`describe_device`'s answer in words, for the console."""
    if d["type"] == "cuda":
        return f"GPU {d['name']} (CUDA {d['cuda']}, torch {d['torch']})"
    return f"CPU {d['name']} ({d['cores']} cores, torch {d['torch']})"


def device_warnings(d: dict[str, Any], compute_kind: str) -> list[str]:
    """A GPU this torch cannot use, and a real model that trains on the CPU."""
    out = []
    if d["type"] == "cpu":
        gpus = sysinfo.gpus()
        if gpus and d["cuda"] is None:
            out.append(f"a GPU is present ({gpus[0]['name']}) but torch {d['torch']} is a CPU "
                       "build, so this run computes on the CPU: install a CUDA build of torch "
                       "in this environment (README, \"Bring your own torch\")")
        elif gpus:
            out.append(f"a GPU is present ({gpus[0]['name']}) but torch cannot use it "
                       f"(torch {d['torch']}, CUDA {d['cuda']}): check the driver and "
                       "CUDA_VISIBLE_DEVICES")
        if compute_kind == "model":
            out.append("the model trains on the CPU: its step time, not the storage, sets the "
                       "pace, and AU describes a CPU-speed accelerator; to ask whether the "
                       "storage keeps up with your GPU, emulate its step with --compute-time "
                       "SECONDS (e.g. 0.05 for a ResNet-50-class step of 64 samples)")
    return out


def _to_device(batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's samples as delivered (compact: the stored int16, cropped uint8) and its
    labels, on `device`; the conversion to the model's floats (`batch.finish`) is the
    step's first operation, on the device, as production pipelines do it."""
    if device.type != "cuda":
        return batch.samples, batch.labels
    x = batch.samples.to(device, non_blocking=True)  # from pinned memory: DMA
    y = batch.labels.to(device, non_blocking=True)
    torch.cuda.synchronize(device)  # the copy is usable (its non-overlapped part is wait)
    return x, y


def run(config: TrainConfig, loader_factory: LoaderFactory, world: World, *,
        progress: Callable[[dict[str, Any]], None] | None = None,
        counters: Callable[[], dict[str, int]] | None = None,
        started: Callable[[], None] | None = None,
        live: Callable[[int, int, int, EpochClock], None] | None = None,
        live_interval_s: float = 2.0,
        dataset: DatasetRef | None = None) -> dict[str, Any] | None:
    """Train `config.repeat` times for `config.epochs`; return the result document on rank 0.

    torch.distributed must already be initialised when `world.size > 1`
    (`iobench.core.distributed.init_process_group`). Each repetition builds a
    fresh loader (and model, from the same seed) and runs every epoch cold,
    so repetitions are independent measurements of one experiment.
    `started()` is called on rank 0 once every rank has its dataset and
    loader; `progress(epoch_record)` on rank 0 after each epoch.
    `live(epoch, step, steps, clock)` is called on rank 0 at most every
    `live_interval_s` during an epoch, at the start of a step's compute
    (inside an emulated step it costs nothing; with a model it is part of
    that step's compute, never of the stall). `counters()`, if given,
    returns byte counters of a storage tier; their per-epoch deltas (rank
    0's) are stored as `tier_bytes`. `dataset` is the dataset to read, when the
    caller resolved it already (`iobench.core.dataref`); else `config` names it.
    """
    device = rank_device(world)
    dataset, mount = _open_dataset(config, world, dataset)
    manifest = dataset.manifest
    check_same_dataset(world, manifest)  # a node with a stale copy fails now, not hours in
    node_memory = {n: m for n, m in world.allgather((world.hostname, sysinfo.memory_bytes()))}
    memory = sum(node_memory.values())
    hooks = _Hooks(progress, counters, live if world.is_root else None,
                   int(live_interval_s * 1e9))
    run = _Run(config, manifest, mount, world, device, hooks)
    run.run_id = world.bcast(run.run_id)  # every rank beats under one name
    beats = Path(config.results) / ".iobench-heartbeats" / run.run_id
    dog = Watchdog(world, config.timeout_s, beats,
                   on_stuck=(lambda why: run.write_partial(memory, "incomplete", why))
                   if world.is_root else None)
    run.watchdog = dog
    try:
        if config.checkpoint is not None:
            assert config.model_name is not None  # check_for_run: a real model
            run.ckpt = TrainCheckpoints(config.checkpoint, world, run.run_id, config.model_name,
                                        config.seed, config.timeout_s, config.dataset,
                                        config.batch_size)
            run.ckpt.open()
            run.warnings += run.ckpt.warnings
        _repetitions(run, loader_factory, started)
    except Interrupted as e:
        run.write_trace()  # the epochs that completed
        raise RunInterrupted(e.signum, run.document(memory, "interrupted", str(e))
                             if world.is_root else None) from None
    finally:
        if run.ckpt is not None:
            run.ckpt.close()  # what is in flight waited for; no unfinished folder left
        dog.close()
        if world.is_root:
            shutil.rmtree(beats, ignore_errors=True)
            with contextlib.suppress(OSError):
                beats.parent.rmdir()  # only when no other run beats there
    run.write_trace()
    return run.document(memory) if world.is_root else None


def _open_dataset(config: TrainConfig, world: World, dataset: DatasetRef | None
                  ) -> tuple[DatasetRef, sysinfo.MountInfo]:
    """The run's dataset (resolved here unless given) and its mount, and the results
    directory proven writable and outside the user's data; an error on every rank."""
    err: IobenchError | None = None
    mount = None
    try:
        dataset = dataset or resolve(config, world)
        mount = sysinfo.mount_of(dataset.root)
        if world.is_root:
            dataset.refuse_inside(config.results)  # never write into the user's data
            check_results_dir(config.results)
            if config.trace is not None:
                check_trace_path(config.trace, dataset)
    except IobenchError as e:
        err = e
    agree(world, err)
    assert dataset is not None and mount is not None
    return dataset, mount


def _repetitions(run: _Run, loader_factory: LoaderFactory,
                 started: Callable[[], None] | None) -> None:
    """Each repetition with a fresh loader, closed after it."""
    config, world = run.config, run.world
    dog = run.watchdog
    assert dog is not None
    for rep in range(config.repeat):
        dog.progress("building the loader")
        loader = _make_loader(loader_factory, run.manifest, config, world, run.device)
        try:
            dog.progress("starting the loader's workers")
            startup = run.start_loader(loader)
            if rep == 0 and started is not None and world.is_root:
                started()
            run.repetition(rep, loader, startup)
        finally:
            loader.close()


def rank_device(world: World) -> torch.device:
    """This rank's GPU (its local rank's), or the CPU where torch sees none. More ranks on a
    node than it has GPUs is refused on every rank of the node together, in one line."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if world.local_size > gpus:
        e = ConfigError(f"{world.local_size} ranks per node but this node has {gpus} GPU(s): "
                        f"start at most {gpus} per node (torchrun --nproc-per-node {gpus}, "
                        f"srun --ntasks-per-node {gpus}, mpiexec -ppn {gpus})")
        e.agreed = True  # every rank of the job checks the same counts before any collective
        raise e
    return torch.device(f"cuda:{world.local_rank}")


class RunInterrupted(Interrupted):
    """SIGINT/SIGTERM during `run`: `partial` is rank 0's result of the epochs that completed
    (status `interrupted`), None on other ranks."""

    def __init__(self, signum: int, partial: dict[str, Any] | None) -> None:
        super().__init__(signum)
        self.partial = partial


def _make_loader(factory: LoaderFactory, manifest: Manifest, config: TrainConfig, world: World,
                 device: torch.device) -> Loader:
    """Build this rank's loader; a failure on any rank is raised on every rank."""
    loader = err = None
    try:
        loader = factory(manifest, config.loader_config("gpu" if device.type == "cuda" else "cpu"),
                         world.rank, world.size)
    except IobenchError as e:
        err = e
    agree(world, err)
    assert loader is not None
    return loader


class _Compute:
    """One step's compute: a real model (forward, backward, SGD), an emulated one, or none."""

    def __init__(self, config: TrainConfig, world: World, device: torch.device) -> None:
        self.config, self.kind, self.device = config, config.compute_kind, device
        self.model_name = config.model_name
        self.params: int | None = None
        self.task: str | None = None
        self.lr: float | None = None
        self.threads = _torch_threads(world, config)
        torch.set_num_threads(self.threads)
        # data-parallel steps wait for every rank's batch (docs/metrics.md, "Emulated compute")
        self.sync = config.step_sync and world.size > 1 and self.kind != "model"
        # a real model's steps are paced by DDP's all-reduce: a 4-byte one after each step
        # (part of its compute) carries the ranks' interrupts, as the emulated steps' does
        self.agrees = self.sync or (self.kind == "model" and world.size > 1)
        self._flag = torch.zeros(1, device=device) if self.agrees else None
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                         if config.amp and device.type == "cuda" else contextlib.nullcontext())
        self.model: Any = None
        if self.kind == "model":
            self._build(world)
        self.reset()

    def _build(self, world: World) -> None:
        config, device = self.config, self.device
        spec = DATASETS[config.dataset]
        assert self.model_name is not None  # built for compute kind "model" only
        mspec = parse_model(self.model_name)
        self.task = mspec.task
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = build_model(self.model_name, spec.num_classes or int(math.prod(spec.label_shape)))
        self.params = count_parameters(model)
        model = model.to(device)
        if config.channels_last:
            model = channels_last_model(model)
        if world.size > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.lr = config.lr or mspec.lr_for(config.batch_size * world.size)
        self.opt = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=0.9, nesterov=True,
                                   weight_decay=5e-4 if self.task == "classification" else 0.0)
        self.loss_fn = (torch.nn.CrossEntropyLoss() if self.task == "classification"
                        else torch.nn.MSELoss())
        model.train()
        self.model = model

    def reset(self) -> None:
        """Zero the per-epoch training statistics."""
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.correct = torch.zeros((), dtype=torch.int64, device=self.device)
        self.seen = 0

    def wait_for_all_ranks(self) -> None:
        """The step may start only when every rank has its batch (a real 4-byte all-reduce)."""
        if self.sync:
            self._agree()

    def _agree(self) -> None:
        """A 4-byte all-reduce carrying each rank's recorded interrupt (0: none): after the
        same step, every rank raises `Interrupted` or none does."""
        import torch.distributed as dist

        from iobench.core.interrupts import pending, settle

        assert self._flag is not None
        self._flag.fill_(pending() or 0)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        settle([int(self._flag.item())])  # (.item() waits for the device)

    def step(self, x: torch.Tensor, y: torch.Tensor, t_ready: int,
             finish: Callable[[torch.Tensor], torch.Tensor] | None = None) -> int | None:
        """Run one step on a usable batch; return its end time when emulated (else None).

        `finish` (the batch's conversion to floats: log1p table, normalisation) runs
        first, on the device, inside the step's compute time.
        """
        if self.kind == "emulated":
            return emulate_compute(self.config.compute_time_s or 0.0, t_ready)
        if self.kind != "model":
            return None
        if finish is not None:
            x = finish(x)
        elif not x.is_floating_point():
            x = x.float()
        if self.config.channels_last:
            x = channels_last(x)
        with self.autocast:
            out = self.model(x)
            loss = self.loss_fn(out.float(), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        n = y.shape[0]
        self.loss_sum += loss.detach().double() * n
        if self.task == "classification":
            self.correct += (out.detach().argmax(1) == y).sum()
        self.seen += n
        if self.agrees:
            self._agree()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return None

    def stats(self) -> tuple[float, int, int]:
        return float(self.loss_sum.item()), int(self.correct.item()), self.seen


class _NotBuilt:
    """What `_Compute` would report, for a run stopped before its first repetition began."""

    def __init__(self, config: TrainConfig) -> None:
        self.kind, self.model_name = config.compute_kind, config.model_name
        self.params = self.task = self.lr = None
        self.threads = torch.get_num_threads()


@dataclass(frozen=True)
class _Hooks:
    """What the caller of `run` hears while a rank trains, and the tier counters it reads."""

    progress: Callable[[dict[str, Any]], None] | None  # after each epoch
    counters: Callable[[], dict[str, int]] | None  # a storage tier's byte counters
    live: Callable[[int, int, int, EpochClock], None] | None  # rank 0, during an epoch
    live_interval_ns: int  # at most one `live` call per interval


class _LoaderTimes:
    """The readers' own clocks over an epoch's batches (`Batch.timing`): read, decode and
    hand-over time, in total and per worker."""

    def __init__(self) -> None:
        self.batches = self.read_ns = self.decode_ns = self.handoff_ns = 0
        self.per_worker: dict[int, list[int]] = {}  # worker id -> [batches, read_ns, decode_ns]

    def add(self, batch: Any, t_got: int, prev_end: int) -> None:
        """A batch received at `t_got`, the previous step having ended at `prev_end`."""
        if batch.timing is None:
            return
        read_ns, decode_ns, made_ns, worker = batch.timing[:4]
        self.batches += 1
        self.read_ns += read_ns
        self.decode_ns += decode_ns
        w = self.per_worker.setdefault(worker, [0, 0, 0])
        w[0] += 1
        w[1] += read_ns
        w[2] += decode_ns
        # the part of this step's wait in which its batch was already made: handing it
        # over (queues, unpickling, collate) cost the step that much
        self.handoff_ns += max(0, t_got - max(made_ns, prev_end))

    def summary(self, workers: int, wall_ns: int) -> dict[str, Any] | None:
        """The epoch's `loader` timing (None when no batch carried a clock)."""
        if not self.batches:
            return None
        return {"workers": workers, "batches": self.batches, "read_s": self.read_ns / 1e9,
                "decode_s": self.decode_ns / 1e9, "handoff_s": self.handoff_ns / 1e9,
                # each worker: its batches, and the part of the epoch it was busy
                "per_worker": [{"worker": k, "batches": v[0], "read_s": v[1] / 1e9,
                                "decode_s": v[2] / 1e9,
                                "busy_fraction": (v[1] + v[2]) / wall_ns}
                               for k, v in sorted(self.per_worker.items())]}


class _Run:
    """The repetitions and epochs of one `iobench train` on one rank, and its result."""

    def __init__(self, config: TrainConfig, manifest: Manifest, mount: sysinfo.MountInfo,
                 world: World, device: torch.device, hooks: _Hooks) -> None:
        self.config, self.manifest, self.mount, self.world = config, manifest, mount, world
        self.device, self.hooks = device, hooks
        assert manifest.root is not None  # run() loaded it from a folder
        note = procio.read_bytes_unavailable(manifest.root)
        self.count_io = note is None
        self.io_note = f"os_read_bytes is null: {note}" if note else None
        self.fault = faults.planned()  # tests only: None unless IOBENCH_TEST_FAULT is set
        self.epochs: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.startups: list[dict[str, Any]] = []
        self.cache_settings: dict[str, Any] = {}
        self.compute: _Compute | None = None
        self.watchdog: Watchdog | None = None
        self.t_run = time.perf_counter()
        self.run_id = new_run_id(world.hostname)  # named by its start time
        self._last_live = 0  # when `hooks.live` was last called (perf_counter ns)
        # rank 0's host's busy CPU when the epoch's first step had every rank's first batch
        self._first_cpu: hostcpu.HostCpu | None = None
        # a real model's last batch (on the device), then its compute-only rate on it
        self._last_batch: tuple[torch.Tensor, torch.Tensor, Any] | None = None
        self.demand: dict[str, Any] | None = None
        self.ceilings: dict[str, Any] | None = None  # a DALI run's (`workflows.ceilings`)
        # --trace: this epoch's step clocks (every rank), every rank's epochs (rank 0)
        self._clocks: StepClocks | None = None
        ck = config.checkpoint
        self.trace = (Trace(config.loader, device.type, checkpoints=ck is not None,
                            checkpoint_mode=ck.mode if ck is not None else "sync",
                            drain=ck is not None and ck.drain_to is not None)
                      if config.trace is not None and world.is_root else None)
        self.ckpt: TrainCheckpoints | None = None  # --checkpoint-every

    def start_loader(self, loader: Loader) -> dict[str, Any]:
        """Start the loader's workers before any epoch's clock and counters (timed, counted)."""
        self.cache_settings = loader.cache_settings()
        io0 = procio.tree_io()
        t0 = time.perf_counter_ns()
        loader.start()
        seconds = (time.perf_counter_ns() - t0) / 1e9
        io = procio.tree_io() - io0
        return {"seconds": seconds, "os_read_bytes": io.read_bytes if self.count_io else None,
                "os_rchar": io.rchar, "processes": io.processes}

    def _at(self, phase: str, step: int | None = None) -> None:
        if self.watchdog is not None:
            self.watchdog.progress(phase, step)

    def write_trace(self) -> None:
        """Rank 0, at the end (or an interrupt): every rank's spans to `--trace`; a failure
        to write it is a warning in the result, which keeps every figure."""
        if self.trace is None or self.config.trace is None:
            return
        self.trace.run_id = self.run_id
        try:
            write_trace(self.config.trace, self.trace)
        except StorageError as e:
            self.warnings.append(f"no trace written: {e}")

    def write_partial(self, cluster_memory_bytes: int, status: str, why: str) -> None:
        """Rank 0, from the watchdog: what was measured so far, marked `status`."""
        from iobench.core.results import write_result

        write_result(self.document(cluster_memory_bytes, status, why), self.config.results)

    def repetition(self, rep: int, loader: Loader, startup: dict[str, Any]) -> None:
        self.compute = _Compute(self.config, self.world, self.device)  # a fresh model each time
        if self.ckpt is not None:
            self._at("checking room for the checkpoints; with --resume, loading one")
            self.ckpt.start_repetition(rep, self.compute.model, self.compute.opt)
        startups = self.world.allgather(startup)
        if self.world.is_root:
            self.startups.append({"repeat": rep, "seconds_max": max(s["seconds"] for s in startups),
                                  "ranks": startups})
        first = 0
        if self.ckpt is not None:  # --resume: from the checkpoint's epoch on
            first = self.ckpt.first_epoch(_planned_steps(loader, self.config), self.config.epochs)
        for epoch in range(first, self.config.epochs):
            self._epoch(rep, epoch, loader)
        if self.ckpt is not None:  # every save written, committed and drained
            self._at("waiting for the checkpoints in flight")
            self.ckpt.end_repetition(self.epochs if self.world.is_root else None)
            if self.trace is not None:  # the writes and drains beside the steps
                self.trace.background += self.ckpt.take_background()
        if rep == 0 and self._last_batch is not None:
            self.demand = self._measure_demand(self.compute, *self._last_batch)
        self._last_batch = None
        if rep == 0 and getattr(loader, "name", "") == "dali" and self.compute.kind != "none":
            # DALI keeps no per-batch clocks: the verdict's cause comes from these passes
            from iobench.workflows.ceilings import measure

            self._at("measuring the loader's ceilings (cold, in memory, decoding)")
            try:
                self.ceilings = measure(loader, lambda: self._evict(loader),
                                        cold=not self.config.warm_cache)
            except IobenchError as e:  # the epochs are measured: they keep their result
                self.warnings.append(f"DALI's ceilings were not measured ({e}): the verdict "
                                     "cannot name the cause")

    def _measure_demand(self, compute: _Compute, x: torch.Tensor, y: torch.Tensor,
                        finish: Any) -> dict[str, Any]:
        """The model's compute-only rate on this rank: a few steps on the last batch, already
        on the device (copies of the model and optimizer; `iobench.core.demand`). After the
        epochs, so no epoch's clock holds it."""
        from iobench.core.demand import compute_rate

        self._at("measuring the model's compute-only rate")
        gpu = self.device.type == "cuda"
        d = compute_rate(compute.model, compute.opt, compute.loss_fn, x, y, finish=finish,
                         autocast=compute.autocast, channels_last=self.config.channels_last,
                         warmup=5 if gpu else 1, steps=20 if gpu else 3)
        return d.to_dict()

    def _evict(self, loader: Loader) -> cache.EvictReport:
        """Empty the dataset's pages from the cache (unless --warm-cache): a collective."""
        config = self.config
        return cache.evict_for_node(self.manifest, self.world, cache.EvictOptions(
            evict_pages=not config.warm_cache,
            scope=loader.config.scope,  # sharded copies: own files
            drop_caches=config.drop_caches, warn_above=RESIDENT_WARN_FRACTION, loud=False,
            evict_cmd=config.evict_cmd))

    def _epoch(self, rep: int, epoch: int, loader: Loader) -> None:
        world = self.world
        compute = self.compute
        assert compute is not None
        self._at(f"evicting the dataset before epoch {epoch + 1}")
        report = self._evict(loader)
        self._at(f"waiting for every rank to start epoch {epoch + 1}")
        world.barrier()  # ranks start the epoch together
        tier0 = self.hooks.counters() if self.hooks.counters and world.is_root else None
        cpu0 = hostcpu.read() if world.is_root else None  # rank 0's host, as tier_bytes
        io0 = procio.tree_io()  # rchar counts on every filesystem; read_bytes not always
        compute.reset()
        if self.ckpt is not None:
            self.ckpt.epoch_start()
        self._first_cpu = None
        clock, timing = self._steps(rep, epoch, loader, compute)
        host_cpu = hostcpu.record(cpu0, hostcpu.read()) if world.is_root else None
        first = hostcpu.record(cpu0, self._first_cpu)
        if host_cpu is not None and first is not None:  # its part until the first batch
            host_cpu["first_batch_busy_s"] = first["busy_s"]
        io = procio.tree_io() - io0
        tier = None
        if tier0 is not None and self.hooks.counters is not None:
            tier1 = self.hooks.counters()
            tier = {k: tier1[k] - v for k, v in tier0.items() if k in tier1}  # a source gone: no figure
        node_frac = {n["node"]: n["resident_fraction"] for n in report.per_node}
        fig = {"rank": world.rank, "host": world.hostname, "node": world.node,
               "node_name": world.node_name,
               **rank_figures(clock),
               "os_read_bytes": io.read_bytes if self.count_io else None,
               "os_rchar": io.rchar, "os_processes": io.processes,
               "loader": timing,
               "cache_resident_fraction_at_start": node_frac.get(world.node)}
        if self.ckpt is not None:
            fig["checkpoint"] = self.ckpt.epoch_end(fig)
        self._at(f"gathering epoch {epoch + 1}'s figures from every rank")
        part = (epoch_part(world.rank, world.hostname, clock, self._clocks,
                           self.ckpt.blocked_log if self.ckpt is not None else ())
                if self._clocks is not None else None)
        gathered = world.allgather((fig, compute.stats(), part))
        if self.trace is not None:
            self.trace.add(rep, epoch, [g[2] for g in gathered])
        if world.is_root:
            self._record(rep, epoch, [g[0] for g in gathered], [g[1] for g in gathered], report,
                         tier, host_cpu)
        faults.at_step(self.fault, world.rank, epoch, -1)  # tests: a signal between epochs

    def _steps(self, rep: int, epoch: int, loader: Loader, compute: _Compute
               ) -> tuple[EpochClock, dict[str, Any] | None]:
        """Run the epoch's steps; the clock's reads tile it (wait, compute, wait, ...).

        Also sums the readers' own clocks carried by each batch (`Batch.timing`):
        where the loader's time went, for the verdict (None without such clocks).
        """
        config = self.config
        steps_total = _planned_steps(loader, config)
        done = self.ckpt.done_before if self.ckpt is not None else 0  # --resume: done before
        limit = config.max_steps if not done else steps_total - done
        steps_total -= done
        clock = EpochClock()
        self._clocks = StepClocks() if config.trace is not None else None
        self._last_live = prev_end = clock.start()
        times = _LoaderTimes()
        # --resume part-way: the loader starts at the first step not trained, in the same
        # order (the steps done before are never read); an interrupt whose raise Python
        # dropped is raised again at the next batch (`batches`)
        it: Iterator[Any] = batches(loader, epoch, start_step=done)
        step = 0
        try:
            while limit is None or step < limit:
                if not compute.agrees and pending():
                    break  # free-running ranks: the epoch's figures' allgather raises it
                self._at(f"waiting for batch {step + 1} of epoch {epoch + 1}", step)
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t_got = time.perf_counter_ns()
                self._step(epoch, step, steps_total, batch, clock, compute, t_got)
                step += 1
                times.add(batch, t_got, prev_end)
                prev_end = clock.last_ns
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # stop a generator left early (--max-steps) so workers settle
        wall = max(clock.end_ns - (clock.start_ns or clock.end_ns), 1)
        return clock, times.summary(loader.config.workers, wall)

    def _step(self, epoch: int, step: int, steps_total: int, batch: Any, clock: EpochClock,
              compute: _Compute, t_got: int) -> None:
        """One step on a batch received at `t_got`: to the device, wait for the other ranks,
        compute; the clock reads the batch ready and the compute done."""
        x, y = _to_device(batch, self.device)
        if self._clocks is not None:  # --trace: a tuple appended, nothing more
            self._clocks.add((t_got, time.perf_counter_ns() if self.device.type == "cuda"
                              else 0, batch.timing))
        self._at(f"waiting for the other ranks' batch {step + 1}", step)
        compute.wait_for_all_ranks()
        t_ready = clock.batch_ready()
        if step == 0 and self.world.is_root:  # the start-up's and first reads' CPU
            self._first_cpu = hostcpu.read()
        if (self.hooks.live is not None
                and t_ready - self._last_live >= self.hooks.live_interval_ns):
            self.hooks.live(epoch, step + 1, steps_total, clock)
            self._last_live = t_ready
        self._at(f"computing step {step + 1} of epoch {epoch + 1}", step)
        faults.at_step(self.fault, self.world.rank, epoch, step)
        end = compute.step(x, y, t_ready, batch.finish)
        clock.compute_done(len(batch.indices), batch.payload_bytes, end)
        if self.ckpt is not None:  # a checkpoint when due, its time outside the step's
            self._at(f"checkpointing after step {step + 1} of epoch {epoch + 1}", step)
            self.ckpt.after_step(epoch, clock)
        if (compute.kind == "model" and step == steps_total - 1
                and epoch == self.config.epochs - 1 and self.demand is None):
            # the run's last planned step, after its clock stopped: a copy, so that no
            # loader buffer stays held (`_measure_demand` times steps on it)
            self._last_batch = (x.clone(), y.clone(), batch.finish)

    def _record(self, rep: int, epoch: int, ranks: list[dict[str, Any]],
                stats: list[tuple[float, int, int]], report: cache.EvictReport,
                tier: dict[str, int] | None, host_cpu: dict[str, Any] | None) -> None:
        config, compute = self.config, self.compute
        assert compute is not None
        tot_loss = sum(s[0] for s in stats)
        tot_correct = sum(s[1] for s in stats)
        tot_seen = sum(s[2] for s in stats)
        classification = compute.task == "classification"
        training = {"samples": tot_seen,
                    "loss": tot_loss / tot_seen if tot_seen else None,
                    "accuracy": tot_correct / tot_seen if tot_seen and classification else None
                    } if compute.kind == "model" else None
        rec: dict[str, Any] = {"repeat": rep, "epoch": epoch, "summary": epoch_summary(ranks), "ranks": ranks,
               "per_node": node_summaries(ranks, list(report.per_node), report.warn_above),
               "cache": {"evicted": not config.warm_cache, **report.to_dict()},
               "training": training, "tier_bytes": tier, "host_cpu": host_cpu}
        if self.ckpt is not None:
            rec["checkpoint"] = epoch_record(ranks)
            if self.ckpt.done_before:  # --resume part-way: these figures are the steps run
                rec["resumed"] = self._resumed_epoch(self.ckpt.done_before)
        rec["warnings"] = _cache_warnings(config, self.mount, self.manifest, report)
        if training and training["loss"] is not None and not math.isfinite(training["loss"]):
            training["loss"] = None  # JSON has no NaN; say it instead
            rec["warnings"].append(f"training diverged in epoch {epoch + 1} (loss is not "
                                   "finite); lower --lr")
        for w in rec["warnings"]:
            if w not in self.warnings:
                self.warnings.append(w)
        self.epochs.append(rec)
        if self.hooks.progress is not None:
            self.hooks.progress(rec)

    def _resumed_epoch(self, done: int) -> dict[str, Any]:
        """`epochs[i].resumed`: an epoch `train --resume` started part-way, at step `done`
        of its order (every rank skipped its first `done` batches, never read them)."""
        batch = self.config.batch_size
        return {"steps_before": done, "samples_skipped": done * batch * self.world.size}

    def document(self, cluster_memory_bytes: int, status: str = "complete",
                 why: str | None = None) -> dict[str, Any]:
        """The result document (rank 0), `iobench.result` v2 (docs/results-schema.md).

        `status` is `complete`, or `interrupted` (SIGINT/SIGTERM) or `incomplete` (the
        watchdog ended a stuck job) with `why`: such a result holds the epochs that
        completed, and compare and report never average it with complete ones.
        """
        config, world = self.config, self.world
        compute: Any = self.compute or _NotBuilt(config)
        server = server_cache_check(config, self.mount, self.manifest, cluster_memory_bytes,
                                    world.num_nodes)
        device = describe_device(self.device)
        warnings = list(self.warnings) + device_warnings(device, compute.kind)
        if server and server["warning"]:
            warnings.append(server["warning"])
        if self.io_note:
            warnings.append(self.io_note)
        from iobench.pfs.control import FSTYPE as EMULATED_FSTYPE

        warnings += first_epoch_notes(self.epochs, self.mount.fstype == EMULATED_FSTYPE)
        if status != "complete":
            warnings.insert(0, f"{status.upper()}: {why}; the result holds the "
                            f"{len(self.epochs)} epoch(s) that completed")
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "status": status, "status_reason": why,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "kind": "train",
            "config": config.to_dict(),
            "world": self._world_section(),
            "compute": self._compute_section(compute, device),
            "cache": self._cache_section(server),
            "loader": {"name": config.loader, "startup": self.startups},
            "dataset": self.manifest.identity(),
            "provenance": {**sysinfo.provenance(self.manifest.root),
                           **({"user_data": self.manifest.extra["user_data"]}
                              if "user_data" in self.manifest.extra else {})},
            "epochs": self.epochs,
            "summary": _run_summary(self.epochs, time.perf_counter() - self.t_run,
                                    config.repeat),
            "warnings": warnings,
            "staging": None,
            **({"ceilings": self.ceilings} if self.ceilings is not None else {}),
            **({"checkpoint": self.ckpt.section(self.epochs)} if self.ckpt is not None else {}),
        }

    def _world_section(self) -> dict[str, Any]:
        world = self.world
        return {"size": world.size, "num_nodes": world.num_nodes,
                "local_size": world.local_size, "launcher": world.launcher,
                "nodes": list(world.node_names) or None,
                "backend": (("nccl" if self.device.type == "cuda" else "gloo")
                            if world.size > 1 else None),
                "device": self.device.type}

    def _compute_section(self, compute: Any, device: dict[str, Any]) -> dict[str, Any]:
        config = self.config
        model_name = compute.model_name
        return {"kind": compute.kind, "model": model_name, "parameters": compute.params,
                "task": compute.task, "compute_time_s": config.compute_time_s,
                "lr": compute.lr if model_name else None,
                "optimizer": "SGD(momentum=0.9, nesterov)" if model_name else None,
                "amp": config.amp and self.device.type == "cuda",
                "channels_last": config.channels_last,
                "decode": config.decode, "torch_threads": compute.threads,
                "device": device,
                "steps": _steps_mode(config, self.world),
                **({"demand": self.demand} if self.demand is not None else {})}

    def _cache_section(self, server: dict[str, Any] | None) -> dict[str, Any]:
        config = self.config
        return {"mode": "warm" if config.warm_cache else "cold",
                "method": None if config.warm_cache else "posix_fadvise(DONTNEED) per "
                "file, spread over the local ranks of each node"
                + (f", after --evict-cmd {config.evict_cmd!r} on each node's local "
                   "rank 0" if config.evict_cmd else ""),
                "evict_cmd": config.evict_cmd,
                "plan": cache.eviction_plan(self.mount).to_dict(),
                "user_space": self.cache_settings,
                "server_cache": server,
                "os_read_bytes_available": self.count_io,
                "os_read_bytes_note": self.io_note}


def _planned_steps(loader: Loader, config: TrainConfig) -> int:
    """An epoch's steps: the loader's, at most --max-steps."""
    steps = loader.steps_per_epoch()
    return steps if config.max_steps is None else min(steps, config.max_steps)


def _steps_mode(config: TrainConfig, world: World) -> str:
    """How ranks' steps relate: `synchronous`, `free-running`, or `single rank`."""
    if world.size == 1:
        return "single rank"
    if config.compute_kind == "model":
        return "synchronous (DDP all-reduce in backward)"
    return "synchronous (all-reduce before each step)" if config.step_sync else "free-running"


FIRST_EPOCH_GAP = 0.05  # stall fraction: epoch 1 this far from the later epochs' is said


def first_epoch_notes(epochs: list[dict[str, Any]], emulated: bool) -> list[str]:
    """A note when epoch 1's stall differs from the later epochs' in every repetition, the
    same way, by FIRST_EPOCH_GAP or more: epoch 1 opens the dataset's files, the later ones
    read through the files the loader keeps open (persistent workers), which is the steady
    state of a long job. Measured on the emulated PFS (docs/metrics.md, "Epoch 1")."""
    reps: dict[int, list[float]] = {}
    for ep in epochs:
        reps.setdefault(ep["repeat"], []).append(ep["summary"]["stall_fraction_mean"])
    pairs = [(f[0], statistics.median(f[1:])) for f in reps.values() if len(f) >= 2]
    if not pairs:
        return []
    gaps = [first - rest for first, rest in pairs]
    if not (all(g <= -FIRST_EPOCH_GAP for g in gaps) or all(g >= FIRST_EPOCH_GAP for g in gaps)):
        return []
    first = statistics.median(p[0] for p in pairs)
    rest = statistics.median(p[1] for p in pairs)
    where = (" On the emulated PFS a file kept open gets fewer reads in flight than a freshly "
             "opened one (a fresh open per epoch reads every epoch as fast as the first)."
             if emulated and first < rest else "")
    return [f"EPOCH 1 stalled {first:.0%} against {rest:.0%} in the later epochs, in every "
            f"repetition ({len(pairs)}): epoch 1 opened the dataset's files, the later epochs "
            "read through the files the loader kept open (persistent workers, as a long "
            f"training job does); take the later epochs as the steady state.{where}"]


def _cache_warnings(config: TrainConfig, mount: sysinfo.MountInfo, manifest: Manifest,
                    report: cache.EvictReport) -> list[str]:
    out = []
    if mount.kind == "memory":
        out.append(f"dataset is on {mount.fstype} (memory): every read comes from RAM and "
                   "cannot be evicted; these figures do not measure storage")
    if config.warm_cache:
        if manifest.total_bytes < sysinfo.memory_bytes():
            out.append("WARM CACHE (--warm-cache): no eviction, and the dataset fits in RAM, so "
                       "epochs after the first may read memory, not storage")
        return out
    if report.warning and mount.kind != "memory":
        out.append(report.warning)
        if report.status == "warm" and parse_format(manifest.format).maps_files:
            out.append(f"{manifest.format} readers map the dataset's files: pages a live reader (e.g. a "
                       "persistent loader worker) keeps mapped cannot be evicted, so cold-cache "
                       "epochs after the first are not assured with this loader")
    return out


# MLPerf Storage's rule: a dataset under 5x the memory that could cache it is not a
# storage benchmark (client caches are evicted; a server's cannot be, from a client).
SERVER_CACHE_FACTOR = 5
_LOCAL_KINDS = ("local", "memory", "overlay")


def server_cache_check(config: TrainConfig, mount: sysinfo.MountInfo, manifest: Manifest,
                       cluster_memory_bytes: int, nodes: int) -> dict[str, Any] | None:
    """The 5x rule for a dataset on a shared (parallel, network, FUSE) tier; None elsewhere.

    The cache size is `--server-cache-gb` when given, else the RAM of the
    job's nodes (MLPerf Storage's stand-in for caches no one measured). The
    emulated tier is exempt: its daemon drops its backing pages itself.
    """
    from iobench.pfs.control import FSTYPE as EMULATED_FSTYPE

    if config.warm_cache or mount.kind in _LOCAL_KINDS or mount.fstype == EMULATED_FSTYPE:
        return None
    if config.server_cache_gb is not None:
        cache_bytes = int(config.server_cache_gb * 1e9)
        source = "--server-cache-gb"
    else:
        cache_bytes = cluster_memory_bytes
        source = f"the RAM of the job's {nodes} node(s)"
    need = SERVER_CACHE_FACTOR * cache_bytes
    ok = manifest.total_bytes >= need
    if config.evict_cmd:  # the rule stands in for caches nobody emptied; the site's command did
        return {"factor": SERVER_CACHE_FACTOR, "cache_bytes": cache_bytes, "cache_source": source,
                "dataset_bytes": manifest.total_bytes, "required_bytes": need, "ok": ok,
                "waived_by": f"--evict-cmd {config.evict_cmd!r}", "warning": None}
    warning = None if ok else (
        f"cache may be served by the storage servers: the dataset is "
        f"{manifest.total_bytes / 1e9:.3g} GB on {mount.fstype}, under {SERVER_CACHE_FACTOR}x "
        f"{source} ({need / 1e9:.3g} GB); a client cannot empty a server's cache (GPFS "
        "pagepool, Lustre OSS memory), so cold epochs may read server memory: generate at "
        f"least {need / 1e9:.3g} GB, or give --server-cache-gb with the servers' real cache")
    return {"factor": SERVER_CACHE_FACTOR, "cache_bytes": cache_bytes, "cache_source": source,
            "dataset_bytes": manifest.total_bytes, "required_bytes": need, "ok": ok,
            "waived_by": None, "warning": warning}


def _run_summary(epochs: list[dict[str, Any]], elapsed_s: float, repeat: int) -> dict[str, Any]:
    """Totals over every epoch of every repetition, the last epoch's training figures, and
    the spread of the headline figures over repetitions (`iobench.core.spread.run_spread`)."""
    last = epochs[-1] if epochs else None
    sums = [e["summary"] for e in epochs]
    return {
        "epochs": len(epochs),
        "repeats": repeat,
        "elapsed_s": elapsed_s,
        "wall_s": sum(s["wall_s"] for s in sums),
        "stall_s_max": sum(s["stall_s_max"] for s in sums),
        "stall_s_mean": sum(s["stall_s_mean"] for s in sums),
        "samples": sum(s["samples"] for s in sums),
        "batch_bytes": sum(s["batch_bytes"] for s in sums),
        "final_loss": last["training"]["loss"] if last and last["training"] else None,
        "final_accuracy": last["training"]["accuracy"] if last and last["training"] else None,
        "spread": run_spread(epochs),
    }
