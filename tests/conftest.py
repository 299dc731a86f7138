"""Shared test helpers: run the CLI in-process or under `mpiexec -n 2`."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from iobench.cli import main

VENV_BIN = Path(sys.executable).parent


def cli(*argv: str) -> int:
    """Run `iobench ARGV...` in this process and return its exit code."""
    return main([str(a) for a in argv])


def mpiexec_path() -> str | None:
    return shutil.which("mpiexec", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def run_mpi(n: int, *argv: str, timeout: float = 300, env: dict[str, str] | None = None,
            module: str = "iobench") -> subprocess.CompletedProcess[str]:
    """Run `mpiexec -n N python -m MODULE ARGV...`, capturing output."""
    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (install the `mpich` extra)")
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([exe, "-n", str(n), sys.executable, "-m", module, *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, env=full_env)


def run_cmd(*argv: str, timeout: float = 300, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run `python -m iobench ARGV...` in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "iobench", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, env=full_env)


# (samples, samples per file or shard): tiny, several files, the last one short
TINY = {"cifar10": (40, 16), "imagenet": (10, 4), "cosmoflow": (4, 3)}
TINY_SEED = 7


@functools.cache
def truth(dataset: str, index: int) -> tuple[Any, Any]:
    """(sample, label) of a TINY dataset's index, from the synthesis itself."""
    from iobench.core.datasets import DATASETS
    from iobench.generators.synth import make_sample

    return make_sample(DATASETS[dataset], TINY_SEED, index)


def check_batches(dataset: str, batches: list, expect: Any) -> None:
    """Each delivered (sample, label) equals the synthesis of its index, in `expect` order."""
    import numpy as np
    import torch

    from iobench.core.datasets import DATASETS

    spec = DATASETS[dataset]
    got = np.concatenate([b.indices.numpy() for b in batches])
    np.testing.assert_array_equal(got, expect)
    for b in batches:
        assert b.indices.dtype == torch.int64
        if spec.num_classes:
            assert b.labels.dtype == torch.int64 and b.labels.shape == (len(b.indices),)
        else:
            assert b.labels.dtype == torch.float32 and b.labels.shape == (len(b.indices), 4)
        for j, i in enumerate(b.indices.tolist()):
            sample, label = truth(dataset, i)
            if spec.sample_kind == "jpeg":
                o = b.offsets
                assert b.samples.dtype == torch.uint8 and b.samples.dim() == 1
                assert b.samples[o[j]:o[j + 1]].numpy().tobytes() == sample
            else:
                assert b.samples.dtype == getattr(torch, spec.sample_dtype)
                np.testing.assert_array_equal(b.samples[j].numpy(), sample)
            np.testing.assert_array_equal(b.labels[j].numpy(), np.asarray(label))


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory):
    """`tiny_root(dataset, fmt)`: the root of a TINY dataset generated once per session (seed
    TINY_SEED), shared by the conformance kit and the loader tests. Read it; copy it to
    damage it."""
    import functools

    storage = tmp_path_factory.mktemp("tiny")

    @functools.cache
    def make(dataset: str, fmt: str) -> Path:
        from iobench.core.errors import UnsupportedError
        from iobench.core.formats import parse_format
        from iobench.workflows.generate import GenerateConfig, generate_dataset

        spec = parse_format(fmt)
        try:
            modules = spec.writer_class().library_modules
        except UnsupportedError as e:  # its writer's library is missing
            pytest.skip(str(e))
        for module in modules:  # an optional extra (zarr), imported by the writer when used
            pytest.importorskip(module, reason=f"the {fmt} format needs {module}: "
                                f"{spec.install}")
        n, per = TINY[dataset]
        m = generate_dataset(GenerateConfig(dataset=dataset, format=fmt, storage=storage,
                                            samples=n, samples_per_file=per, seed=TINY_SEED))
        assert m.root is not None
        return m.root

    return make


# Modules whose tests time things tightly (emulated steps within 5 %, shadow clocks, signals
# at exact points, AU against a bandwidth) or evict the whole page cache (drop_caches).
# `make test` runs every other module in parallel (pytest-xdist, one module per process at
# a time; the Slurm module keeps its service to itself, and the GlusterFS modules take the
# volume one at a time, test_gluster.py's LOCK) and
# these afterwards, alone, so no other test's load or eviction skews them.
SERIAL_MODULES = frozenset({
    "test_cache", "test_honesty", "test_interrupts", "test_pfs", "test_search",
    "test_train", "test_train_mpi", "test_verdict", "test_watchdog",
})


@pytest.fixture
def tmpfs(tmp_path: Path):
    """`tmpfs(size)`: a tmpfs of that size (e.g. "3m") mounted in the test's folder, for a
    full disk; the test is skipped where none can be mounted (needs root). Unmounted after."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"tmpfs{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                           capture_output=True, text=True) if os.geteuid() == 0 else None
        if r is None or r.returncode != 0:
            pytest.skip(f"cannot mount a {size} tmpfs here: "
                        f"{'needs root' if r is None else r.stderr.strip() or r.returncode}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
