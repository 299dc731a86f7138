"""LMDB writer's I/O: one fsync per file before its rename (none per commit), and the dirty
pages' memory reused from one file to the next."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest


def test_each_file_synced_once_before_its_rename_none_per_commit(tmp_path):
    """fio's reference write syncs once at the end: so does each LMDB file (LMDB's own
    per-commit fdatasync and meta-page sync are off), and its one fsync comes before the
    rename that gives it its final name, so the manifest never lists an unsynced file."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("needs strace (apt-get install strace)")
    log = tmp_path / "strace.log"
    r = subprocess.run([strace, "-f", "-y", "-o", str(log), "-e",
                        "trace=fsync,fdatasync,sync_file_range,rename,renameat,renameat2",
                        sys.executable, "-m", "iobench", "generate", "--dataset", "cifar10",
                        "--format", "lmdb", "--samples", "40", "--samples-per-file", "16",
                        "--jobs", "2", "--storage", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "ptrace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stderr
    calls = [ln for ln in log.read_text().splitlines() if "part-0" in ln]
    for k in range(3):
        tmp = f".part-{k:05d}.lmdb.tmp"
        syncs = [i for i, ln in enumerate(calls) if re.search(r"\b(fsync|fdatasync)\(", ln)
                 and f"/{tmp}>" in ln]
        renames = [i for i, ln in enumerate(calls) if re.search(r"\brename", ln) and tmp in ln]
        assert len(syncs) == 1 and "fsync(" in calls[syncs[0]], (tmp, calls)
        assert len(renames) == 1 and syncs[0] < renames[0], (tmp, calls)


FAULTS = """
import json, resource, sys
from pathlib import Path
from iobench.core.datasets import DATASETS
from iobench.generators import get_writer
w = get_writer("lmdb", DATASETS["cifar10"], 0)
w.prepare()
n, out = int(sys.argv[2]), []
for task in w.plan(2 * n, n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    w.write(Path(sys.argv[1]), task)
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(out))
"""


def test_dirty_pages_memory_reused_by_the_next_file(tmp_path):
    """LMDB mallocs each dirty page and frees them when the environment closes; the second
    file must reuse that memory instead of faulting in (and zeroing) every page again.
    Counted in a fresh process: a long-lived test process's heap has its own history."""
    import json

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's allocator only")
    n = 3000  # one 4 KB overflow page per 3 KB record
    r = subprocess.run([sys.executable, "-c", FAULTS, str(tmp_path), str(n)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    faults = json.loads(r.stdout)
    # before: about 2.8 faults per record in every file; now about 1,000 in all for the
    # second (Python's own objects, the checksum's buffer)
    assert len(faults) == 2 and faults[1] < n, faults
    assert sorted(p.name for p in tmp_path.glob("part-*")) == ["part-00000.lmdb",
                                                               "part-00001.lmdb"]


def test_row_views_are_the_rows():
    """The records handed to LMDB are each row's bytes, in order, the last chunk's too."""
    from iobench.generators.lmdb import row_views

    buf = np.arange(5 * 7, dtype=np.uint8).reshape(5, 7)
    for rows in (buf, buf[:3], buf[:1]):
        views = row_views(rows)
        assert [bytes(v) for v in views] == [r.tobytes() for r in rows]
        assert all(isinstance(v, memoryview) and v.nbytes == 7 for v in views)
