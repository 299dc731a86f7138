"""The CLI skeleton, `iobench info`, errors, JSON and sampling contracts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import cli, run_cmd
from iobench.core import sampling, sysinfo
from iobench.core.errors import ConfigError, DatasetError, IobenchError, StorageError
from iobench.core.jsonio import atomic_file, read_json, write_atomic, write_json_atomic


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli("--version")
    assert e.value.code == 0
    assert "iobench 0." in capsys.readouterr().out


def test_info_matches_findmnt(tmp_path):
    r = run_cmd("info", "/tmp", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    fm = subprocess.run(["findmnt", "-no", "FSTYPE,OPTIONS", "--target", "/tmp"],
                        capture_output=True, text=True, check=True).stdout.split()
    assert doc["storage"]["fstype"] == fm[0]
    assert set(doc["storage"]["options"].split(",")) == set(fm[1].split(","))
    assert doc["storage"]["free_bytes"] > 0
    for lib in ("python", "torch", "h5py", "hdf5", "netCDF4", "netcdf-c", "lmdb", "mpi4py", "mpi"):
        assert doc["versions"][lib], lib
    assert doc["cpu_count"] >= 1 and doc["memory_bytes"] > 2**20
    human = run_cmd("info", "/tmp")
    assert human.returncode == 0 and fm[0] in human.stdout


@pytest.mark.parametrize("argv, needle", [
    (["info", "/does/not/exist"], "does not exist"),
    (["info", "--bogus"], "unrecognized arguments: --bogus"),
    (["no-such-command"], "invalid choice"),
])
def test_bad_input_is_one_line(argv, needle):
    r = run_cmd(*argv)
    assert r.returncode != 0
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_fs_kinds():
    assert sysinfo.fs_kind("lustre") == "parallel"
    assert sysinfo.fs_kind("gpfs") == "parallel"
    assert sysinfo.fs_kind("nfs4") == "network"
    assert sysinfo.fs_kind("xfs") == "local"
    assert sysinfo.fs_kind("tmpfs") == "memory"
    assert sysinfo.fs_kind("fuse.iobench-pfs") == "fuse"
    assert sysinfo.fs_kind("overlay") == "overlay"


def test_mountinfo_parsing(tmp_path):
    mi = tmp_path / "mountinfo"
    mi.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
        "90 27 0:50 / /lus rw,noatime - lustre 10.0.0.1@o2ib:/fs rw,flock,lazystatfs\n"
        "91 27 0:51 / /lus/sub\\040dir rw - gpfs gpfs0 rw\n")
    (tmp_path / "x").mkdir()
    m = sysinfo.mount_of(tmp_path / "x", mountinfo=str(mi))
    assert m.fstype == "ext4" and m.options == "rw,relatime,discard"


def test_errors_inherit_builtins():
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, IobenchError)
    assert issubclass(StorageError, OSError)


def test_json_atomic_and_exclusive(tmp_path):
    p = tmp_path / "r.json"
    write_json_atomic(p, {"schema": "t", "schema_version": 1, "x": np.int64(3)})
    assert read_json(p, schema="t", max_version=1)["x"] == 3
    assert p.stat().st_mode & 0o044 == 0o044  # readable by others (shared clusters)
    with pytest.raises(FileExistsError):
        write_json_atomic(p, {"schema": "t", "schema_version": 1}, exclusive=True)
    assert list(tmp_path.iterdir()) == [p]  # no temporary left behind
    with pytest.raises(DatasetError, match="upgrade iobench"):
        write_json_atomic(p, {"schema": "t", "schema_version": 9})
        read_json(p, schema="t", max_version=1)
    p.write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        read_json(p, schema="t", max_version=1)


def test_an_interrupted_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "report.html"
    write_atomic(p, b"old")
    with pytest.raises(KeyboardInterrupt), atomic_file(p) as f:
        f.write(b"half of the new")
        raise KeyboardInterrupt
    assert p.read_bytes() == b"old" and list(tmp_path.iterdir()) == [p]
    with atomic_file(p, text=True) as f:
        f.write("new")
    assert p.read_text() == "new" and p.stat().st_mode & 0o044 == 0o044
    (tmp_path / "r.json").write_text("{}")
    with pytest.raises(StorageError, match="cannot write .*r.json/x: Not a directory"):
        write_atomic(tmp_path / "r.json" / "x", b"data")


@pytest.mark.parametrize("mode", ["global", "block", "none"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_sampling_partitions_each_epoch(mode, world):
    n = 1000
    per = [sampling.rank_indices(n, mode, 7, 1, r, world, block_size=32, window=4)
           for r in range(world)]
    assert len({len(p) for p in per}) == 1
    allidx = np.concatenate(per)
    assert len(np.unique(allidx)) == len(allidx) == n - n % world
    again = sampling.rank_indices(n, mode, 7, 1, 0, world, block_size=32, window=4)
    assert np.array_equal(again, per[0])
    other = sampling.rank_indices(n, mode, 7, 2, 0, world, block_size=32, window=4)
    assert np.array_equal(other, per[0]) == (mode == "none")


def test_block_shuffle_keeps_locality():
    order = sampling.epoch_order(np.arange(4096), "block", 0, 0, block_size=64, window=2)
    # each window of 2 blocks covers exactly 2 whole blocks
    for w in range(0, 4096, 128):
        blocks = set((order[w:w + 128] // 64).tolist())
        assert len(blocks) == 2
    assert not np.array_equal(order, np.arange(4096))


def test_local_scope_reads_only_own_files():
    ranges = [(0, 100), (100, 100), (200, 100), (300, 50)]
    r0 = sampling.rank_indices(350, "global", 1, 0, 0, 2, file_ranges=ranges, scope="local")
    r1 = sampling.rank_indices(350, "global", 1, 0, 1, 2, file_ranges=ranges, scope="local")
    assert len(r0) == len(r1) == 150
    assert set(r0) <= set(range(0, 100)) | set(range(200, 300))
    assert set(r1) <= set(range(100, 200)) | set(range(300, 350))
    with pytest.raises(ConfigError, match="at least one file per rank"):
        sampling.rank_indices(350, "global", 1, 0, 0, 8, file_ranges=ranges, scope="local")


def test_every_option_of_every_command_says_what_it_does() -> None:
    import argparse

    from iobench.cli import SUBCOMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(SUBCOMMANDS)
    missing = [(name, a.option_strings or a.dest) for name, sp in sub.choices.items()
               for a in sp._actions if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, missing
    top = parser.format_help()
    assert all(name in top for name in SUBCOMMANDS)  # `iobench --help` lists every command


def test_a_command_imports_what_it_needs_only(tmp_path: Path) -> None:
    """`iobench generate` (and `--help`) build only their own options: torch, which the
    `train` options import, costs ~1.5 s of CPU per process and is not loaded; `train`
    still parses its own options."""
    import sys

    probe = ("import sys\nfrom iobench.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
             "except SystemExit as e:\n    rc = e.code\nprint(rc, 'torch' in sys.modules)")
    for args, want in ((["generate", "--dataset", "cifar10", "--samples", "64", "--storage",
                         str(tmp_path)], "0 False"),
                       (["--debug", "generate", "--help"], "0 False"),
                       (["train", "--loader", "hdf5", "--storage", str(tmp_path),
                         "--model", "none", "--epochs", "1", "--results",
                         str(tmp_path / "r")], "0 True")):
        r = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True,
                           text=True, timeout=300)
        assert r.stdout.strip().splitlines()[-1].endswith(want), (args, r.stdout, r.stderr)


def test_provenance_names_the_code_that_measured() -> None:
    from iobench.core.sysinfo import code_version, provenance

    here = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    code = code_version()
    assert code is not None and code["commit"] == head.stdout.strip()
    assert isinstance(code["dirty"], bool)
    assert provenance()["code"] == code


def test_an_unexpected_error_is_one_line_with_its_traceback_kept(monkeypatch, capsys) -> None:
    """The last line of defence: a bug is one line naming it and where its traceback went."""
    import re

    import iobench.cli.info as info
    from iobench.cli import INTERNAL_ERROR, main

    def broken(args):
        return {}["no such key"]  # a bug, not a user's mistake

    monkeypatch.setattr(info, "main", broken)
    assert main(["info"]) == INTERNAL_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error: KeyError" in err[0], err
    path = re.search(r"traceback in (\S+),", err[0]).group(1)
    assert "Traceback" in Path(path).read_text() and "broken" in Path(path).read_text()
    Path(path).unlink()
    with pytest.raises(KeyError):
        main(["--debug", "info"])
