"""Shared helpers of the generation benchmarks: run `iobench generate` and fio, keep medians."""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WROTE = re.compile(r"wrote ([0-9.]+) MB in (\d+) files.* in [0-9.]+ s \(([0-9.]+) MB/s")


def venv_bin(name: str) -> str:
    """`name` from the interpreter's own bin directory (the venv's mpiexec), else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def loadavg() -> float:
    """One-minute load average (how busy the shared machine was)."""
    return os.getloadavg()[0]


def header(work: Path) -> dict[str, Any]:
    """Date, host, cores, load, disk and code version: printed and returned for the JSON."""
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "generators"],
                               capture_output=True, text=True).stdout.strip()
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    disk = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE", "--target", str(work)],
                          capture_output=True, text=True).stdout.strip()
    info = {"date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "host": socket.gethostname(),
            "cores": os.cpu_count(), "load_1min_start": loadavg(), "disk": disk,
            "commit": commit, "python": platform.python_version(), "command": " ".join(sys.argv)}
    print(f"date {info['date']}  host {info['host']}  cores {info['cores']}  commit {commit}  "
          f"load {info['load_1min_start']:.2f}  disk {disk} ({work})")
    print(f"command: {info['command']}")
    return info


def generate(storage: Path, dataset: str, fmt: str, samples: int, samples_per_file: int,
             jobs: int = 1, ranks: int = 1, seed: int = 0,
             pythonpath: str | None = None) -> dict[str, float]:
    """Run `iobench generate` into a fresh `storage`; its own timing and the process wall time.

    `seconds` is what the command reports (from the first task to the last file
    fsynced, manifest statistics apart); `wall_s` includes interpreter start-up;
    `cpu_s` is the CPU time (user + system) of the command and its workers, start-up
    included, which other jobs on a shared machine disturb less than the wall clock.
    `pythonpath`: run an older iobench importable from there (a tree with
    iobench/loaders and iobench/generators linked in), for before/after side by side.
    """
    shutil.rmtree(storage, ignore_errors=True)
    argv = [sys.executable, "-m", "iobench", "generate", "--dataset", dataset, "--format", fmt,
            "--samples", str(samples), "--samples-per-file", str(samples_per_file),
            "--seed", str(seed), "--storage", str(storage.resolve())]
    if ranks > 1:
        argv = [venv_bin("mpiexec"), "-n", str(ranks), *argv]
    else:
        argv += ["--jobs", str(jobs)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # not from a checkout: `python -m` puts the working directory first on sys.path
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=storage.parent)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its workers
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if r.returncode != 0:
        raise SystemExit(f"generate failed ({' '.join(argv)}):\n{r.stderr}")
    m = WROTE.search(r.stderr)
    if not m:
        raise SystemExit(f"cannot parse the generate output:\n{r.stderr}")
    # the rate, not the seconds: they are printed to 0.1 s, which is 8 % of a 1.2 s run
    mb, files, mbps = float(m.group(1)), int(m.group(2)), float(m.group(3))
    secs = mb / mbps
    return {"MB": mb, "files": files, "seconds": secs, "wall_s": wall, "MBps": mb / secs,
            "samples_per_s": samples / secs, "cpu_s": cpu, "MB_per_cpu_s": mb / cpu}


def fio_write(directory: Path, total_bytes: int, jobs: int) -> dict[str, float]:
    """fio's buffered sequential write of `total_bytes` in `jobs` processes with a final fsync.

    `MBps` is fio's own aggregate bandwidth (its runtime includes the final
    fsync); `wall_MBps` divides by the fio process's wall time instead.
    """
    fio = shutil.which("fio")
    if not fio:
        raise SystemExit("fio is not installed: run `make system-deps` (apt-get install fio)")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    per_job_mib = max(16, total_bytes // jobs // (1 << 20) // 16 * 16)
    argv = [fio, "--name=w", "--rw=write", "--bs=16m", f"--size={per_job_mib}m",
            f"--numjobs={jobs}", "--end_fsync=1", f"--directory={directory}",
            "--group_reporting", "--output-format=json"]
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    shutil.rmtree(directory, ignore_errors=True)
    if r.returncode != 0:
        raise SystemExit(f"fio failed:\n{r.stderr}")
    w = json.loads(r.stdout)["jobs"][0]["write"]
    return {"MBps": w["bw_bytes"] / 1e6, "wall_MBps": w["io_bytes"] / 1e6 / wall,
            "bytes": w["io_bytes"], "command": " ".join(argv)}


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt(xs: list[float], spec: str = ".0f") -> str:
    """`median [min-max]` of repeated values."""
    if len(xs) == 1:
        return format(xs[0], spec)
    return f"{median(xs):{spec}} [{min(xs):{spec}}-{max(xs):{spec}}]"


def save(path: Path | None, doc: dict[str, Any]) -> None:
    """Write the figures as JSON (temporary name, then rename)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    print(f"figures: {path}")
