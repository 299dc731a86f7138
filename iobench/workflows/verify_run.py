"""The `verify` workflow: a dataset's files against its manifest, then (--deep) every sample."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from iobench.core.dataref import DatasetRef, load_ref, locate
from iobench.core.errors import ConfigError, DatasetNotFoundError
from iobench.core.world import World


@dataclass(frozen=True)
class VerifyOutcome:
    """The dataset checked and every problem found (none: it is intact), on every rank."""

    dataset: DatasetRef
    problems: list[str]


def verify(path: str | Path, world: World, jobs: int = 1, deep: bool = False,
           allow_extra: bool = False, dataset_name: str | None = None,
           fmt: str | None = None) -> VerifyOutcome:
    """Check the dataset at `path` (its root, or the storage root holding it, as every other
    command takes it; `dataset_name` and `fmt` pick one of several): sizes, sha256, that
    each file opens
    (`iobench.generators.verify`); with `deep`, once those hold, every sample read and
    decoded (`iobench.loaders.readers.deep_check`), each rank its share. A collective."""
    from iobench.generators.verify import verify_dataset

    if jobs < 1:
        raise ConfigError(f"--jobs {jobs} must be >= 1")
    try:
        dataset = locate(path, dataset_name, fmt)
    except DatasetNotFoundError:
        if dataset_name or fmt or not Path(path).is_dir():
            raise
        # a folder holding no dataset: said as a dataset root's (generation unfinished?)
        dataset = load_ref(Path(path), str(Path(path).parent))
    root = dataset.root
    problems = verify_dataset(root, jobs=jobs, world=world, allow_extra=allow_extra)
    if deep and not problems:  # the files are what the manifest says: now each sample
        from iobench.loaders.readers import deep_check

        mine = deep_check(dataset.manifest, first=world.rank, step=world.size)
        problems = sorted(sum(world.allgather(mine), []))
    return VerifyOutcome(dataset, problems)
