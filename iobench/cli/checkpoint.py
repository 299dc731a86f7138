"""Write checkpoints with torch.distributed.checkpoint (one fsync'ed shard per rank), then read them back cold.

The layout is a llama3 model at MLPerf Storage's checkpoint size (llama3-8b: 105 GB over 8
processes; --scale shrinks every shard alike) or a model `iobench train` knows. Each of
--repeat checkpoints is committed with a completion marker; then each is evicted from the
page cache and read back, and the OS's read bytes are checked against the checkpoint's.
Launch plainly, or with `mpiexec -n R`, `srun` or `torchrun`; rank 0 prints and writes an
`iobench.checkpoint` result into --results. docs/checkpoint.md explains the figures.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from iobench.core.errors import IobenchError

LLAMA3_NAMES = ("llama3-8b", "llama3-70b", "llama3-405b", "llama3-1t")


# one of several ranks: interrupts wait for the ranks' first collective from the start
RANKED = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--storage", default=None, metavar="DIR",
                       help="write the checkpoints into a new folder in DIR (one filesystem "
                            "every rank sees), then read them back")
    where.add_argument("--read", default=None, metavar="DIR",
                       help="read a checkpoint `iobench checkpoint --keep` wrote (its folder, "
                            "ckpt-NNN) with as many ranks as wrote it; nothing is written")
    p.add_argument("--model", default="llama3-8b", metavar="NAME",
                   help=f"the layout: {', '.join(LLAMA3_NAMES)} (MLPerf Storage's sizes), or a "
                        "model `train` knows (cnn, resnet18, resnet50, cosmoflow: its state "
                        "dict and SGD momentum); default llama3-8b")
    p.add_argument("--scale", type=float, default=1.0, metavar="FRACTION",
                   help="llama3 layouts: each rank saves this share of the model's per-rank "
                        "bytes, keeping its tensor count and size mix (default 1: MLPerf's)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="write N checkpoints, then read N (MLPerf Storage: 10); with --read, "
                        "read it N times (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tensors' contents (default 0)")
    p.add_argument("--evict-cmd", default=None, metavar="CMD",
                   help="shell command that empties what no client can (a shared tier's server "
                        "caches), run by each node's local rank 0 before every read; without "
                        "it, reads on a shared tier are marked unverified, not cold")
    p.add_argument("--keep", action="store_true",
                   help="keep the checkpoints (default: removed after they were read)")
    p.add_argument("--mtbf", type=float, default=None, metavar="HOURS",
                   help="the job's mean time between failures: report Young's checkpoint "
                        "interval sqrt(2 x cost x MTBF) and the time lost per day at it")
    p.add_argument("--interval", type=float, default=None, metavar="SECONDS",
                   help="with --mtbf: the interval you checkpoint at now, to compare")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="a collective that waits longer fails the job (a dead rank; "
                        "default 600)")
    p.add_argument("--results", default="iobench-results", metavar="DIR",
                   help="where the result JSON goes (default: ./iobench-results)")


def main(args: argparse.Namespace) -> int:
    from iobench.core.interrupts import act_now
    from iobench.core.world import get_world

    # the CLI entered interrupts(defer=True) first thing (cli._ranked): several ranks act
    # on an interrupt together, at a collective; one process at once, from here
    world = get_world()
    if world.size == 1:
        act_now()
    return _run(args, world)


def _run(args: argparse.Namespace, world: Any) -> int:
    from iobench.workflows.checkpoint import CheckpointConfig, checkpoint_job

    try:
        cfg = CheckpointConfig(storage=args.storage, read=args.read, model=args.model,
                               scale=args.scale, repeat=args.repeat, seed=args.seed,
                               results=args.results, evict_cmd=args.evict_cmd, keep=args.keep,
                               timeout_s=args.timeout, mtbf_h=args.mtbf,
                               interval_s=args.interval)
    except IobenchError as e:
        if world.is_root:
            raise  # the same on every rank: printed once
        return e.exit_code
    outcome = checkpoint_job(cfg, world)
    if outcome.interrupted is not None:
        if world.is_root:
            print(f"iobench: interrupted ({outcome.interrupted}); the checkpoint being written "
                  "was removed, complete ones are untouched; no result written",
                  file=sys.stderr, flush=True)
    elif outcome.doc is not None:
        print_result(outcome.doc, str(outcome.path))
    return outcome.exit_code


def print_result(doc: dict[str, Any], path: str) -> None:
    """A short table: per checkpoint, write and read GB/s, duration and the slowest rank."""
    from rich.console import Console
    from rich.table import Table

    from iobench.core.spread import fmt_spread

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    lay = doc["layout"]
    for w in doc["warnings"]:
        console.print(f"[bold yellow]warning:[/] {w}", markup=True, soft_wrap=True)
    table = Table(title=f"checkpoint {lay['model']} x {doc['world']['size']} rank(s): "
                        f"{lay['tensors_per_rank']} tensors, "
                        f"{lay['rank_tensor_bytes'] / 1e6:,.1f} MB per rank")
    for col in ("phase", "#", "GB", "duration s (max)", "GB/s (total)", "GB/s (slowest rank)",
                "cache", "OS read"):
        table.add_column(col, justify="right")
    for phase, recs in (("write", doc["writes"]), ("read", doc["reads"])):
        for r in recs:
            table.add_row(phase, str(r["index"]), f"{r['bytes'] / 1e9:.3f}",
                          f"{r['duration_s']:.3f}", f"{r['throughput_GBps']:.3f}",
                          f"{r['rank_GBps_min']:.3f}",
                          r["cache"]["status"] if phase == "read" else "fsync",
                          r["os_read_check"] if phase == "read" else "")
    console.print(table)
    s = doc["summary"]
    for phase in ("write", "read"):
        sp = s[phase]["throughput_GBps"]
        if sp:
            console.print(f"{phase}: {fmt_spread(sp)} GB/s over {sp['n']} checkpoint(s), "
                          f"duration {fmt_spread(s[phase]['duration_s'])} s (median "
                          "[min-max])", markup=False)
    if s["read_gap_s"] is not None:
        console.print(f"the reads began {s['read_gap_s']:.1f} s after the last write ended "
                      "(MLPerf Storage v3.0 asks for at most 30 s)", markup=False)
    if s["young"] is not None:
        console.print(young_line(s["young"]), markup=False, soft_wrap=True)
    console.print(f"result: {path}", markup=False, soft_wrap=True)


def young_line(y: dict[str, Any]) -> str:
    """Young's interval in words, and the time lost per day at it (and at --interval)."""
    line = (f"checkpoint every {_dur(y['optimal_s'])} (Young: sqrt(2 x {y['cost_s']:.3g} s "
            f"per save x MTBF {y['mtbf_s'] / 3600:g} h)); expected loss "
            f"{_dur(y['lost_per_day_s'])} per day (saves, lost work, {y['restart_s']:.3g} s "
            "restarts)")
    if y["used_s"] is not None:
        line += (f"; every {_dur(y['used_s'])} as now: {_dur(y['lost_per_day_used_s'])} "
                 "per day")
    return line


def _dur(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"
