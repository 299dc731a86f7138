"""The README's main job runs as printed, with only its paths replaced (a newcomer's path)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import VENV_BIN

README = Path(__file__).parent.parent / "README.md"


def main_job() -> list[str]:
    text = README.read_text()
    block = text.split("Then, with your parallel filesystem", 1)[1]
    body = re.search(r"```sh\n(.*?)```", block, re.S)
    assert body, "README: the main-job block is missing"
    return [line for line in body.group(1).splitlines() if line.strip()]


@pytest.mark.slow
def test_readme_main_job_runs_as_printed(tmp_path: Path) -> None:
    lines = main_job()
    assert lines[0].startswith("iobench generate") and lines[-1].startswith("iobench compare")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    out = ""
    for line in lines:
        cmd = line.replace("/lustre/$USER/iob", str(tmp_path / "pfs")).replace(
            "/tmp/nvme", str(tmp_path / "nvme"))
        r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, (cmd, r.stderr[-2000:])
        out = r.stdout
    flat = " ".join(out.split())
    assert "run 2:" in flat and ("pays for itself" in flat or "never pays" in flat), flat[-800:]
    assert (tmp_path / "stall.png").stat().st_size > 0
