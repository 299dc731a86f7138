"""Every child process iobench starts is governed (issue 32, item 5): its own process group,
a time limit, nothing left running after it, a bounded tail of its output, and pipes that a
background grandchild still holds never waited on."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from iobench.core import cache
from iobench.core.errors import StorageError
from iobench.core.launch import run


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (gone, or a zombie its parent has not reaped yet),
    waiting for an asynchronous SIGKILL to land."""
    for _ in range(300):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_background_child_of_the_evict_command_neither_blocks_nor_survives(
        tmp_path: Path) -> None:
    """`--evict-cmd 'sleep 1000 &'`: the shell exits at once; iobench used to wait for the
    pipes the sleep still held until the time limit, and then call it a failure."""
    pidfile = tmp_path / "bg.pid"
    r = cache.run_evict_cmd(f"sleep 1000 & echo $! > {pidfile}; echo evicted", None, 0,
                            timeout_s=30)
    assert r["returncode"] == 0 and r["output"] == "evicted", r
    assert _gone(int(pidfile.read_text())), "the background sleep outlived its command"


def test_an_evict_command_past_its_limit_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    r = cache.run_evict_cmd(f"sleep 1000 & echo $! > {pidfile}; wait", None, 0, timeout_s=1)
    assert r["returncode"] is None and "did not finish within 1 s" in r["output"]
    assert _gone(int(pidfile.read_text())), "the timed-out command's child still runs"


def test_a_failing_command_that_prints_10_mb_is_one_short_line() -> None:
    script = "head -c 10000000 /dev/zero | tr '\\0' x; echo; echo 'cannot reach oss3' >&2; " \
             "head -c 10000000 /dev/zero | tr '\\0' y >&2; exit 3"
    from iobench.core.launch import OUTPUT_TAIL_BYTES, capture

    r = cache.run_evict_cmd(script, None, 0, timeout_s=60)
    assert r["returncode"] == 3 and 0 < len(r["output"]) <= 300, len(r["output"])
    res = capture(["bash", "-c", script], 60)
    assert res.code == 3 and res.truncated
    assert len(res.stdout) <= OUTPUT_TAIL_BYTES and len(res.stderr) <= OUTPUT_TAIL_BYTES


def test_the_evict_failure_message_is_one_bounded_line(tmp_path: Path) -> None:
    """What the user sees when the command fails: one line, not megabytes."""
    from test_cache import make_dataset

    from iobench.core.world import World

    m = make_dataset(tmp_path / "d", [8192])
    opts = cache.EvictOptions(evict_cmd="head -c 3000000 /dev/zero | tr '\\0' z; exit 1")
    with pytest.raises(StorageError, match="exit status 1") as e:
        cache.evict_for_node(m, World(), opts)
    assert "\n" not in str(e.value) and len(str(e.value)) < 600, len(str(e.value))


def test_a_command_that_cannot_start_says_why() -> None:
    from iobench.core.launch import capture

    r = capture(["/nonexistent/evict-tool"], 10)
    assert r.code is None and r.error is not None and "cannot run it" in r.last_line()


def test_what_an_iobench_child_leaves_in_its_group_is_killed_when_it_exits(
        tmp_path: Path) -> None:
    """A sweep or search child that exits leaving a process behind (a loader worker)."""
    pidfile = tmp_path / "stray.pid"
    end = run(["bash", "-c", f"sleep 1000 & echo $! > {pidfile}; exit 0"], tmp_path / "c.log",
              60)
    assert end.ok
    assert _gone(int(pidfile.read_text())), "the child's stray process still runs"


def test_a_log_that_cannot_be_written_is_one_storage_line(tmp_path: Path) -> None:
    """A full disk while `search` writes a point's log (here /dev/full: every write is
    ENOSPC), or a log folder that cannot be made: StorageError, and nothing started."""
    with pytest.raises(StorageError, match="cannot write the child's log /dev/full"):
        run([sys.executable, "-c", "pass"], Path("/dev/full"), 60)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match="cannot write the child's log"):
        run([sys.executable, "-c", "pass"], blocker / "n1" / "train.log", 60)


def test_the_last_line_of_a_huge_log_is_read_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    end = run([sys.executable, "-c", "import sys; sys.stdout.write('x' * 5_000_000); "
               "print(); print('iobench: error: the real reason'); raise SystemExit(2)"],
              log, 60)
    assert end.code == 2 and end.why() == "exit 2: iobench: error: the real reason"
