"""Shared test helpers: run the CLI in-process or under `mpiexec -n 2`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory):
    """`tiny_root(dataset, fmt)`: the root of a TINY dataset generated once per session (seed
    TINY_SEED), shared by the conformance kit and the loader tests. Read it; copy it to
    damage it."""
    import functools

    storage = tmp_path_factory.mktemp("tiny")

    @functools.cache
    def make(dataset: str, fmt: str) -> Path:
        from iobench.generators import GenerateConfig, generate_dataset

        n, per = TINY[dataset]
        m = generate_dataset(GenerateConfig(dataset=dataset, format=fmt, storage=storage,
                                            samples=n, samples_per_file=per, seed=TINY_SEED))
        assert m.root is not None
        return m.root

    return make
