"""DatasetRef: the one object that names a run's dataset, resolved and validated once, passed down.

A dataset is either one `iobench generate` wrote (`STORAGE/<dataset>-<format>/`,
its manifest `iobench.json`) or the user's own data (`--data PATH`, with
`--data-key`/`--label-key`; an in-memory manifest, nothing written there).
Every workflow resolves its request here once, at its entry, and hands the
`DatasetRef` (with its manifest) to whatever reads the dataset; nothing else
turns (storage, dataset, format) strings into a folder (`dataset_root` is the
naming rule, and the only place it is applied).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from iobench.core.datasets import DATASETS, dataset_dirname
from iobench.core.errors import ConfigError, DatasetError, DatasetNotFoundError
from iobench.core.formats import DEFAULT_FORMAT, FORMATS, loader_formats
from iobench.core.manifest import MANIFEST_NAME, Manifest

RESULTS_OPTION = "--results"


def dataset_root(storage: str | Path, dataset: str, fmt: str) -> Path:
    """`STORAGE/<dataset>-<format>`: where a generated dataset lives (or will)."""
    return Path(storage) / dataset_dirname(dataset, fmt)


@dataclass(frozen=True)
class DatasetRef:
    """A dataset found and checked: its folder, name, format, manifest, and the user-data keys.

    `storage` is what the user named: the storage root holding the dataset's
    folder, or the `--data` path itself (a file or a folder) for the user's data.
    """

    storage: str
    root: Path  # the folder holding the dataset's files (the user's folder for --data)
    dataset: str
    format: str
    manifest: Manifest = field(repr=False, compare=False)
    data: str | None = None  # the user's --data path, as given
    data_key: str | None = None
    label_key: str | None = None

    @property
    def user_data(self) -> bool:
        """True for the user's own data (`--data`), False for a generated dataset."""
        return self.data is not None

    def sibling(self, fmt: str) -> DatasetRef | None:
        """The same generated dataset in format `fmt` beside this one, if it is there."""
        if self.user_data:
            return None
        try:
            return load_ref(dataset_root(self.storage, self.dataset, fmt), self.storage)
        except DatasetNotFoundError:
            return None

    def refuse_inside(self, path: str | Path, option: str = RESULTS_OPTION,
                      copies: Iterable[str | Path] = ()) -> None:
        """A ConfigError when `path` (an output directory) lies in the user's data tree (iobench
        reads `--data` and never writes there), in this dataset's folder, in its copy under
        each storage root of `copies` (a stage destination, which may not exist yet), or in
        any other dataset's folder (`refuse_in_dataset`)."""
        if self.user_data and Path(self.storage).is_dir():
            data = Path(self.storage).resolve()
            out = Path(path).resolve()
            if out == data or data in out.parents:
                raise ConfigError(f"{option} {path} is inside --data {self.data}: iobench never "
                                  f"writes into your data; give {option} a directory outside it")
        roots = [dataset_root(c, self.dataset, self.format) for c in copies]
        refuse_in_dataset(path, option, *([] if self.user_data else [self.root]), *roots)


def dataset_around(path: str | Path) -> Path | None:
    """The dataset folder (one holding a manifest) that `path` is or lies in, or None."""
    for folder in (Path(path).resolve(), *Path(path).resolve().parents):
        try:
            if (folder / MANIFEST_NAME).is_file():
                return folder
        except OSError:  # unreadable: not a dataset iobench can see
            continue
    return None


def refuse_in_dataset(path: str | Path, option: str = RESULTS_OPTION, *roots: Path) -> None:
    """A ConfigError when `path` (an output directory) is or lies in a dataset folder: one of
    `roots` (a dataset a run reads or writes, there or not yet) or any folder holding a
    manifest. A file there is one the manifest does not list, and `verify` rejects the
    dataset for it."""
    out = Path(path).resolve()
    inside = next((r for r in roots if out == Path(r).resolve()
                   or Path(r).resolve() in out.parents), None) or dataset_around(out)
    if inside is not None:
        raise ConfigError(f"{option} {path} is inside the dataset {inside}: a file written "
                          "there makes `iobench verify` reject the dataset; give "
                          f"{option} a directory outside it")


class DatasetRequest(Protocol):
    """The fields of a run that name its dataset (`iobench.workflows.train.TrainConfig` has them)."""

    @property
    def loader(self) -> str: ...
    @property
    def storage(self) -> str: ...
    @property
    def dataset(self) -> str: ...
    @property
    def format(self) -> str | None: ...
    @property
    def data(self) -> str | None: ...
    @property
    def data_key(self) -> str | None: ...
    @property
    def label_key(self) -> str | None: ...


def for_loader(storage: str, dataset: str, loader: str, fmt: str | None = None) -> DatasetRef:
    """The dataset `loader` reads under the storage root `storage`: `<dataset>-<format>` with
    the format the loader's own (or, for dali, `fmt` or the one found); a clear error
    naming `iobench generate` when it is not there."""
    root_dir = Path(storage)
    if not root_dir.is_dir():
        raise DatasetNotFoundError(f"--storage {root_dir} is not a directory; give the directory "
                                   "you generated into (iobench generate --storage DIR)")
    if fmt is None and loader == "dali":  # whichever format exists
        found = [f for f in loader_formats("dali")
                 if (dataset_root(root_dir, dataset, f) / MANIFEST_NAME).is_file()]
        if len(found) > 1:
            raise ConfigError(f"{root_dir} holds {dataset} in several formats "
                              f"({', '.join(found)}); pick one with --format")
        fmt = found[0] if found else DEFAULT_FORMAT
    fmt = fmt or loader
    root = dataset_root(root_dir, dataset, fmt)
    if not (root / MANIFEST_NAME).is_file():
        raise DatasetNotFoundError(
            f"no {dataset} dataset in {fmt} format at {root}; create it with: "
            f"iobench generate --dataset {dataset} --format {fmt} --storage {root_dir}")
    ref = load_ref(root, storage)
    if ref.dataset != dataset:
        raise ConfigError(f"{root} holds {ref.dataset!r}, not {dataset!r}")
    return ref


def locate(storage: str | Path, dataset: str | None = None, fmt: str | None = None
           ) -> DatasetRef:
    """The one iobench dataset under a storage root, or at a dataset root itself.

    `dataset` and `fmt` narrow the choice; when they are not given and exactly
    one dataset matches, it is the one, so commands can take `--dataset`/`--format`
    from what is there. Several matches or none are one-line errors naming the
    options that fix them. The ref's `storage` is the storage root either way.
    """
    root = Path(storage)
    if (root / MANIFEST_NAME).is_file():
        ref = load_ref(root, str(root.parent))
        if (dataset or ref.dataset, fmt or ref.format) != (ref.dataset, ref.format):
            raise DatasetError(f"{root} holds {ref.dataset}/{ref.format}, not "
                               f"{dataset or ref.dataset}/{fmt or ref.format}: drop --dataset/"
                               "--format or give the ones it holds")
        return ref
    if not root.exists():
        raise DatasetNotFoundError(f"{root} does not exist; give the storage root you "
                                   "generated into (iobench generate --storage DIR)")
    if not root.is_dir():
        raise DatasetNotFoundError(f"{root} is not a directory; give the storage root you "
                                   "generated into (iobench generate --storage DIR)")
    if dataset and fmt and dataset_root(root, dataset, fmt).is_dir():
        # named, and there: its manifest says what is wrong (e.g. generation unfinished)
        return load_ref(dataset_root(root, dataset, fmt), str(root))
    found = [(d, f) for d in ([dataset] if dataset else DATASETS)
             for f in ([fmt] if fmt else FORMATS)
             if (dataset_root(root, d, f) / MANIFEST_NAME).is_file()]
    if len(found) == 1:
        return load_ref(dataset_root(root, *found[0]), str(root))
    if not found:
        d, f = dataset or "cifar10", fmt or DEFAULT_FORMAT
        what = (f"no dataset {dataset_dirname(dataset, fmt)} under {root}: "
                f"{dataset_root(root, dataset, fmt)} does not exist" if dataset and fmt
                else f"no {dataset or fmt or 'iobench'} dataset under {root}")
        raise DatasetNotFoundError(f"{what}; generate it with `iobench generate --dataset {d} "
                                   f"--format {f} --storage {root}`")
    names = ", ".join(f"{d}-{f}" for d, f in found)
    hint = "--format" if dataset else "--dataset and --format"
    raise ConfigError(f"{root} holds several datasets ({names}); pick one with {hint}")


def user_data(world: Any, data: str, data_key: str | None = None,
              label_key: str | None = None, loader: str | None = None) -> DatasetRef:
    """The user's data at `data`, its manifest built on rank 0 and sent to every rank (a
    collective; an error is raised on every rank). With `loader`, it must read that format."""
    from iobench.core.userdata import shared_manifest

    manifest = shared_manifest(world, data, data_key, label_key)
    if loader is not None and manifest.format != loader:
        raise ConfigError(f"--data {data} is {manifest.format} data; read it "
                          f"with --loader {manifest.format}")
    assert manifest.root is not None  # shared_manifest roots it at the user's folder
    return DatasetRef(storage=data, root=manifest.root, dataset=manifest.dataset,
                      format=manifest.format, manifest=manifest, data=data,
                      data_key=data_key, label_key=label_key)


def resolve(config: DatasetRequest, world: Any = None) -> DatasetRef:
    """The dataset a train-like request names: its `--data`, or its loader's dataset under
    `--storage`. A collective with `--data` (rank 0 lists the user's tree)."""
    if config.data is not None:
        from iobench.core.world import World

        return user_data(world or World(), config.data, config.data_key, config.label_key, config.loader)
    return for_loader(config.storage, config.dataset, config.loader, config.format)


def load_ref(root: Path, storage: str) -> DatasetRef:
    """The generated dataset at `root` (its manifest loaded and checked), named as found
    under the storage root `storage`."""
    manifest = Manifest.load(root)
    return DatasetRef(storage=storage, root=root, dataset=manifest.dataset,
                      format=manifest.format, manifest=manifest)
