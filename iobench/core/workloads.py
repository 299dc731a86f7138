"""MLPerf Storage training workloads and accelerator types, in one table (docs/mlperf.md: sources).

A `Workload` holds what MLPerf Storage v3.0's workload configurations fix:
on-disk sample size and spread, samples per file, format, batch, emulated
compute time per accelerator type, AU threshold and epochs. `resolve`
turns `--workload W --accelerator A` into a `WorkloadRun`: the iobench
dataset, format and batch that reproduce it, and the dataset-size rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from iobench.core.errors import ConfigError
from iobench.core.formats import FILES, HDF5, NPZ

ACCELERATORS: tuple[str, ...] = ("a100", "h100", "b200", "mi355")
GIB = 1 << 30
MIN_STEPS_PER_ACCELERATOR = 500  # MLPerf's rule: at least 500 steps of every accelerator
HOST_MEMORY_FACTOR = 5  # ... and at least 5x the client hosts' memory
# bounds beyond any machine, so that a typo is refused rather than answered with 30 digits
MAX_ACCELERATORS = 1_000_000
MAX_HOSTS = 1_000_000
MAX_HOST_MEMORY_GB = 1 << 20  # GiB per host: 1 PiB


@dataclass(frozen=True)
class Workload:
    """One MLPerf Storage training workload (sizes in bytes, times in seconds per step)."""

    name: str
    mlperf_format: str  # what MLPerf writes (DLIO's `dataset.format`: its name, not iobench's)
    sample_bytes: int  # DLIO `record_length_bytes`
    sample_bytes_stdev: int  # DLIO `record_length_bytes_stdev` (0: every sample the same)
    samples_per_file: int
    batch: dict[str, int]  # accelerator -> samples per step per accelerator
    compute_s: dict[str, float]  # accelerator -> emulated seconds per step
    au_threshold: float
    epochs: int
    # how iobench reproduces it: its dataset and format (None: cannot yet, see `missing`),
    # read by that format's own loader
    dataset: str | None
    format: str
    note: str = ""  # how iobench's samples differ from MLPerf's
    missing: str = ""  # why `--workload` cannot run yet (empty when it can)
    accelerators: tuple[str, ...] = field(init=False)

    @property
    def loader(self) -> str:
        return self.format

    def __post_init__(self) -> None:
        if set(self.batch) != set(self.compute_s):
            raise ValueError(f"{self.name}: batch and compute_s name different accelerators")
        object.__setattr__(self, "accelerators", tuple(a for a in ACCELERATORS
                                                       if a in self.compute_s))


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload(
        name="unet3d", mlperf_format="npz", sample_bytes=146_600_628,
        sample_bytes_stdev=68_341_808, samples_per_file=1,
        batch={"a100": 7, "h100": 7, "b200": 7},
        compute_s={"a100": 0.636, "h100": 0.323, "b200": 0.162},
        au_threshold=0.90, epochs=5, dataset="unet3d", format=NPZ,
        note="one .npz per sample holding a d x 264 x 264 x 4 int16 volume of iobench's "
             "learnable CosmoFlow field instead of a KiTS19 CT volume; d varies per sample "
             "(log-normal, seeded) so sizes have MLPerf's mean and spread (146,600,628 B "
             "+- 68,341,808); the loader reads each file whole and crops or zero-pads it to a "
             "264-slice patch, so a batch stacks"),
    Workload(
        name="resnet50", mlperf_format="tfrecord", sample_bytes=114_660, sample_bytes_stdev=0,
        samples_per_file=1251, batch={"a100": 400, "h100": 400},
        compute_s={"a100": 0.435, "h100": 0.224},
        au_threshold=0.90, epochs=5, dataset="imagenet", format=HDF5,
        note="HDF5 files of 1,251 ImageNet-like JPEGs (variable size, mean ~110 KB) instead "
             "of TFRecord files of 1,251 fixed 114,660 B records: same samples per file, "
             "bytes per sample within 10%, but HDF5 reads each sample at an offset from the "
             "file's index where TFRecord is read as a stream"),
    Workload(
        name="cosmoflow", mlperf_format="tfrecord", sample_bytes=2_828_486,
        sample_bytes_stdev=71_311, samples_per_file=1, batch={"a100": 1, "h100": 1},
        compute_s={"a100": 0.00551, "h100": 0.00350},
        au_threshold=0.70, epochs=5, dataset="cosmoflow-mlperf", format=FILES,
        note="one .npy file per sample holding a 71^3 x 4 int16 volume (2,863,416 B with "
             "its header, +1.2%) of iobench's learnable CosmoFlow field, instead of one "
             "TFRecord per sample of gzip-compressed 128^3 x 4 volumes; every sample the "
             "same size (MLPerf's spread is +-71,311 B, 2.5%)"),
    Workload(
        name="retinanet", mlperf_format="jpeg", sample_bytes=322_957, sample_bytes_stdev=0,
        samples_per_file=1, batch={"b200": 24, "mi355": 32},
        compute_s={"b200": 0.04755, "mi355": 0.0634},
        au_threshold=0.85, epochs=8, dataset="openimages", format=FILES,
        note="one JPEG per file of iobench's ImageNet-like synthesis at 1.7x the side (mean "
             "321,317 B over 1,000 samples, -0.5%; std 151 KB) instead of OpenImages photos; MLPerf's records are all "
             "322,957 B"),
)}


def parse_workload(name: str) -> Workload:
    """The workload called `name`, or a ConfigError naming the choices."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ConfigError(f"unknown --workload {name!r}; choose one of: "
                          f"{', '.join(WORKLOADS)}") from None


@dataclass(frozen=True)
class WorkloadRun:
    """A workload on one accelerator type: what `--workload W --accelerator A` sets."""

    workload: Workload
    accelerator: str

    @property
    def batch(self) -> int:
        return self.workload.batch[self.accelerator]

    @property
    def compute_s(self) -> float:
        return self.workload.compute_s[self.accelerator]

    @property
    def demand_Bps(self) -> float:
        """Bytes per second one accelerator reads to stay busy: batch x sample / compute."""
        return self.batch * self.workload.sample_bytes / self.compute_s

    def required_samples(self, accelerators: int, hosts: int = 0,
                         host_memory_gb: float = 0.0) -> int:
        """MLPerf's minimum dataset: max(500 x batch x N, H x G x 5 GiB / sample bytes), in
        exact integer arithmetic (G as the decimal it was written as, rounded up once); a
        ConfigError for counts beyond any machine (`parse_accelerators`, `parse_host_memory`)."""
        parse_accelerators(accelerators)
        hosts, gib = parse_host_memory(hosts, host_memory_gb)
        steps = MIN_STEPS_PER_ACCELERATOR * self.batch * accelerators
        memory = hosts * gib * HOST_MEMORY_FACTOR * GIB  # bytes, exact
        return max(steps, -(-memory.numerator // (memory.denominator
                                                  * self.workload.sample_bytes)))

    def required_files(self, samples: int) -> int:
        return -(-samples // self.workload.samples_per_file)  # integers: exact at any size

    def describe(self) -> str:
        w = self.workload
        return (f"{w.name} on {self.accelerator}: batch {self.batch}, compute "
                f"{self.compute_s} s/step, samples of {w.sample_bytes:,} B, AU >= "
                f"{w.au_threshold:.2f}")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_accelerators(accelerators: int) -> int:
    """A count of accelerators: a whole number from 1 to MAX_ACCELERATORS; else a ConfigError."""
    if not _whole(accelerators) or not 1 <= accelerators <= MAX_ACCELERATORS:
        raise ConfigError(f"--accelerators {accelerators!r} must be a whole number from 1 to "
                          f"{MAX_ACCELERATORS:,}")
    return accelerators


def parse_host_memory(hosts: int, host_memory_gb: float) -> tuple[int, Fraction]:
    """(hosts, GiB of memory per host as an exact fraction: the decimal it was written as)
    for the 5x host memory rule; a ConfigError for a count or size beyond any machine, a
    negative one, or one that is not a finite number."""
    if not _whole(hosts) or not 0 <= hosts <= MAX_HOSTS:
        raise ConfigError(f"--hosts {hosts!r} must be a whole number from 0 to {MAX_HOSTS:,}")
    if isinstance(host_memory_gb, bool) or not isinstance(host_memory_gb, (int, float)) \
            or not math.isfinite(host_memory_gb) \
            or not 0 <= host_memory_gb <= MAX_HOST_MEMORY_GB:
        raise ConfigError(f"--host-memory-gb {host_memory_gb!r} must be a finite number of GiB "
                          f"from 0 to {MAX_HOST_MEMORY_GB:,} (1 PiB per host)")
    return hosts, Fraction(repr(float(host_memory_gb)))


def resolve(workload: str, accelerator: str | None, runnable: bool = True) -> WorkloadRun:
    """`--workload W --accelerator A` checked: the accelerator is one W defines, and (with
    `runnable`) iobench can build W's dataset; else a ConfigError naming the fix."""
    w = parse_workload(workload)
    if accelerator is None:
        raise ConfigError(f"--workload {w.name} needs --accelerator; choose one of: "
                          f"{', '.join(w.accelerators)}")
    if accelerator not in w.accelerators:
        raise ConfigError(f"--accelerator {accelerator!r} is not defined for {w.name} by MLPerf "
                          f"Storage; choose one of: {', '.join(w.accelerators)}")
    if runnable:
        check_runnable(w)
    return WorkloadRun(w, accelerator)


def check_runnable(w: Workload) -> None:
    """A ConfigError when iobench cannot write or read `w`'s dataset yet."""
    from iobench.core.formats import FORMATS

    if w.format not in FORMATS:
        raise ConfigError(f"--workload {w.name}: the format {w.format!r} is not registered "
                          f"(formats: {', '.join(FORMATS)}); {w.missing or 'install it'}")
    if w.dataset is None:
        if w.mlperf_format == w.format:  # its format is there now: only the table lacks it
            raise ConfigError(f"--workload {w.name}: the {w.format!r} format is registered but "
                              f"WORKLOADS[{w.name!r}].dataset in iobench/core/workloads.py names no "
                              "dataset yet; set it to the dataset that format writes")
        raise ConfigError(f"--workload {w.name} cannot run yet: {w.missing}")
