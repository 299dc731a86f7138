"""Check a dataset against its manifest: sizes, sha256 checksums, that every file
opens with its format's library holding samples of the dataset's dtype, shape,
keys, labels in range and image kind (magic bytes), and that nothing else is in
the folder. Exit code 0 only when all is well."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from iobench.core.datasets import DATASETS
    from iobench.core.formats import FORMATS

    p.add_argument("path", help="the dataset root (the directory holding iobench.json), or the "
                                "storage root it was generated into (as --storage elsewhere)")
    p.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help="which dataset under a storage root holding several")
    p.add_argument("--format", default=None, choices=list(FORMATS),
                   help="which format under a storage root holding several")
    p.add_argument("--jobs", type=int, default=1, help="checking processes per rank (default: 1)")
    p.add_argument("--deep", action="store_true",
                   help="also read every sample with its format's reader and decode every "
                        "JPEG strictly (dtype, shape, key and label of each; slower: reads "
                        "and decodes the whole dataset)")
    p.add_argument("--allow-extra", action="store_true",
                   help="accept files in the dataset folder that the manifest does not list "
                        "(default: each is a problem, e.g. a leftover of an interrupted copy)")


def main(args: argparse.Namespace) -> int:
    from iobench.core.world import get_world
    from iobench.workflows.verify_run import verify

    world = get_world()
    out = verify(args.path, world, jobs=args.jobs, deep=args.deep, allow_extra=args.allow_extra,
                 dataset_name=args.dataset, fmt=args.format)
    if not world.is_root:
        return 1 if out.problems else 0
    for p in out.problems:
        print(p, file=sys.stderr)
    m = out.dataset.manifest
    if out.problems:
        print(f"{m.root}: {len(out.problems)} problem(s) in {len(m.files)} files",
              file=sys.stderr)
        return 1
    print(f"{m.root}: OK ({len(m.files)} files, {m.num_samples} samples, "
          f"{m.total_bytes / 1e6:.1f} MB)")
    return 0
