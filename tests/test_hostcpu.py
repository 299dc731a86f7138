"""The host's busy CPU from /proc/stat (`iobench.core.hostcpu`): its count, deltas, and no guess."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from iobench.core import hostcpu
from iobench.core.hostcpu import HostCpu


def _cpu_lines() -> int:
    lines = Path("/proc/stat").read_text().splitlines()
    return sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())


def test_a_busy_loop_shows_in_the_hosts_busy_cpu() -> None:
    t0 = time.perf_counter()
    before = hostcpu.read()
    while time.perf_counter() - t0 < 0.3:  # this process busy for 0.3 s
        pass
    after = hostcpu.read()
    wall = time.perf_counter() - t0
    assert before is not None and after is not None
    assert before.cpus == after.cpus == _cpu_lines()
    busy = (after - before).busy_s
    assert busy > 0.1, busy  # the loop's own ~0.3 s, whatever else the host does
    # at most every CPU busy all the time; the counters move in whole ticks, so a tick
    # per CPU at either end may fall inside the readings but outside the wall clock
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert busy <= (wall + 2 * tick) * after.cpus, (busy, wall, after.cpus)


def test_a_difference_keeps_the_cpu_count() -> None:
    d = HostCpu(busy_s=12.5, cpus=4) - HostCpu(busy_s=10.0, cpus=4)
    assert d == HostCpu(busy_s=2.5, cpus=4)


def test_record_names_its_source_and_none_without_a_reading() -> None:
    rec = hostcpu.record(HostCpu(1.0, 2), HostCpu(1.75, 2))
    assert rec == {"busy_s": 0.75, "cpus": 2, "source": hostcpu.SOURCE}
    assert hostcpu.record(None, HostCpu(1.0, 2)) is None
    assert hostcpu.record(HostCpu(1.0, 2), None) is None


def test_an_unreadable_proc_stat_gives_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.setattr(hostcpu, "PROC_STAT", str(tmp_path / "missing"))
    assert hostcpu.read() is None


@pytest.mark.parametrize("text", ["", "cpu  1 2 3\ncpu0 1 2 3\n",
                                  "cpu  1 2 3 4 5 6 7 8 0 0\n",  # no cpuN line
                                  "cpu  1 2 x 4 5 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"])
def test_a_malformed_proc_stat_gives_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          text: str) -> None:
    path = tmp_path / "stat"
    path.write_text(text)
    monkeypatch.setattr(hostcpu, "PROC_STAT", str(path))
    assert hostcpu.read() is None


def test_busy_counts_user_nice_system_irq_softirq_only(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    path = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    path.write_text(f"cpu  {tick} {tick} {tick} 999 999 {tick} {tick} 999 5 5\n"
                    "cpu0 1 1 1 1 1 1 1 1 0 0\ncpu1 1 1 1 1 1 1 1 1 0 0\nintr 0\n")
    monkeypatch.setattr(hostcpu, "PROC_STAT", str(path))
    assert hostcpu.read() == HostCpu(busy_s=5.0, cpus=2)
