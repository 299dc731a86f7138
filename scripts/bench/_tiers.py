"""Shared helpers of the real-tier benchmarks: the one-box GlusterFS, datasets on it, runs."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GLUSTER = REPO / "scripts" / "pfs" / "local-gluster.sh"
EVICT = f"{GLUSTER} evict"
IOBENCH = [sys.executable, "-m", "iobench"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure, show its output's tail and stop the benchmark."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, **kw)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return r


def gluster_up() -> Path:
    """The one-box GlusterFS mount (brought up, or reused when it runs)."""
    r = run(["bash", GLUSTER, "up"])
    return Path(r.stdout.strip().split("=", 1)[1])


def brick_read_bytes() -> int:
    """Bytes the brick daemons read from disk so far (`/proc/<pid>/io` of glusterfsd)."""
    total = 0
    for pid in run(["bash", GLUSTER, "brick-pids"]).stdout.split():
        with open(f"/proc/{pid}/io") as f:
            total += next(int(ln.split()[1]) for ln in f if ln.startswith("read_bytes"))
    return total


def ensure_dataset(storage: Path, dataset: str, fmt: str, samples: int, jobs: int = 2) -> Path:
    """Generate `dataset` in `fmt` under `storage` unless a complete copy is there."""
    root = storage / f"{dataset}-{fmt}"
    if not (root / "iobench.json").is_file():
        log(f"generating {dataset}/{fmt}, {samples} samples, in {storage}")
        run([*IOBENCH, "generate", "--dataset", dataset, "--format", fmt, "--samples",
             str(samples), "--storage", storage, "--jobs", str(jobs), "--force"])
    return root


def ensure_copy(src_root: Path, storage: Path) -> Path:
    """Copy a dataset directory under `storage` (complete copies only: manifest last)."""
    dst = storage / src_root.name
    if (dst / "iobench.json").is_file():
        return dst
    log(f"copying {src_root} to {storage}")
    tmp = storage / f".{src_root.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    storage.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src_root, tmp, ignore=shutil.ignore_patterns("iobench.json"))
    shutil.copy2(src_root / "iobench.json", tmp / "iobench.json")
    os.rename(tmp, dst)
    os.sync()
    return dst


def only_result(d: Path) -> dict[str, Any]:
    (path,) = sorted(d.glob("*.json"))
    return json.loads(path.read_text())


def train(storage: Path, dataset: str, fmt: str, results: Path, args: list[str]) -> dict[str, Any]:
    """One `iobench train` in a subprocess; its result document."""
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir(parents=True)
    run([*IOBENCH, "train", "--loader", fmt, "--dataset", dataset, "--storage", storage,
         "--results", results, *args])
    return only_result(results)


def med(doc: dict[str, Any], key: str) -> float | None:
    """Median over repetitions (and epochs) of a headline figure of a train result."""
    sp = doc["summary"]["spread"].get(key)
    return sp["median"] if sp else None


def epoch_values(doc: dict[str, Any], key: str) -> list[float]:
    """Every epoch's summary figure `key` (all repetitions)."""
    return [e["summary"][key] for e in doc["epochs"]]


def fmt_spread(vals: list[float], spec: str = ".3g") -> str:
    """`median [min-max]` of a list."""
    if not vals:
        return "n/a"
    m = statistics.median(vals)
    if len(vals) == 1:
        return format(m, spec)
    return f"{m:{spec}} [{min(vals):{spec}}-{max(vals):{spec}}]"


def statuses(doc: dict[str, Any]) -> str:
    return ",".join(sorted({e["cache"]["status"] for e in doc["epochs"]}))


def header(what: str) -> str:
    load = os.getloadavg()
    return (f"{what}: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, host "
            f"{os.uname().nodename}, {os.cpu_count()} cores, load average "
            f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start")
