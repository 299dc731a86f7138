"""Train a real model (or emulate one) with a real loader and measure data stall per epoch.

Reads STORAGE/<dataset>-<format>/ (as `iobench generate --storage STORAGE`
writes it), evicts the dataset from the page cache before every epoch
(unless --warm-cache), and writes one result JSON to --results. Launch
plainly, or with `mpiexec -n R`, `srun` or `torchrun`; rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from iobench.core.errors import ConfigError, IobenchError

_COMPUTE_WORDS = {
    "model": "real model {model} ({params:,} parameters): forward + backward{ar} + SGD step",
    "emulated": "emulated accelerator: {t} s per step (no model)",
    "none": "none: pure ingest, no compute",
}


# one of several ranks: interrupts wait for the ranks' first collective from the start
RANKED = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    from iobench.cli._workload import add_workload_arguments
    from iobench.core.datasets import DATASETS
    from iobench.core.formats import FORMATS
    from iobench.core.models import MODELS
    from iobench.workflows.train import LOADER_NAMES

    p.add_argument("--loader", default=None, choices=LOADER_NAMES,
                   help="reader to use (required with --storage unless --workload sets it; "
                        "with --data: the format of the data)")
    p.add_argument("--storage", default=None, metavar="DIR",
                   help="directory holding <dataset>-<format>/ (from `iobench generate`)")
    p.add_argument("--data", default=None, metavar="PATH",
                   help="your own data instead of --storage: an HDF5 or NetCDF-4 file or a "
                        "folder of them, an LMDB environment, or an ImageFolder tree "
                        "(class/xxx.jpg); read only, nothing is written there "
                        "(docs/training.md, 'Your own data')")
    p.add_argument("--data-key", default=None, metavar="NAME",
                   help="with --data (HDF5/NetCDF): the array of samples, one row each "
                        "(default: detected)")
    p.add_argument("--label-key", default=None, metavar="NAME",
                   help="with --data: the 1-D integer array of class labels (HDF5/NetCDF), "
                        "or the LMDB key of the labels record (default: detected)")
    p.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help="which dataset under --storage (default: cifar10)")
    p.add_argument("--format", default=None, choices=list(FORMATS),
                   help="on-disk format, for --loader dali (default: the one found)")
    p.add_argument("--model", default="auto", metavar="NAME",
                   help=f"auto, the default (cifar10: cnn, imagenet: resnet50, cosmoflow: cosmoflow), none "
                   f"(pure ingest), or one of: {', '.join(MODELS)}")
    p.add_argument("--compute-time", type=float, default=None, metavar="SECONDS",
                   help="emulate an accelerator that computes SECONDS per step (no model)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per repetition, each from a cold cache (default 3; with "
                        "--workload, the workload's: 5, retinanet 8)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per step per rank (default: per dataset, "
                   + ", ".join(f"{d.name} {d.default_batch_size}" for d in DATASETS.values())
                   + ")")
    p.add_argument("--workers", type=int, default=2, help="loader workers per rank (default 2)")
    p.add_argument("--worker-type", default="process", choices=("process", "thread"),
                   help="loader workers as processes (PyTorch DataLoader) or threads "
                        "(default: process)")
    p.add_argument("--shuffle", default="global", choices=("global", "block", "none"),
                   help="global: every sample in random order; block: random blocks of "
                        "consecutive samples, shuffled within a window; none: file order "
                        "(default: global)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sample order, augmentation and model (default 0)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N", help="steps per epoch at most")
    p.add_argument("--no-decode", action="store_true",
                   help="read stored bytes only, no decoding (needs --model none or --compute-time)")
    p.add_argument("--warm-cache", action="store_true",
                   help="do not evict the dataset from the page cache before each epoch")
    p.add_argument("--drop-caches", action="store_true",
                   help="root only: also drop the node's whole page cache "
                        "(/proc/sys/vm/drop_caches) before each epoch")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: per model)")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast (CUDA only)")
    p.add_argument("--channels-last", action="store_true", help="channels-last memory format")
    _add_run_arguments(p)
    _add_checkpoint_arguments(p)
    add_workload_arguments(p)


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """How the run is watched, labelled, repeated, judged and staged; where results go."""
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="end the whole job when a rank makes no progress for this long (a "
                        "frozen or dead rank), naming it; results so far are kept, marked "
                        "incomplete (default 300)")
    p.add_argument("--tier", default=None, metavar="NAME",
                   help="name of the storage tier, stored in the result; `iobench report` "
                        "names the run's tier by it (default: the tier's probe label, else "
                        "its filesystem and path)")
    p.add_argument("--results", default="iobench-results", metavar="DIR",
                   help="where the result JSON goes (default: ./iobench-results)")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="also write every rank's per-step spans (wait, fetch, decode, "
                        "host-to-device, compute) to FILE as Chrome trace-event JSON, for "
                        "Perfetto or chrome://tracing; `iobench report` draws it "
                        "(docs/training.md, 'A timeline of every step')")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="N independent cold repetitions of the whole run (fresh loader and "
                        "model each); figures are reported as median [min-max] with the "
                        "coefficient of variation (default 1; MLPerf Storage uses 5)")
    p.add_argument("--no-step-sync", action="store_true",
                   help="with --compute-time or --model none on several ranks: let ranks run "
                        "free instead of waiting for every rank's batch at each step as "
                        "data-parallel training (and DLIO 2.0, a barrier per step) does")
    p.add_argument("--server-cache-gb", type=float, default=None, metavar="GB",
                   help="size of the storage servers' caches (GPFS pagepool, Lustre OSS "
                        "memory); a dataset under 5x this (default: 5x the nodes' RAM) on a "
                        "shared tier is flagged, since clients cannot evict server caches")
    p.add_argument("--au-threshold", type=float, default=None, metavar="FRACTION",
                   help="the verdict: accelerator utilisation at or above this keeps up "
                        "(default 0.90, MLPerf Storage's; with --workload, the workload's)")
    p.add_argument("--evict-cmd", default=None, metavar="CMD",
                   help="shell command that empties what no client can (a shared filesystem's "
                        "server caches, a remount), run by each node's local rank 0 before "
                        "every cold epoch and before a --stage-to copy; without it, epochs on "
                        "a shared tier are marked unverified, not cold")
    p.add_argument("--stage-to", default=None, metavar="DIR2",
                   help="stage the dataset to DIR2 first (iobench stage), then train from the "
                        "copy; the result records staging and training together")
    p.add_argument("--stage-mode", default="replicate", choices=("replicate", "shard"),
                   help="with --stage-to: a full copy per node, or each node only its ranks' "
                        "files (then each rank shuffles within its own files; default: replicate)")
    p.add_argument("--warm-source", action="store_true",
                   help="with --stage-to: do not evict the source before copying (stage_s may "
                        "then time a copy from memory; the result says so)")


def _add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    """Checkpoints while training (docs/checkpoint.md, 'Checkpoints in training')."""
    from iobench.workflows.train_checkpoint import DEFAULT_KEEP, MODES

    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="save the model and optimizer state every N steps with "
                        "torch.distributed.checkpoint (one file per rank, fsync'ed, committed "
                        "whole) and report the time steps were blocked by it, apart from the "
                        "data stall (needs --checkpoint-to; default: no checkpoints)")
    p.add_argument("--checkpoint-to", default=None, metavar="DIR",
                   help="where the checkpoints go (a folder iobench-train-<run id> in DIR, one "
                        "filesystem every rank sees; never inside the dataset); only the "
                        "newest --checkpoint-keep complete ones stay")
    p.add_argument("--checkpoint-mode", default="sync", choices=MODES,
                   help="sync: the step waits for the whole save; async: DCP's async_save, "
                        "the step waits only for the copy to CPU memory (and a previous save "
                        "still in flight), the write goes on in the background (default: sync)")
    p.add_argument("--checkpoint-keep", type=int, default=DEFAULT_KEEP, metavar="K",
                   help="complete checkpoints kept in DIR (and DIR2); older ones are removed "
                        f"to bound the disk used (default {DEFAULT_KEEP})")
    p.add_argument("--drain-to", default=None, metavar="DIR2",
                   help="the burst-buffer pattern: rank 0 copies each committed checkpoint to "
                        "DIR2 (the shared tier) in the background and commits it there whole; "
                        "the result gives each drain's time and the data stall of steps "
                        "taken while a drain ran against the others (default: no drain)")
    p.add_argument("--resume", action="store_true",
                   help="carry on from the newest complete checkpoint in --checkpoint-to DIR "
                        "(any earlier run's; a .partial one a killed or failed save left is "
                        "never taken): its model and optimizer state loaded with DCP, its "
                        "epoch and step counted on; refused in one line for another model, "
                        "dataset, world size or batch size (default: start from step 0)")
    p.add_argument("--mtbf", type=float, default=None, metavar="HOURS",
                   help="with --checkpoint-every: the job's mean time between failures; the "
                        "verdict gives Young/Daly's interval sqrt(2 x cost x MTBF) in seconds "
                        "and steps, and the time lost per day at it and at N (default: none)")


def build_config(args: argparse.Namespace) -> Any:
    from iobench.core.datasets import parse_dataset
    from iobench.workflows.train import TrainConfig

    _apply_workload(args)
    batch = args.batch_size
    loader, storage, dataset, model = args.loader, args.storage, args.dataset, args.model
    if args.data is not None:
        from iobench.core.userdata import USER_DATASET, detect_format

        if storage is not None or dataset is not None:
            raise ConfigError("give --storage/--dataset (a dataset from `iobench generate`) or "
                              "--data (your own), not both")
        if args.stage_to:
            raise ConfigError("--stage-to copies datasets iobench generated; with --data, "
                              "copy your data to the faster tier and run again from there")
        loader = loader or detect_format(args.data)
        storage, dataset = args.data, USER_DATASET
        if model == "auto" and args.compute_time is None:
            model = "none"  # no model fits data iobench knows nothing about: pure ingest
        batch = batch or 64
    elif storage is None:
        raise ConfigError("--storage DIR (a dataset from `iobench generate`) or --data PATH "
                          "(your own data) is required")
    elif loader is None:
        from iobench.workflows.train import LOADER_NAMES

        raise ConfigError("--loader is required with --storage; choose one of: "
                          + ", ".join(LOADER_NAMES))
    else:
        dataset = dataset or "cifar10"
    if batch is None:
        batch = parse_dataset(dataset).default_batch_size
    return TrainConfig(loader=loader, storage=storage, dataset=dataset, data=args.data,
                       data_key=args.data_key, label_key=args.label_key,
                       format=args.format, model=model, compute_time_s=args.compute_time,
                       epochs=args.epochs, batch_size=batch, workers=args.workers,
                       worker_type=args.worker_type, shuffle=args.shuffle, seed=args.seed,
                       max_steps=args.max_steps, decode=not args.no_decode,
                       warm_cache=args.warm_cache, drop_caches=args.drop_caches, lr=args.lr,
                       amp=args.amp,
                       channels_last=args.channels_last, timeout_s=args.timeout,
                       results=args.results, repeat=args.repeat,
                       step_sync=not args.no_step_sync, server_cache_gb=args.server_cache_gb,
                       au_threshold=args.au_threshold, evict_cmd=args.evict_cmd,
                       tier=args.tier,
                       trace=None if args.trace is None else os.path.abspath(args.trace),
                       checkpoint=_checkpoint_plan(args))


def _checkpoint_plan(args: argparse.Namespace) -> Any:
    from iobench.workflows.train_checkpoint import plan_from_options

    return plan_from_options(args.checkpoint_every, args.checkpoint_to, args.checkpoint_mode,
                             args.checkpoint_keep, args.drain_to, args.mtbf, args.resume)


def _apply_workload(args: argparse.Namespace) -> None:
    """`--workload W --accelerator A`: W's dataset, loader, batch, compute time (no model, no
    decoding, as MLPerf Storage emulates it), epochs and AU threshold."""
    from iobench.cli._workload import clash, workload_of

    run = workload_of(args)
    if run is None:
        args.epochs = 3 if args.epochs is None else args.epochs
        args.au_threshold = 0.90 if args.au_threshold is None else args.au_threshold
        return
    w = run.workload
    if args.data is not None:
        raise ConfigError(f"--workload {w.name} reads the dataset iobench generates for it "
                          "(--storage DIR), --data reads your own: give one of them")
    clash("--dataset", args.dataset, w.dataset, w.name)
    clash("--batch-size", args.batch_size, run.batch, w.name)
    clash("--compute-time", args.compute_time, run.compute_s, w.name)
    if args.model not in ("auto", "none"):
        raise ConfigError(f"--model {args.model} runs a real model and --workload {w.name} "
                          "emulates its compute: drop one of them")
    args.loader = args.loader or w.loader
    args.dataset, args.batch_size, args.compute_time = w.dataset, run.batch, run.compute_s
    args.no_decode = True
    args.epochs = w.epochs if args.epochs is None else args.epochs
    args.au_threshold = w.au_threshold if args.au_threshold is None else args.au_threshold


def build_request(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(the training config, the `--stage-to` plan or None, the `--workload` run or None);
    a bad option is raised the same on every rank."""
    from iobench.cli._workload import workload_of
    from iobench.workflows.train_run import StagePlan

    try:
        config = build_config(args)
        if args.warm_source and not args.stage_to:
            raise ConfigError("--warm-source applies to the staging copy: add --stage-to DIR2, "
                              "or drop --warm-source")
        stage = StagePlan(args.stage_to, args.stage_mode, warm_source=args.warm_source,
                          progress=sys.stderr.isatty(), log_progress=not sys.stderr.isatty()
                          ) if args.stage_to else None
        return config, stage, workload_of(args)
    except IobenchError as e:
        e.agreed = True  # same on every rank
        raise


def main(args: argparse.Namespace) -> int:
    from iobench.core import faults
    from iobench.core.interrupts import act_now
    from iobench.core.world import get_world
    from iobench.workflows.train_run import train_job

    faults.at_start()  # tests only: a no-op unless IOBENCH_TEST_FAULT is set
    world = get_world()
    if world.size == 1:  # alone: an interrupt acts at once (it was deferred until now)
        act_now()
    try:
        config, stage, workload = build_request(args)
    except IobenchError as e:
        if world.is_root:
            raise  # the CLI prints it once
        return e.exit_code
    out = _Output(world, config)
    outcome = train_job(config, world, stage=stage, workload=workload, hooks=out.hooks())
    if outcome.interrupted is not None:
        _interrupted(outcome, world)
    elif outcome.doc is not None and outcome.path is not None:
        out.finish(outcome.doc, outcome.path)
    return outcome.exit_code


def _interrupted(outcome: Any, world: Any) -> None:
    """What an interrupt left: the epochs that completed, written, or nothing."""
    doc = outcome.doc
    if doc is not None and doc["epochs"]:
        print(f"iobench: interrupted ({outcome.interrupted}) after {len(doc['epochs'])} "
              f"complete epoch(s); result marked interrupted: {outcome.path}",
              file=sys.stderr, flush=True)
    elif world.is_root:
        print(f"iobench: interrupted ({outcome.interrupted}) before any epoch completed; no "
              "result written", file=sys.stderr, flush=True)


def spread_line(doc: dict[str, Any]) -> str:
    """The headline figures over repetitions: median [min-max], with the CV of each."""
    from iobench.core.spread import fmt_spread

    names = {"epoch_wall_s": "epoch wall s", "stall_s": "stall s", "au": "AU",
             "samples_per_s": "samples/s", "read_MBps": "MB/s"}
    parts = []
    for key, label in names.items():
        sp = doc["summary"]["spread"].get(key)
        if sp:
            cv = f", CV {sp['cv']:.0%}" if sp["cv"] is not None else ""
            parts.append(f"{label} {fmt_spread(sp)}{cv}")
    return (f"over {doc['config']['repeat']} repetitions, median [min-max]: "
            + "; ".join(parts))



def _resumed(epoch: dict[str, Any]) -> str:
    """` (resumed at step S+1)` for an epoch `train --resume` began part-way (its figures
    are those of the steps from there on), else nothing."""
    r = epoch.get("resumed")
    return f" (resumed at step {r['steps_before'] + 1})" if r else ""


class _Output:
    """Rank 0's console output: a header, a line per epoch, a table at the end."""

    def __init__(self, world: Any, config: Any) -> None:
        from rich.console import Console

        self.config = config
        self.on = world.is_root
        # not a terminal (a log file, a batch job): wide enough that tables do not wrap
        self.console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
        self.world = world
        self.shown: set[str] = set()
        self.redraw = False

    def hooks(self) -> Any:
        """The console's ears on the job (rank 0 prints; the others stay quiet)."""
        from iobench.workflows.train_run import TrainHooks

        return TrainHooks(started=self.start, progress=self.epoch, live=self.live,
                          live_interval_s=self.live_interval_s, tier=self.tier,
                          warning=self.warning)

    def tier(self, tier: dict[str, Any]) -> None:
        if self.on:
            self.console.print(f"[bold yellow]{tier['note']}[/] (profile "
                               f"{tier['profile'].get('name')}, backing {tier['backing']})")

    def warning(self, message: str) -> None:
        if self.on:
            self.console.print(f"[bold yellow]warning: {message}[/]")

    def start(self, dataset: Any) -> None:
        if not self.on:
            return
        c = self.config
        cache = "WARM (--warm-cache: no eviction)" if c.warm_cache else "cold (evicted before every epoch)"
        compute = {"model": f"real model {c.model_name}",
                   "emulated": f"emulated accelerator, {c.compute_time_s} s per step",
                   "none": "none (pure ingest" + (", no decode)" if not c.decode else ")")
                   }[c.compute_kind]
        what = "your data" if c.data else c.dataset
        self.console.print(f"[bold]iobench train[/] {what} via {c.loader} from {dataset.storage}: "
                           f"{self.world.size} rank(s), batch {c.batch_size}/rank, "
                           f"{c.workers} {c.worker_type} worker(s), shuffle {c.shuffle}")
        import torch

        from iobench.workflows.train import describe_device, device_warnings, device_words

        use_cuda = torch.cuda.is_available()
        device = describe_device(torch.device(f"cuda:{self.world.local_rank}" if use_cuda
                                              else "cpu"))
        self.console.print(f"compute: {compute} on {device_words(device)}; cache: {cache}")
        for w in device_warnings(device, c.compute_kind):
            self.shown.add(w)
            self.console.print(f"[bold red]WARNING:[/] {w}")

    @property
    def live_interval_s(self) -> float:
        # a terminal gets a line redrawn in place; a log file a line a minute
        return 1.0 if sys.stdout.isatty() else 60.0

    def live(self, epoch: int, step: int, steps: int, clock: Any) -> None:
        """Progress inside an epoch (rank 0's own figures so far)."""
        import time

        from iobench.core.metrics import fmt_rate

        elapsed = (time.perf_counter_ns() - clock.start_ns) / 1e9
        line = (f"epoch {epoch + 1}/{self.config.epochs}: step {step}/{steps}, "
                f"{fmt_rate(clock.samples / elapsed)} samples/s, "
                f"stall {sum(clock.wait_ns) / 1e9 / elapsed:.1%} so far (rank 0)")
        if sys.stdout.isatty():
            sys.stdout.write(f"\r{line}\x1b[K")
            sys.stdout.flush()
            self.redraw = True
        else:
            print(line, flush=True)

    def epoch(self, rec: dict[str, Any]) -> None:
        from iobench.core.metrics import fmt_rate
        from iobench.workflows.train_checkpoint import epoch_words

        if not self.on:
            return
        if self.redraw:  # clear the live line
            sys.stdout.write("\r\x1b[K")
            self.redraw = False
        for w in rec["warnings"]:
            if w not in self.shown:
                self.shown.add(w)
                self.console.print(f"[bold red]WARNING:[/] {w}")
        s, t = rec["summary"], rec["training"]
        rep = (f"repeat {rec['repeat'] + 1}/{self.config.repeat}, "
               if self.config.repeat > 1 else "")
        line = (f"{rep}epoch {rec['epoch'] + 1}/{self.config.epochs}{_resumed(rec)}: "
                f"{s['steps']} steps, "
                f"{fmt_rate(s['samples_per_s'])} samples/s, {fmt_rate(s['read_MBps'])} MB/s, "
                f"stall {s['stall_fraction_max']:.1%} (max {s['stall_s_max']:.2f} s of "
                f"{s['wall_s']:.2f} s), AU {s['au_mean']:.2f}")
        line += epoch_words(rec)
        if t and t["accuracy"] is not None:
            line += f", train acc {t['accuracy']:.3f}"
        if t:
            line += ", loss diverged" if t["loss"] is None else f", train loss {t['loss']:.4f}"
        self.console.print(line)
        nodes = rec.get("per_node") or []
        if len(nodes) > 1:  # each node's pace and cache, so a straggler shows as it happens
            self.console.print("  per node: " + "; ".join(
                f"{n['name']} {fmt_rate(n['samples_per_s'])} samples/s, stall "
                f"{n['stall_s']:.2f} s, cached "
                + ("?" if n["cache_resident_fraction_at_start"] is None
                   else f"{n['cache_resident_fraction_at_start']:.0%}")
                + (f" ({n['cache'].upper()})" if n["cache"] else "") for n in nodes),
                highlight=False, soft_wrap=True)

    def finish(self, doc: dict[str, Any], path: Any) -> None:
        from rich.table import Table

        from iobench.core.metrics import fmt_rate

        comp = doc["compute"]
        words = _COMPUTE_WORDS[comp["kind"]].format(model=comp["model"], params=comp["parameters"] or 0,
                                                    t=comp["compute_time_s"],
                                                    ar=" + DDP all-reduce" if doc["world"]["size"] > 1 else "")
        table = Table(title=f"run {doc['run_id']}  ·  compute: {words}")
        reps = doc["config"]["repeat"] > 1
        for col in (("repeat",) if reps else ()) + ("epoch", "wall s", "stall s (max)", "stall %", "AU", "samples/s", "MB/s",
                    "OS read MB", "cached at start", "loss", "acc"):
            table.add_column(col, justify="right")
        for e in doc["epochs"]:
            s, t = e["summary"], e["training"] or {}
            res = e["cache"]["resident_fraction"]
            table.add_row(*((str(e["repeat"] + 1),) if reps else ()),
                          str(e["epoch"] + 1) + _resumed(e), f"{s['wall_s']:.2f}",
                          f"{s['stall_s_max']:.2f}",
                          f"{s['stall_fraction_max']:.1%}", f"{s['au_mean']:.2f}",
                          fmt_rate(s["samples_per_s"]), fmt_rate(s["read_MBps"]),
                          "n/a" if s["os_read_bytes"] is None else f"{s['os_read_bytes'] / 1e6:.1f}",
                          "unknown" if res is None else f"{res:.0%}",
                          "" if t.get("loss") is None else f"{t['loss']:.3f}",
                          "" if t.get("accuracy") is None else f"{t['accuracy']:.3f}")
        self.console.print(table)
        if reps:
            self.console.print(spread_line(doc), markup=False)
        self.console.print(f"compute: {words}; cache: {doc['cache']['mode']}; steps: "
                           f"{doc['compute']['steps']}")
        user = doc["provenance"].get("user_data")
        if user:
            from iobench.core.userdata import describe

            self.console.print(f"data: {describe(user)}", markup=False, soft_wrap=True)
        for w in doc["warnings"]:  # the run's own (epoch 1 against the rest, ...), once
            if w not in self.shown:
                self.shown.add(w)
                self.console.print(f"[bold red]WARNING:[/] {w}")
        self.console.print(f"result: {path}")
        from iobench.workflows.train_checkpoint import checkpoint_line

        if (ckpt := checkpoint_line(doc)) is not None:
            print(ckpt, flush=True)
        print(doc["summary"]["verdict"]["line"], flush=True)  # one line, never wrapped
