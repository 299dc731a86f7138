"""`iobench train` with one rank's loader slowed, for the step-synchronisation test.

Run as `mpiexec -n 2 python tests/slow_rank_train.py --slow-rank 1 --slow-s 0.1 TRAIN ARGS`.
It is the CLI's training path with the loader wrapped (tests/wrappers.py `Slow`);
rank 0 writes the result into --results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from iobench.cli.train import add_arguments, build_config
from iobench.core import distributed, results
from iobench.core.world import get_world
from iobench.loaders import make_loader
from iobench.workflows import train
from wrappers import Slow


def main() -> int:
    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--slow-rank", type=int, required=True)
    p.add_argument("--slow-s", type=float, required=True)
    args = p.parse_args()
    world = get_world()
    config = build_config(args)
    distributed.init_process_group(world, False, config.timeout_s)

    def factory(manifest, lc, rank, size):
        loader = make_loader(config.loader, manifest, lc, rank, size)
        return Slow(loader, args.slow_s) if rank == args.slow_rank else loader

    try:
        doc = train.run(config, factory, world)
    finally:
        distributed.destroy_process_group()
    if doc is not None:
        print(results.write_result(doc, config.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
