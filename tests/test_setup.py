"""What `make demo` and `make test` install on the machine: the demo only what it needs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "install-system-deps.sh"


def _packages(group: str) -> list[str]:
    out = subprocess.run(["bash", str(SCRIPT), group, "--list"], capture_output=True,
                         text=True, timeout=30, check=True)
    return out.stdout.split()


def _prerequisites(target: str) -> list[str]:
    m = re.search(rf"^{target}:([^\n]*)$", (REPO / "Makefile").read_text(), re.M)
    assert m, target
    return m.group(1).split()


def test_the_demo_installs_fuse_only_and_the_suite_the_rest() -> None:
    demo, everything = _packages("demo"), _packages("all")
    assert demo == ["fuse3", "libfuse2"]  # emulate-pfs: the demo's parallel filesystem
    assert set(demo) < set(everything)
    for pkg in ("glusterfs-server", "slurmctld", "munge", "chromium-headless-shell", "fio"):
        assert pkg in everything and pkg not in demo
    assert "demo-deps" in _prerequisites("demo") and "system-deps" not in _prerequisites("demo")
    assert "system-deps" in _prerequisites("test")


def test_an_unknown_group_is_one_line_and_exit_2() -> None:
    r = subprocess.run(["bash", str(SCRIPT), "everything"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
