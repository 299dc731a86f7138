"""Hostile input is one line and a non-zero exit, never a hang or an `internal error`
(issue 32, items 2 and 3): special files where a file is expected, a missing optional
library, a dead FUSE mount, a state folder that cannot be written, result files that are not
UTF-8, emulator profiles of the wrong types, absurd `datasize` figures."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from conftest import cli, run_cmd
from iobench.core.errors import ConfigError, StorageError

JPEG = b"\xff\xd8\xff\xe0" + bytes(60)


def _one_line_error(r: subprocess.CompletedProcess[str], rc: int = 2) -> str:
    """The error line of a failed command: exit `rc`, no traceback, no internal error."""
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("iobench: error: ")]
    assert r.returncode == rc, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert len(lines) == 1, r.stderr
    return lines[0]


# ------------------------------------------------------------------ special files (item 2)

def test_an_imagefolder_whose_first_jpeg_is_a_fifo_is_refused_not_waited_on(
        tmp_path: Path) -> None:
    tree = tmp_path / "images"
    (tree / "cat").mkdir(parents=True)
    os.mkfifo(tree / "cat" / "a.jpg")
    (tree / "cat" / "b.jpg").write_bytes(JPEG)
    r = run_cmd("bench-read", "--data", tree, "--loaders", "files", "--max-batches", "1",
                timeout=120)
    assert "cat/a.jpg is a FIFO, not a regular file" in _one_line_error(r)


def test_a_data_file_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    from iobench.core.errors import DatasetError
    from iobench.core.userdata import detect_format

    os.mkfifo(tmp_path / "samples.h5")
    with pytest.raises(DatasetError, match="samples.h5 is a FIFO, not a regular file"):
        detect_format(tmp_path / "samples.h5")
    folder = tmp_path / "mixed"
    folder.mkdir()
    os.mkfifo(folder / "a.h5")
    os.mkfifo(folder / "b.bin")  # no suffix it knows: detection would read its magic bytes
    with pytest.raises(DatasetError, match=r"a\.h5 \(a FIFO\)"):
        detect_format(folder)


def test_report_lists_a_fifo_json_as_unreadable_and_reports_the_rest(tmp_path: Path) -> None:
    from result_docs import real_result

    results = tmp_path / "results"
    results.mkdir()
    (results / "run.json").write_text(json.dumps(real_result()))
    os.mkfifo(results / "stuck.json")
    (results / "latin1.json").write_bytes(b'{"schema": "iobench.result", "x": "caf\xe9"}')
    out = tmp_path / "report.md"
    r = run_cmd("report", results, "--out", out, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert "stuck.json" in text and "latin1.json" in text


def test_a_result_that_is_not_utf8_is_one_line_for_compare(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"schema": "iobench.result", "note": "\xff\xfe"}')
    assert cli("compare", bad) == 2
    err = capsys.readouterr().err
    assert "is not UTF-8 text" in err and "internal error" not in err


# ------------------------------------------------------- a missing optional library (item 3)

BLOCK_ZARR = ("import sys; sys.modules['zarr'] = None; from iobench.cli import main; "
              "sys.exit(main(sys.argv[1:]))")


def test_zarr_not_installed_is_the_install_hint(tmp_path: Path) -> None:
    """zarr-python is imported inside the writer's and reader's methods: the format's own
    check names what to install before a worker fails mid-epoch."""
    assert cli("generate", "--dataset", "cifar10", "--format", "zarr", "--samples", "32",
               "--storage", tmp_path) == 0

    def blocked(*argv: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", BLOCK_ZARR, *map(str, argv)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})

    hint = "the zarr format needs a missing package (zarr): pip install 'iobench[zarr]'"
    for r in (blocked("generate", "--dataset", "cifar10", "--format", "zarr", "--samples",
                      "32", "--storage", tmp_path / "other"),
              blocked("train", "--dataset", "cifar10", "--loader", "zarr", "--storage",
                      tmp_path, "--epochs", "1", "--batch-size", "8", "--max-steps", "2",
                      "--results", tmp_path / "res"),
              blocked("verify", tmp_path / "cifar10-zarr")):
        assert hint in _one_line_error(r)
    assert not (tmp_path / "other" / "cifar10-zarr").exists()
    assert not list((tmp_path / "res").glob("*.json")) if (tmp_path / "res").exists() else True


# ------------------------------------------------------------- storage failures (item 3)

@pytest.mark.parametrize("code", [errno.ENOTCONN, errno.ENOSPC, errno.ESTALE, errno.EROFS])
def test_a_storage_oserror_escaping_a_command_is_one_line(monkeypatch, capsys,
                                                          code: int) -> None:
    """A dead FUSE mount (`Transport endpoint is not connected`), a full disk, a stale
    handle: the storage failed, not iobench; any command meeting one says so in one line."""
    import iobench.cli.info as info

    def dead(args: object) -> int:
        raise OSError(code, os.strerror(code), "/mnt/pfs/cifar10-hdf5")

    monkeypatch.setattr(info, "main", dead)
    assert cli("info", "/mnt/pfs") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"iobench: error: /mnt/pfs/cifar10-hdf5: {os.strerror(code)}: ")
    assert "internal error" not in err and "\n" not in err


def test_a_real_dead_fuse_mount_is_one_line(tmp_path: Path) -> None:
    """The emulated tier's daemon killed: every path under the mount is ENOTCONN."""
    from iobench.pfs.control import fuse_problem

    if fuse_problem() is not None:
        pytest.skip(f"FUSE unusable here: {fuse_problem()}")
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    assert cli("emulate-pfs", "--backing", backing, "--mount", mnt,
               "--profile", "passthrough") == 0
    try:
        pid = json.loads((mnt / ".iobench-pfs-stats").read_text())["pid"]
        os.kill(pid, 9)
        for _ in range(200):
            try:
                os.stat(mnt)
            except OSError as e:
                if e.errno == errno.ENOTCONN:
                    break
        r = run_cmd("verify", mnt, timeout=120)
        assert "Transport endpoint is not connected" in _one_line_error(r)
    finally:
        cli("emulate-pfs", "--unmount", mnt, "--lazy")


def test_an_emulator_state_folder_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "backing").mkdir()
    r = run_cmd("emulate-pfs", "--backing", tmp_path / "backing", "--mount", tmp_path / "mnt",
                timeout=120, env={"IOBENCH_PFS_RUN_DIR": str(tmp_path / "file" / "run")})
    line = _one_line_error(r)
    assert "cannot write the emulator's state" in line and "IOBENCH_PFS_RUN_DIR" in line
    assert not (tmp_path / "mnt").exists()  # nothing left behind that it made


# ------------------------------------------------------- emulator profiles (items 3 and 4)

@pytest.mark.parametrize("profile, needle", [
    ({"name": "x", "imitates": "y", "sources": 5}, "sources=5 must be a list of strings"),
    ({"name": "x", "imitates": "y", "sources": [1]}, "must be a list of strings"),
    ({"name": "x", "imitates": "y", "metadata_ms": "0.5"}, "metadata_ms='0.5' must be a number"),
    ({"name": "x", "imitates": "y", "bandwidth_MBps": "fast"}, "must be a number or null"),
    ({"name": "x", "imitates": "y", "iops": True}, "iops=True must be a number"),
    ({"name": ["a"], "imitates": "y"}, "name=['a'] must be a non-empty string"),
    ({"name": "x", "imitates": {"a": 1}}, "imitates={'a': 1} must be a non-empty string"),
    ({"name": "x", "imitates": "y", "read_ms": None}, "read_ms=None must be a number"),
])
def test_a_profile_of_the_wrong_types_is_refused_by_name(tmp_path: Path, profile: dict,
                                                         needle: str) -> None:
    from iobench.pfs.profiles import load_profile

    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"schema": "iobench.pfs-profile", "schema_version": 1,
                                "profile": profile}))
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        load_profile(str(path))


def test_a_probe_result_of_the_wrong_types_is_refused(tmp_path: Path) -> None:
    from iobench.pfs.profiles import load_profile

    path = tmp_path / "probe.json"
    for summary in ({"cold_open_ms_p50": "1", "close_ms_p50": 1, "cold_read_ms_p50": 1,
                     "seq_read_MBps": 100}, [1, 2]):
        path.write_text(json.dumps({"schema": "iobench.probe", "summary": summary,
                                    "storage": {}, "provenance": [1]}))
        with pytest.raises(ConfigError, match="probe"):
            load_profile(str(path))


# ------------------------------------------------------------------ datasize (items 3 and 4)

@pytest.mark.parametrize("argv, needle", [
    (("--hosts", "2", "--host-memory-gb", "inf"), "--host-memory-gb inf must be a finite"),
    (("--hosts", "2", "--host-memory-gb", "nan"), "--host-memory-gb nan must be a finite"),
    (("--hosts", "2", "--host-memory-gb", "1e30"), "1 PiB per host"),
    (("--hosts", "10000000000", "--host-memory-gb", "64"), "--hosts 10000000000 must be"),
])
def test_datasize_refuses_absurd_figures(capsys, argv: tuple[str, ...], needle: str) -> None:
    assert cli("datasize", "--workload", "unet3d", "--accelerator", "h100",
               "--accelerators", "8", *argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "internal error" not in err


def test_datasize_counts_are_exact_integers() -> None:
    """ceil(H x G x 5 GiB / sample bytes) of the decimal G as written, never of a float
    product that lands a hair above a whole number (one sample too many)."""
    from iobench.core.workloads import resolve

    run = resolve("resnet50", "h100", runnable=False)
    sample = run.workload.sample_bytes
    for hosts, gib in ((3, 0.1), (7, 1.7), (1000, 512.3), (999_999, 1_048_575.9)):
        exact = Fraction(hosts) * Fraction(str(gib)) * 5 * (1 << 30) / sample
        want = max(500 * run.batch * 1, -(-exact.numerator // exact.denominator))
        assert run.required_samples(1, hosts, gib) == want
    files = run.required_files(10**17 + 1)
    assert files == -(-(10**17 + 1) // run.workload.samples_per_file)
    with pytest.raises(ConfigError, match="--accelerators"):
        run.required_samples(10**9)


def test_a_log_folder_on_a_full_disk_is_a_storage_error() -> None:
    """`search` writes each point's log through `launch.run`: /dev/full is a disk with no
    space left."""
    from iobench.core.launch import run

    with pytest.raises(StorageError, match="No space left on device"):
        run([sys.executable, "-c", "pass"], Path("/dev/full"), 60)
