"""What mpi4py a loader's worker processes hold, for the MPI-in-workers test.

Run as `mpiexec -n 2 python tests/mpi_worker_probe.py ROOT OUT`. Each rank joins MPI
(`get_world`), builds the real `files` loader with 2 worker processes and reads an
epoch twice: through iobench's own DataLoader (forked workers), and through a DataLoader
over the loader's reader and sampler whose workers are spawned (a fresh interpreter, as
DALI's GPU pipelines and any non-fork start method make them). After each batch a worker
writes OUT/<context>-<rank>-<pid>.json: the mpi4py modules it holds, and those it
imported itself (not inherited from its rank by fork). Rank 0 prints the epochs' sample
counts as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))


def _mpi_modules() -> set[str]:
    return {k for k in sys.modules if k == "mpi4py" or k.startswith("mpi4py.")}


class Probe:
    """A fetcher that records, in the worker that runs it, what mpi4py it has loaded."""

    def __init__(self, fetcher: Any, context: str, rank: int, out: str,
                 inherited: frozenset[str]) -> None:
        self.fetcher, self.context, self.rank, self.out = fetcher, context, rank, out
        self.inherited = inherited  # the rank's mpi4py modules when its workers were forked

    def __getitem__(self, key: Any) -> Any:
        item = self.fetcher[key]
        have = _mpi_modules()
        own = have if self.context == "spawn" else have - self.inherited
        doc = {"pid": os.getpid(), "context": self.context, "rank": self.rank,
               "mpi4py": sorted(have), "imported_here": sorted(own),
               "environ_pmi": sorted(k for k in os.environ if k.startswith("PMI"))}
        Path(self.out, f"{self.context}-{self.rank}-{os.getpid()}.json").write_text(
            json.dumps(doc))
        return item

    def __len__(self) -> int:
        return len(self.fetcher)


class Reads:
    """Reads a sampler key's samples with the loader's own reader (picklable, unlike the
    fetcher and its shared batch slots): what a spawned worker runs."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __getitem__(self, key: Any) -> Any:
        return self.reader.read(key[1]).labels


def _identity(x: Any) -> Any:
    return x


def main() -> int:
    from torch.utils.data import DataLoader

    from iobench.core.world import get_world
    from iobench.loaders import LoaderConfig, make_loader

    root, out = sys.argv[1], sys.argv[2]
    world = get_world()
    assert world.size == 2 and "mpi4py.MPI" in sys.modules  # MPI is up in every rank
    cfg = LoaderConfig(batch_size=4, workers=2, decode=False, seed=1, shuffle="global")
    counts = []
    with make_loader("files", root, cfg, world.rank, world.size) as ld:
        inherited = frozenset(_mpi_modules())
        ld.fetcher = Probe(ld.fetcher, "fork", world.rank, out, inherited)
        counts.append(sum(len(b.indices) for b in ld.epoch(0)))
        spawned = DataLoader(Probe(Reads(ld.reader), "spawn", world.rank, out, inherited),
                             batch_size=None, sampler=ld.sampler, num_workers=2,
                             collate_fn=_identity, multiprocessing_context="spawn")
        ld.sampler.epoch = 0
        counts.append(sum(len(labels) for labels in spawned))
    everyone = world.allgather(counts)
    if world.rank == 0:
        print(json.dumps({"counts": everyone}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
