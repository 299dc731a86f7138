#!/usr/bin/env python3
"""Where `iobench checkpoint`'s save spends its time: each phase's start and end on each rank.

Runs `--saves` saves of a layout's shard the way `iobench checkpoint` does (its writer,
`lean_dcp`, its planner where the code has one), with DCP's planner, storage writer and
collectives wrapped to record the clock (`time.perf_counter_ns`, one clock for the
processes of one host) as each phase starts and ends. Prints, per save and rank, each
phase's [start-end] in ms from that rank's start of the save, `write_s` (to its shard
fsync'ed, as `iobench checkpoint` measures it) and `save_s` (to DCP's save returning); then
the medians of the first save and of the later ones. Under mpiexec for several ranks:

    mpiexec -n 2 .venv/bin/python scripts/bench/checkpoint_phases.py [--scale 0.03] [--saves 6]
        [--work /var/tmp/iobench-ckpt-phases]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EVENTS: list[tuple[str, int]] = []
PHASES = (  # (class's module, class, method, label)
    ("torch.distributed.checkpoint.default_planner", "DefaultSavePlanner", "set_up_planner",
     "setup"),
    ("torch.distributed.checkpoint.default_planner", "DefaultSavePlanner", "create_local_plan",
     "local_plan"),
    ("torch.distributed.checkpoint.utils", "_DistWrapper", "gather_object", "gather"),
    ("torch.distributed.checkpoint.default_planner", "DefaultSavePlanner",
     "create_global_plan", "global_plan"),
    ("torch.distributed.checkpoint.utils", "_DistWrapper", "scatter_object", "scatter"),
    ("torch.distributed.checkpoint.default_planner", "DefaultSavePlanner", "finish_plan",
     "finish_plan"),
    ("torch.distributed.checkpoint.filesystem", "FileSystemWriter", "write_data", "write_data"),
    ("iobench.core.checkpoint_write", "ShardWriter", "sync_close", "last_writes+fsync"),
    ("torch.distributed.checkpoint.filesystem", "FileSystemWriter", "finish", "metadata"),
    ("torch.distributed.checkpoint.utils", "_DistWrapper", "broadcast_object", "broadcast"),
)


def _timed(label: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        EVENTS.append((label + ">", time.perf_counter_ns()))
        try:
            return f(*args, **kwargs)
        finally:
            EVENTS.append((label + "<", time.perf_counter_ns()))
    return timed


def instrument() -> None:
    import importlib

    for module, cls, method, label in PHASES:
        owner = getattr(importlib.import_module(module), cls)
        setattr(owner, method, _timed(label, getattr(owner, method)))


def one_save(state: dict[str, Any], folder: Path, world: Any) -> dict[str, Any]:
    """One save as `iobench checkpoint` makes it; this rank's clock marks."""
    from torch.distributed.checkpoint.state_dict_saver import save

    from iobench.core import checkpoint_store
    from iobench.core.checkpoint_io import lean_dcp

    w = checkpoint_store.writer(folder, lambda: None, records=True)
    make = getattr(checkpoint_store, "save_planner", None)  # (older code: DCP's default)
    EVENTS.clear()
    t0 = time.perf_counter_ns()
    with lean_dcp():
        save(state, storage_writer=w, planner=make() if make else None,
             no_dist=world.size == 1)
    t1 = time.perf_counter_ns()
    return {"t0": t0, "write_ms": (w.shard_end_ns - t0) / 1e6, "save_ms": (t1 - t0) / 1e6,
            "events": [(name, (t - t0) / 1e6) for name, t in EVENTS]}


def spans(events: list[tuple[str, float]]) -> str:
    """'label [start-end]' for each phase, in the order they started."""
    open_at: dict[str, float] = {}
    out = []
    for name, ms in events:
        label = name[:-1]
        if name.endswith(">"):
            open_at[label] = ms
        elif label in open_at:
            out.append(f"{label} [{open_at.pop(label):.0f}-{ms:.0f}]")
    return " ".join(out)


def report(saves: list[list[dict[str, Any]]]) -> None:
    """Rank 0: every save's phases per rank, then the first and later saves' medians."""
    for k, ranks in enumerate(saves):
        print(f"save {k}:")
        for r, rec in enumerate(ranks):
            print(f"  rank {r}: write_s {rec['write_ms']:.0f} ms, save_s {rec['save_ms']:.0f} "
                  f"ms | {spans(rec['events'])}")
    worst = [max(rec["write_ms"] for rec in ranks) for ranks in saves]
    later = f"{statistics.median(worst[1:]):.0f} ms" if len(worst) > 1 else "-"
    print(f"\nwrite_s, slowest rank: first save {worst[0]:.0f} ms, later saves median "
          f"{later} ({' '.join(f'{x:.0f}' for x in worst)}); load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="/var/tmp/iobench-ckpt-phases")
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--scale", type=float, default=0.03)
    p.add_argument("--saves", type=int, default=6)
    a = p.parse_args()
    from iobench.core import distributed
    from iobench.core.checkpoint_layout import build_state, layout_for
    from iobench.core.world import get_world

    world = get_world()
    distributed.init_process_group(world, False, 600)
    instrument()
    state = build_state(layout_for(a.model, a.scale, world.size), world.rank, 0)
    work = Path(a.work) / world.bcast(f"run-{os.getpid()}")
    saves = []
    for k in range(a.saves):
        folder = work / f"ckpt-{k:03d}"
        if world.is_root:
            folder.mkdir(parents=True)
        world.barrier()
        saves.append(world.allgather(one_save(state, folder, world)))
    if world.is_root:
        report(saves)
        shutil.rmtree(work, ignore_errors=True)
    distributed.destroy_process_group()


if __name__ == "__main__":
    main()
