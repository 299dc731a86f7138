"""The synthetic datasets iobench can generate (the on-disk formats: `iobench.core.formats`).

This table is the contract between `iobench.generators` (which writes) and
`iobench.loaders` (which reads): sample and label shapes and dtypes, default
sizes, and the real-world dataset each one imitates.
"""

from __future__ import annotations

from dataclasses import dataclass

from iobench.core.errors import ConfigError


@dataclass(frozen=True)
class DatasetSpec:
    """Shape of one synthetic dataset.

    `sample_shape` is None for variable-size encoded samples (JPEG), whose
    decoded shape differs per sample. Labels are class ids (`num_classes > 0`)
    or a float vector of regression targets (`num_classes == 0`).
    """

    name: str
    sample_kind: str  # "jpeg" (encoded bytes) or "array" (raw ndarray)
    sample_shape: tuple[int, ...] | None
    sample_dtype: str
    label_shape: tuple[int, ...]
    label_dtype: str
    num_classes: int
    default_samples: int
    full_samples: int
    default_samples_per_file: int
    files_extension: str  # extension of one sample file of a one-file-per-sample tree
    imitates: str
    # samples per step per rank when none is given: fits `default_samples` with >= 10
    # steps per epoch (cosmoflow: 1, as MLPerf HPC CosmoFlow and DLIO's workloads)
    default_batch_size: int = 64

    @property
    def array_shape(self) -> tuple[int, ...]:
        """`sample_shape` of an array dataset (a JPEG dataset has none: asking is a bug)."""
        assert self.sample_shape is not None, f"{self.name} holds JPEG samples"
        return self.sample_shape

    @property
    def sample_nbytes(self) -> int | None:
        """Bytes of one raw sample, or None when samples vary in size."""
        if self.sample_shape is None:
            return None
        import numpy as np

        return int(np.prod(self.sample_shape)) * np.dtype(self.sample_dtype).itemsize


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="imagenet", sample_kind="jpeg", sample_shape=None, sample_dtype="uint8",
            label_shape=(), label_dtype="int64", num_classes=1000,
            default_samples=1000, full_samples=1_281_167, default_samples_per_file=1024,
            files_extension=".JPEG",
            imitates="ILSVRC-2012 train: 1,281,167 JPEGs, ~138 GB, mean ~110 KB",
        ),
        DatasetSpec(
            name="cifar10", sample_kind="array", sample_shape=(32, 32, 3), sample_dtype="uint8",
            label_shape=(), label_dtype="int64", num_classes=10,
            default_samples=10_000, full_samples=50_000, default_samples_per_file=16_384,
            files_extension=".png",
            imitates="CIFAR-10 train: 50,000 32x32x3 images",
        ),
        DatasetSpec(
            name="cosmoflow", sample_kind="array", sample_shape=(128, 128, 128, 4),
            sample_dtype="int16", label_shape=(4,), label_dtype="float32", num_classes=0,
            default_samples=32, full_samples=524_288, default_samples_per_file=16,
            files_extension=".npy",
            imitates="MLPerf HPC CosmoFlow: 128^3 x 4 redshift dark-matter volumes, 4 parameters",
            default_batch_size=1,
        ),
        # MLPerf Storage's cosmoflow workload (iobench/core/workloads.py): the same field on a 71^3
        # box, 2,863,288 B per sample (+1.2% on MLPerf's 2,828,486 B), one file per sample
        DatasetSpec(
            name="cosmoflow-mlperf", sample_kind="array", sample_shape=(71, 71, 71, 4),
            sample_dtype="int16", label_shape=(4,), label_dtype="float32", num_classes=0,
            default_samples=64, full_samples=524_288, default_samples_per_file=1,
            files_extension=".npy",
            imitates="MLPerf Storage cosmoflow: 524,288 samples of 2,828,486 B +- 71,311",
            default_batch_size=1,
        ),
        # MLPerf Storage's unet3d workload: the same field on a 264^3 box, one .npz per
        # sample; stored depths vary (generators/synth.py DEPTH_SPREAD: MLPerf's mean and
        # spread), and the shape here is the fixed patch loaders crop or pad them to
        DatasetSpec(
            name="unet3d", sample_kind="array", sample_shape=(264, 264, 264, 4),
            sample_dtype="int16", label_shape=(4,), label_dtype="float32", num_classes=0,
            default_samples=7, full_samples=168, default_samples_per_file=1,
            files_extension=".npy",
            imitates="MLPerf Storage unet3d (KiTS19): 168 volumes of 146,600,628 B +- 68,341,808",
            default_batch_size=7,
        ),
        # MLPerf Storage's retinanet workload: imagenet's synthesis at 1.85x the side (long
        # side at most 1,600 px), so JPEGs average ~323 KB as OpenImages' do, one per file
        DatasetSpec(
            name="openimages", sample_kind="jpeg", sample_shape=None, sample_dtype="uint8",
            label_shape=(), label_dtype="int64", num_classes=1000,
            default_samples=256, full_samples=1_170_301, default_samples_per_file=1,
            files_extension=".JPEG",
            imitates="MLPerf Storage retinanet (OpenImages): JPEGs of mean 322,957 B",
            default_batch_size=24,
        ),
    )
}


def parse_dataset(name: str) -> DatasetSpec:
    """Return the spec for dataset `name`, or a ConfigError naming the choices."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}") from None


def dataset_dirname(dataset: str, fmt: str) -> str:
    """Directory name of a dataset under a storage root: `<dataset>-<format>`."""
    return f"{dataset}-{fmt}"
