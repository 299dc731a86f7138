"""Which samples each rank's loader delivers, per epoch: a sharding check to run under a launcher.

`mpiexec -n 2 python -m iobench.loaders._coverage ROOT LOADER [--epochs E]
[--shuffle S] [--workers W] [--batch-size B]` iterates E epochs on every rank
and rank 0 prints one JSON line: {"world": n, "num_samples": N, "epochs":
[[indices of rank 0], [indices of rank 1], ...] per epoch, "steps": [...]},
so a test (or a user on a new cluster) can check that the ranks' shares are
disjoint, cover the dataset, and have equal step counts.
"""

from __future__ import annotations

import argparse
import json
import sys

from iobench.core.errors import IobenchError
from iobench.core.world import get_world
from iobench.loaders import LoaderConfig, make_loader


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m iobench.loaders._coverage")
    p.add_argument("root")
    p.add_argument("loader")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--shuffle", default="global")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--shuffle-window", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    world = get_world()
    try:
        cfg = LoaderConfig(batch_size=a.batch_size, workers=a.workers, shuffle=a.shuffle,
                           block_size=a.block_size, shuffle_window=a.shuffle_window,
                           seed=a.seed, decode=False)
        with make_loader(a.loader, a.root, cfg, world.rank, world.size) as loader:
            epochs, steps = [], []
            for e in range(a.epochs):
                got: list[int] = []
                n = 0
                for b in loader.epoch(e):
                    got.extend(b.indices.tolist())
                    n += 1
                epochs.append(world.allgather(got))
                steps.append(world.allgather(n))
            num = loader.manifest.num_samples
    except IobenchError as e:
        print(f"rank {world.rank}: error: {e}", file=sys.stderr)
        world.abort(2)
        return 2
    if world.rank == 0:
        print(json.dumps({"world": world.size, "num_samples": num, "epochs": epochs,
                          "steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
